//! Issue 48's canary scenario, live: `infergate up` on a copy of
//! `config/scenarios/quality-canary/` (listeners on free ports, the analysis window shortened
//! from 10 s to 6 s), real sim engines on both versions, the canary's on an H200 (faster) with
//! `--fault-repeat-rate 0.05`. Steady closed-loop traffic with a fresh session per request; the
//! first window with `min_samples` scored answers per version rolls the canary back with a
//! reason naming `repetition`. The same traffic with the fault flag removed promotes the canary.
//!
//! Why the first judged window decides: the engine's fault draw is deterministic in the request
//! number and seed (0 here), and every run of 250 consecutive canary requests holds at least 6
//! loops, which the 1% one-sided z-test always sees against a stable that never loops (z ≈
//! sqrt(6) > 2.326); the scenario asks for 300 per version. About 12 s a test.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common;
use common::gateway::{Gateway, MODEL, TempDir, eventually};

/// The scenario's directory in the repository.
const SCENARIO: &str = "config/scenarios/quality-canary";
/// Concurrent clients: enough for several hundred answers per version in a window.
const CLIENTS: usize = 24;
/// Completion tokens per request: a loop of the fault's six-word phrase over 20 words is
/// unmistakable (most 4-grams repeat), and short answers keep the windows full.
const TOKENS: u64 = 20;
/// Many distinct words: the sim engine answers with words of the prompt in random order, so a
/// healthy answer repeats no 4-gram.
const PROMPT: &str = "Summarise briefly: rivers carry stones, sand and silt from mountains \
    through forests, valleys, towns and farmland toward wide estuaries where tides, storms, \
    herons, fishermen and ferries meet the restless grey ocean every single morning.";

/// Starts `up` on a copy of the scenario: window shortened, and without the canary's fault flag
/// when `healthy`.
async fn serve(healthy: bool) -> (Gateway, TempDir) {
    let root = std::path::Path::new(common::REPO).join(SCENARIO);
    let read = |name: &str| {
        std::fs::read_to_string(root.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let mut config = read("infergate.yaml");
    let fault = ", \"--fault-repeat-rate\", \"0.05\"";
    assert!(
        config.contains(fault),
        "the scenario's canary has its fault"
    );
    if healthy {
        config = config.replace(fault, "");
    }
    let routing = read("policies/routing.yaml");
    let window = "window: 10s";
    assert!(routing.contains(window), "the scenario's window");
    let dir = TempDir::new("quality-canary");
    dir.write_config(&config);
    // 6 s, not less: a window decides once each version has `min_samples` requests, and quality
    // is judged only if each also has that many scored answers, which trail the answers by the
    // few still being scored. A 4 s window on a loaded 2-core CI machine closed with 302 stable
    // requests and 299 scored, and promoted the canary unjudged.
    //
    // The latency ratios are raised out of reach: this scenario is about quality, and a p99
    // over ~300 values per version on a 2-core machine shared with other tests moved past 1.5×
    // between two equal engines' versions in a fresh-clone CI run (275.7 against 181.4 ms).
    // The latency checks themselves are unit-tested (`canary::analysis_tests`, `judge`).
    let mut routing = routing.replace(window, "window: 6s");
    for ratio in ["max_ttft_p99_ratio: 1.5", "max_itl_p99_ratio: 1.5"] {
        assert!(routing.contains(ratio), "the scenario's {ratio}");
        routing = routing.replace(ratio, &ratio.replace("1.5", "1000"));
    }
    dir.write_routing(&routing);
    let cache = dir.path.join("cache").to_string_lossy().into_owned();
    let gw = Gateway::up_with(
        Some(&dir.config()),
        &[("INFERGATE_CACHE_DIR", cache.as_str())],
    )
    .await;
    (gw, dir)
}

/// Closed-loop clients on kept-alive connections, each request a fresh session; every answer
/// must be 200. Stopped (and checked) by [`Load::stop`].
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<u64>>,
}

impl Load {
    fn start(gw: &Gateway) -> Load {
        let key = gw.api_key.clone().expect("up prints a demo key");
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicU64::new(0));
        let body = Bytes::from(
            json!({
                "model": MODEL,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": TOKENS,
            })
            .to_string(),
        );
        let tasks = (0..CLIENTS)
            .map(|_| {
                let (url, key, body) = (gw.url.clone(), key.clone(), body.clone());
                let (stop, next) = (stop.clone(), next.clone());
                tokio::spawn(async move {
                    let mut conn = common::Conn::open(&url).await.expect("connect");
                    let auth = format!("Bearer {key}");
                    let mut answered = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let session = format!("s-{}", next.fetch_add(1, Ordering::Relaxed));
                        let headers =
                            [("authorization", auth.as_str()), ("x-session-id", &session)];
                        let reply = conn
                            .send_with(
                                Method::POST,
                                "/v1/chat/completions",
                                &headers,
                                Some(body.clone()),
                            )
                            .await
                            .expect("the gateway answers");
                        let status = reply.status();
                        let text = reply.into_body().collect().await.expect("body").to_bytes();
                        assert_eq!(status, StatusCode::OK, "{text:?}");
                        answered += 1;
                    }
                    answered
                })
            })
            .collect();
        Load { stop, tasks }
    }

    /// Stops the clients; the requests answered.
    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = 0;
        for t in self.tasks {
            total += t.await.expect("a client failed");
        }
        total
    }
}

/// `GET /admin/canary`'s entry of the scenario's model.
async fn state(gw: &Gateway) -> Value {
    gw.admin_json("/admin/canary").await["models"][MODEL].clone()
}

/// Drives the load until the first decision other than a hold for too little data; returns that
/// decision's state and how long it took.
async fn first_verdict(gw: &Gateway) -> (Value, Duration) {
    let started = Instant::now();
    let load = Load::start(gw);
    let verdict = eventually("a judged window", Duration::from_secs(30), || async {
        let s = state(gw).await;
        let d = &s["last_decision"];
        let waiting = d.is_null()
            || (d["decision"] == "hold"
                && d["reason"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("too little data")));
        (!waiting).then_some(s)
    })
    .await;
    let took = started.elapsed();
    assert!(load.stop().await > 0);
    (verdict, took)
}

#[tokio::test]
async fn a_faster_canary_that_loops_in_5_percent_of_answers_is_rolled_back_for_repetition() {
    let _machine = common::machine::whole_machine().await;
    let (gw, _dir) = serve(false).await;
    let (s, took) = first_verdict(&gw).await;
    let d = &s["last_decision"];
    assert_eq!(d["decision"], "rollback", "{s}");
    let reason = d["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("repetition rate ") && reason.contains("% on canary vs 0.00% on stable"),
        "{reason}"
    );
    assert!(reason.contains("one-sided two-proportion z ="), "{reason}");
    assert_eq!(s["weights"], json!([["stable", 100], ["canary", 0]]), "{s}");
    // Nothing else: the canary is as error-free as stable (latency is not judged here, see
    // `serve`).
    assert!(
        !reason.contains("error rate") && !reason.contains("p99"),
        "{reason}"
    );
    let metrics = gw.metrics().await;
    let promotes =
        format!("infergate_canary_decisions_total{{model=\"{MODEL}\",decision=\"promote\"}}");
    assert_eq!(common::find_metric(&metrics, &promotes).unwrap_or(0.0), 0.0);
    let loops = |version: &str| {
        common::find_metric(
            &metrics,
            &format!(
                "infergate_quality_signal_total{{tenant=\"demo\",model=\"{MODEL}\",version=\"{version}\",signal=\"repetition\"}}"
            ),
        )
    };
    assert!(loops("canary").is_some_and(|n| n >= 6.0), "{metrics}");
    assert_eq!(loops("stable"), None, "stable's answers never loop");
    eprintln!("rolled back {took:?} after the load started: {reason}");
}

#[tokio::test]
async fn the_same_canary_without_the_fault_is_promoted() {
    let _machine = common::machine::whole_machine().await;
    let (gw, _dir) = serve(true).await;
    let (s, took) = first_verdict(&gw).await;
    let d = &s["last_decision"];
    assert_eq!(d["decision"], "promote", "{s}");
    assert_eq!(
        (d["from"].as_u64(), d["to"].as_u64()),
        (Some(50), Some(100)),
        "{s}"
    );
    assert_eq!(s["weights"], json!([["stable", 0], ["canary", 100]]), "{s}");
    let reason = d["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("quality over"),
        "quality was compared: {reason}"
    );
    eprintln!("promoted {took:?} after the load started: {reason}");
}
