//! `bench --replay TRACE` and `sim --replay TRACE` (issue 43, item 3) the way an operator runs
//! them: traffic with shared system prompts goes through a gateway that keeps a trace file;
//! the simulator replays that file with every request and about the prefix cache hits of the
//! workload itself (the prefix groups survive without any text in the trace), and `bench`
//! replays it against the gateway at twice the speed, every request again.

use crate::common;
use crate::tools_support;

use std::time::Duration;

use common::Engine;
use common::gateway::{Gateway, TempDir, config_yaml, routing_yaml};
use serde_json::Value;
use tools_support::{float, infergate, uint};

/// Two system prompts of 600 tokens, each request one of them and 700-900 tokens of its own;
/// 40 requests in 2 s.
const GROUPED: &str = r"name: grouped
seed: 9
duration: 2s
arrival:
  poisson: {rate: 20}
prompt_tokens: {dist: uniform, min: 700, max: 900}
output_tokens: {dist: fixed, value: 8}
prefix_groups: {count: 2, tokens: 600, zipf: 0.0, share: 1.0}
slo: {ttft: 2s, itl: 500ms}
";

fn json(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test]
async fn a_gateway_trace_replays_in_sim_and_bench_with_its_prefix_groups() {
    let _machine = tools_support::shared_machine().await;
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("replay");
    dir.write_config(&config_yaml(
        &[engine.url.as_str()],
        "trace: {path: trace.jsonl, sample: 1, max_bytes: 4194304, keep: 1}\n",
    ));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let workload = dir.path.join("grouped.yaml");
    std::fs::write(&workload, GROUPED).unwrap();
    let key = gw.api_key.clone();
    let bench = |args: Vec<String>| {
        let mut all = vec!["bench".to_owned(), "--url".to_owned(), gw.url.clone()];
        all.extend(args);
        all.push("--quiet".to_owned());
        if let Some(key) = &key {
            all.extend(["--api-key".to_owned(), key.clone()]);
        }
        async move {
            let args: Vec<&str> = all.iter().map(String::as_str).collect();
            infergate(&args, Duration::from_secs(60)).await
        }
    };
    let s = |p: &std::path::Path| p.to_string_lossy().into_owned();

    let recorded = dir.path.join("recorded.json");
    bench(vec![
        "--workload".into(),
        s(&workload),
        "--out".into(),
        s(&recorded),
    ])
    .await
    .ok("bench --workload grouped");
    let sent = uint(&json(&recorded), "ok");
    assert!(sent >= 20, "the workload ran: {sent} answers");
    let trace = dir.path.join("trace.jsonl");
    let lines = || {
        std::fs::read_to_string(&trace)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("a JSON trace line"))
            .collect::<Vec<Value>>()
    };
    common::eventually("every trace line", Duration::from_secs(10), || async {
        (lines().len() as u64 == sent).then_some(())
    })
    .await;
    for l in lines() {
        assert!(
            l["prefix"].as_array().is_some_and(|m| m.len() >= 4),
            "a 700-token prompt has marks up to 8 blocks: {l}"
        );
    }

    // The simulator replays every request, and the shared prefixes are shared again: about
    // the prefix cache hits of the workload itself in the same simulator.
    let sim = |args: Vec<String>, name: &str| {
        let out = dir.path.join(name);
        let mut all: Vec<String> = vec!["sim".into(), "--workers".into(), "1".into()];
        all.extend(args);
        all.extend(["--out".into(), s(&out)]);
        async move {
            let args: Vec<&str> = all.iter().map(String::as_str).collect();
            infergate(&args, Duration::from_secs(60)).await.ok("sim");
            json(&out)
        }
    };
    let original = sim(vec!["--workload".into(), s(&workload)], "sim-workload.json").await;
    let replay = sim(vec!["--replay".into(), s(&trace)], "sim-replay.json").await;
    assert_eq!(uint(&replay, "requests"), sent, "{replay}");
    let (want, got) = (
        float(&original["extra"], "cached_share"),
        float(&replay["extra"], "cached_share"),
    );
    assert!(want > 0.3, "the workload's groups are cached: {want}");
    // The marks keep a group's prefix to a power of two blocks (512 of the 600 shared tokens
    // here), never more than was shared.
    assert!(
        got > 0.75 * want && got <= want + 0.02,
        "replayed cached share {got} vs the workload's {want}"
    );

    // bench replays it against the gateway, twice as fast.
    let replayed = dir.path.join("replayed.json");
    bench(vec![
        "--replay".into(),
        s(&trace),
        "--speed".into(),
        "2".into(),
        "--out".into(),
        s(&replayed),
    ])
    .await
    .ok("bench --replay --speed 2");
    let r = json(&replayed);
    assert_eq!(uint(&r, "requests"), sent, "{r}");
    assert_eq!(uint(&r, "ok"), sent, "{r}");
    let (original, fast) = (
        float(&json(&recorded), "duration_s"),
        float(&r, "duration_s"),
    );
    assert!(
        fast < original * 0.8,
        "twice as fast: {fast} s vs {original} s"
    );

    // A workload and a replay at once is a usage error.
    let both = bench(vec![
        "--workload".into(),
        "chat".into(),
        "--replay".into(),
        s(&trace),
    ])
    .await;
    assert_ne!(both.code, Some(0), "{}", both.stderr);
}
