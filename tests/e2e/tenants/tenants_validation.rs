//! Every answer the gateway gives before any upstream work, with its status code and message:
//! authentication (401), body size (413), JSON and field ranges (400), model routing (404/403),
//! context length, a request larger than the whole token budget (400, not 429), and a tier's
//! concurrency cap (429), released when the client goes away.

use crate::common;
use crate::tenant_support;

use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use tenant_support::{Conn, Gw, MODEL, Reply, Setup, completion, key_of, post, post_raw};

use common::{Engine, assert_error};

const TIERS: &str = "tiers:
  basic: {priority: 1, tokens_per_minute: 1000, max_tokens: 100, default_max_tokens: 50, models: [llama-3-8b]}
  solo: {priority: 1, max_concurrent: 1, max_tokens: 4000}
";

/// Asserts `reply` is the OpenAI-style error `status` whose message holds every needle; returns
/// the `error` object.
fn expect_error(what: &str, reply: &Reply, status: StatusCode, needles: &[&str]) -> Value {
    assert_eq!(reply.status, status, "{what}: {}", reply.text);
    assert_eq!(
        reply.header("content-type"),
        Some("application/json"),
        "{what}"
    );
    assert_error(status, &reply.json(), needles)
}

async fn start(engine: &Engine) -> Gw {
    Gw::start(&Setup {
        workers: &[&engine.url],
        max_context: Some(2048),
        aliases: &["mistral-7b"],
        extra: "limits: {max_body_bytes: 32768}",
        tenants: &[("val", "basic"), ("solo", "solo")],
        tiers: TIERS,
        ..Setup::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_validation_error_has_its_status_and_message() {
    let engine = Engine::start(&[]).await;
    let gw = start(&engine).await;
    let (url, chat_url) = (gw.at("/v1/completions"), gw.at("/v1/chat/completions"));
    let key = key_of("val");
    let key = Some(key.as_str());
    let ok = completion("hello", 4);

    // Authentication, before anything else.
    let r = post(&url, None, &ok).await;
    let e = expect_error("no key", &r, StatusCode::UNAUTHORIZED, &["API key"]);
    assert_eq!(e["type"], "authentication_error");
    let r = post(&url, Some("ig-not-a-key"), &ok).await;
    let e = expect_error(
        "wrong key",
        &r,
        StatusCode::UNAUTHORIZED,
        &["Incorrect API key"],
    );
    assert_eq!(e["type"], "authentication_error");
    assert!(!r.text.contains("ig-not-a-key"), "the key was echoed");

    // The body: size, then JSON.
    let big = json!({"model": MODEL, "prompt": "x".repeat(40_000)});
    let r = post(&url, key, &big).await;
    expect_error(
        "body too large",
        &r,
        StatusCode::PAYLOAD_TOO_LARGE,
        &["32768"],
    );
    let r = post_raw(&url, key, "{\"model\": \"llama-3-8b\", \"prompt\": ").await;
    let e = expect_error("malformed JSON", &r, StatusCode::BAD_REQUEST, &["JSON"]);
    assert_eq!(e["type"], "invalid_request_error");

    // Field ranges, each naming its field.
    let fields: [(&str, Value, &str, &[&str]); 5] = [
        (
            "temperature",
            json!({"model": MODEL, "prompt": "hi", "temperature": 3}),
            "temperature",
            &["temperature", "must be in [0, 2]", "3"],
        ),
        (
            "top_p",
            json!({"model": MODEL, "prompt": "hi", "top_p": 0}),
            "top_p",
            &["top_p", "(0, 1]"],
        ),
        (
            "max_tokens 0",
            json!({"model": MODEL, "prompt": "hi", "max_tokens": 0}),
            "max_tokens",
            &["max_tokens", "at least 1"],
        ),
        (
            "max_tokens over the ceiling",
            json!({"model": MODEL, "prompt": "hi", "max_tokens": 101}),
            "max_tokens",
            &["101", "basic", "at most 100"],
        ),
        (
            "empty prompt",
            json!({"model": MODEL, "prompt": ""}),
            "prompt",
            &["prompt", "non-empty"],
        ),
    ];
    for (what, body, param, needles) in fields {
        let r = post(&url, key, &body).await;
        let e = expect_error(what, &r, StatusCode::BAD_REQUEST, needles);
        assert_eq!(e["param"], param, "{what}");
    }
    let r = post(&url, key, &json!({"model": MODEL, "prompt": []})).await;
    expect_error(
        "empty prompt array",
        &r,
        StatusCode::BAD_REQUEST,
        &["prompt"],
    );
    let r = post(&chat_url, key, &json!({"model": MODEL, "messages": []})).await;
    let e = expect_error(
        "empty messages",
        &r,
        StatusCode::BAD_REQUEST,
        &["messages", "non-empty"],
    );
    assert_eq!(e["param"], "messages");

    // Models: unknown (404) and not allowed for the tier (403).
    let r = post(&url, key, &json!({"model": "gpt-9", "prompt": "hi"})).await;
    expect_error(
        "unknown model",
        &r,
        StatusCode::NOT_FOUND,
        &["gpt-9", "does not exist"],
    );
    let r = post(&url, key, &json!({"model": "mistral-7b", "prompt": "hi"})).await;
    let e = expect_error(
        "model outside the tier",
        &r,
        StatusCode::FORBIDDEN,
        &["basic", "mistral-7b"],
    );
    assert_eq!(e["type"], "permission_error");

    // A prompt over the model's context names both numbers.
    let long = common::words(2500, 3);
    let long_tokens = tenant_support::prompt_tokens(&long);
    assert!(long_tokens > 2048, "{long_tokens}");
    let r = post(&url, key, &completion(&long, 10)).await;
    expect_error(
        "prompt over max_context",
        &r,
        StatusCode::BAD_REQUEST,
        &[&long_tokens.to_string(), "2048", MODEL],
    );

    // More than the tier's whole tokens_per_minute: a 400 that says so, not a 429 to retry.
    let prompt = common::words(950, 4);
    let need = tenant_support::prompt_tokens(&prompt) + 100;
    assert!((1001..2048).contains(&need), "{need}");
    let r = post(&url, key, &completion(&prompt, 100)).await;
    let e = expect_error(
        "over the whole token budget",
        &r,
        StatusCode::BAD_REQUEST,
        &["can never pass", &need.to_string(), "1000"],
    );
    assert_eq!(e["param"], "max_tokens");
    assert!(
        r.header("retry-after").is_none(),
        "a request that can never pass got Retry-After"
    );

    // None of the above cost anything: the tenant still has its whole budget.
    let r = post(&url, key, &ok).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let reserve = tenant_support::prompt_tokens("hello") + 4;
    assert_eq!(r.header_u64("x-ratelimit-remaining-tokens"), 1000 - reserve);

    gw.expect_metric(
        "infergate_rejections_total{tenant=\"unknown\",reason=\"auth\"}",
        2.0,
        Duration::from_secs(5),
    )
    .await;
    gw.expect_metric(
        "infergate_rejections_total{tenant=\"val\",reason=\"validation\"}",
        13.0,
        Duration::from_secs(5),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrent_is_a_429_until_the_request_in_flight_ends() {
    let engine = Engine::start(&[]).await;
    let gw = start(&engine).await;
    let url = gw.at("/v1/completions");
    let key = key_of("solo");

    // One long stream in flight (1,000 tokens take seconds), its first event read.
    let mut body = completion("tell me everything", 1000);
    body["stream"] = json!(true);
    let mut held = Conn::open(&url).await.expect("connect");
    let res = held
        .send_as(
            Method::POST,
            "/v1/completions",
            Some(Bytes::from(body.to_string())),
            Some(&key),
        )
        .await
        .expect("stream");
    assert_eq!(res.status(), StatusCode::OK);
    let mut stream = res.into_body();
    let first = tokio::time::timeout(
        tenant_support::HTTP_DEADLINE,
        http_body_util::BodyExt::frame(&mut stream),
    )
    .await
    .expect("first event in time");
    assert!(matches!(first, Some(Ok(_))), "{first:?}");

    let r = post(&url, Some(&key), &completion("and again", 4)).await;
    let e = expect_error(
        "second request in flight",
        &r,
        StatusCode::TOO_MANY_REQUESTS,
        &["allows 1 at once"],
    );
    assert_eq!(e["type"], "rate_limit_error");
    assert!(r.header_u64("retry-after") >= 1);

    // The client goes away: its slot comes back without waiting for the 1,000 tokens.
    let left = Instant::now();
    drop(stream);
    drop(held);
    let deadline = left + Duration::from_secs(3);
    loop {
        let r = post(&url, Some(&key), &completion("and again", 4)).await;
        if r.status == StatusCode::OK {
            break;
        }
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
        assert!(
            Instant::now() < deadline,
            "the slot of a client that left was not released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        gw.metric("infergate_rejections_total{tenant=\"solo\",reason=\"rate\"}")
            .await,
        gw.metric("infergate_tenant_requests_total{tenant=\"solo\",outcome=\"rejected\"}")
            .await
    );
}
