//! Deadlines: a tier with `min_deadline` lets its requests name a TTFT deadline
//! (`x-infergate-deadline-ms`). With the only slot held, a request whose deadline the queue's
//! predicted wait already passes gets its 429 at once (not after waiting in vain), with a
//! Retry-After that, honoured, ends in a 200; a request whose deadline the wait fits in is
//! served; a tier without `min_deadline` answers 400 to the header.

use crate::common;
use crate::tenant_support;

use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use tenant_support::{Gw, Setup, completion, key_of, post};

use common::Engine;

/// POSTs `body` as `tenant` with `x-infergate-deadline-ms: ms`: status, Retry-After, body.
async fn with_deadline(
    url: &str,
    tenant: &str,
    ms: u64,
    body: &serde_json::Value,
) -> (StatusCode, Option<u64>, String) {
    let auth = format!("Bearer {}", key_of(tenant));
    let ms = ms.to_string();
    let headers = [
        ("authorization", auth.as_str()),
        ("x-infergate-deadline-ms", ms.as_str()),
    ];
    let (status, headers, text) =
        common::http::send(Method::POST, url, &headers, Some(body.to_string()))
            .await
            .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let retry = headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (status, retry, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_the_queue_cannot_meet_is_refused_at_once_and_retry_after_is_honest() {
    // An L4 decodes llama-3-8b at ~70 ms a token: the occupier holds the only slot for ~3 s.
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let gw = Gw::start(&Setup {
        workers: &[&engine.url],
        admission: Some("{max_in_flight_per_worker: 1, max_queue: 50, max_wait: 60s}"),
        tenants: &[("rt", "realtime"), ("batch", "plain")],
        tiers: "tiers:\n  realtime: {priority: 1, min_deadline: 100ms}\n  plain: {priority: 1}\n",
        ..Setup::default()
    })
    .await;
    let url = gw.at("/v1/completions");
    let short = completion("a short question", 2);

    // A tier without min_deadline: the header is an error, not silently dropped.
    let (status, _, text) = with_deadline(&url, "batch", 500, &short).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("takes no deadlines"), "{text}");

    let occupier = {
        let url = url.clone();
        tokio::spawn(
            async move { post(&url, Some(&key_of("batch")), &completion("hold", 40)).await },
        )
    };
    engine
        .wait_metric("vllm:num_requests_running", Duration::from_secs(10), |v| {
            v == 1.0
        })
        .await;

    // The predicted wait (one request's hold, a second before any has been measured) is past
    // 100 ms: refused at once, well before the slot frees.
    let t0 = Instant::now();
    let (status, retry, text) = with_deadline(&url, "rt", 100, &short).await;
    let took = t0.elapsed();
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
    assert!(text.contains("deadline"), "{text}");
    assert!(took < Duration::from_secs(1), "refused after {took:?}");
    assert!(!occupier.is_finished(), "the slot freed before the refusal");
    let mut retry = retry.expect("a 429 names its Retry-After");
    assert!((1..=60).contains(&retry), "Retry-After {retry}");

    // Honoured, the Retry-After ends in a 200 (within the occupier's few seconds).
    let mut answered = false;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(retry)).await;
        let (status, next, text) = with_deadline(&url, "rt", 100, &short).await;
        if status == StatusCode::OK {
            answered = true;
            break;
        }
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
        retry = next.expect("a 429 names its Retry-After");
    }
    assert!(answered, "ten honoured Retry-Afters and still refused");
    assert_eq!(occupier.await.unwrap().status, StatusCode::OK);

    // A deadline the wait fits in: queued behind a new occupier, then served.
    let occupier = {
        let url = url.clone();
        tokio::spawn(
            async move { post(&url, Some(&key_of("batch")), &completion("hold", 10)).await },
        )
    };
    engine
        .wait_metric("vllm:num_requests_running", Duration::from_secs(10), |v| {
            v == 1.0
        })
        .await;
    let (status, _, text) = with_deadline(&url, "rt", 30_000, &short).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(occupier.await.unwrap().status, StatusCode::OK);
    let refused = gw
        .metric("infergate_rejections_total{tenant=\"rt\",reason=\"deadline\"}")
        .await;
    assert!(refused >= 1.0, "deadline refusals counted: {refused}");
}
