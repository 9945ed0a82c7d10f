//! `sim --replay` of a gateway trace whose requests asked for features that change the
//! engine's path: `n` choices decode together as sequences of one batch, image parts meet the
//! engine's refusal, logprobs, tools and formats run as the engine runs them.

use std::time::Duration;

use super::*;
use crate::workload;

/// A gateway trace file of `lines` (JSON values), written under a fresh name.
fn trace_file(name: &str, lines: &[serde_json::Value]) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "infergate-replay-{name}-{}.jsonl",
        std::process::id()
    ));
    let text: Vec<String> = lines.iter().map(ToString::to_string).collect();
    std::fs::write(&path, text.join("\n")).expect("write the trace");
    path
}

fn line(id: &str, ms: i64, completion: u64, features: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "request_id": id, "start_ms": ms, "tenant": "t", "status": 200,
        "prompt_tokens": 300, "completion_tokens": completion, "max_tokens": 64,
        "features": features,
    })
}

fn run(name: &str, lines: &[serde_json::Value]) -> crate::report::Report {
    run_traced(name, lines).report
}

/// The run of a replay on one worker, keeping its flight records.
fn run_traced(name: &str, lines: &[serde_json::Value]) -> SimResult {
    let path = trace_file(name, lines);
    let w = workload::replay(&path, 1.0).expect("a replayable trace");
    let cfg = SimConfig {
        workers: 1,
        record_flights: true,
        ..SimConfig::default()
    };
    let r = simulate(
        &cfg,
        &w,
        &Overrides::default(),
        &policy_config("round_robin").unwrap(),
    )
    .expect("runs");
    let _ = std::fs::remove_file(&path);
    r
}

#[test]
fn n_choices_decode_together_and_images_meet_the_engines_refusal() {
    let plain = run("plain", &[line("a", 0, 32, serde_json::json!({"n": 1}))]);
    assert_eq!((plain.requests, plain.ok), (1, 1));
    assert_eq!(plain.extra["batch_mean"], 1.0);

    // Four choices of 32 tokens: one prefill, then the four sequences decode in one batch.
    let four = run("n4", &[line("a", 0, 128, serde_json::json!({"n": 4}))]);
    assert_eq!((four.requests, four.ok), (1, 1), "{four:?}");
    assert!(four.extra["batch_mean"] > 3.0, "{:?}", four.extra);
    let out = four.tokens_out_per_s * four.duration_s;
    assert!((out - 128.0).abs() < 1.0, "every choice's tokens: {out}");

    let mixed = run(
        "mixed",
        &[
            line(
                "a",
                0,
                16,
                serde_json::json!({"n": 2, "logprobs": true, "top_logprobs": 2}),
            ),
            line(
                "b",
                100,
                8,
                serde_json::json!({"tools": 2, "response_format": "json_object"}),
            ),
            line("c", 200, 8, serde_json::json!({"images": 1})),
        ],
    );
    assert_eq!(
        (mixed.requests, mixed.ok, mixed.client_errors),
        (3, 2, 1),
        "{mixed:?}"
    );
    assert_eq!(mixed.extra["engine_refused_invalid"], 1.0);
    let out = mixed.tokens_out_per_s * mixed.duration_s;
    assert!((out - 24.0).abs() < 1.0, "16 + 8 tokens served: {out}");
    assert!(mixed.duration_s >= Duration::from_millis(200).as_secs_f64());
}

#[test]
fn the_simulated_flight_records_name_the_replayed_features() {
    let r = run_traced(
        "flights",
        &[
            line("a", 0, 16, serde_json::json!({"n": 2, "logprobs": true})),
            line("b", 50, 8, serde_json::json!({"tools": 1})),
            line("c", 100, 8, serde_json::json!({"n": 1})),
        ],
    );
    let mut features: Vec<serde_json::Value> = r
        .trace
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["flight"].clone())
        .collect();
    features.sort_by_key(|f| f["features"]["n"].as_u64());
    assert_eq!(features.len(), 3);
    let two = &features[2];
    assert_eq!(
        (
            two["features"]["n"].as_u64(),
            two["features"]["best_of"].as_u64()
        ),
        (Some(2), Some(2))
    );
    assert_eq!(two["features"]["logprobs"], true);
    assert_eq!(two["tokens"]["decode"], 16, "both choices' tokens");
    assert!(features.iter().any(|f| f["features"]["tools"] == true));
    assert!(features.iter().all(|f| f["features"]["stream"] == true));
}
