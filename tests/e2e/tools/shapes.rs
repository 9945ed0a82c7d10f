//! `infergate shapes` on a real trace: a sim engine capturing only batch sizes 1, 2 and 4 behind
//! a gateway writing every request's flight record to its trace file; waves of 1 to 8
//! concurrent requests make steps of many batch sizes, some decode batches past 4 (eager). The
//! steps per batch size recovered from the trace add up to the engine's own
//! `infergate_engine_steps_total{path}`, a bad line is counted and skipped, and the proposal
//! covers its target on the training window and says how it does on the held-out one.

use crate::common;
use crate::tools_support;

use std::path::Path;
use std::time::Duration;

use common::Engine;
use common::gateway::{Gateway, TempDir, chat, config_yaml, routing_yaml, send};
use hyper::{Method, StatusCode};
use serde_json::Value;
use tools_support::{float, infergate_json};

/// Concurrent requests of each wave, in arrival order: small batches first, large ones later.
const WAVES: [usize; 6] = [1, 2, 3, 4, 6, 8];

/// The trace's lines so far.
fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

/// Sends one wave of `n` concurrent chat requests of `tokens` tokens each, every other one
/// streamed, and waits for all of them.
async fn wave(url: &str, wave: usize, n: usize, tokens: u64) {
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let body = chat(
            "Be brief.",
            &format!("wave {wave} request {i}"),
            tokens,
            i % 2 == 1,
        );
        let (url, id) = (url.to_owned(), format!("shapes-{wave}-{i}"));
        set.spawn(async move {
            let (status, _, text) = send(
                Method::POST,
                &url,
                &[("x-request-id", id.as_str())],
                Some(body.to_string()),
            )
            .await
            .expect("answer");
            assert_eq!(status, StatusCode::OK, "{text}");
        });
    }
    while let Some(done) = set.join_next().await {
        done.expect("request task");
    }
}

/// A number in [0, 1].
fn share(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: {v} is not a number"));
    assert!((0.0..=1.0).contains(&x), "{what} = {x}");
    x
}

#[tokio::test]
async fn shapes_recovers_the_engines_steps_and_proposes_sizes_it_checks_on_later_traffic() {
    // The waves must overlap in the engine to make large batches: no machine-wide load beside.
    let _machine = tools_support::shared_machine().await;
    let engine = Engine::start(&["--cuda-graph-sizes", "1,2,4", "--max-num-seqs", "16"]).await;
    let dir = TempDir::new("shapes");
    dir.write_config(&config_yaml(
        &[engine.url.as_str()],
        "trace: {path: trace.jsonl, sample: 1, max_bytes: 4194304, keep: 1}\n",
    ));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let url = gw.at("/v1/chat/completions");

    for (w, &n) in WAVES.iter().enumerate() {
        wave(&url, w, n, 16).await;
    }
    let total: usize = WAVES.iter().sum();
    let trace = dir.path.join("trace.jsonl");
    common::eventually("every trace line", Duration::from_secs(10), || async {
        (lines(&trace) == total).then_some(())
    })
    .await;
    let engine_graph = engine
        .metric("infergate_engine_steps_total{path=\"graph\"}")
        .await;
    let engine_eager = engine
        .metric("infergate_engine_steps_total{path=\"eager\"}")
        .await;

    // A line no gateway wrote: counted, not fatal.
    let edited = dir.path.join("edited.jsonl");
    let mut text = std::fs::read_to_string(&trace).unwrap();
    text.push_str("{\"start_ms\": \"garbage\"\n");
    std::fs::write(&edited, text).unwrap();
    let edited_s = edited.to_string_lossy().into_owned();

    let d = infergate_json(&["shapes", &edited_s, "--json"]).await;
    assert_eq!(d["requests"], total as u64, "{d}");
    assert_eq!(d["bad_lines"], 1, "{d}");
    assert_eq!(d["without_record"], 0, "{d}");
    assert_eq!(d["capture"], serde_json::json!([1, 2, 4]), "{d}");
    assert_eq!(d["exact"], true, "{d}");
    // steps(b) = sum of hist[b] / b over the requests: the engine's own step counts.
    let graph = float(&d["paths"], "graph_steps");
    let eager = float(&d["paths"], "eager_steps");
    assert!(
        (graph - engine_graph).abs() < 0.01 && (eager - engine_eager).abs() < 0.01,
        "trace: {graph} graph, {eager} eager; engine: {engine_graph} graph, {engine_eager} eager"
    );
    let rows = d["steps"].as_array().unwrap();
    let sum = |key: &str, pick: &dyn Fn(u64) -> bool| -> f64 {
        rows.iter()
            .filter(|r| pick(r["batch"].as_u64().unwrap()))
            .map(|r| r[key].as_f64().unwrap())
            .sum()
    };
    assert!(sum("graph", &|b| b <= 4) >= 1.0, "{d}");
    assert_eq!(
        sum("graph", &|b| b > 4),
        0.0,
        "no graph past the largest size: {d}"
    );
    assert_eq!(sum("decode_eager", &|b| b <= 4), 0.0, "{d}");
    assert!(
        sum("decode_eager", &|b| b > 4) >= 1.0,
        "some decode batches outgrew the capture sizes: {d}"
    );
    assert!(sum("mixed", &|_| true) >= 1.0, "{d}");
    for r in rows {
        for key in ["graph", "decode_eager", "mixed"] {
            let steps = r[key].as_f64().unwrap();
            assert!(steps >= 0.0 && (steps - steps.round()).abs() < 0.01, "{r}");
        }
    }
    share(&d["paths"]["graph_share"], "graph share");
    share(&d["cache"]["cached_share"], "cached share");
    let streamed: usize = WAVES.iter().map(|n| n / 2).sum();
    assert_eq!(d["features"]["stream"], streamed as u64, "{d}");
    let by_length: u64 = d["lengths"]["requests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap())
        .map(|c| c.as_u64().unwrap())
        .sum();
    assert_eq!(by_length, total as u64);

    let target = 0.9;
    let p = infergate_json(&[
        "shapes",
        &edited_s,
        "--propose",
        "--holdout",
        "--target-share",
        &target.to_string(),
        "--max-sizes",
        "4",
        "--json",
    ])
    .await;
    assert_eq!(p["train_until"], 0.5, "{p}");
    assert_eq!(p["reached"], true, "{p}");
    let sizes: Vec<u64> = p["proposed"]["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert!(!sizes.is_empty() && sizes.len() <= 4, "{p}");
    assert!(sizes.windows(2).all(|w| w[0] < w[1]), "{p}");
    let list: Vec<String> = sizes.iter().map(u64::to_string).collect();
    assert_eq!(p["flag"], format!("--cuda-graph-sizes {}", list.join(",")));
    for set in ["proposed", "current"] {
        for window in ["train", "holdout"] {
            let c = &p[set][window];
            share(&c["coverage"], &format!("{set} {window} coverage"));
            share(&c["padding_share"], &format!("{set} {window} padding"));
            assert!(
                float(c, "covered_steps") <= float(c, "decode_steps") + 1e-9,
                "{c}"
            );
        }
        assert!(float(&p[set]["cost"], "seconds") > 0.0, "{p}");
    }
    let train = &p["proposed"]["train"];
    assert!(float(train, "coverage") >= target, "{p}");
    assert!(float(train, "decode_steps") > 0.0, "{p}");
    // The windows split the requests; the first holds the small waves.
    let (n_train, n_later) = (
        p["proposed"]["train"]["requests"].as_u64().unwrap(),
        p["proposed"]["holdout"]["requests"].as_u64().unwrap(),
    );
    assert_eq!(n_train + n_later, total as u64, "{p}");
    assert_eq!(p["current"]["sizes"], serde_json::json!([1, 2, 4]));
    let per_size = p["proposed"]["cost"]["per_size"].as_array().unwrap();
    assert_eq!(per_size.len(), sizes.len(), "{p}");
    let bytes: u64 = per_size.iter().map(|s| s["bytes"].as_u64().unwrap()).sum();
    assert_eq!(p["proposed"]["cost"]["bytes"], bytes, "{p}");

    // The text form names the flag to apply.
    let run = tools_support::infergate(
        &["shapes", &edited_s, "--propose", "--holdout"],
        Duration::from_secs(30),
    )
    .await;
    let out = run.ok("shapes --propose");
    assert!(out.contains("held-out window"), "{out}");
    assert!(
        out.contains("apply: infergate engine --cuda-graph-sizes "),
        "{out}"
    );
}
