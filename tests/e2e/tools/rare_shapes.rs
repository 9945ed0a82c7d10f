//! Victims and culprits (issue 43) the way an operator runs them. `sim` on the shipped
//! `rare-shapes` workload: the chat requests that decoded beside a long prompt's prefill chunk
//! (a step past the captured budget) have a worse ITL p99 than the rest, and the `--out` JSON
//! carries `by_class` and `victims`. `bench --expect-path` against a gateway and a sim engine
//! with small capture sizes and a few long prompts: a satisfiable expectation passes, an
//! impossible one exits non-zero naming the class.

use crate::common;
use crate::tools_support;

use std::time::Duration;

use common::Engine;
use common::gateway::{Gateway, POOL, TempDir, config_yaml, routing_yaml};
use serde_json::Value;
use tools_support::{float, infergate, uint};

#[tokio::test]
async fn sim_on_rare_shapes_shows_the_victims_of_the_long_prompts() {
    let dir = TempDir::new("rare-shapes-sim");
    let out = dir.path.join("sim.json");
    let out_s = out.to_string_lossy().into_owned();
    let args = [
        "sim",
        "--workload",
        "rare-shapes",
        "--workers",
        "1",
        "--policy",
        "least_load",
        // Long prompts in chunks of 2,048 tokens: a few long steps per victim, not one.
        "--max-num-batched-tokens",
        "2048",
        "--duration",
        "60s",
        "--seed",
        "1",
        "--out",
        &out_s,
    ];
    let run = infergate(&args, Duration::from_secs(60)).await;
    let text = run.ok("sim --workload rare-shapes");
    assert!(text.contains("chat shared a step"), "{text}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let classes = &report["by_class"];
    for class in ["chat", "long"] {
        assert!(uint(&classes[class], "ok") > 0, "{class}: {classes}");
    }
    assert!(
        uint(&classes["long"]["by_path"]["mixed"], "ok") > 0,
        "long prompts take several eager chunks: {classes}"
    );
    let v = &report["victims"];
    assert_eq!(v["class"], "chat", "{v}");
    assert_eq!(
        uint(v, "unknown"),
        0,
        "the simulator knows every request: {v}"
    );
    let (shared, clean) = (&v["shared"], &v["not_shared"]);
    assert!(
        uint(shared, "requests") > 0 && uint(clean, "requests") > uint(shared, "requests"),
        "{v}"
    );
    let (hit, calm) = (float(shared, "itl_p99"), float(clean, "itl_p99"));
    assert!(
        hit > 2.0 * calm,
        "victims' ITL p99 {hit} s against the others' {calm} s: {v}"
    );
    assert!(
        float(v, "tail_share") > 0.5,
        "the victims hold most of the chat class's ITL tail: {v}"
    );
}

/// Short chats and a few long prompts, chunked by the engine into several eager steps.
const TWO_CLASSES: &str = r"name: two-classes
seed: 5
duration: 2s
arrival:
  poisson: {rate: 10}
classes:
  - name: short
    weight: 0.8
    prompt_tokens: {dist: uniform, min: 20, max: 40}
    output_tokens: {dist: fixed, value: 16}
  - name: long
    weight: 0.2
    prompt_tokens: {dist: uniform, min: 1500, max: 2000}
    output_tokens: {dist: fixed, value: 32}
slo: {ttft: 2s, itl: 500ms}
";

/// A sim engine capturing batches up to 8, in steps of at most 512 tokens: `TWO_CLASSES`' long
/// prompts take several eager chunks (`mixed`), its short ones decode on graphs.
async fn small_capture_engine() -> Engine {
    Engine::start(&[
        "--cuda-graph-sizes",
        "1,2,4,8",
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        "512",
        // Runs send the same prompts again: no cached prefix may shorten their prefill.
        "--no-prefix-caching",
    ])
    .await
}

#[tokio::test]
async fn bench_expect_path_passes_a_path_taken_and_fails_one_missed() {
    let _machine = tools_support::shared_machine().await;
    let engine = small_capture_engine().await;
    let dir = TempDir::new("rare-shapes-bench");
    // The test config sets `debug_headers: true`: the flight record reaches the client.
    dir.write_config(&config_yaml(&[engine.url.as_str()], ""));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let workload = dir.path.join("two-classes.yaml");
    std::fs::write(&workload, TWO_CLASSES).unwrap();
    let workload_s = workload.to_string_lossy().into_owned();
    let bench = |expect: &'static str, out: &'static str| {
        let out = dir.path.join(out).to_string_lossy().into_owned();
        let mut args = vec![
            "bench".to_owned(),
            "--url".to_owned(),
            gw.url.clone(),
            "--workload".to_owned(),
            workload_s.clone(),
            "--quiet".to_owned(),
            "--expect-path".to_owned(),
            expect.to_owned(),
            "--out".to_owned(),
            out,
        ];
        if let Some(key) = &gw.api_key {
            args.extend(["--api-key".to_owned(), key.clone()]);
        }
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            infergate(&args, Duration::from_secs(30)).await
        }
    };

    // Prompts of 1,500 tokens and more in steps of at most 512: several eager chunks, then
    // graph decodes (at most 8 in flight, all captured): every long request is `mixed`.
    let run = bench("long=mixed", "pass.json").await;
    let text = run.ok("bench --expect-path long=mixed");
    assert!(
        text.contains("expect-path long=mixed: ok — 100.0% of"),
        "{text}"
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path.join("pass.json")).unwrap())
            .unwrap();
    assert!(uint(&report["by_class"]["long"], "ok") > 0, "{report}");
    let v = &report["victims"];
    assert_eq!(v["class"], "short", "{v}");
    assert_eq!(
        uint(v, "unknown"),
        0,
        "the gateway relayed every flight record: {v}"
    );

    let run = bench("long=graph", "fail.json").await;
    assert_ne!(run.code, Some(0), "an impossible path must fail the run");
    assert!(
        run.stderr.contains("`long`") && run.stderr.contains("did not take the intended path"),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout
            .contains("expect-path long=graph: MISSED — 0.0% of"),
        "{}",
        run.stdout
    );
    assert!(dir.path.join("fail.json").exists(), "the report is written");
}

/// The gateway's trace keeps each request's shape class, and a replay of it is reported and
/// checked by those classes: `bench` records the two classes through a gateway whose
/// routing.yaml names the long prompts `long-prompt`; `bench --replay` of its trace file
/// passes `--expect-path long-prompt=mixed` and fails `long-prompt=graph`.
#[tokio::test]
async fn a_replayed_gateway_trace_is_checked_by_its_shape_classes() {
    let _machine = tools_support::shared_machine().await;
    let engine = small_capture_engine().await;
    let dir = TempDir::new("rare-shapes-replay");
    dir.write_config(&config_yaml(
        &[engine.url.as_str()],
        "trace: {path: trace.jsonl, sample: 1, max_bytes: 4194304, keep: 2}\n",
    ));
    dir.write_routing(&format!(
        "{}shape_classes:\n  - name: long-prompt\n    match: {{prompt_tokens: {{min: 1000}}}}\n    \
         pool: {POOL}\n",
        routing_yaml("round_robin", &[])
    ));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let workload = dir.path.join("two-classes.yaml");
    std::fs::write(&workload, TWO_CLASSES).unwrap();
    let bench = |source: [&str; 2], expect: Option<&str>, out: &str| {
        let mut args: Vec<String> = ["bench", "--url", gw.url.as_str(), "--quiet", "--out"]
            .iter()
            .map(|a| (*a).to_owned())
            .collect();
        args.push(dir.path.join(out).to_string_lossy().into_owned());
        args.extend(source.iter().map(|a| (*a).to_owned()));
        if let Some(e) = expect {
            args.extend(["--expect-path".to_owned(), e.to_owned()]);
        }
        if let Some(key) = &gw.api_key {
            args.extend(["--api-key".to_owned(), key.clone()]);
        }
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            infergate(&args, Duration::from_secs(30)).await
        }
    };
    let workload_s = workload.to_string_lossy().into_owned();
    let recorded = bench(["--workload", workload_s.as_str()], None, "recorded.json").await;
    recorded.ok("bench two-classes");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path.join("recorded.json")).unwrap())
            .unwrap();
    let sent = uint(&report, "requests");
    let long = uint(&report["by_class"]["long"], "requests");
    assert!(long > 0 && sent > long, "{report}");

    // Every request leaves its line, named by the class routing.yaml put it in.
    let trace = dir.path.join("trace.jsonl");
    let lines: Vec<Value> = common::eventually(
        "a trace line per request",
        Duration::from_secs(10),
        || async {
            let lines: Vec<Value> = std::fs::read_to_string(&trace)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            (lines.len() as u64 == sent).then_some(lines)
        },
    )
    .await;
    let named = |c: &str| lines.iter().filter(|l| l["class"] == c).count() as u64;
    assert_eq!(
        named("long-prompt"),
        long,
        "the long prompts, by the gateway's estimate"
    );
    assert_eq!(named("unclassified"), sent - long);

    let trace_s = trace.to_string_lossy().into_owned();
    let replay = ["--replay", trace_s.as_str()];
    let run = bench(replay, Some("long-prompt=mixed"), "replayed.json").await;
    let text = run.ok("bench --replay --expect-path long-prompt=mixed");
    assert!(
        text.contains("expect-path long-prompt=mixed: ok — 100.0% of"),
        "{text}"
    );
    let replayed: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path.join("replayed.json")).unwrap())
            .unwrap();
    assert_eq!(
        uint(&replayed["by_class"]["long-prompt"], "ok"),
        long,
        "{replayed}"
    );
    assert_eq!(
        uint(&replayed["by_class"]["unclassified"], "requests"),
        sent - long
    );

    let run = bench(replay, Some("long-prompt=graph"), "missed.json").await;
    assert_ne!(run.code, Some(0), "an impossible path must fail the replay");
    assert!(
        run.stdout
            .contains("expect-path long-prompt=graph: MISSED — 0.0% of"),
        "{}",
        run.stdout
    );
    // A class the trace does not name is refused before anything is sent.
    let run = bench(replay, Some("chat=graph"), "unknown.json").await;
    assert_ne!(run.code, Some(0));
    assert!(run.stderr.contains("chat"), "{}", run.stderr);
}

/// `infergate sim` on the shipped scenario's config with `--engine-args-from-config`: its
/// report, parsed.
async fn scenario_sim(dir: &TempDir, config: &str, extra: &[&str], name: &str) -> Value {
    let config = format!(
        "{}/config/scenarios/rare-shapes/{config}",
        crate::common::REPO
    );
    let out = dir.path.join(name).to_string_lossy().into_owned();
    let mut args = vec![
        "sim",
        "--workload",
        "rare-shapes",
        "--gateway-config",
        config.as_str(),
        "--engine-args-from-config",
        "--duration",
        "60s",
        "--out",
        out.as_str(),
    ];
    args.extend_from_slice(extra);
    infergate(&args, Duration::from_secs(60))
        .await
        .ok("sim on the rare-shapes scenario");
    serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap()
}

#[tokio::test]
async fn the_shape_class_lever_keeps_chat_off_the_long_chunks_on_the_same_engines() {
    let dir = TempDir::new("rare-shapes-lever");
    let before = scenario_sim(&dir, "infergate.yaml", &[], "before.json").await;
    let chat = scenario_sim(&dir, "lever.yaml", &["--pool", "local"], "chat.json").await;
    let long = scenario_sim(&dir, "lever.yaml", &["--pool", "long"], "long.json").await;
    let class = |r: &Value, c: &str| r["by_class"][c].clone();
    let (b, l) = (class(&before, "chat"), class(&chat, "chat"));
    // The class's requests went to the other pool: every chat request is this pool's alone.
    assert_eq!(
        float(&chat["extra"], "shape_class_elsewhere"),
        float(&class(&before, "long"), "requests")
    );
    assert!(chat["by_class"]["long"].is_null(), "{}", chat["by_class"]);
    assert_eq!(uint(&l, "requests"), uint(&b, "requests"));
    // Before, the answers decoding beside a long chunk froze; with the class none does.
    let (was, now) = (float(&b, "worst_gap_p99"), float(&l, "worst_gap_p99"));
    assert!(now * 2.0 <= was, "worst gap p99 {was} -> {now}");
    assert_eq!(float(&l, "goodput"), 1.0, "{l}");
    assert!(
        chat["by_class"]["chat"]["by_path"]["mixed"].is_null(),
        "every chat answer took the graph path: {}",
        chat["by_class"]["chat"]
    );
    // The long prompts are served on their own engine, not refused.
    let lc = class(&long, "long");
    assert!(
        uint(&lc, "ok") > 0 && uint(&lc, "ok") == uint(&lc, "requests"),
        "{lc}"
    );
}

/// Lever 1 the way an operator pulls it, all in the simulator: a small model's engine captures
/// batch sizes up to 16, a burst pushes its running batch past them (every step of the burst
/// eager); `sim --trace` writes the flight records, `shapes --propose` chooses sizes from the
/// first half and checks them on the second, and the same traffic on the proposed sizes keeps
/// every answer on the graph path, the burst's answers decoding at least twice as fast.
#[tokio::test]
async fn sizes_proposed_from_a_sim_trace_keep_a_burst_on_the_graph_path() {
    let dir = TempDir::new("rare-shapes-lever1");
    let workload = dir.path.join("bursts.yaml");
    std::fs::write(
        &workload,
        "name: bursts\nseed: 5\nduration: 40s\narrival:\n  stages:\n\
         \x20   - {rate: 2, duration: 10s}\n    - {rate: 80, duration: 500ms}\n\
         \x20   - {rate: 2, duration: 14500ms}\n    - {rate: 80, duration: 500ms}\n\
         \x20   - {rate: 2, duration: 14500ms}\n\
         prompt_tokens: {dist: fixed, value: 8}\n\
         output_tokens: {dist: lognormal, mean: 600, sigma: 0.2, min: 200, max: 1200}\n\
         correlation: 0\nslo: {ttft: 1s, itl: 5ms}\n",
    )
    .unwrap();
    let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let (workload_s, trace) = (s(&workload), dir.path.join("before.jsonl"));
    let sim = |sizes: String, most: u64, out: String, trace: Option<String>| {
        let mut args: Vec<String> = [
            "sim",
            "--workload",
            &workload_s,
            "--workers",
            "1",
            "--policy",
            "least_load",
            "--model",
            "qwen2.5-0.5b",
            "--endpoint",
            "completions",
            "--cuda-graph-sizes",
            &sizes,
            "--out",
            &out,
        ]
        .map(str::to_owned)
        .to_vec();
        for flag in ["--max-num-seqs", "--max-num-batched-tokens"] {
            args.extend([flag.to_owned(), most.to_string()]);
        }
        args.extend(trace.into_iter().flat_map(|t| ["--trace".to_owned(), t]));
        args
    };
    let before_out = s(&dir.path.join("before.json"));
    let args = sim("1,2,4,8,16".into(), 64, before_out.clone(), Some(s(&trace)));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = infergate(&args, Duration::from_secs(60)).await;
    assert!(run.ok("sim --trace").contains("trace: "), "{}", run.ok(""));
    let before: Value =
        serde_json::from_str(&std::fs::read_to_string(&before_out).unwrap()).unwrap();
    let off: u64 = before["by_path"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(path, _)| *path != "graph")
        .map(|(_, v)| uint(v, "ok"))
        .sum();
    assert!(
        off > 0,
        "the burst leaves the fast path: {}",
        before["by_path"]
    );

    let trace_s = s(&trace);
    let shapes = [
        "shapes",
        &trace_s,
        "--propose",
        "--holdout",
        "--target-share",
        "1",
        "--model",
        "qwen2.5-0.5b",
        "--json",
    ];
    let run = infergate(&shapes, Duration::from_secs(30)).await;
    let p: Value = serde_json::from_str(run.ok("shapes --propose")).unwrap();
    assert_eq!(
        uint(&p, "bad_lines"),
        0,
        "the sim's trace lines are trace lines: {p}"
    );
    let sizes: Vec<u64> = p["proposed"]["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    let largest = *sizes.last().unwrap();
    assert!(
        largest > 16,
        "the burst's batches call for larger sizes: {sizes:?}"
    );
    assert!(
        float(&p["proposed"]["holdout"], "coverage") > float(&p["current"]["holdout"], "coverage"),
        "checked on the second burst, which the proposal did not see: {p}"
    );

    let after_out = s(&dir.path.join("after.json"));
    let joined = sizes
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    // With as many sequences and tokens a step as the largest size (lever.yaml's rule), no step
    // can outgrow the captured sizes.
    let args = sim(joined.clone(), largest, after_out.clone(), None);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    infergate(&args, Duration::from_secs(60))
        .await
        .ok("sim, proposed sizes");
    let after: Value = serde_json::from_str(&std::fs::read_to_string(&after_out).unwrap()).unwrap();
    let paths = after["by_path"].as_object().unwrap();
    assert_eq!(
        paths.keys().collect::<Vec<_>>(),
        ["graph"],
        "every answer on the graph path: {paths:?}"
    );
    // The burst's answers decode at the graph path's pace: the slowest answers' mean gap (TPOT
    // p99 over answers) falls by more than half (eager steps of a 0.5B model cost ~3x a graph's).
    let (b, a) = (float(&before["tpot"], "p99"), float(&after["tpot"], "p99"));
    assert!(
        a * 2.0 < b,
        "TPOT p99 with the burst's steps captured: {b} -> {a}"
    );

    // The trace is also a workload (how the lever is replayed live): replayed (as completions,
    // like the run that wrote it), the same traffic on the proposed sizes decodes as the
    // workload did, every request under its workload class.
    let replay_out = s(&dir.path.join("replayed.json"));
    let mut args = sim(joined, largest, replay_out.clone(), None);
    let at = args.iter().position(|a| a == "--workload").unwrap();
    args.splice(at..at + 2, ["--replay", &trace_s].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    infergate(&args, Duration::from_secs(60))
        .await
        .ok("sim --replay of the sim's trace");
    let replayed: Value =
        serde_json::from_str(&std::fs::read_to_string(&replay_out).unwrap()).unwrap();
    assert_eq!(
        uint(&replayed["by_class"]["default"], "ok"),
        uint(&after, "requests"),
        "{}",
        replayed["by_class"]
    );
    let r = float(&replayed["tpot"], "p99");
    assert!(
        (r - a).abs() <= 0.05 * a,
        "TPOT p99 replayed {r} against {a}"
    );
}
