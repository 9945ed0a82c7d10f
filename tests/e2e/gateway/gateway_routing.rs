//! Routing policies end to end over four sim engines: `prefix` concentrates requests sharing a
//! long system prompt on one worker, spreads unseen prefixes, keeps affinity when every worker is
//! equally saturated, and spills off a home much busier than its peers; `round_robin` spreads
//! evenly. Decisions are checked on the response header and the metrics.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::gateway::{
    Gateway, POOL, TempDir, chat, config_yaml, eventually, random_text, routing_yaml, worker_of,
};
use common::{Engine, SseStream, open_stream, post_json};
use hyper::StatusCode;

/// Four `--gpu h100` engines behind a gateway with `policy` and its `params`.
async fn four_workers(tag: &str, policy: &str, params: &[&str]) -> (Vec<Engine>, TempDir, Gateway) {
    let mut engines = Vec::new();
    for _ in 0..4 {
        engines.push(Engine::start(&["--gpu", "h100"]).await);
    }
    let urls: Vec<&str> = engines.iter().map(|e| e.url.as_str()).collect();
    let dir = TempDir::new(tag);
    dir.write_config(&config_yaml(&urls, ""));
    dir.write_routing(&routing_yaml(policy, params));
    let gw = Gateway::start(&dir.config(), &[]).await;
    (engines, dir, gw)
}

/// Sends a short chat with `system` and `user` through the gateway; returns the worker URL.
async fn route(gw: &Gateway, system: &str, user: &str) -> String {
    let (status, headers, res) = post_json(
        &gw.at("/v1/chat/completions"),
        &chat(system, user, 2, false),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{res}");
    assert_eq!(res["usage"]["completion_tokens"], 2, "{res}");
    worker_of(&headers)
}

/// `infergate_routing_decisions_total{pool,reason}` now.
async fn decisions(gw: &Gateway, reason: &str) -> f64 {
    gw.metric(&format!(
        "infergate_routing_decisions_total{{pool=\"{POOL}\",reason=\"{reason}\"}}"
    ))
    .await
}

#[tokio::test]
async fn prefix_concentrates_shared_system_prompts_and_spreads_unseen_ones() {
    let (engines, _dir, gw) = four_workers("prefix", "prefix", &[]).await;
    let system = random_text(2048, 1);

    let mut home = None;
    for turn in 0..8 {
        let user = format!("Question {turn}: {}", random_text(120, 100 + turn));
        let w = route(&gw, &system, &user).await;
        assert_eq!(*home.get_or_insert(w.clone()), w, "turn {turn} left home");
    }
    assert_eq!(decisions(&gw, "prefix_home").await, 1.0);
    assert_eq!(decisions(&gw, "prefix_hit").await, 7.0);
    // The home engine really reused the shared prefix from its KV cache.
    let home = home.unwrap();
    let home_engine = engines.iter().find(|e| e.url == home).expect("home engine");
    let hits = home_engine.metric("vllm:prefix_cache_hits_total").await;
    assert!(hits >= 7.0 * 400.0, "home engine prefix-cache hits {hits}");
    // The engines report cached tokens on every answer; routing predicted them and was right.
    let actual = gw
        .metric(&format!(
            "infergate_routing_actual_cached_tokens_total{{pool=\"{POOL}\"}}"
        ))
        .await;
    let predicted = gw
        .metric(&format!(
            "infergate_routing_predicted_cached_tokens_total{{pool=\"{POOL}\"}}"
        ))
        .await;
    assert!(actual >= 7.0 * 400.0, "actual cached {actual}");
    assert!(
        predicted > 0.5 * actual && predicted < 1.5 * actual,
        "predicted {predicted} vs actual {actual} cached tokens"
    );
    eventually("index size published", Duration::from_secs(5), || async {
        let blocks = gw
            .metric(&format!(
                "infergate_routing_index_blocks{{pool=\"{POOL}\",worker=\"{home}\"}}"
            ))
            .await;
        (blocks >= 8.0).then_some(())
    })
    .await;

    // Unseen prefixes go to their consistent-hash homes: spread, not piled on one worker.
    let mut per_worker: HashMap<String, usize> = HashMap::new();
    for i in 0..40 {
        let w = route(&gw, &random_text(2048, 1_000 + i), "Summarise.").await;
        *per_worker.entry(w).or_default() += 1;
    }
    assert!(per_worker.len() >= 3, "40 prefixes on {per_worker:?}");
    assert!(
        per_worker.values().all(|&n| n <= 25),
        "one worker took most: {per_worker:?}"
    );
    assert_eq!(decisions(&gw, "prefix_home").await, 41.0);
    assert_eq!(decisions(&gw, "load_spill").await, 0.0);
}

#[tokio::test]
async fn a_saturated_home_spills_to_the_next_worker_in_hash_order() {
    let (engines, _dir, gw) = four_workers("spill", "prefix", &[]).await;
    let system = random_text(2048, 7);
    let home = route(&gw, &system, "First question.").await;
    assert_eq!(route(&gw, &system, "Second question.").await, home);
    let home_engine = engines.iter().find(|e| e.url == home).expect("home engine");

    // Load the home with long streams sent straight to it (as another gateway replica would):
    // 6 requests above its idle peers is past the tolerance (0.25 × mean 1.5 + 2).
    let mut held: Vec<SseStream> = Vec::new();
    for i in 0..6 {
        let body = chat(&random_text(300, 50 + i), "Go on forever.", 4000, true);
        let s = open_stream(&home_engine.at("/v1/chat/completions"), &body).await;
        assert_eq!(s.status, StatusCode::OK);
        held.push(s);
    }
    eventually(
        "home load seen by the gateway",
        Duration::from_secs(5),
        || async {
            let w = gw.worker_status(&home).await;
            let load = w["running"].as_f64()? + w["waiting"].as_f64()?;
            (load >= 6.0).then_some(())
        },
    )
    .await;

    let spills = decisions(&gw, "load_spill").await;
    let other = route(&gw, &system, "Third question, while home is busy.").await;
    assert_ne!(other, home, "a saturated home still took the prefix");
    assert_eq!(decisions(&gw, "load_spill").await, spills + 1.0);
    let lost = gw
        .metric(&format!(
            "infergate_routing_prefix_lost_total{{pool=\"{POOL}\",reason=\"queue\"}}"
        ))
        .await;
    assert_eq!(lost, 1.0, "the holder lost on its queue");
    // The spill target now holds the prefix too: the next request is a hit there.
    let hits = decisions(&gw, "prefix_hit").await;
    assert_eq!(route(&gw, &system, "Fourth question.").await, other);
    assert_eq!(decisions(&gw, "prefix_hit").await, hits + 1.0);

    // Once the home is idle again, both workers holding the prefix are hits (ties: lower load).
    drop(held);
    eventually("home idle again", Duration::from_secs(10), || async {
        let w = gw.worker_status(&home).await;
        let load = w["running"].as_f64()? + w["waiting"].as_f64()?;
        (load == 0.0).then_some(())
    })
    .await;
    let hits = decisions(&gw, "prefix_hit").await;
    let fifth = route(&gw, &system, "Fifth question.").await;
    assert!(fifth == home || fifth == other, "{fifth} holds no copy");
    assert_eq!(decisions(&gw, "prefix_hit").await, hits + 1.0);
}

#[tokio::test]
async fn every_worker_equally_saturated_keeps_the_prefix_on_its_holder() {
    let (engines, _dir, gw) = four_workers("saturated", "prefix", &[]).await;
    let system = random_text(2048, 9);
    let home = route(&gw, &system, "First question.").await;
    // Every engine runs the same long streams, sent straight to it: all equally busy.
    let mut held: Vec<SseStream> = Vec::new();
    for (e, engine) in engines.iter().enumerate() {
        for i in 0..6 {
            let body = chat(
                &random_text(300, 200 + 10 * e as u64 + i),
                "Go on forever.",
                4000,
                true,
            );
            let s = open_stream(&engine.at("/v1/chat/completions"), &body).await;
            assert_eq!(s.status, StatusCode::OK);
            held.push(s);
        }
    }
    eventually(
        "every worker's load seen",
        Duration::from_secs(5),
        || async {
            for e in &engines {
                let w = gw.worker_status(&e.url).await;
                let load = w["running"].as_f64()? + w["waiting"].as_f64()?;
                if load < 6.0 {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let hits = decisions(&gw, "prefix_hit").await;
    for turn in 0..5 {
        let w = route(
            &gw,
            &system,
            &format!("Question {turn} while all are busy."),
        )
        .await;
        assert_eq!(w, home, "turn {turn} left the holder");
    }
    assert_eq!(decisions(&gw, "prefix_hit").await, hits + 5.0);
    assert_eq!(decisions(&gw, "load_spill").await, 0.0);
    drop(held);
}

#[tokio::test]
async fn round_robin_spreads_evenly() {
    let (engines, _dir, gw) = four_workers("rr", "round_robin", &[]).await;
    let system = random_text(2048, 3);
    let mut per_worker: HashMap<String, usize> = HashMap::new();
    for turn in 0..12 {
        let w = route(&gw, &system, &format!("Turn {turn}.")).await;
        *per_worker.entry(w).or_default() += 1;
    }
    for e in &engines {
        assert_eq!(per_worker.get(&e.url), Some(&3), "{per_worker:?}");
    }
    assert_eq!(decisions(&gw, "round_robin").await, 12.0);
    assert_eq!(decisions(&gw, "prefix_hit").await, 0.0);
}
