//! What the gateway reads from a worker for itself (its `/metrics` polls and `/kv/events`) is
//! bounded and checked: nonsense numbers make a poll invalid and eject the worker, a huge scrape
//! is cut off, a hung one delays no other worker's polls, an endless event line is dropped and
//! its stream reopened with backoff, and the prefix index stays within its configured size
//! whatever KV capacity a worker claims. Each case keeps a healthy engine serving beside it.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::{Method, StatusCode};

use crate::common::Engine;
use crate::common::gateway::{
    Gateway, MODEL, POOL, TempDir, chat, config_yaml, eventually, routing_yaml, send, worker_of,
};
use crate::common::rogue::{Rogue, RogueRequest, Step, answer, chat_completion, json_answer};

/// Polls every 100 ms; two failed polls eject.
const HEALTH: &str = "health: {poll_interval: 100ms, timeout: 1s, eject_after: 2, readmit_after: 2";

/// A pool of `engine` and `rogues` routed by `policy` (with `params`), health [`HEALTH`] plus
/// `health_extra` (`, key: value` pairs).
async fn gateway(
    tag: &str,
    engine: &Engine,
    rogues: &[&Rogue],
    (policy, params): (&str, &[&str]),
    health_extra: &str,
) -> (TempDir, Gateway) {
    let mut urls = vec![engine.url.as_str()];
    urls.extend(rogues.iter().map(|r| r.url.as_str()));
    let dir = TempDir::new(tag);
    dir.write_config(&config_yaml(&urls, &format!("{HEALTH}{health_extra}}}\n")));
    dir.write_routing(&routing_yaml(policy, params));
    let gw = Gateway::start(&dir.config(), &[]).await;
    (dir, gw)
}

/// Sends `n` chats (each its own prompt) and asserts every one got 200 from `engine`.
async fn all_served_by(gw: &Gateway, engine: &Engine, n: usize) {
    for i in 0..n {
        let body = chat(
            &format!("You are assistant number {i}."),
            "Say hi.",
            2,
            false,
        );
        let (status, headers, text) = send(
            Method::POST,
            &gw.at("/v1/chat/completions"),
            &[],
            Some(body.to_string()),
        )
        .await
        .expect("the gateway answers");
        assert_eq!(status, StatusCode::OK, "request {i}: {text}");
        assert_eq!(worker_of(&headers), engine.url, "request {i}");
    }
}

/// A rogue's answer to anything but `/metrics`: no KV events (404), and a plain good chat
/// completion for anything else.
fn chat_ok(req: &RogueRequest) -> Vec<Step> {
    if req.path.starts_with("/kv/events") {
        return answer(404, "text/plain", "no events");
    }
    json_answer(&chat_completion(
        MODEL,
        "hi",
        serde_json::json!({"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}),
    ))
}

/// vLLM gauges of a worker too busy for routing to pick (valid numbers).
const BUSY_VLLM_METRICS: &str =
    "vllm:num_requests_running 500\nvllm:num_requests_waiting 500\nvllm:kv_cache_usage_perc 0.5\n";

fn failures(reason: &str) -> String {
    format!("infergate_worker_poll_failures_total{{pool=\"{POOL}\",reason=\"{reason}\"}}")
}

#[tokio::test]
async fn nonsense_queue_metrics_are_rejected_and_eject_the_worker_in_a_prefix_pool() {
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let mut rogues = Vec::new();
    for bad in [
        "vllm:num_requests_waiting NaN\nvllm:num_requests_running 0\n",
        "vllm:num_requests_waiting 0\nvllm:num_requests_running 1e308\n",
        "vllm:num_requests_waiting -Inf\nvllm:num_requests_running 0\n",
        "vllm:num_requests_waiting 0\nvllm:num_requests_running -3\n",
    ] {
        rogues.push(
            Rogue::start(move |req: &RogueRequest| {
                if req.path.starts_with("/metrics") {
                    answer(200, "text/plain", bad)
                } else {
                    chat_ok(req)
                }
            })
            .await,
        );
    }
    let refs: Vec<&Rogue> = rogues.iter().collect();
    let (_dir, gw) = gateway("polls-nonsense", &engine, &refs, ("prefix", &[]), "").await;
    for r in &rogues {
        gw.wait_health(&r.url, false, Duration::from_secs(5)).await;
    }
    // Each rogue failed at least the two polls that ejected it, every one as invalid_value.
    let invalid = gw.metric(&failures("invalid_value")).await;
    assert!(invalid >= 8.0, "{invalid} invalid polls");
    let ejections = gw
        .metric(&format!(
            "infergate_worker_ejections_total{{pool=\"{POOL}\"}}"
        ))
        .await;
    assert!(ejections >= 4.0, "{ejections} ejections");
    // The pool still routes (the measured failure was 503 "no healthy worker in pool").
    all_served_by(&gw, &engine, 30).await;
    gw.wait_health(&engine.url, true, Duration::from_secs(1))
        .await;
}

#[tokio::test]
async fn a_50_mb_scrape_is_cut_off_and_counted_too_large() {
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let huge = Bytes::from(vec![b'#'; 50 << 20]);
    // Good scrapes until the gateway's memory at rest is measured, then 50 MB ones.
    let bad = Arc::new(AtomicBool::new(false));
    // One declares its length, one streams until it closes (no length to refuse up front).
    let declared = {
        let (huge, bad) = (huge.clone(), bad.clone());
        Rogue::start(move |req: &RogueRequest| {
            if !req.path.starts_with("/metrics") {
                chat_ok(req)
            } else if bad.load(Ordering::Relaxed) {
                answer(200, "text/plain", huge.clone())
            } else {
                answer(200, "text/plain", BUSY_VLLM_METRICS)
            }
        })
        .await
    };
    let undeclared = {
        let bad = bad.clone();
        Rogue::start(move |req: &RogueRequest| {
            if !req.path.starts_with("/metrics") {
                chat_ok(req)
            } else if bad.load(Ordering::Relaxed) {
                vec![
                    Step::Send(Bytes::from_static(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n",
                    )),
                    Step::Send(huge.clone()),
                    Step::Close,
                ]
            } else {
                answer(200, "text/plain", BUSY_VLLM_METRICS)
            }
        })
        .await
    };
    let (_dir, gw) = gateway(
        "polls-huge",
        &engine,
        &[&declared, &undeclared],
        ("prefix", &[]),
        ", max_scrape_bytes: 1048576",
    )
    .await;
    eventually("a few good polls", Duration::from_secs(5), || async {
        (declared.metrics_polls() >= 3 && undeclared.metrics_polls() >= 3).then_some(())
    })
    .await;
    // Warmed by as many requests as are sent below, so their own memory is in the baseline.
    all_served_by(&gw, &engine, 30).await;
    let before = gw.rss_kib();
    bad.store(true, Ordering::Relaxed);
    let peak = Cell::new(before);
    eventually(
        "many oversized scrapes refused",
        Duration::from_secs(10),
        || async {
            peak.set(peak.get().max(gw.rss_kib()));
            (gw.metric(&failures("too_large")).await >= 10.0).then_some(())
        },
    )
    .await;
    gw.wait_health(&declared.url, false, Duration::from_secs(5))
        .await;
    gw.wait_health(&undeclared.url, false, Duration::from_secs(5))
        .await;
    all_served_by(&gw, &engine, 30).await;
    let peak = peak.get().max(gw.rss_kib());
    // Unbounded, each 50 MB scrape was buffered whole and copied into a string (+193 MiB
    // measured): one such scrape alone is over 100 MiB. Bounded at 1 MiB, what remains is
    // allocator and connection slack (up to 42 MiB seen with the other trust tests beside it).
    let growth_mib = peak.saturating_sub(before) / 1024;
    assert!(growth_mib < 64, "gateway RSS grew {growth_mib} MiB");
}

#[tokio::test]
async fn a_hung_metrics_endpoint_delays_no_other_workers_polls() {
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let hung = Rogue::start(|req: &RogueRequest| {
        if req.path.starts_with("/metrics") {
            vec![Step::Hang]
        } else {
            chat_ok(req)
        }
    })
    .await;
    // A second rogue that answers its polls at once (too busy to be routed to).
    let prompt = Rogue::start(|req: &RogueRequest| {
        if req.path.starts_with("/metrics") {
            answer(200, "text/plain", BUSY_VLLM_METRICS)
        } else {
            chat_ok(req)
        }
    })
    .await;
    let (_dir, gw) = gateway(
        "polls-hung",
        &engine,
        &[&hung, &prompt],
        ("least_load", &[]),
        "",
    )
    .await;
    // Its polls time out (1 s each) until it is ejected; it hangs on every poll after that too.
    gw.wait_health(&hung.url, false, Duration::from_secs(5))
        .await;
    let start = prompt.metrics_polls();
    let t0 = Instant::now();
    all_served_by(&gw, &engine, 30).await;
    eventually("two seconds of polls", Duration::from_secs(10), || async {
        (t0.elapsed() >= Duration::from_secs(2)).then_some(())
    })
    .await;
    let polls = prompt.metrics_polls() - start;
    let secs = t0.elapsed().as_secs_f64();
    // Every 100 ms on its own schedule: ~20 in 2 s. Waiting on the hung scrape's 1 s timeout
    // each round, it got at most 2.
    assert!(
        polls as f64 >= 8.0 * secs / 2.0,
        "{polls} polls in {secs:.1} s"
    );
    let timeouts = gw.metric(&failures("timeout")).await;
    assert!(timeouts >= 2.0, "{timeouts} timed-out polls");
    let per_worker = gw
        .metric(&format!(
            "infergate_worker_polls_total{{pool=\"{POOL}\",worker=\"{}\"}}",
            prompt.url
        ))
        .await;
    assert!(per_worker >= polls as f64, "{per_worker} polls counted");
}

/// An NDJSON stream head for `/kv/events`.
fn ndjson_head() -> Step {
    Step::Send(Bytes::from_static(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\nconnection: close\r\n\r\n",
    ))
}

#[tokio::test]
async fn an_endless_kv_event_line_is_dropped_and_reopened_with_backoff() {
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let opens = Arc::new(AtomicU64::new(0));
    let chunk = Bytes::from(vec![b'a'; 64 << 10]);
    let counted = opens.clone();
    let rogue = Rogue::start(move |req: &RogueRequest| {
        if req.path.starts_with("/metrics") {
            answer(200, "text/plain", BUSY_VLLM_METRICS)
        } else if req.path.starts_with("/kv/events") {
            counted.fetch_add(1, Ordering::Relaxed);
            // 2 MiB of one line, then silence: past the 1 MiB cap long before the silence
            // timeout.
            let mut steps = vec![ndjson_head()];
            steps.extend((0..32).map(|_| Step::Send(chunk.clone())));
            steps.push(Step::Hang);
            steps
        } else {
            chat_ok(req)
        }
    })
    .await;
    let (_dir, gw) = gateway(
        "polls-kv-line",
        &engine,
        &[&rogue],
        ("prefix", &[]),
        ", max_kv_event_line_bytes: 1048576, kv_events_max_backoff: 2s",
    )
    .await;
    let before = gw.rss_kib();
    // Reopened after 100 ms, 200, 400, 800...: four opens within about two seconds.
    eventually("the stream reopened", Duration::from_secs(10), || async {
        (opens.load(Ordering::Relaxed) >= 4).then_some(())
    })
    .await;
    let start = opens.load(Ordering::Relaxed);
    let t0 = Instant::now();
    all_served_by(&gw, &engine, 30).await;
    let peak = Cell::new(gw.rss_kib());
    eventually(
        "three seconds of reopening",
        Duration::from_secs(10),
        || async {
            peak.set(peak.get().max(gw.rss_kib()));
            (t0.elapsed() >= Duration::from_secs(3)).then_some(())
        },
    )
    .await;
    let reopened = opens.load(Ordering::Relaxed) - start;
    let secs = t0.elapsed().as_secs_f64();
    // Backing off from 800 ms to the 2 s ceiling: about one open per 2 s of the window.
    // Reopened at every 100 ms poll (or at once) it was 30 to 400.
    let most = (secs / 2.0).ceil() as u64 + 2;
    assert!(reopened <= most, "{reopened} opens in {secs:.1} s");
    let growth_mib = peak.get().saturating_sub(before) / 1024;
    assert!(growth_mib < 40, "gateway RSS grew {growth_mib} MiB");
    let live = gw
        .metric(&format!(
            "infergate_routing_kv_events_live{{pool=\"{POOL}\",worker=\"{}\"}}",
            rogue.url
        ))
        .await;
    assert_eq!(live, 0.0, "a stream that never sent a line is not live");
}

#[tokio::test]
async fn the_prefix_index_stays_within_its_cap_whatever_capacity_a_worker_claims() {
    const CAP: usize = 5_000;
    let engine = Engine::start(&["--gpu", "l4"]).await;
    // 62.5M blocks of 16: a claim of 1e9 tokens (believable, so the polls are good), which would
    // let the index keep all 80k keys the worker streams.
    let metrics = format!(
        "{IDLE}vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"62500000\"}} 1\n",
        IDLE = crate::common::rogue::IDLE_VLLM_METRICS
    );
    let line = |kind: &str, keys: std::ops::Range<u64>| {
        let keys: Vec<String> = keys.map(|k| format!("\"{k:016x}\"")).collect();
        Bytes::from(format!(
            "{{\"type\":\"{kind}\",\"keys\":[{}]}}\n",
            keys.join(",")
        ))
    };
    let mut events = vec![ndjson_head(), Step::Send(line("snapshot", 1..30_001))];
    for batch in 0..5u64 {
        let from = 30_001 + batch * 10_000;
        events.push(Step::Send(line("stored", from..from + 10_000)));
    }
    events.push(Step::Hang);
    // The claim reaches the index with the first request routed to the worker: the events
    // start after that (503 until then, so the gateway keeps reopening with backoff).
    let routed = Arc::new(AtomicBool::new(false));
    let seen = routed.clone();
    let rogue = Rogue::start(move |req: &RogueRequest| {
        if req.path.starts_with("/metrics") {
            answer(200, "text/plain", metrics.clone())
        } else if req.path.starts_with("/kv/events") {
            if seen.load(Ordering::Relaxed) {
                events.clone()
            } else {
                answer(503, "text/plain", "not yet")
            }
        } else {
            seen.store(true, Ordering::Relaxed);
            chat_ok(req)
        }
    })
    .await;
    let cap_param = format!("max_index_blocks_per_worker: {CAP}");
    let (_dir, gw) = gateway(
        "polls-index-cap",
        &engine,
        &[&rogue],
        ("prefix", &[cap_param.as_str()]),
        ", kv_events_max_backoff: 500ms",
    )
    .await;
    // Distinct prompts spread over both workers by their hash.
    let mut by_engine = 0;
    for i in 0..40 {
        let body = chat(&format!("You are helper {i}."), "Say hi.", 2, false);
        let (status, headers, text) = send(
            Method::POST,
            &gw.at("/v1/chat/completions"),
            &[],
            Some(body.to_string()),
        )
        .await
        .expect("the gateway answers");
        assert_eq!(status, StatusCode::OK, "request {i}: {text}");
        if worker_of(&headers) == engine.url {
            by_engine += 1;
        }
    }
    assert!(
        routed.load(Ordering::Relaxed),
        "no request reached the rogue"
    );
    assert!(by_engine > 0, "the engine served none of 40 requests");
    let gauge = |name: &str| format!("{name}{{pool=\"{POOL}\",worker=\"{}\"}}", rogue.url);
    gw.wait_metric(&gauge("infergate_routing_kv_events_live"), |v| v == 1.0)
        .await;
    // Every key arrived; the index kept the newest CAP of them, and never more.
    let blocks = gw
        .settle_metric(
            &gauge("infergate_routing_index_blocks"),
            Duration::from_secs(5),
            |v| v == CAP as f64,
        )
        .await;
    assert_eq!(blocks, CAP as f64);
    all_served_by_any(&gw, 10).await;
    for _ in 0..5 {
        let blocks = gw.metric(&gauge("infergate_routing_index_blocks")).await;
        assert!(blocks <= CAP as f64, "{blocks} blocks indexed");
    }
    gw.wait_health(&rogue.url, true, Duration::from_secs(1))
        .await;
    gw.wait_health(&engine.url, true, Duration::from_secs(1))
        .await;
}

/// Sends `n` chats and asserts every one got 200 (from any worker).
async fn all_served_by_any(gw: &Gateway, n: usize) {
    for i in 0..n {
        let body = chat(&format!("You are reviewer {i}."), "Say hi.", 2, false);
        let (status, _, text) = send(
            Method::POST,
            &gw.at("/v1/chat/completions"),
            &[],
            Some(body.to_string()),
        )
        .await
        .expect("the gateway answers");
        assert_eq!(status, StatusCode::OK, "request {i}: {text}");
    }
}

#[tokio::test]
async fn a_worker_removed_by_a_reload_stops_being_polled_and_a_new_one_starts() {
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let busy = |req: &RogueRequest| {
        if req.path.starts_with("/metrics") {
            answer(200, "text/plain", BUSY_VLLM_METRICS)
        } else {
            chat_ok(req)
        }
    };
    let (old, new) = (Rogue::start(busy).await, Rogue::start(busy).await);
    let (dir, gw) = gateway("polls-reload", &engine, &[&old], ("least_load", &[]), "").await;
    eventually("the old worker polled", Duration::from_secs(5), || async {
        (old.metrics_polls() >= 3).then_some(())
    })
    .await;
    dir.write_config(&config_yaml(
        &[&engine.url, &new.url],
        &format!("{HEALTH}}}\n"),
    ));
    let (status, _, text) = send(Method::POST, &gw.admin_at("/admin/reload"), &[], None)
        .await
        .expect("admin reload");
    assert_eq!(status, StatusCode::OK, "{text}");
    eventually("the new worker polled", Duration::from_secs(5), || async {
        (new.metrics_polls() >= 3).then_some(())
    })
    .await;
    // A poll of the old worker may have been under way at the reload; none starts after it.
    let (old_at, new_at) = (old.metrics_polls(), new.metrics_polls());
    all_served_by(&gw, &engine, 10).await;
    eventually(
        "ten more polls of the new worker",
        Duration::from_secs(5),
        || async { (new.metrics_polls() >= new_at + 10).then_some(()) },
    )
    .await;
    assert!(
        old.metrics_polls() <= old_at + 1,
        "the removed worker was polled {} more times",
        old.metrics_polls() - old_at
    );
}
