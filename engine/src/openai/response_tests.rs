//! Tests of the response shapes against vLLM's.

use super::*;
use crate::openai::DONE;
use serde_json::Value;

fn meta(endpoint: Endpoint) -> ResponseMeta {
    ResponseMeta {
        id: "cmpl-x".to_owned(),
        created: 1_700_000_000,
        model: "m".to_owned(),
        endpoint,
    }
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap()
}

fn event(s: &str) -> Value {
    assert!(s.starts_with("data: "), "{s}");
    assert!(s.ends_with("\n\n"), "{s}");
    json(&s["data: ".len()..s.len() - 2])
}

/// A whole answer with one choice and no logprobs.
fn one(meta: &ResponseMeta, text: &str, finish: FinishReason) -> String {
    let choice = Choice {
        index: 0,
        text,
        finish,
        logprobs: None,
    };
    full_response(meta, &[choice], &USAGE)
}

fn keys(v: &Value) -> Vec<&str> {
    v.as_object().unwrap().keys().map(String::as_str).collect()
}

const USAGE: Usage = Usage {
    prompt_tokens: 7,
    completion_tokens: 5,
    cached_tokens: 4,
};

#[test]
fn usage_shape() {
    let v = json(&serde_json::to_string(&USAGE).unwrap());
    assert_eq!(v["prompt_tokens"], 7);
    assert_eq!(v["completion_tokens"], 5);
    assert_eq!(v["total_tokens"], 12);
    assert_eq!(v["prompt_tokens_details"]["cached_tokens"], 4);
    assert_eq!(v.as_object().unwrap().len(), 4);
}

#[test]
fn ids_are_prefixed_and_unique() {
    let a = ResponseMeta::new(Endpoint::Completions, "m");
    let b = ResponseMeta::new(Endpoint::Completions, "m");
    let c = ResponseMeta::new(Endpoint::ChatCompletions, "m");
    let hex = a.id.strip_prefix("cmpl-").unwrap();
    assert_eq!(hex.len(), 32);
    assert!(
        hex.chars()
            .all(|ch| ch.is_ascii_hexdigit() && !ch.is_ascii_uppercase())
    );
    assert_ne!(a.id, b.id);
    assert_eq!(c.id.strip_prefix("chatcmpl-").unwrap().len(), 32);
    assert!(a.created > 1_600_000_000);
    let many: std::collections::HashSet<String> = (0..1000)
        .map(|_| ResponseMeta::new(Endpoint::Completions, "m").id)
        .collect();
    assert_eq!(many.len(), 1000);
}

#[test]
fn completion_full_response() {
    let v = json(&one(
        &meta(Endpoint::Completions),
        "hi there",
        FinishReason::Length,
    ));
    assert_eq!(
        keys(&v),
        ["choices", "created", "id", "model", "object", "usage"]
    );
    assert_eq!(v["id"], "cmpl-x");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["created"], 1_700_000_000);
    assert_eq!(v["model"], "m");
    let choice = &v["choices"][0];
    assert_eq!(v["choices"].as_array().unwrap().len(), 1);
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["text"], "hi there");
    assert!(choice["logprobs"].is_null());
    assert_eq!(choice["finish_reason"], "length");
    assert!(choice.get("stop_reason").unwrap().is_null());
    assert!(choice.get("prompt_logprobs").unwrap().is_null());
    assert_eq!(v["usage"]["total_tokens"], 12);
}

#[test]
fn chat_full_response() {
    let v = json(&one(
        &meta(Endpoint::ChatCompletions),
        "Hello \"x\"",
        FinishReason::Stop,
    ));
    assert_eq!(v["object"], "chat.completion");
    let choice = &v["choices"][0];
    assert_eq!(
        keys(choice),
        [
            "finish_reason",
            "index",
            "logprobs",
            "message",
            "stop_reason"
        ]
    );
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "Hello \"x\"");
    assert_eq!(choice["message"]["tool_calls"], serde_json::json!([]));
    assert_eq!(choice["finish_reason"], "stop");
    assert!(choice["logprobs"].is_null());
    assert!(choice.get("stop_reason").unwrap().is_null());
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

#[test]
fn keys_keep_vllm_order() {
    let s = one(&meta(Endpoint::ChatCompletions), "x", FinishReason::Stop);
    let pos = |k: &str| s.find(&format!("\"{k}\"")).unwrap();
    assert!(pos("id") < pos("object") && pos("object") < pos("created"));
    assert!(
        pos("created") < pos("model")
            && pos("model") < pos("choices")
            && pos("choices") < pos("usage")
    );
    assert!(
        pos("prompt_tokens") < pos("total_tokens")
            && pos("total_tokens") < pos("completion_tokens")
    );
}

#[test]
fn chat_chunks() {
    let m = meta(Endpoint::ChatCompletions);
    let first = event(&chunk(&m, 0, "", true, None, None));
    assert_eq!(
        keys(&first),
        ["choices", "created", "id", "model", "object"]
    );
    assert_eq!(first["object"], "chat.completion.chunk");
    let choice = &first["choices"][0];
    assert_eq!(
        keys(choice),
        ["delta", "finish_reason", "index", "logprobs"]
    );
    assert_eq!(
        choice["delta"],
        serde_json::json!({"role": "assistant", "content": ""})
    );
    assert!(choice["finish_reason"].is_null());

    let mid = event(&chunk(&m, 0, " the", false, None, None));
    assert_eq!(
        mid["choices"][0]["delta"],
        serde_json::json!({"content": " the"})
    );

    let last = event(&chunk(&m, 0, "", false, Some(FinishReason::Stop), None));
    let choice = &last["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert!(choice.get("stop_reason").unwrap().is_null());
}

#[test]
fn completion_chunks() {
    let m = meta(Endpoint::Completions);
    let v = event(&chunk(&m, 0, "abc", true, None, None));
    assert_eq!(v["object"], "text_completion");
    let choice = &v["choices"][0];
    assert_eq!(
        keys(choice),
        ["finish_reason", "index", "logprobs", "stop_reason", "text"]
    );
    assert_eq!(choice["text"], "abc");
    assert!(choice["finish_reason"].is_null());
    let v = event(&chunk(&m, 0, "", false, Some(FinishReason::Length), None));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

#[test]
fn usage_chunks() {
    for (endpoint, object) in [
        (Endpoint::ChatCompletions, "chat.completion.chunk"),
        (Endpoint::Completions, "text_completion"),
    ] {
        let v = event(&usage_chunk(&meta(endpoint), &USAGE));
        assert_eq!(v["object"], object);
        assert_eq!(v["choices"], serde_json::json!([]));
        assert_eq!(v["usage"]["completion_tokens"], 5);
        assert_eq!(v["usage"]["total_tokens"], 12);
    }
}

#[test]
fn done_event() {
    assert_eq!(DONE, "data: [DONE]\n\n");
}

#[test]
fn models_list_shape() {
    let v = json(&models_list(&["a".to_owned(), "b".to_owned()], 4096, 123));
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    assert_eq!(data[0]["id"], "a");
    assert_eq!(data[0]["object"], "model");
    assert_eq!(data[0]["created"], 123);
    assert_eq!(data[0]["owned_by"], "infergate");
    assert_eq!(data[0]["root"], "a");
    assert!(data[0].get("parent").unwrap().is_null());
    assert_eq!(data[0]["max_model_len"], 4096);
    assert_eq!(data[1]["id"], "b");
    assert_eq!(json(&models_list(&[], 1, 0))["data"], serde_json::json!([]));
}

#[test]
fn several_choices_keep_their_indices_and_logprobs() {
    use super::super::logprobs::{LogprobEntry, TopEntry};
    let entries = vec![LogprobEntry {
        token: " b".to_owned(),
        bytes: b" b".to_vec(),
        logprob: Some(-0.5),
        top: vec![TopEntry {
            token: " b".to_owned(),
            bytes: b" b".to_vec(),
            logprob: -0.5,
        }],
        text_offset: 0,
    }];
    let choices = [
        Choice {
            index: 0,
            text: " a",
            finish: FinishReason::Length,
            logprobs: None,
        },
        Choice {
            index: 1,
            text: " b",
            finish: FinishReason::Stop,
            logprobs: Some(&entries),
        },
    ];
    let v = json(&full_response(
        &meta(Endpoint::Completions),
        &choices,
        &USAGE,
    ));
    assert_eq!(v["choices"][1]["index"], 1);
    assert_eq!(v["choices"][1]["logprobs"]["tokens"][0], " b");
    assert_eq!(v["choices"][1]["logprobs"]["top_logprobs"][0][" b"], -0.5);
    assert!(v["choices"][0]["logprobs"].is_null());
    let v = json(&full_response(
        &meta(Endpoint::ChatCompletions),
        &choices,
        &USAGE,
    ));
    assert_eq!(v["choices"][1]["logprobs"]["content"][0]["logprob"], -0.5);
    let c = event(&chunk(
        &meta(Endpoint::ChatCompletions),
        3,
        " b",
        false,
        None,
        Some(&entries),
    ));
    assert_eq!(c["choices"][0]["index"], 3);
    assert_eq!(c["choices"][0]["logprobs"]["content"][0]["token"], " b");
}
