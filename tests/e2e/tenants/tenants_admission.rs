//! Admission under contention: a pool with one slow worker and one request in flight at a time
//! serves a high-priority tier's queued requests before a low tier's that arrived earlier.

use crate::common;
use crate::tenant_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::StatusCode;
use tenant_support::{Gw, POOL, Setup, completion, key_of, post};
use tokio::task::JoinSet;

use common::Engine;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_priority_queued_requests_overtake_earlier_low_priority_ones() {
    // An L4 decodes llama-3-8b at ~70 ms a token: the first request holds the only slot for
    // seconds while the others queue behind it.
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let tiers = "tiers:\n  low: {priority: 1}\n  high: {priority: 10}\n";
    let gw = Gw::start(&Setup {
        workers: &[&engine.url],
        admission: Some("{max_in_flight_per_worker: 1, max_queue: 50, max_wait: 60s}"),
        tenants: &[("lo", "low"), ("hi", "high")],
        tiers,
        ..Setup::default()
    })
    .await;
    let url = gw.at("/v1/completions");
    let depth = format!("infergate_queue_depth{{pool=\"{POOL}\"}}");
    let finished: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut tasks = JoinSet::new();
    let mut send = |name: String, tenant: &str, max_tokens: u64| {
        let (url, key, finished) = (url.clone(), key_of(tenant), finished.clone());
        let body = completion(&format!("request {name}"), max_tokens);
        tasks.spawn(async move {
            let reply = post(&url, Some(&key), &body).await;
            assert_eq!(reply.status, StatusCode::OK, "{name}: {}", reply.text);
            finished.lock().unwrap().push(name);
        });
    };

    // Occupy the only slot for ~3 s.
    send("occupier".into(), "lo", 40);
    engine
        .wait_metric("vllm:num_requests_running", Duration::from_secs(10), |v| {
            v == 1.0
        })
        .await;
    // Three low-tier requests queue first, then three high-tier ones, one at a time so that
    // their arrival order is known.
    let queued = [("low", "lo"), ("high", "hi")];
    let mut n = 0.0;
    for (label, tenant) in queued {
        for i in 1..=3 {
            send(format!("{label}-{i}"), tenant, 2);
            n += 1.0;
            gw.expect_metric(&depth, n, Duration::from_secs(10)).await;
        }
    }
    assert!(
        finished.lock().unwrap().is_empty(),
        "the occupier finished before all six were queued: the test cannot tell priority apart"
    );

    tasks.join_all().await;
    let order = finished.lock().unwrap().clone();
    assert_eq!(
        order,
        [
            "occupier", "high-1", "high-2", "high-3", "low-1", "low-2", "low-3"
        ],
        "completion order"
    );
    let waits = format!("infergate_queue_wait_seconds_count{{pool=\"{POOL}\"}}");
    gw.expect_metric(&waits, 7.0, Duration::from_secs(5)).await;
    gw.expect_metric(&depth, 0.0, Duration::from_secs(5)).await;
    // Each queued request waited at least for the occupier's remaining decode.
    let waited = gw
        .metric(&format!(
            "infergate_queue_wait_seconds_sum{{pool=\"{POOL}\"}}"
        ))
        .await;
    assert!(waited > 6.0 * 0.5, "total queue wait {waited} s");
}
