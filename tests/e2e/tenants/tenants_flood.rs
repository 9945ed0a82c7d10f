//! A flood of 10,000 requests against a pool whose admission queue holds 100: the excess is
//! refused with 429 at once, every refusal is counted, and the gateway's memory stays bounded.

use crate::common;
use crate::tenant_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tenant_support::{Gw, HTTP_DEADLINE, POOL, Setup, completion, key_of, post};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use common::Engine;

/// Requests in flight at once (and so client connections open at most).
const CONCURRENCY: usize = 1000;
/// Requests in the flood.
const REQUESTS: usize = 10_000;

/// What one request saw: status, seconds to the whole answer, Retry-After.
type Seen = (StatusCode, f64, Option<u64>);

/// One request on a pooled keep-alive connection.
async fn one(
    client: Client<HttpConnector, Full<Bytes>>,
    url: String,
    key: String,
    body: Bytes,
) -> Seen {
    let req = Request::post(url.as_str())
        .header(CONTENT_TYPE, "application/json")
        .header(AUTHORIZATION, format!("Bearer {key}"))
        .body(Full::new(body))
        .expect("request");
    let started = Instant::now();
    let exchange = async {
        let res = client.request(req).await?;
        let (parts, body) = res.into_parts();
        let bytes = body.collect().await?.to_bytes();
        Ok::<_, tenant_support::BoxError>((parts, bytes))
    };
    let (parts, bytes) = tokio::time::timeout(HTTP_DEADLINE, exchange)
        .await
        .expect("answer within the deadline")
        .expect("exchange");
    let secs = started.elapsed().as_secs_f64();
    if parts.status == StatusCode::TOO_MANY_REQUESTS {
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("admission queue full"), "429 body: {text}");
    }
    let retry_after = parts
        .headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (parts.status, secs, retry_after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_of_ten_thousand_is_refused_fast_with_bounded_memory() {
    let engine = Engine::start(&[]).await;
    let gw = Gw::start(&Setup {
        workers: &[&engine.url],
        admission: Some("{max_in_flight_per_worker: 1, max_queue: 100, max_wait: 60s}"),
        tenants: &[("bulk", "bulk")],
        tiers: "tiers:\n  bulk: {priority: 1}\n",
        ..Setup::default()
    })
    .await;
    let (url, key) = (gw.at("/v1/completions"), key_of("bulk"));
    let body = completion("hi", 1);
    // Warm up (tokenizer tables, connection pools) before the baseline.
    let warm = post(&url, Some(&key), &body).await;
    assert_eq!(warm.status, StatusCode::OK, "{}", warm.text);
    let baseline = gw.rss_kib();

    // Sample the gateway's resident memory while the flood runs.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(baseline));
    let sampler = {
        let (stop, peak, pid) = (stop.clone(), peak.clone(), gw.pid);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    && let Some(kib) = s
                        .lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                {
                    peak.fetch_max(kib, Ordering::Relaxed);
                }
            }
        })
    };

    let body = Bytes::from(body.to_string());
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(CONCURRENCY)
        .build_http::<Full<Bytes>>();
    let permits = Arc::new(Semaphore::new(CONCURRENCY));
    let flood_started = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..REQUESTS {
        let permit = permits.clone().acquire_owned().await.expect("semaphore");
        let request = one(client.clone(), url.clone(), key.clone(), body.clone());
        set.spawn(async move {
            let seen = request.await;
            drop(permit);
            seen
        });
    }
    let seen: Vec<_> = set.join_all().await;
    let flood_secs = flood_started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    sampler.await.expect("sampler");
    let peak = peak.load(Ordering::Relaxed);

    assert_eq!(seen.len(), REQUESTS);
    let refused: Vec<_> = seen
        .iter()
        .filter(|(s, _, _)| *s == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    let ok = seen.iter().filter(|(s, _, _)| *s == StatusCode::OK).count();
    assert_eq!(
        ok + refused.len(),
        seen.len(),
        "only 200 and 429 expected: {:?}",
        seen.iter()
            .find(|(s, _, _)| !matches!(s.as_u16(), 200 | 429))
    );
    // 101 fit (one slot, 100 queued) plus what the worker finished while the flood lasted.
    assert!(
        refused.len() >= seen.len() / 2,
        "only {} of {} refused",
        refused.len(),
        seen.len()
    );
    // Refusals are answered at once, not after a wait in the queue (which lasts up to 60 s);
    // the time includes the client's own wait behind its other 999 requests in flight.
    let mut secs: Vec<f64> = refused.iter().map(|(_, s, _)| *s).collect();
    secs.sort_by(f64::total_cmp);
    let p99 = secs[secs.len() * 99 / 100];
    let max = secs[secs.len() - 1];
    assert!(max < 1.0, "429 answered in p99 {p99:.3} s, max {max:.3} s");
    // Retry-After comes from the completion rate and the position: a whole number ≥ 1.
    assert!(
        refused.iter().all(|(_, _, r)| matches!(r, Some(1..=60))),
        "Retry-After missing or out of range"
    );
    let grown_mib = peak.saturating_sub(baseline) as f64 / 1024.0;
    assert!(
        grown_mib < 100.0,
        "gateway RSS grew by {grown_mib:.1} MiB ({baseline} → {peak} KiB)"
    );

    gw.expect_metric(
        "infergate_rejections_total{tenant=\"bulk\",reason=\"queue_full\"}",
        refused.len() as f64,
        Duration::from_secs(5),
    )
    .await;
    gw.expect_metric(
        "infergate_tenant_requests_total{tenant=\"bulk\",outcome=\"ok\"}",
        (ok + 1) as f64,
        Duration::from_secs(5),
    )
    .await;
    let depth = format!("infergate_queue_depth{{pool=\"{POOL}\"}}");
    gw.expect_metric(&depth, 0.0, Duration::from_secs(5)).await;
    eprintln!(
        "flood: {flood_secs:.1} s, {ok} served, {} refused (p99 {p99:.3} s, max {max:.3} s), RSS {baseline} → {peak} KiB",
        refused.len()
    );
}
