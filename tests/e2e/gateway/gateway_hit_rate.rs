//! The explained hit rate end to end: `infergate_route_cached_tokens_total{pool,kind}` against
//! what the answers said, on sim engines behind a `prefix` gateway. Precise mode (KV events):
//! new prefixes count nothing anywhere (a cold workload), repeated shared prefixes count exactly
//! the cached tokens the workers delivered, and routing never predicts more than it knew to be
//! available. Approximate mode: an eviction the gateway did not cause shows as a stale view
//! (predicted above delivered).

use crate::common;

use std::time::Duration;

use crate::tools_support::infergate;
use common::gateway::{
    Gateway, POOL, TempDir, chat, config_yaml, eventually, random_text, routing_yaml, send,
    worker_of,
};
use common::{Engine, post_json};
use hyper::{Method, StatusCode};

/// How long a counter may take to include an answer the client already has (the routing
/// feedback runs when the body ends).
const SETTLE: Duration = Duration::from_secs(5);

/// The three counters, (predicted, delivered, available).
async fn counters(gw: &Gateway) -> (f64, f64, f64) {
    let text = gw.metrics().await;
    let kind = |k: &str| {
        common::find_metric(
            &text,
            &format!("infergate_route_cached_tokens_total{{pool=\"{POOL}\",kind=\"{k}\"}}"),
        )
        .unwrap_or_else(|| panic!("no {k} series in\n{text}"))
    };
    (kind("predicted"), kind("delivered"), kind("available"))
}

/// Waits until `delivered` reads `want` (every answer sent so far is counted); the three counters.
async fn settled(gw: &Gateway, want: f64) -> (f64, f64, f64) {
    eventually("delivered counts every answer", SETTLE, || async {
        let c = counters(gw).await;
        (c.1 == want).then_some(c)
    })
    .await
}

/// A chat through the gateway: (worker, cached prompt tokens the answer reported, and the
/// gateway's `x-infergate-route-cached` account of the pick: predicted, available).
async fn ask(gw: &Gateway, system: &str, user: &str) -> (String, u64, (u64, u64)) {
    let (status, headers, res) = post_json(
        &gw.at("/v1/chat/completions"),
        &chat(system, user, 2, false),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let cached = res["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {res}"));
    let route = headers
        .get("x-infergate-route-cached")
        .and_then(|v| v.to_str().ok())
        .and_then(infergate_cli::bench::parse_route_cached)
        .unwrap_or_else(|| panic!("no route account in {headers:?}"));
    (worker_of(&headers), cached, route)
}

/// Engines with `args` behind a `prefix` gateway.
async fn pool(tag: &str, n: usize, args: &[&str]) -> (Vec<Engine>, TempDir, Gateway) {
    let mut engines = Vec::new();
    for _ in 0..n {
        engines.push(Engine::start(args).await);
    }
    let urls: Vec<&str> = engines.iter().map(|e| e.url.as_str()).collect();
    let dir = TempDir::new(tag);
    dir.write_config(&config_yaml(&urls, ""));
    dir.write_routing(&routing_yaml("prefix", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    (engines, dir, gw)
}

#[tokio::test]
async fn precise_mode_counters_explain_cold_then_warm_prefixes() {
    let (engines, dir, gw) = pool("hit-rate-precise", 2, &["--gpu", "h100"]).await;
    eventually("both workers' KV events live", SETTLE, || async {
        for e in &engines {
            let live = gw
                .metric(&format!(
                    "infergate_routing_kv_events_live{{pool=\"{POOL}\",worker=\"{}\"}}",
                    e.url
                ))
                .await;
            if live != 1.0 {
                return None;
            }
        }
        Some(())
    })
    .await;
    assert_eq!(counters(&gw).await, (0.0, 0.0, 0.0), "before any request");

    // A cold workload: the first request of each of 4 groups finds nothing anywhere.
    let systems: Vec<String> = (0..4).map(|g| random_text(2048, 4600 + g)).collect();
    let mut delivered = 0u64;
    for system in &systems {
        let (_, cached, route) = ask(&gw, system, "First question.").await;
        assert_eq!(route, (0, 0), "a cold pick predicts nothing");
        delivered += cached;
    }
    assert_eq!(delivered, 0, "a new random prefix was cached somewhere");
    assert_eq!(settled(&gw, 0.0).await, (0.0, 0.0, 0.0), "cold");

    // Warm: 3 more requests per group, each sharing its group's system prompt.
    let (mut said_predicted, mut said_available) = (0, 0);
    for round in 0..3 {
        for system in &systems {
            let (_, cached, (p, a)) = ask(&gw, system, &format!("Question {round}.")).await;
            delivered += cached;
            (said_predicted, said_available) = (said_predicted + p, said_available + a);
        }
    }
    let (predicted, got, available) = settled(&gw, delivered as f64).await;
    // Each answer's header is its share of the counters.
    assert_eq!(
        (said_predicted as f64, said_available as f64),
        (predicted, available),
        "the answers' route accounts against the counters"
    );
    // 12 warm requests over a ~500-token shared prefix each.
    assert!(got >= 12.0 * 256.0, "delivered only {got} cached tokens");
    assert!(
        predicted <= available,
        "predicted {predicted} > available {available}"
    );
    // Precise and roomy: what routing expected is what the workers had, within a block or so
    // per request (the index counts whole blocks of the canonical prompt).
    assert!(
        predicted >= 0.5 * got && predicted <= 1.5 * got,
        "predicted {predicted} vs delivered {got}"
    );
    // With room everywhere nothing was lost to load: the best available was what was chosen.
    assert!(
        available - predicted <= 0.1 * available,
        "a routing loss on an idle pool: available {available}, predicted {predicted}"
    );

    // `bench` reads the same account from each answer: two groups sharing 600-token prefixes.
    let workload = dir.path.join("groups.yaml");
    std::fs::write(
        &workload,
        "name: groups\nseed: 3\nduration: 2s\narrival:\n  poisson: {rate: 10}\n\
         prompt_tokens: {dist: fixed, value: 700}\noutput_tokens: {dist: fixed, value: 4}\n\
         correlation: 0\nprefix_groups: {count: 2, tokens: 600, zipf: 0, share: 1.0}\n",
    )
    .unwrap();
    let out = dir.path.join("bench.json");
    let (w, o) = (workload.to_string_lossy(), out.to_string_lossy());
    let mut args = vec![
        "bench",
        "--url",
        &gw.url,
        "--workload",
        &w,
        "--quiet",
        "--out",
        &o,
    ];
    if let Some(key) = &gw.api_key {
        args.extend(["--api-key", key]);
    }
    infergate(&args, Duration::from_secs(30)).await.ok("bench");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let c = &report["cached_tokens"];
    let n = |k: &str| {
        c[k].as_u64()
            .unwrap_or_else(|| panic!("no {k} in {report}"))
    };
    assert_eq!(
        n("answers"),
        report["ok"].as_u64().unwrap(),
        "every answer carried it: {c}"
    );
    assert!(n("predicted") <= n("available"), "{c}");
    // All but the first of each group hit (at least the shared blocks).
    assert!(n("delivered") >= (n("answers") - 2) * 256, "{c}");
}

#[tokio::test]
async fn approximate_mode_shows_an_eviction_it_did_not_see_as_a_stale_view() {
    // A small KV cache (64 blocks × 16 tokens) that a few long prompts fill; no KV events.
    let args = &[
        "--gpu",
        "h100",
        "--num-gpu-blocks-override",
        "64",
        "--no-kv-events",
    ];
    let (_engines, _dir, gw) = pool("hit-rate-stale", 1, args).await;
    let system = random_text(2048, 4700);
    let (home, _, _) = ask(&gw, &system, "First question.").await;
    let (_, hit, _) = ask(&gw, &system, "Second question.").await;
    assert!(hit >= 256, "only {hit} cached tokens on the second ask");
    let before = settled(&gw, hit as f64).await;
    assert!(
        before.0 <= before.2,
        "predicted above available: {before:?}"
    );

    // Traffic the gateway never sees evicts the prefix from the worker.
    for i in 0..6 {
        let body = chat(&random_text(3500, 4800 + i), "Unrelated work.", 2, false).to_string();
        let (status, _, text) = send(
            Method::POST,
            &format!("{home}/v1/chat/completions"),
            &[],
            Some(body),
        )
        .await
        .expect("engine answers");
        assert_eq!(status, StatusCode::OK, "{text}");
    }
    let (_, stale, _) = ask(&gw, &system, "Third question.").await;
    // (A few leading blocks of chat template every prompt shares may survive.)
    assert!(
        stale <= 128,
        "{stale} cached tokens: the flood did not evict"
    );
    let after = settled(&gw, (hit + stale) as f64).await;
    let predicted = after.0 - before.0;
    let delivered = after.1 - before.1;
    // The index still believed the worker held the prefix: predicted well above delivered.
    assert!(
        predicted >= 256.0 && predicted > delivered + 200.0,
        "no stale view: predicted {predicted}, delivered {delivered}"
    );
    assert!(after.0 <= after.2, "predicted above available: {after:?}");
}
