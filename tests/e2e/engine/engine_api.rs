//! End-to-end tests of the engine's OpenAI-compatible API: response shapes, streaming, sampling
//! determinism, stop strings, model names and request validation, over real HTTP to a real process.

use crate::common;

use std::time::Duration;

use common::{
    Engine, assert_error, get, parse_exec_path, post_json, post_raw, stream, token_ids, words,
};
use hyper::StatusCode;
use serde_json::{Value, json};

const MODEL: &str = "llama-3-8b";

fn completion(prompt: &str, max_tokens: u64, extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens});
    merge(&mut body, extra);
    body
}

fn chat(content: &str, max_tokens: u64, extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    });
    merge(&mut body, extra);
    body
}

fn merge(body: &mut Value, extra: Value) {
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
}

fn text_of(res: &Value) -> String {
    res["choices"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no choices[0].text in {res}"))
        .to_owned()
}

/// Token counts agree (cached tokens may differ: the second request reuses the first's blocks).
fn assert_same_counts(a: &Value, b: &Value) {
    for key in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert!(a[key].is_u64(), "{key} in {a}");
        assert_eq!(a[key], b[key], "{key}: {a} vs {b}");
    }
}

#[tokio::test]
async fn completion_counts_tokens_and_steps_and_is_reproducible() {
    let e = Engine::start(&["--gpu", "h100"]).await;
    let url = e.at("/v1/completions");
    let max = 8;
    let body = completion(
        "The capital of France is",
        max,
        json!({"ignore_eos": true, "seed": 42}),
    );
    let (status, headers, res) = post_json(&url, &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    assert_eq!(res["object"], "text_completion");
    assert_eq!(res["choices"].as_array().map(Vec::len), Some(1), "{res}");
    assert!(res["id"].as_str().unwrap().starts_with("cmpl-"), "{res}");
    assert_eq!(res["model"], MODEL);
    let text = text_of(&res);
    assert!(!text.trim().is_empty(), "{res}");
    assert_eq!(text.split_whitespace().count() as u64, max, "{text:?}");
    assert_eq!(res["choices"][0]["finish_reason"], "length");
    let usage = &res["usage"];
    assert_eq!(usage["completion_tokens"], max);
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert!((4..=8).contains(&prompt_tokens), "{usage}");
    assert_eq!(usage["total_tokens"], prompt_tokens + max);

    // The prompt fits one step: 1 prefill step (which samples the first token) + max-1 decodes.
    let path = headers
        .get("x-infergate-exec-path")
        .expect("x-infergate-exec-path header")
        .to_str()
        .unwrap();
    let (graph, eager) = parse_exec_path(path);
    assert_eq!(graph + eager, max, "{path}");
    assert!(eager >= 1, "the prefill runs eager: {path}");

    // Same seed and prompt → same text; another seed → other text.
    let (_, _, again) = post_json(&url, &body).await;
    assert_eq!(text_of(&again), text);
    let other_seed = completion(
        "The capital of France is",
        max,
        json!({"ignore_eos": true, "seed": 43}),
    );
    let (_, _, other) = post_json(&url, &other_seed).await;
    assert_ne!(text_of(&other), text);

    // Greedy is deterministic whatever the seed.
    let greedy = |seed: u64| {
        completion(
            "The capital of France is",
            max,
            json!({"ignore_eos": true, "temperature": 0, "seed": seed}),
        )
    };
    let (_, _, g1) = post_json(&url, &greedy(1)).await;
    let (_, _, g2) = post_json(&url, &greedy(2)).await;
    let (_, _, g3) = post_json(
        &url,
        &completion(
            "The capital of France is",
            max,
            json!({"ignore_eos": true, "temperature": 0}),
        ),
    )
    .await;
    assert_eq!(text_of(&g1), text_of(&g2));
    assert_eq!(text_of(&g1), text_of(&g3));
    assert_eq!(g1["usage"]["completion_tokens"], max);

    // The engine's step counter saw at least this request's steps.
    let steps = e
        .metric("infergate_engine_steps_total{path=\"graph\"}")
        .await
        + e.metric("infergate_engine_steps_total{path=\"eager\"}")
            .await;
    assert!(steps >= max as f64, "{steps}");
}

#[tokio::test]
async fn completion_stream_matches_non_streamed() {
    let e = Engine::start(&["--gpu", "h100"]).await;
    let url = e.at("/v1/completions");
    let max = 10;
    let extra = json!({"ignore_eos": true, "seed": 7});
    let (status, _, whole) = post_json(&url, &completion("Once upon a time", max, extra)).await;
    assert_eq!(status, StatusCode::OK, "{whole}");

    let body = completion(
        "Once upon a time",
        max,
        json!({"ignore_eos": true, "seed": 7, "stream": true,
               "stream_options": {"include_usage": true}}),
    );
    let s = stream(&url, &body).await;
    assert_eq!(s.status, StatusCode::OK);
    assert_eq!(
        s.headers.get("content-type").unwrap(),
        "text/event-stream",
        "{:?}",
        s.headers
    );
    assert_eq!(s.last_data(), "[DONE]");
    let chunks = s.chunks();
    let (usage_chunk, choice_chunks) = chunks.split_last().expect("chunks");
    assert!(choice_chunks.len() >= 2, "{chunks:?}");
    let id = choice_chunks[0]["id"].as_str().unwrap();
    let mut text = String::new();
    for (i, c) in choice_chunks.iter().enumerate() {
        assert_eq!(c["object"], "text_completion", "{c}");
        assert_eq!(c["id"], id, "one id per stream");
        assert_eq!(c["model"], MODEL);
        text += c["choices"][0]["text"].as_str().expect("choices[0].text");
        let finish = &c["choices"][0]["finish_reason"];
        if i + 1 == choice_chunks.len() {
            assert_eq!(*finish, "length", "{c}");
        } else {
            assert!(finish.is_null(), "finish before the end: {c}");
        }
    }
    assert_eq!(usage_chunk["choices"], json!([]), "{usage_chunk}");
    assert_eq!(usage_chunk["usage"]["completion_tokens"], max);
    assert_same_counts(&usage_chunk["usage"], &whole["usage"]);
    assert_eq!(text.split_whitespace().count() as u64, max, "{text:?}");
    assert_eq!(text, text_of(&whole), "streamed and whole answers differ");

    // The exec-path comment comes before [DONE] and counts every step.
    let (graph, eager) = parse_exec_path(&s.exec_path().expect("exec-path comment"));
    assert_eq!(graph + eager, max);
    let done_at = s.events.len() - 1;
    let comment_at = s
        .events
        .iter()
        .position(|e| !e.comments.is_empty())
        .unwrap();
    assert!(comment_at < done_at);

    // Chunks arrive as tokens are made, not in one burst at the end: 9 decode steps of ≥ 6 ms
    // separate the first and the last token.
    let data: Vec<_> = s.events.iter().filter(|e| e.data.is_some()).collect();
    let spread = data[data.len() - 3].at - data[0].at;
    assert!(spread >= Duration::from_millis(30), "spread {spread:?}");
}

#[tokio::test]
async fn chat_stream_matches_non_streamed() {
    let e = Engine::start(&["--gpu", "h100"]).await;
    let url = e.at("/v1/chat/completions");
    let max = 6;
    let (status, _, whole) = post_json(
        &url,
        &chat("Hello there", max, json!({"ignore_eos": true, "seed": 5})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let whole_text = whole["choices"][0]["message"]["content"].as_str().unwrap();

    let body = chat(
        "Hello there",
        max,
        json!({"ignore_eos": true, "seed": 5, "stream": true,
               "stream_options": {"include_usage": true}}),
    );
    let s = stream(&url, &body).await;
    assert_eq!(s.status, StatusCode::OK);
    assert_eq!(s.last_data(), "[DONE]");
    let chunks = s.chunks();
    let (usage_chunk, choice_chunks) = chunks.split_last().unwrap();
    let first = &choice_chunks[0];
    assert_eq!(first["object"], "chat.completion.chunk");
    assert!(first["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant", "{first}");
    let mut text = String::new();
    for (i, c) in choice_chunks.iter().enumerate() {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        let delta = &c["choices"][0]["delta"];
        if i > 0 {
            assert!(delta.get("role").is_none(), "role repeated: {c}");
        }
        text += delta["content"].as_str().expect("delta.content");
        let finish = &c["choices"][0]["finish_reason"];
        if i + 1 == choice_chunks.len() {
            assert_eq!(*finish, "length", "{c}");
        } else {
            assert!(finish.is_null(), "{c}");
        }
    }
    assert_eq!(usage_chunk["object"], "chat.completion.chunk");
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], max);
    assert_same_counts(&usage_chunk["usage"], &whole["usage"]);
    assert_eq!(text.split_whitespace().count() as u64, max, "{text:?}");
    assert_eq!(text, whole_text);

    // Without include_usage there is no usage chunk: every JSON chunk has one choice.
    let plain = chat(
        "Hello there",
        max,
        json!({"ignore_eos": true, "seed": 5, "stream": true}),
    );
    let s = stream(&url, &plain).await;
    assert_eq!(s.last_data(), "[DONE]");
    for c in s.chunks() {
        assert_eq!(c["choices"].as_array().map(Vec::len), Some(1), "{c}");
        assert!(c.get("usage").is_none(), "{c}");
    }
}

#[tokio::test]
async fn chat_answers_as_assistant_and_stop_strings_cut() {
    let e = Engine::start(&["--gpu", "h100"]).await;
    let chat_url = e.at("/v1/chat/completions");
    let prompt = "Tell me a story about a cat";
    // Sampled without a seed, the first token may be the end of sequence (an empty answer,
    // rightly): `min_tokens` holds it back so the usage check below has tokens to count.
    let (status, _, res) = post_json(&chat_url, &chat(prompt, 12, json!({"min_tokens": 1}))).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    assert_eq!(res["object"], "chat.completion");
    let choice = &res["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_string());
    let finish = choice["finish_reason"].as_str().unwrap();
    assert!(finish == "length" || finish == "stop", "{res}");
    let prompt_tokens = res["usage"]["prompt_tokens"].as_u64().unwrap();
    let n_words = prompt.split_whitespace().count() as u64;
    assert!(
        prompt_tokens > n_words + 3,
        "the chat template adds tokens: {prompt_tokens} for {n_words} words"
    );
    let completion_tokens = res["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&completion_tokens), "{res}");

    // Greedy output, then a stop string taken from its middle.
    let url = e.at("/v1/completions");
    let greedy = json!({"ignore_eos": true, "temperature": 0});
    let (_, _, full) = post_json(&url, &completion("A short poem:", 20, greedy.clone())).await;
    let full = text_of(&full);
    let word = full
        .split_whitespace()
        .nth(10)
        .expect("20 words")
        .to_owned();
    let stop = format!(" {word}");
    let cut = full.find(&stop).unwrap();
    let mut extra = greedy;
    merge(&mut extra, json!({"stop": [stop.clone()]}));
    let (status, _, res) = post_json(&url, &completion("A short poem:", 20, extra.clone())).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    assert_eq!(text_of(&res), full[..cut], "stop {stop:?} in {full:?}");
    assert_eq!(res["choices"][0]["finish_reason"], "stop", "{res}");
    let tokens = res["usage"]["completion_tokens"].as_u64().unwrap();
    let words_before = full[..cut].split_whitespace().count() as u64;
    assert_eq!(tokens, words_before + 1, "the stop token itself counts");

    // Streamed, the same cut, and nothing of the stop string leaks into a chunk.
    merge(&mut extra, json!({"stream": true}));
    let s = stream(&url, &completion("A short poem:", 20, extra)).await;
    let text: String = s
        .chunks()
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(text, full[..cut]);
    let last = s.chunks().pop().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");

    // The sequence ended by the stop string gives its KV blocks back.
    e.wait_metric("vllm:kv_cache_usage_perc", Duration::from_secs(5), |v| {
        v == 0.0
    })
    .await;
}

#[tokio::test]
async fn models_lists_served_names() {
    let e = Engine::start(&["--gpu", "h100"]).await;
    let (status, text) = get(&e.at("/v1/models")).await;
    assert_eq!(status, StatusCode::OK);
    let models: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL, "{models}");
    assert_eq!(models["data"][0]["object"], "model");
    assert!(models["data"][0]["max_model_len"].as_u64().unwrap() >= 8192);

    let e = Engine::start(&["--gpu", "h100", "--served-model-name", "my-model"]).await;
    let (_, text) = get(&e.at("/v1/models")).await;
    let models: Value = serde_json::from_str(&text).unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["my-model"]);

    let url = e.at("/v1/completions");
    let mut body = completion("Hi", 2, json!({}));
    body["model"] = json!("my-model");
    let (status, _, res) = post_json(&url, &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    assert_eq!(res["model"], "my-model");

    let (status, _, res) = post_json(&url, &completion("Hi", 2, json!({}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{res}");
    let err = assert_error(status, &res, &[MODEL]);
    assert_eq!(err["type"], "not_found_error");

    // Metrics carry the served name.
    let (_, metrics) = get(&e.at("/metrics")).await;
    assert!(
        metrics.contains("vllm:num_requests_running{model_name=\"my-model\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn bad_requests_get_400_naming_the_problem() {
    let e = Engine::start(&["--gpu", "h100", "--max-model-len", "256"]).await;
    let url = e.at("/v1/completions");
    let chat_url = e.at("/v1/chat/completions");
    let as_json = |text: &str| -> Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
    };

    let (status, _, text) = post_raw(&url, "{\"model\": \"llama-3-8b\", \"prompt\": ").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(status, &as_json(&text), &["JSON"]);

    let (status, _, res) = post_json(&url, &completion("", 4, json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let err = assert_error(status, &res, &["empty"]);
    assert_eq!(err["param"], "prompt");
    assert_eq!(err["type"], "invalid_request_error");

    let body = json!({"model": MODEL, "max_tokens": 4,
                      "messages": [{"role": "wizard", "content": "hi"}]});
    let (status, _, res) = post_json(&chat_url, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let err = assert_error(status, &res, &["wizard"]);
    assert_eq!(err["param"], "messages[0].role");

    // 300 prompt tokens + 10 > 256: the message names the limit and the request's sizes.
    let body = json!({"model": MODEL, "prompt": token_ids(300, 1), "max_tokens": 10});
    let (status, _, res) = post_json(&url, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(status, &res, &["256", "310", "300"]);

    // The same as text.
    let (status, _, res) = post_json(&url, &completion(&words(400, 0), 4, json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(status, &res, &["256"]);

    let (status, _, res) = post_json(&url, &completion("Hi", 1000, json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let err = assert_error(status, &res, &["256", "1000"]);
    assert_eq!(err["param"], "max_tokens");

    let (status, _, res) = post_json(&url, &completion("Hi", 0, json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        assert_error(status, &res, &["max_tokens"])["param"],
        "max_tokens"
    );

    let (status, _, res) = post_json(&url, &completion("Hi", 4, json!({"n": 0}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(assert_error(status, &res, &["n"])["param"], "n");

    let (status, _, res) = post_json(&url, &completion("Hi", 4, json!({"temperature": 5}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        assert_error(status, &res, &["temperature"])["param"],
        "temperature"
    );

    // Unknown fields are ignored, as vLLM does by default.
    let body = completion(
        "Hi",
        3,
        json!({"ignore_eos": true, "frobnicate": {"x": [1, 2]}, "priority_lane": "gold"}),
    );
    let (status, _, res) = post_json(&url, &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    assert_eq!(res["usage"]["completion_tokens"], 3);

    // Errors before streaming are plain HTTP errors, not SSE.
    let s = stream(&url, &completion("", 4, json!({"stream": true}))).await;
    assert_eq!(s.status, StatusCode::BAD_REQUEST);

    // Unknown routes are 404 in the same shape.
    let (status, _, text) = post_raw(&e.at("/v1/audio/speech"), "{}").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(status, &as_json(&text), &["/v1/audio/speech"]);

    // Nothing of the refused requests stayed in the engine.
    assert_eq!(e.metric("vllm:num_requests_waiting").await, 0.0);
    assert_eq!(e.metric("vllm:num_requests_running").await, 0.0);
}

#[tokio::test]
async fn oversize_body_gets_413() {
    let e = Engine::start(&["--gpu", "h100", "--max-body-bytes", "1000"]).await;
    let url = e.at("/v1/completions");
    let (status, _, res) = post_json(&url, &completion(&words(400, 1), 2, json!({}))).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{res}");
    assert_error(status, &res, &["1000"]);

    let (status, _, res) = post_json(&url, &completion("Hi", 2, json!({}))).await;
    assert_eq!(status, StatusCode::OK, "a small body still passes: {res}");
}

/// A stop string ends the request in the HTTP layer; the response and the metrics must still carry
/// the engine's accounting: steps taken, cached prompt tokens, and a `stop` finish.
#[tokio::test]
async fn stop_string_finish_keeps_engine_accounting() {
    let e = Engine::start(&["--gpu", "h100"]).await;
    let url = e.at("/v1/completions");
    let prompt = words(40, 3);
    let greedy = json!({"ignore_eos": true, "temperature": 0});
    let (_, headers, full) = post_json(&url, &completion(&prompt, 20, greedy.clone())).await;
    let full_path = headers["x-infergate-exec-path"]
        .to_str()
        .unwrap()
        .to_owned();
    let (g, eg) = parse_exec_path(&full_path);
    assert_eq!(g + eg, 20, "{full_path}");
    let full = text_of(&full);
    let stop = format!(" {}", full.split_whitespace().nth(10).unwrap());
    let cut = full.find(&stop).unwrap();

    let mut extra = greedy;
    merge(&mut extra, json!({"stop": stop}));
    let (status, headers, res) = post_json(&url, &completion(&prompt, 20, extra)).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    assert_eq!(text_of(&res), full[..cut]);
    assert_eq!(res["choices"][0]["finish_reason"], "stop");
    let tokens = res["usage"]["completion_tokens"].as_u64().unwrap();
    e.wait_metric("vllm:num_requests_running", Duration::from_secs(5), |v| {
        v == 0.0
    })
    .await;

    let mut problems = Vec::new();
    let path = headers["x-infergate-exec-path"].to_str().unwrap();
    let (graph, eager) = parse_exec_path(path);
    // The engine sees the stop at its next step, so it may have run a step or two past it
    // (never past max_tokens); the report counts the steps it really ran.
    if graph + eager < tokens || graph + eager > 20 {
        problems.push(format!(
            "x-infergate-exec-path is {path:?} for {tokens} generated tokens"
        ));
    }
    let cached = &res["usage"]["prompt_tokens_details"]["cached_tokens"];
    if cached.as_u64().unwrap_or(0) < 16 {
        problems.push(format!(
            "cached_tokens is {cached} though the same 40-token prompt just ran"
        ));
    }
    let stopped = e
        .metric_or_zero("vllm:request_success_total{finished_reason=\"stop\"}")
        .await;
    let aborted = e
        .metric_or_zero("vllm:request_success_total{finished_reason=\"abort\"}")
        .await;
    let length = e
        .metric_or_zero("vllm:request_success_total{finished_reason=\"length\"}")
        .await;
    if stopped != 1.0 {
        problems.push(format!(
            "request_success_total: stop={stopped} abort={aborted} length={length} \
             (expected stop=1, length=1)"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("; "));
}
