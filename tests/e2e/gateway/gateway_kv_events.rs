//! Precise mode end to end: our engine streams which router keys it holds (`GET /kv/events`),
//! the gateway subscribes and routes on that real residency; a worker without events keeps the
//! approximate index. Under evictions the gateway cannot see (traffic straight to a worker), the
//! precise gateway finds the copy that is really there while the approximate one sends the
//! request to the worker that evicted it.

use crate::common;

use std::time::Duration;

use common::gateway::{
    Gateway, POOL, TempDir, chat, config_yaml, eventually, random_text, routing_yaml, send,
    worker_of,
};
use common::{Engine, post_json};
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use infergate::routing::features::{
    DEFAULT_BLOCK_BYTES, DEFAULT_MAX_BLOCKS, canonical_chat, prefix_hashes,
};
use infergate_engine::kv_events::{PREFIX_KEYS_HEADER, PrefixKeys};
use serde_json::Value;

/// A small KV cache (64 blocks × 16 tokens) that a few long prompts fill.
const SMALL_KV: &[&str] = &["--gpu", "h100", "--num-gpu-blocks-override", "64"];

/// The header a gateway sends for a chat of `system` then `user`.
fn keys_header(system: &str, user: &str) -> (String, Vec<u64>) {
    let canonical = canonical_chat(&[("system", system), ("user", user)]);
    let keys = prefix_hashes(&canonical, DEFAULT_BLOCK_BYTES, DEFAULT_MAX_BLOCKS);
    (
        PrefixKeys::header_value(DEFAULT_BLOCK_BYTES, canonical.len(), &keys),
        keys,
    )
}

/// A chat through the gateway: (worker, cached prompt tokens).
async fn ask(gw: &Gateway, system: &str, user: &str) -> (String, u64) {
    let (status, headers, res) = post_json(
        &gw.at("/v1/chat/completions"),
        &chat(system, user, 2, false),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{res}");
    (worker_of(&headers), cached(&res))
}

fn cached(res: &Value) -> u64 {
    res["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {res}"))
}

/// A chat straight to an engine, with extra headers; returns the cached prompt tokens.
async fn direct(engine: &str, system: &str, user: &str, headers: &[(&str, &str)]) -> u64 {
    let body = chat(system, user, 2, false).to_string();
    let (status, _, text) = send(
        Method::POST,
        &format!("{engine}/v1/chat/completions"),
        headers,
        Some(body),
    )
    .await
    .expect("engine answers");
    assert_eq!(status, StatusCode::OK, "{text}");
    cached(&serde_json::from_str(&text).expect("JSON answer"))
}

/// Long prompts sent straight to `engine`, sharing nothing: they evict its whole cache.
async fn flood(engine: &str, seed: u64) {
    for i in 0..6 {
        direct(
            engine,
            &random_text(3500, seed + i),
            "Unrelated work the gateway never sees.",
            &[],
        )
        .await;
    }
}

fn gauge(name: &str, worker: &str) -> String {
    format!("{name}{{pool=\"{POOL}\",worker=\"{worker}\"}}")
}

async fn live(gw: &Gateway, worker: &str) -> f64 {
    gw.metric(&gauge("infergate_routing_kv_events_live", worker))
        .await
}

async fn index_blocks(gw: &Gateway, worker: &str) -> f64 {
    gw.metric(&gauge("infergate_routing_index_blocks", worker))
        .await
}

/// Two engines with `engine_args` behind a `prefix` gateway.
async fn two_workers(tag: &str, args: [&[&str]; 2]) -> (Vec<Engine>, TempDir, Gateway) {
    let mut engines = Vec::new();
    for a in args {
        engines.push(Engine::start(a).await);
    }
    let urls: Vec<&str> = engines.iter().map(|e| e.url.as_str()).collect();
    let dir = TempDir::new(tag);
    dir.write_config(&config_yaml(&urls, ""));
    dir.write_routing(&routing_yaml("prefix", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    (engines, dir, gw)
}

/// Builds the scenario: the prefix is placed through the gateway on `home`, then (unseen by
/// this gateway) warmed on the other worker by another router and evicted from `home`.
/// Returns (home, other).
async fn warm_elsewhere_evict_home(
    gw: &Gateway,
    engines: &[Engine],
    system: &str,
) -> (String, String) {
    let (home, _) = ask(gw, system, "First question.").await;
    let other = engines
        .iter()
        .map(|e| e.url.clone())
        .find(|u| *u != home)
        .expect("two workers");
    // Another gateway replica sends the same prefix to `other`, with its keys.
    let user = "Asked through another gateway.";
    let (header, _) = keys_header(system, user);
    direct(&other, system, user, &[(PREFIX_KEYS_HEADER, &header)]).await;
    flood(&home, 900).await;
    // `home` no longer holds the prefix: the same prompt straight to it finds nothing cached.
    (home, other)
}

#[tokio::test]
async fn precise_mode_routes_to_the_copy_that_is_really_there() {
    let (engines, _dir, gw) = two_workers("kv-precise", [SMALL_KV, SMALL_KV]).await;
    eventually(
        "both workers' KV events live",
        Duration::from_secs(10),
        || async {
            for e in &engines {
                if live(&gw, &e.url).await != 1.0 {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let system = random_text(2048, 41);
    let (home, other) = warm_elsewhere_evict_home(&gw, &engines, &system).await;
    // The events said so: the gateway holds nothing for `home` and the prefix for `other`.
    eventually(
        "evictions and the other copy seen",
        Duration::from_secs(10),
        || async {
            (index_blocks(&gw, &home).await == 0.0 && index_blocks(&gw, &other).await > 0.0)
                .then_some(())
        },
    )
    .await;
    let (w, hit) = ask(&gw, &system, "Second question.").await;
    assert_eq!(w, other, "routed to the worker that evicted the prefix");
    assert!(hit >= 256, "only {hit} cached tokens on the real holder");
}

#[tokio::test]
async fn approximate_mode_cannot_see_evictions_it_did_not_cause() {
    let args: &[&str] = &[
        "--gpu",
        "h100",
        "--num-gpu-blocks-override",
        "64",
        "--no-kv-events",
    ];
    let (engines, _dir, gw) = two_workers("kv-approx", [args, args]).await;
    let system = random_text(2048, 41);
    let (home, _other) = warm_elsewhere_evict_home(&gw, &engines, &system).await;
    let (w, hit) = ask(&gw, &system, "Second question.").await;
    assert_eq!(
        w, home,
        "the approximate index still believes home holds it"
    );
    assert!(hit < 64, "{hit} cached tokens: the flood did not evict");
    for e in &engines {
        assert_eq!(live(&gw, &e.url).await, 0.0);
    }
}

#[tokio::test]
async fn a_worker_without_events_keeps_the_approximate_index() {
    let plain: &[&str] = &["--gpu", "h100", "--no-kv-events"];
    let (engines, _dir, gw) = two_workers("kv-mixed", [&["--gpu", "h100"], plain]).await;
    let (precise, approx) = (&engines[0].url, &engines[1].url);
    eventually(
        "the first worker's KV events live",
        Duration::from_secs(10),
        || async { (live(&gw, precise).await == 1.0).then_some(()) },
    )
    .await;
    // The worker without events answered 404 and is not asked again for a while.
    let (status, _, _) = send(Method::GET, &format!("{approx}/kv/events"), &[], None)
        .await
        .expect("engine answers");
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(live(&gw, approx).await, 0.0);
    // Prefixes homed on either worker stick and hit there.
    let mut homes = std::collections::HashSet::new();
    for g in 0..40 {
        let system = random_text(2048, 500 + g);
        let (first, _) = ask(&gw, &system, "First question.").await;
        let (second, hit) = ask(&gw, &system, "Second question.").await;
        assert_eq!(first, second, "group {g} moved");
        assert!(
            hit >= 256,
            "group {g}: only {hit} cached tokens on {second}"
        );
        homes.insert(first);
        if homes.len() == 2 {
            break;
        }
    }
    assert_eq!(
        homes.len(),
        2,
        "no prefix was homed on both kinds of worker"
    );
}

/// Reads the NDJSON lines of `GET /kv/events` until `until` accepts one (or 10 s pass).
async fn read_events(
    url: &str,
    mut until: impl FnMut(&Value) -> bool,
    mut during: impl AsyncFnMut(),
) {
    let res = common::open(Method::GET, &format!("{url}/kv/events"), None)
        .await
        .expect("subscribe");
    assert_eq!(res.status, StatusCode::OK);
    let mut body = res.body;
    let mut buf = Vec::new();
    let mut first = true;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .expect("the awaited event within 10 s")
            .expect("stream open")
            .expect("frame");
        buf.extend_from_slice(frame.data_ref().expect("data"));
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let v: Value = serde_json::from_slice(&line).expect("JSON line");
            if first {
                assert_eq!(
                    v["type"], "snapshot",
                    "the stream starts with a snapshot: {v}"
                );
                first = false;
                during().await;
                continue;
            }
            if until(&v) {
                return;
            }
        }
    }
}

#[tokio::test]
async fn the_engine_streams_a_snapshot_then_stored_and_removed_keys() {
    let engine = Engine::start(SMALL_KV).await;
    let system = random_text(2048, 77);
    let user = "Which keys do you hold?";
    let (header, keys) = keys_header(&system, user);
    let hex: Vec<String> = keys.iter().map(|k| format!("{k:016x}")).collect();
    let url = engine.url.clone();
    read_events(
        &url,
        |v| {
            v["type"] == "stored"
                && v["keys"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|k| *k == hex[0]))
        },
        async || {
            direct(&url, &system, user, &[(PREFIX_KEYS_HEADER, &header)]).await;
        },
    )
    .await;
    // A new subscriber's snapshot holds the key; a flood evicts it and says so.
    read_events(
        &url,
        |v| {
            v["type"] == "removed"
                && v["keys"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|k| *k == hex[0]))
        },
        async || flood(&url, 300).await,
    )
    .await;
}
