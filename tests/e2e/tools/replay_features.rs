//! `bench --replay` and `sim --replay` (issue 43, item 3) keep the features that change the
//! engine's path: requests with `n: 2`, logprobs, tools with a JSON `response_format`, and an
//! image part go through a gateway that keeps a trace; `sim --replay` runs them as the engine
//! does (two sequences, the image refused with the engine's 400), and `bench --replay` sends
//! them again: the replayed trace has the same features (the gateway's line and the engine's
//! record, as `infergate shapes` counts them), statuses, answer lengths and sequence counts.

use crate::common;
use crate::tools_support;

use std::path::Path;
use std::time::Duration;

use common::Engine;
use common::gateway::{Gateway, MODEL, TempDir, config_yaml, routing_yaml};
use common::http::post_as;
use serde_json::{Value, json};
use tools_support::{float, infergate, infergate_json, uint};

/// The original traffic: (body members besides model, messages and max_tokens, status).
fn originals() -> Vec<(Value, u16)> {
    let image = json!([
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]);
    vec![
        (json!({}), 200),
        (json!({"n": 2}), 200),
        (json!({"logprobs": true, "top_logprobs": 2}), 200),
        (
            json!({
                "tools": [
                    {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
                    {"type": "function", "function": {"name": "b", "parameters": {"type": "object"}}},
                ],
                "response_format": {"type": "json_object"},
            }),
            200,
        ),
        (json!({"content": image}), 400),
    ]
}

fn json_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn trace_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What must survive a replay of each line, sorted (replayed requests may interleave).
fn kept(lines: &[String]) -> Vec<String> {
    let mut kept: Vec<String> = lines
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON trace line");
            let f = &v["flight"];
            json!({
                "status": v["status"],
                "features": v["features"],
                "completion_tokens": v["completion_tokens"],
                "engine_features": f["features"],
                // A request's choices decode side by side (others' may join by timing).
                "choices_together": v["features"]["n"]
                    .as_u64()
                    .filter(|&n| n > 1)
                    .map(|n| f["batch"]["max"].as_u64() >= Some(n)),
            })
            .to_string()
        })
        .collect();
    kept.sort();
    kept
}

#[tokio::test]
async fn replays_keep_n_logprobs_tools_formats_and_image_parts() {
    let _machine = tools_support::shared_machine().await;
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("replay-features");
    dir.write_config(&config_yaml(
        &[engine.url.as_str()],
        "trace: {path: trace.jsonl, sample: 1, max_bytes: 4194304, keep: 1}\n",
    ));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let key = gw.api_key.clone();
    let url = format!("{}/v1/chat/completions", gw.url);
    for (i, (extra, status)) in originals().into_iter().enumerate() {
        let content = extra
            .get("content")
            .cloned()
            .unwrap_or_else(|| json!(format!("request {i}: tell me about rivers")));
        let mut body = json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 8,
            "ignore_eos": true,
            // As bench sends them (the engine's record says whether an answer streamed).
            "stream": true,
        });
        for (k, v) in extra.as_object().unwrap() {
            if k != "content" {
                body[k] = v.clone();
            }
        }
        let reply = post_as(&url, key.as_deref(), &body).await;
        assert_eq!(reply.status.as_u16(), status, "{body}: {}", reply.text);
    }
    let trace = dir.path.join("trace.jsonl");
    common::eventually("the five trace lines", Duration::from_secs(10), || async {
        (trace_lines(&trace).len() == 5).then_some(())
    })
    .await;
    let original = dir.path.join("original.jsonl");
    std::fs::write(&original, trace_lines(&trace).join("\n")).unwrap();
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let want = kept(&trace_lines(&original));
    assert!(
        want.iter()
            .any(|k| k.contains(r#""response_format":"json_object""#) && k.contains(r#""tools":2"#)),
        "the gateway records the features: {want:#?}"
    );

    // The simulator runs them as the engine does: two sequences' tokens, the image refused.
    let sim_out = dir.path.join("sim.json");
    let sim = infergate(
        &[
            "sim",
            "--replay",
            &s(&original),
            "--workers",
            "1",
            "--out",
            &s(&sim_out),
        ],
        Duration::from_secs(60),
    )
    .await;
    sim.ok("sim --replay");
    let r = json_file(&sim_out);
    assert_eq!(
        (
            uint(&r, "requests"),
            uint(&r, "ok"),
            uint(&r, "client_errors")
        ),
        (5, 4, 1),
        "{r}"
    );
    assert_eq!(float(&r["extra"], "engine_refused_invalid"), 1.0, "{r}");
    let tokens = float(&r, "tokens_out_per_s") * float(&r, "duration_s");
    assert!(
        (tokens - 40.0).abs() < 1.0,
        "8 + 2 × 8 + 8 + 8 tokens: {tokens}"
    );

    // bench sends them again, and reports the engine's refusal of the image.
    let bench_out = dir.path.join("bench.json");
    let mut args = vec![
        "bench".to_owned(),
        "--url".into(),
        gw.url.clone(),
        "--replay".into(),
        s(&original),
        "--out".into(),
        s(&bench_out),
        "--quiet".into(),
    ];
    if let Some(key) = &key {
        args.extend(["--api-key".to_owned(), key.clone()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    infergate(&args, Duration::from_secs(60))
        .await
        .ok("bench --replay");
    let b = json_file(&bench_out);
    assert_eq!(
        (
            uint(&b, "requests"),
            uint(&b, "ok"),
            uint(&b, "client_errors")
        ),
        (5, 4, 1),
        "{b}"
    );
    common::eventually(
        "the replayed trace lines",
        Duration::from_secs(10),
        || async { (trace_lines(&trace).len() == 10).then_some(()) },
    )
    .await;
    let replayed_lines = trace_lines(&trace)[5..].to_vec();
    assert_eq!(kept(&replayed_lines), want);
    let replayed = dir.path.join("replayed.jsonl");
    std::fs::write(&replayed, replayed_lines.join("\n")).unwrap();
    let (a, b) = (
        infergate_json(&["shapes", &s(&original), "--json"]).await,
        infergate_json(&["shapes", &s(&replayed), "--json"]).await,
    );
    assert_eq!(a["features"], b["features"]);
    for feature in ["n_gt_1", "logprobs", "tools", "response_format"] {
        assert_eq!(
            uint(&a["features"], feature),
            1,
            "{feature}: {}",
            a["features"]
        );
    }
}
