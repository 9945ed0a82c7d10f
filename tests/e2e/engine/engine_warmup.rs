//! Warm-up before readiness: an engine with capture sizes is alive (`/health` 200) at once, but
//! `/ready` answers 503 and generation is refused until the sim backend has charged each size's
//! modelled capture time; then it is ready, and the metrics say what each size cost.

use crate::common;

use std::time::{Duration, Instant};

use common::{Engine, get, metric, post_json};
use hyper::StatusCode;
use serde_json::json;

/// Sizes 1, 2, 4, 8 of Llama-3-8B model 0.19 s of capture; x10 is about 1.9 s.
const ARGS: [&str; 4] = [
    "--cuda-graph-sizes",
    "1,2,4,8",
    "--sim-capture-time-scale",
    "10",
];

#[tokio::test]
async fn an_engine_is_alive_but_not_ready_until_its_capture_sizes_are_warm() {
    let started = Instant::now();
    let engine = Engine::start_alive("sim", &ARGS, &[]).await;
    assert_eq!(get(&engine.at("/health")).await.0, StatusCode::OK);
    let (status, body) = get(&engine.at("/ready")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("warming up"), "{body}");
    let (status, _, answer) = post_json(
        &engine.at("/v1/completions"),
        &json!({"model": "llama-3-8b", "prompt": "hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(
        metric(&engine.at("/metrics"), "infergate_engine_ready").await,
        0.0
    );

    common::wait_ok(&engine.at("/ready"), Duration::from_secs(20))
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(1800));
    let m = engine.at("/metrics");
    assert_eq!(metric(&m, "infergate_engine_ready").await, 1.0);
    let total = metric(&m, "infergate_engine_warmup_seconds").await;
    assert!((1.85..10.0).contains(&total), "{total}");
    // 32 layers x (1.5 ms + 0.75 us) x 10 for size 1; 2 MiB + 8 x 56 KiB for size 8.
    let one = metric(&m, "infergate_engine_capture_seconds{size=\"1\"}").await;
    assert!(one >= 0.48, "{one}");
    let bytes = metric(&m, "infergate_engine_capture_bytes{size=\"8\"}").await;
    assert_eq!(bytes, f64::from((2 << 20) + 8 * 2 * 14336 * 2));
    let (status, _, answer) = post_json(
        &engine.at("/v1/completions"),
        &json!({"model": "llama-3-8b", "prompt": "hi", "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

#[tokio::test]
async fn an_eager_engine_is_ready_at_once() {
    let engine = Engine::start_alive("sim", &["--enforce-eager"], &[]).await;
    assert_eq!(get(&engine.at("/ready")).await.0, StatusCode::OK);
    assert_eq!(
        metric(&engine.at("/metrics"), "infergate_engine_warmup_seconds").await,
        0.0
    );
}
