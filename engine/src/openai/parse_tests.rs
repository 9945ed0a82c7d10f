//! Tests of request parsing: every rule with a good and a bad case.

use super::*;
use hyper::StatusCode;
use serde_json::json;

fn completion(body: Value) -> Result<ParsedRequest, ApiError> {
    parse_completion(body.to_string().as_bytes())
}

fn chat(body: Value) -> Result<ParsedRequest, ApiError> {
    parse_chat(body.to_string().as_bytes(), &ChatTemplate::default_chatml())
}

/// A completions body with `extra` merged into a valid base.
fn with(extra: Value) -> Value {
    let mut body = json!({"model": "m", "prompt": "hi"});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Asserts a 400 whose `param` is `param` and whose message contains `needle`.
fn rejects(result: Result<ParsedRequest, ApiError>, param: &str, needle: &str) {
    let err = result.unwrap_err();
    assert_eq!(err.status, StatusCode::BAD_REQUEST, "{err:?}");
    assert_eq!(err.param.as_deref(), Some(param), "{err:?}");
    assert!(
        err.message.contains(needle),
        "{:?} lacks {needle:?}",
        err.message
    );
}

#[test]
fn minimal_completion_defaults() {
    let p = completion(with(json!({}))).unwrap();
    assert_eq!(p.endpoint, Endpoint::Completions);
    assert_eq!(p.model, "m");
    assert_eq!(p.prompts, [Prompt::Text("hi".to_owned())]);
    assert!(!p.stream && !p.include_usage);
    assert_eq!((p.n, p.best_of, p.echo, p.logprobs), (1, 1, false, None));
    assert_eq!(p.max_tokens, None);
    assert_eq!(p.user, None);
    let want = SamplingParams {
        max_tokens: 0,
        ..SamplingParams::default()
    };
    assert_eq!(p.sampling, want);
}

#[test]
fn full_completion() {
    let p = completion(with(json!({
        "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 32,
        "min_tokens": 4, "temperature": 0.0, "top_p": 0.5, "top_k": 40, "seed": 7,
        "ignore_eos": true, "stop": ["\n", "END"], "user": "u1", "n": 1, "best_of": 1,
        "logprobs": 3, "echo": false, "frequency_penalty": 0.5, "unknown_field": {"x": 1},
    })))
    .unwrap();
    assert!(p.stream && p.include_usage);
    assert_eq!(p.max_tokens, Some(32));
    assert_eq!(p.user.as_deref(), Some("u1"));
    let s = &p.sampling;
    assert_eq!(
        (s.min_tokens, s.temperature, s.top_p, s.top_k),
        (4, 0.0, 0.5, 40)
    );
    assert_eq!(s.seed, Some(7));
    assert!(s.ignore_eos);
    assert_eq!(s.stop, ["\n", "END"]);
    assert_eq!(p.logprobs, Some(3));
}

#[test]
fn nulls_are_absent() {
    let p = completion(with(
        json!({"max_tokens": null, "stop": null, "seed": null, "stream_options": null}),
    ))
    .unwrap();
    assert_eq!(p.max_tokens, None);
    assert!(p.sampling.stop.is_empty());
}

#[test]
fn invalid_json_and_body() {
    let err = parse_completion(b"{\"model\": ").unwrap_err();
    assert_eq!(err.status, StatusCode::BAD_REQUEST);
    assert!(
        err.message.contains("invalid JSON body") && err.message.contains("EOF"),
        "{}",
        err.message
    );
    assert!(parse_completion(b"[]").is_err());
    assert!(parse_chat(b"nope", &ChatTemplate::default_chatml()).is_err());
}

#[test]
fn model_is_required_string() {
    rejects(
        completion(json!({"prompt": "hi"})),
        "model",
        "`model` is required",
    );
    rejects(
        completion(json!({"model": 3, "prompt": "hi"})),
        "model",
        "string",
    );
    rejects(
        chat(json!({"messages": [{"role": "user", "content": "x"}]})),
        "model",
        "required",
    );
}

#[test]
fn prompt_forms() {
    let p = |v: Value| completion(with(json!({"prompt": v})));
    assert_eq!(
        p(json!(["one"])).unwrap().prompts,
        [Prompt::Text("one".to_owned())]
    );
    assert_eq!(
        p(json!([1, 2, 3])).unwrap().prompts,
        [Prompt::Tokens(vec![1, 2, 3])]
    );
    assert_eq!(
        p(json!([[5, 6]])).unwrap().prompts,
        [Prompt::Tokens(vec![5, 6])]
    );
    // Lists: one prompt per element, in order.
    assert_eq!(
        p(json!(["a", "b"])).unwrap().prompts,
        [Prompt::Text("a".to_owned()), Prompt::Text("b".to_owned())]
    );
    assert_eq!(
        p(json!([[1], [2, 3]])).unwrap().prompts,
        [Prompt::Tokens(vec![1]), Prompt::Tokens(vec![2, 3])]
    );
    rejects(completion(json!({"model": "m"})), "prompt", "required");
    rejects(p(json!("")), "prompt", "empty");
    rejects(p(json!([])), "prompt", "empty");
    rejects(p(json!([""])), "prompt", "empty");
    rejects(p(json!(["a", ""])), "prompt", "empty");
    rejects(p(json!([[]])), "prompt", "empty");
    rejects(p(json!([[1], []])), "prompt", "empty");
    rejects(p(json!([[1], "a"])), "prompt", "token-id arrays");
    rejects(p(json!([1, -2])), "prompt", "token ids");
    rejects(p(json!([1, 1.5])), "prompt", "token ids");
    rejects(p(json!([1, 4_294_967_296_u64])), "prompt", "token ids");
    rejects(p(json!([1, "a"])), "prompt", "token ids");
    rejects(p(json!(["a", 1])), "prompt", "an array of strings");
    rejects(p(json!(5)), "prompt", "must be a string");
    rejects(p(json!([{"x": 1}])), "prompt", "must be a string");
}

#[test]
fn sampling_ranges() {
    let ok = |v: Value| completion(with(v)).unwrap().sampling;
    assert_eq!(ok(json!({"temperature": 2})).temperature, 2.0);
    assert_eq!(ok(json!({"top_p": 1})).top_p, 1.0);
    assert_eq!(ok(json!({"top_k": 0})).top_k, -1);
    assert_eq!(ok(json!({"top_k": -1})).top_k, -1);
    assert_eq!(ok(json!({"top_k": 1})).top_k, 1);
    rejects(
        completion(with(json!({"temperature": -0.1}))),
        "temperature",
        "[0, 2]",
    );
    rejects(
        completion(with(json!({"temperature": 2.01}))),
        "temperature",
        "[0, 2]",
    );
    rejects(
        completion(with(json!({"temperature": "hot"}))),
        "temperature",
        "number",
    );
    rejects(completion(with(json!({"top_p": 0}))), "top_p", "(0, 1]");
    rejects(completion(with(json!({"top_p": 1.5}))), "top_p", "(0, 1]");
    rejects(completion(with(json!({"top_k": -2}))), "top_k", "-1");
    rejects(completion(with(json!({"top_k": 1.5}))), "top_k", "integer");
}

#[test]
fn token_limits() {
    let ok = |v: Value| completion(with(v)).unwrap();
    assert_eq!(ok(json!({"max_tokens": 1})).max_tokens, Some(1));
    assert_eq!(ok(json!({"max_tokens": 16.0})).max_tokens, Some(16));
    assert_eq!(
        ok(json!({"min_tokens": 5, "max_tokens": 5}))
            .sampling
            .min_tokens,
        5
    );
    assert_eq!(ok(json!({"min_tokens": 500})).sampling.min_tokens, 500);
    rejects(
        completion(with(json!({"max_tokens": 0}))),
        "max_tokens",
        "at least 1",
    );
    rejects(
        completion(with(json!({"max_tokens": -3}))),
        "max_tokens",
        "at least 1",
    );
    rejects(
        completion(with(json!({"max_tokens": "10"}))),
        "max_tokens",
        "integer",
    );
    rejects(
        completion(with(json!({"min_tokens": -1}))),
        "min_tokens",
        "at least 0",
    );
    rejects(
        completion(with(json!({"min_tokens": 6, "max_tokens": 5}))),
        "min_tokens",
        "at most `max_tokens`",
    );
}

#[test]
fn chat_max_completion_tokens_takes_precedence() {
    let base = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    let mut body = base.clone();
    body["max_tokens"] = json!(10);
    body["max_completion_tokens"] = json!(20);
    assert_eq!(chat(body).unwrap().max_tokens, Some(20));
    let mut body = base.clone();
    body["max_tokens"] = json!(10);
    assert_eq!(chat(body).unwrap().max_tokens, Some(10));
    let mut body = base.clone();
    body["max_completion_tokens"] = json!(0);
    rejects(chat(body), "max_completion_tokens", "at least 1");
    let mut body = base;
    body["max_completion_tokens"] = json!(4);
    body["min_tokens"] = json!(5);
    rejects(chat(body), "min_tokens", "`max_completion_tokens`");
}

#[test]
fn n_best_of_echo_logprobs() {
    let p = completion(with(
        json!({"n": 3, "best_of": 5, "echo": true, "logprobs": 0}),
    ))
    .unwrap();
    assert_eq!((p.n, p.best_of, p.echo, p.logprobs), (3, 5, true, Some(0)));
    let p = completion(with(json!({"n": 4}))).unwrap();
    assert_eq!((p.n, p.best_of), (4, 4), "best_of defaults to n");
    assert!(completion(with(json!({"n": 128, "logprobs": 20}))).is_ok());
    rejects(completion(with(json!({"n": 0}))), "n", "at least 1");
    rejects(completion(with(json!({"n": 129}))), "n", "at most 128");
    rejects(completion(with(json!({"n": "2"}))), "n", "integer");
    rejects(
        completion(with(json!({"n": 3, "best_of": 2}))),
        "best_of",
        "at least `n`",
    );
    rejects(
        completion(with(json!({"best_of": 0}))),
        "best_of",
        "at least 1",
    );
    rejects(
        completion(with(json!({"best_of": 500}))),
        "best_of",
        "at most",
    );
    rejects(
        completion(with(json!({"best_of": 2, "stream": true}))),
        "best_of",
        "cannot be streamed",
    );
    assert!(completion(with(json!({"n": 2, "best_of": 2, "stream": true}))).is_ok());
    rejects(completion(with(json!({"echo": 1}))), "echo", "boolean");
    rejects(
        completion(with(json!({"logprobs": 21}))),
        "logprobs",
        "[0, 20]",
    );
    rejects(
        completion(with(json!({"logprobs": -1}))),
        "logprobs",
        "[0, 20]",
    );
    rejects(
        completion(with(json!({"logprobs": true}))),
        "logprobs",
        "integer",
    );
    // max_tokens 0 is the prompt alone: only with echo.
    let p = completion(with(json!({"echo": true, "max_tokens": 0}))).unwrap();
    assert_eq!(p.max_tokens, Some(0));
    rejects(
        completion(with(json!({"max_tokens": 0}))),
        "max_tokens",
        "0 only with `echo`",
    );
}

#[test]
fn stop_forms() {
    let stop = |v: Value| completion(with(json!({"stop": v})));
    assert_eq!(stop(json!("###")).unwrap().sampling.stop, ["###"]);
    assert!(stop(json!([])).unwrap().sampling.stop.is_empty());
    assert_eq!(
        stop(json!(["a", "b", "c", "d"]))
            .unwrap()
            .sampling
            .stop
            .len(),
        4
    );
    rejects(stop(json!(["a", "b", "c", "d", "e"])), "stop", "at most 4");
    rejects(stop(json!("")), "stop", "empty");
    rejects(stop(json!(["a", ""])), "stop", "empty");
    rejects(stop(json!(["a", 1])), "stop", "string");
    rejects(stop(json!(3)), "stop", "string");
}

#[test]
fn seeds() {
    let seed = |v: Value| completion(with(json!({"seed": v})));
    assert_eq!(seed(json!(0)).unwrap().sampling.seed, Some(0));
    assert_eq!(seed(json!(-1)).unwrap().sampling.seed, Some(u64::MAX));
    assert_eq!(seed(json!(i64::MIN)).unwrap().sampling.seed, Some(1 << 63));
    assert_eq!(seed(json!(u64::MAX)).unwrap().sampling.seed, Some(u64::MAX));
    rejects(seed(json!(1.5)), "seed", "integer");
    rejects(seed(json!("7")), "seed", "integer");
}

#[test]
fn booleans_and_strings() {
    rejects(
        completion(with(json!({"ignore_eos": "yes"}))),
        "ignore_eos",
        "boolean",
    );
    rejects(completion(with(json!({"stream": 1}))), "stream", "boolean");
    rejects(completion(with(json!({"user": 5}))), "user", "string");
}

#[test]
fn stream_options() {
    let p = completion(with(json!({"stream": true, "stream_options": {}}))).unwrap();
    assert!(!p.include_usage);
    rejects(
        completion(with(json!({"stream_options": {"include_usage": true}}))),
        "stream_options",
        "`stream` is true",
    );
    rejects(
        completion(with(json!({"stream": true, "stream_options": true}))),
        "stream_options",
        "object",
    );
    rejects(
        completion(with(
            json!({"stream": true, "stream_options": {"include_usage": "y"}}),
        )),
        "stream_options.include_usage",
        "boolean",
    );
}

fn messages(msgs: Value) -> Result<ParsedRequest, ApiError> {
    chat(json!({"model": "m", "messages": msgs}))
}

#[test]
fn chat_renders_template() {
    let p = messages(json!([
        {"role": "system", "content": "S"},
        {"role": "developer", "content": "D"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "tool_calls": []},
        {"role": "tool", "content": "T", "tool_call_id": "1"},
    ]))
    .unwrap();
    assert_eq!(p.endpoint, Endpoint::ChatCompletions);
    assert_eq!(
        p.prompts[0],
        Prompt::Text(
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>developer\nD<|im_end|>\n\
             <|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n\
             <|im_start|>tool\nT<|im_end|>\n<|im_start|>assistant\n"
                .to_owned()
        )
    );
}

#[test]
fn chat_add_generation_prompt() {
    let body = json!({"model": "m", "add_generation_prompt": false, "chat_template_kwargs": {"x": 1},
        "messages": [{"role": "user", "content": "x"}]});
    assert_eq!(
        chat(body).unwrap().prompts,
        [Prompt::Text("<|im_start|>user\nx<|im_end|>\n".to_owned())]
    );
    let body = json!({"model": "m", "add_generation_prompt": "no", "messages": [{"role": "user", "content": "x"}]});
    rejects(chat(body), "add_generation_prompt", "boolean");
}

#[test]
fn chat_message_rules() {
    rejects(chat(json!({"model": "m"})), "messages", "required");
    rejects(messages(json!("hi")), "messages", "array");
    rejects(messages(json!([])), "messages", "empty");
    rejects(messages(json!(["hi"])), "messages[0]", "object");
    rejects(
        messages(json!([{"content": "x"}])),
        "messages[0].role",
        "required",
    );
    rejects(
        messages(json!([{"role": 1, "content": "x"}])),
        "messages[0].role",
        "string",
    );
    rejects(
        messages(json!([{"role": "user", "content": "x"}, {"role": "wizard", "content": "x"}])),
        "messages[1].role",
        "`wizard`",
    );
    rejects(
        messages(json!([{"role": "user", "content": null}])),
        "messages[0].content",
        "required",
    );
    rejects(
        messages(json!([{"role": "user"}])),
        "messages[0].content",
        "required",
    );
    rejects(
        messages(json!([{"role": "user", "content": 3}])),
        "messages[0].content",
        "string",
    );
    assert!(messages(json!([{"role": "assistant"}])).is_ok());
}

#[test]
fn chat_content_parts() {
    rejects(
        messages(
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        ),
        "messages[0].content[0]",
        "`image_url`",
    );
    rejects(
        messages(json!([{"role": "user", "content": ["x"]}])),
        "messages[0].content[0]",
        "object",
    );
    rejects(
        messages(json!([{"role": "user", "content": [{"text": "x"}]}])),
        "messages[0].content[0]",
        "type",
    );
    rejects(
        messages(json!([{"role": "user", "content": [{"type": "text", "text": 1}]}])),
        "messages[0].content[0].text",
        "string",
    );
    let p = messages(json!([{"role": "user", "content": []}])).unwrap();
    assert_eq!(
        p.prompts[0],
        Prompt::Text("<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n".to_owned())
    );
}

#[test]
fn chat_shares_sampling_rules() {
    let msgs = json!([{"role": "user", "content": "x"}]);
    let body = json!({"model": "m", "messages": msgs, "n": 2});
    assert_eq!(chat(body).unwrap().n, 2);
    let body = json!({"model": "m", "messages": msgs, "n": 200});
    rejects(chat(body), "n", "at most 128");
    let body = json!({"model": "m", "messages": msgs, "echo": true});
    rejects(chat(body), "echo", "not supported");
    // Chat logprobs: a boolean, with `top_logprobs` alternatives that need it.
    let body = json!({"model": "m", "messages": msgs, "logprobs": true, "top_logprobs": 5});
    assert_eq!(chat(body).unwrap().logprobs, Some(5));
    let body = json!({"model": "m", "messages": msgs, "logprobs": true});
    assert_eq!(chat(body).unwrap().logprobs, Some(0));
    let body = json!({"model": "m", "messages": msgs, "logprobs": false});
    assert_eq!(chat(body).unwrap().logprobs, None);
    let body = json!({"model": "m", "messages": msgs, "top_logprobs": 2});
    rejects(chat(body), "top_logprobs", "requires `logprobs`");
    let body = json!({"model": "m", "messages": msgs, "logprobs": false, "top_logprobs": 0});
    rejects(chat(body), "top_logprobs", "requires `logprobs`");
    let body = json!({"model": "m", "messages": msgs, "logprobs": true, "top_logprobs": 21});
    rejects(chat(body), "top_logprobs", "[0, 20]");
    let body = json!({"model": "m", "messages": msgs, "logprobs": 3});
    rejects(chat(body), "logprobs", "boolean");
    let body = json!({"model": "m", "messages": msgs, "max_tokens": 0});
    rejects(chat(body), "max_tokens", "at least 1");
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0.7,
        "stream": true, "stream_options": {"include_usage": true}, "seed": -5});
    let p = chat(body).unwrap();
    assert!(p.stream && p.include_usage);
    assert_eq!(p.sampling.temperature, 0.7);
    assert_eq!(p.sampling.seed, Some((-5_i64) as u64));
}

#[test]
fn template_errors_surface_as_400() {
    let t = ChatTemplate::from_source("{{ raise_exception('no system role') }}", "", "").unwrap();
    let body = json!({"model": "m", "messages": [{"role": "system", "content": "x"}]});
    let err = parse_chat(body.to_string().as_bytes(), &t).unwrap_err();
    assert_eq!(err.status, StatusCode::BAD_REQUEST);
    assert_eq!(err.message, "no system role");
}
