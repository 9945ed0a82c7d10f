//! The OpenAI surface clients probe before they send work: `GET /v1/models/{id}` in OpenAI's
//! shape (404 in its error shape for an unknown model or a canary-only version), `GET /health`
//! as readiness (what vLLM, SGLang, TGI and tools such as guidellm check first), and a 404 for an
//! unknown `/v1/` path that names the supported ones. Real gateway and sim worker on loopback.

mod common;
#[path = "tenant_support/mod.rs"]
mod tenant_support;

use hyper::StatusCode;
use serde_json::Value;
use tenant_support::{Gw, MODEL, Setup};

use common::Engine;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_can_be_retrieved_and_health_is_readiness() {
    let engine = Engine::start(&[]).await;
    let gw = Gw::start(&Setup {
        workers: &[&engine.url],
        admission: None,
        max_context: None,
        aliases: &["second-name"],
        extra: "",
        tenants: &[("acme", "t")],
        tiers: "tiers:\n  t: {priority: 1}\n",
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
