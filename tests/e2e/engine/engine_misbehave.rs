//! The engine's quality faults end to end: an engine started with `--fault-repeat-rate 1`
//! (or `--fault-empty-rate`, `--fault-refusal-rate`, `--fault-broken-json-rate` at 1, or
//! `--fault-longer-answers`) answers every request that way, streamed and whole alike, with
//! `usage` counting the tokens of exactly the text sent. About 1 s.

use crate::common;

use common::{Engine, post_json, stream};
use hyper::StatusCode;
use serde_json::{Value, json};

const MODEL: &str = "llama-3-8b";

/// A chat request of `max_tokens`, with `response_format` JSON when `json`.
fn ask(max_tokens: u64, json: bool) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name rivers, stones and towns along the coast."}],
        "max_tokens": max_tokens,
    });
    if json {
        body["response_format"] = json!({"type": "json_object"});
    }
    body
}

/// The whole answer's (content, finish_reason, completion_tokens), and the same read from the
/// streamed answer (deltas joined, the usage chunk's count).
async fn both(e: &Engine, body: &Value) -> [(String, String, u64); 2] {
    let url = e.at("/v1/chat/completions");
    let (status, _, whole) = post_json(&url, body).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let choice = &whole["choices"][0];
    let w = (
        choice["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        choice["finish_reason"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        whole["usage"]["completion_tokens"].as_u64().expect("usage"),
    );
    let mut body = body.clone();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let s = stream(&url, &body).await;
    assert_eq!(s.status, StatusCode::OK);
    let mut text = String::new();
    let (mut finish, mut tokens) = (String::new(), None);
    for chunk in s.chunks() {
        if let Some(c) = chunk["choices"][0]["delta"]["content"].as_str() {
            text.push_str(c);
        }
        if let Some(f) = chunk["choices"][0]["finish_reason"].as_str() {
            finish = f.to_owned();
        }
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            tokens = Some(n);
        }
    }
    [w, (text, finish, tokens.expect("a usage chunk"))]
}

#[tokio::test]
async fn each_quality_fault_shapes_streamed_and_whole_answers_alike() {
    let sim = ["--gpu", "h100", "--sim-mean-output-tokens", "4"];
    let with = |flags: &'static [&'static str]| {
        let mut args = sim.to_vec();
        args.extend_from_slice(flags);
        async move { Engine::start(&args).await }
    };
    let (repeat, empty, refusal, json_engine, longer) = tokio::join!(
        with(&["--fault-repeat-rate", "1"]),
        with(&["--fault-empty-rate", "1"]),
        with(&["--fault-refusal-rate", "1"]),
        with(&["--fault-broken-json-rate", "1"]),
        with(&["--fault-longer-answers"]),
    );

    // A loop of the six-token phrase, cut at max_tokens.
    for (text, finish, tokens) in both(&repeat, &ask(18, false)).await {
        assert_eq!(text, " and then the same thing again".repeat(3));
        assert_eq!((finish.as_str(), tokens), ("length", 18));
    }
    for (text, finish, tokens) in both(&empty, &ask(18, false)).await {
        assert_eq!((text.as_str(), finish.as_str(), tokens), ("", "stop", 0));
    }
    for (text, finish, tokens) in both(&refusal, &ask(64, false)).await {
        assert_eq!(text, "I'm sorry, but I can't help with that request.");
        // The refusal is 13 cl100k tokens, each counted once.
        assert_eq!((finish.as_str(), tokens), ("stop", 13));
    }
    for (text, finish, tokens) in both(&json_engine, &ask(64, true)).await {
        assert!(serde_json::from_str::<Value>(&text).is_err(), "{text}");
        assert!(text.starts_with("{\"answer\": \""), "{text}");
        assert_eq!(finish, "stop");
        assert!(tokens > 0);
    }
    // Without response_format the same engine answers as usual (the sim's words of the prompt).
    let [(text, _, _), _] = both(&json_engine, &ask(8, false)).await;
    assert!(!text.starts_with('{'), "{text}");
    // A mean of 4 tokens, yet every answer runs to max_tokens.
    for (_, finish, tokens) in both(&longer, &ask(40, false)).await {
        assert_eq!((finish.as_str(), tokens), ("length", 40));
    }
}
