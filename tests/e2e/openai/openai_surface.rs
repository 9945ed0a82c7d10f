//! The OpenAI surface clients probe before they send work: `GET /v1/models/{id}` in OpenAI's
//! shape (404 in its error shape for an unknown model or a canary-only version), `GET /health`
//! as readiness (what vLLM, SGLang, TGI and tools such as guidellm check first), and a 404 for an
//! unknown `/v1/` path that names the supported ones. Real gateway and sim worker on loopback.

use crate::common;
use crate::tenant_support;

use std::time::Duration;

use hyper::StatusCode;
use serde_json::{Value, json};
use tenant_support::{Gw, MODEL, Setup, key_of, post};

use common::Engine;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_can_be_retrieved_and_health_is_readiness() {
    let engine = Engine::start(&[]).await;
    let gw = Gw::start(&Setup {
        workers: &[&engine.url],
        aliases: &["second-name"],
        tenants: &[("acme", "t")],
        tiers: "tiers:\n  t: {priority: 1}\n",
        ..Setup::default()
    })
    .await;
    let json = |text: &str| -> Value { serde_json::from_str(text).expect("JSON") };

    let (status, text) = common::get(&gw.at(&format!("/v1/models/{MODEL}"))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let m = json(&text);
    assert_eq!(
        (m["id"].as_str(), m["object"].as_str()),
        (Some(MODEL), Some("model"))
    );
    assert!(
        m["created"].as_u64() > Some(0) && m["owned_by"].is_string(),
        "{m}"
    );
    let (status, _) = common::get(&gw.at("/v1/models/second-name")).await;
    assert_eq!(status, StatusCode::OK);

    let (status, text) = common::get(&gw.at("/v1/models/gpt-nope")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let err = &json(&text)["error"];
    assert!(
        err["message"]
            .as_str()
            .is_some_and(|m| m.contains("`gpt-nope` does not exist")),
        "{text}"
    );
    assert!(err["type"].is_string(), "{text}");

    let (status, text) = common::get(&gw.at("/health")).await;
    assert_eq!(status, StatusCode::OK, "{text}");

    let (status, text) = common::get(&gw.at("/v1/embeddingz")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        text.contains("POST /v1/chat/completions") && text.contains("GET /v1/models"),
        "{text}"
    );

    // Readiness follows the workers: with the only worker gone, /health fails as /readyz does.
    drop(engine);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (health, _) = common::get(&gw.at("/health")).await;
        let (readyz, _) = common::get(&gw.at("/readyz")).await;
        if health == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(readyz, StatusCode::SERVICE_UNAVAILABLE);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "/health stayed {health}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Embeddings and the Responses API go through the same phases as chat: auth, limits, routing
/// and accounting. Embeddings are metered on input tokens only; a Responses answer, streamed or
/// not, is metered from its `usage` (`input_tokens`, `output_tokens`), and its streamed events
/// reach the client untouched (no usage chunk hidden, no `[DONE]` added).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_and_responses_are_proxied_and_metered_from_their_usage() {
    let engine = Engine::start(&[]).await;
    let gw = Gw::start(&Setup {
        workers: &[&engine.url],
        tenants: &[("acme", "t")],
        tiers: "tiers:\n  t: {priority: 1}\n",
        ..Setup::default()
    })
    .await;
    let key = key_of("acme");
    let json_of = |text: &str| -> Value { serde_json::from_str(text).expect("JSON") };
    let prompt_sel = "infergate_tenant_tokens_total{tenant=\"acme\",kind=\"prompt\"}";
    let completion_sel = "infergate_tenant_tokens_total{tenant=\"acme\",kind=\"completion\"}";
    let within = Duration::from_secs(5);

    let anonymous = post(
        &gw.at("/v1/embeddings"),
        None,
        &json!({"model": MODEL, "input": "a"}),
    )
    .await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);

    let e = post(
        &gw.at("/v1/embeddings"),
        Some(&key),
        &json!({"model": MODEL, "input": ["the quick brown fox", "jumps"]}),
    )
    .await;
    assert_eq!(e.status, StatusCode::OK, "{}", e.text);
    let e = json_of(&e.text);
    assert_eq!(e["data"].as_array().map(Vec::len), Some(2), "{e}");
    let embedded = e["usage"]["prompt_tokens"]
        .as_f64()
        .expect("usage.prompt_tokens");
    assert!(embedded > 0.0, "{e}");
    gw.expect_metric(prompt_sel, embedded, within).await;
    assert_eq!(gw.metric(completion_sel).await, 0.0);

    let r = post(
        &gw.at("/v1/responses"),
        Some(&key),
        &json!({"model": MODEL, "input": "Say hello.", "max_output_tokens": 5}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = json_of(&r.text);
    assert_eq!(r["object"], "response", "{r}");
    let (input, output) = (
        r["usage"]["input_tokens"].as_f64().expect("input_tokens"),
        r["usage"]["output_tokens"].as_f64().expect("output_tokens"),
    );
    assert!(input > 0.0 && output > 0.0 && output <= 5.0, "{r}");
    gw.expect_metric(prompt_sel, embedded + input, within).await;
    gw.expect_metric(completion_sel, output, within).await;

    let s = post(
        &gw.at("/v1/responses"),
        Some(&key),
        &json!({"model": MODEL, "input": "Say hello.", "max_output_tokens": 4, "stream": true}),
    )
    .await;
    assert_eq!(s.status, StatusCode::OK, "{}", s.text);
    let events: Vec<Value> = s
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(json_of)
        .collect();
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types.first(), Some(&"response.created"), "{types:?}");
    let last = events.last().expect("events");
    assert!(
        ["response.completed", "response.incomplete"]
            .contains(&last["type"].as_str().unwrap_or("")),
        "{types:?}"
    );
    assert!(!s.text.contains("[DONE]"), "{}", s.text);
    let streamed = last["response"]["usage"]["output_tokens"]
        .as_f64()
        .expect("usage");
    let streamed_in = last["response"]["usage"]["input_tokens"]
        .as_f64()
        .expect("usage");
    gw.expect_metric(completion_sel, output + streamed, within)
        .await;
    gw.expect_metric(prompt_sel, embedded + input + streamed_in, within)
        .await;
}
