//! Warm-up before admission: a worker that joins the pool while it warms up, or comes back
//! warming after a crash under load, gets no traffic from the gateway until its `/ready` says
//! 200 (counted at the worker: served plus refused), while a warm worker serves the load; then
//! it is routed to.

use crate::common;

use std::time::{Duration, Instant};

use common::gateway::{
    FAST_HEALTH, Gateway, TempDir, chat, config_yaml, port_of, routing_yaml, send, worker_of,
};
use common::{Engine, find_metric, get, metric};
use hyper::{Method, StatusCode};

/// Sizes 1..8 of Llama-3-8B model 0.19 s of capture; x15 is about 2.9 s of warm-up.
const WARMING: [&str; 4] = [
    "--cuda-graph-sizes",
    "1,2,4,8",
    "--sim-capture-time-scale",
    "15",
];

/// Generation requests that reached the engine at `url`: served, plus refused while it warmed
/// up (its own counts, whoever sent them).
async fn received(url: &str) -> f64 {
    let text = get(&format!("{url}/metrics")).await.1;
    let served: f64 = text
        .lines()
        .filter(|l| l.starts_with("vllm:request_success_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let refused = find_metric(
        &text,
        "infergate_engine_rejected_total{reason=\"not_ready\"}",
    )
    .unwrap_or(0.0);
    served + refused
}

/// Sends short requests one after another for `during`; returns the worker of each answer.
async fn load(url: &str, during: Duration) -> Vec<String> {
    let body = chat("Be brief.", "Hello there.", 2, false).to_string();
    let mut workers = Vec::new();
    let end = Instant::now() + during;
    while Instant::now() < end {
        let (status, headers, text) = send(Method::POST, url, &[], Some(body.clone()))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK, "{text}");
        workers.push(worker_of(&headers));
    }
    workers
}

/// Sends requests until one is answered by `worker`, within `within`.
async fn until_served_by(url: &str, worker: &str, within: Duration) {
    let end = Instant::now() + within;
    loop {
        if load(url, Duration::from_millis(50))
            .await
            .iter()
            .any(|w| w == worker)
        {
            return;
        }
        assert!(
            Instant::now() < end,
            "{worker} never got traffic once ready"
        );
    }
}

#[tokio::test]
async fn a_warming_worker_gets_no_traffic_until_ready_even_after_a_restart() {
    let warm = Engine::start(&[]).await;
    let mut cold = Engine::start_alive("sim", &WARMING, &[]).await;
    let dir = TempDir::new("warmup");
    // A killed worker's requests eject it; a short ejection keeps the test to seconds.
    let extra = format!("{FAST_HEALTH}outlier: {{base_ejection_time: 500ms}}\n");
    dir.write_config(&config_yaml(&[&warm.url, &cold.url], &extra));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let url = gw.at("/v1/chat/completions");

    // It joined warming: round robin would give it half; it gets none while /ready is 503.
    let workers = load(&url, Duration::from_millis(800)).await;
    assert_eq!(
        get(&cold.at("/ready")).await.0,
        StatusCode::SERVICE_UNAVAILABLE,
        "the load must run inside the warm-up to prove anything"
    );
    assert!(workers.len() >= 5, "{workers:?}");
    assert!(workers.iter().all(|w| *w == warm.url), "{workers:?}");
    assert_eq!(received(&cold.url).await, 0.0);

    common::wait_ok(&cold.at("/ready"), Duration::from_secs(20))
        .await
        .unwrap();
    until_served_by(&url, &cold.url, Duration::from_secs(10)).await;

    // Under load, it crashes and comes back on its port, warming again: nothing until ready.
    let port = port_of(&cold.url);
    let loader = tokio::spawn({
        let url = url.clone();
        async move { load(&url, Duration::from_millis(1500)).await }
    });
    drop(cold);
    cold = Engine::start_on(port, &WARMING).await;
    let workers = loader.await.unwrap();
    assert_eq!(
        get(&cold.at("/ready")).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert!(workers.iter().all(|w| *w == warm.url), "{workers:?}");
    // A restart between two polls (once its ejection has run out) can let one request reach it
    // before the poll sees its 503: it refuses it as not ready, the gateway takes it out at once
    // and retries on the warm worker (every answer above came from the warm one). Never more.
    assert!(received(&cold.url).await <= 1.0);
    common::wait_ok(&cold.at("/ready"), Duration::from_secs(20))
        .await
        .unwrap();
    until_served_by(&url, &cold.url, Duration::from_secs(10)).await;
    assert_eq!(
        metric(&cold.at("/metrics"), "infergate_engine_ready").await,
        1.0
    );
}
