//! End-to-end tests of the measurement tools, each a real `infergate` process: `plan kv` and
//! `plan spec` against hand calculations, `sim` (reports, determinism, policy comparison),
//! `plan capacity`, `bench` (and `bench diff`) against a live engine, and the simulator against
//! the live gateway on the same workload.

use crate::common;
use crate::tools_support;

use std::time::Duration;

use common::Engine;
use common::gateway::{Gateway, TempDir, config_yaml, line_of, routing_yaml};
use infergate_cli::report::Report;
use infergate_cli::workload::{self, Overrides};
use tools_support::{
    ShortWorkload, assert_close, float, infergate, infergate_json, read_report, report_of,
    shared_machine, uint, whole_machine,
};

const GIB: f64 = (1u64 << 30) as f64;

/// llama-3-8b (Meta-Llama-3-8B config.json): KV bytes per token = K and V × 32 layers × 8 KV
/// heads × head_dim 128 × 2 bytes (bf16).
const LLAMA3_8B_KV_BYTES_PER_TOKEN: u64 = 2 * 32 * 8 * 128 * 2;
/// Published parameter counts; weights are bf16 (2 bytes each).
const LLAMA3_8B_PARAMS: u64 = 8_030_261_248;
const LLAMA3_70B_PARAMS: u64 = 70_553_706_496;

/// Checks the block arithmetic of a `plan kv --json` answer against the printed budget.
fn check_kv_blocks(plan: &serde_json::Value, context: u64, mean_context: u64) {
    let block = uint(plan, "block_size");
    assert_eq!(block, 16, "{plan}");
    assert_eq!(
        (uint(plan, "context"), uint(plan, "mean_context")),
        (context, mean_context)
    );
    let bytes_per_token = uint(plan, "kv_bytes_per_token");
    assert_eq!(bytes_per_token, LLAMA3_8B_KV_BYTES_PER_TOKEN, "{plan}");
    assert_eq!(bytes_per_token, 131_072);
    // One GPU: the blocks are the KV bytes divided by the bytes of one block, rounded down.
    let kv_bytes = uint(plan, "kv_cache_bytes");
    let blocks = kv_bytes / (block * bytes_per_token);
    assert_eq!(uint(plan, "num_blocks"), blocks, "{plan}");
    assert_eq!(uint(plan, "kv_tokens"), blocks * block);

    let full = context.div_ceil(block);
    let mean = mean_context.div_ceil(block);
    assert_eq!(uint(plan, "blocks_per_full_seq"), full);
    assert_eq!(uint(plan, "blocks_per_mean_seq"), mean);
    assert_eq!(uint(plan, "seqs_at_full"), blocks / full);
    assert_eq!(uint(plan, "seqs_at_mean"), blocks / mean);
    assert_eq!(
        uint(plan, "full_requests_to_exhaust"),
        blocks.div_ceil(full)
    );
    assert_close(
        "displaced per full request",
        float(plan, "displaced_per_full_request"),
        full as f64 / mean as f64,
        1e-12,
    );
    let rows = plan["burst"].as_array().expect("burst rows");
    assert!(rows.len() >= 2, "{plan}");
    for row in rows {
        let f = uint(row, "full_requests");
        assert!(f <= blocks / full, "{row}");
        assert_eq!(uint(row, "mean_seqs"), (blocks - f * full) / mean, "{row}");
    }
    assert_eq!(uint(&rows[0], "full_requests"), 0);
    assert_eq!(uint(&rows[0], "mean_seqs"), blocks / mean);
}

/// The KV cache is what 90% of the GPU leaves after the bf16 weights and a runtime reserve of
/// at most a few GiB.
fn check_kv_budget(plan: &serde_json::Value, gpu_gib: f64) {
    let weights = uint(plan, "weight_bytes_per_gpu");
    assert_eq!(weights, 2 * LLAMA3_8B_PARAMS, "{plan}");
    let usable = 0.9 * gpu_gib * GIB;
    let left = usable - weights as f64;
    let kv = uint(plan, "kv_cache_bytes") as f64;
    assert!(
        kv < left && kv > left - 4.0 * GIB,
        "KV cache {:.2} GiB, but {:.2} GiB are left after the weights",
        kv / GIB,
        left / GIB
    );
}

#[tokio::test]
async fn plan_kv_matches_hand_calculation() {
    let _machine = shared_machine().await;
    let h100 = infergate_json(&[
        "plan",
        "kv",
        "--model",
        "llama-3-8b",
        "--gpu",
        "h100",
        "--json",
    ])
    .await;
    assert_eq!(h100["gpu"], "h100");
    // Defaults: the model's max_model_len (8,192) and a quarter of it as the mean.
    check_kv_blocks(&h100, 8192, 2048);
    check_kv_budget(&h100, 80.0);

    let mi300x = infergate_json(&[
        "plan",
        "kv",
        "--model",
        "llama-3-8b",
        "--gpu",
        "mi300x",
        "--context",
        "32768",
        "--mean-context",
        "4100",
        "--json",
    ])
    .await;
    assert_eq!(mi300x["gpu"], "mi300x");
    check_kv_blocks(&mi300x, 32_768, 4100);
    check_kv_budget(&mi300x, 192.0);
    // 4,100 tokens do not fill 256 blocks of 16: the 257th holds the last 4.
    assert_eq!(uint(&mi300x, "blocks_per_mean_seq"), 257);
    assert_eq!(uint(&mi300x, "blocks_per_full_seq"), 2048);
    let notes = mi300x["notes"].to_string();
    assert!(notes.contains("max_model_len"), "{notes}");
}

#[tokio::test]
async fn plan_kv_refuses_a_model_that_does_not_fit() {
    let _machine = shared_machine().await;
    let run = infergate(
        &["plan", "kv", "--model", "llama-3-70b", "--gpu", "h100"],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(run.code, Some(1), "{run:?}");
    let err = &run.stderr;
    // 70.55 B parameters × 2 bytes = 131.4 GiB against 80 GiB × 0.9 = 72.0 GiB.
    let need = format!("{:.1} GiB", (2 * LLAMA3_70B_PARAMS) as f64 / GIB);
    assert_eq!(need, "131.4 GiB");
    for needle in [need.as_str(), "72.0 GiB", "--tensor-parallel-size"] {
        assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    }
}

#[tokio::test]
async fn plan_spec_matches_the_formula() {
    let _machine = shared_machine().await;
    let spec = infergate_json(&["plan", "spec", "--alpha", "0.6", "--k", "4", "--json"]).await;
    // (1 − 0.6^5) / (1 − 0.6) = (1 − 0.07776) / 0.4.
    let expected = (1.0 - 0.07776) / 0.4;
    assert_close("E", expected, 2.3056, 1e-12);
    assert_close("E", float(&spec, "expected_tokens"), expected, 1e-9);
    assert_eq!(spec["draft_cost_source"], "default");
    assert_close("draft cost", float(&spec, "draft_cost"), 0.05, 1e-12);
    assert_close(
        "bound",
        float(&spec, "speedup_bound"),
        expected / (1.0 + 4.0 * 0.05),
        1e-9,
    );

    let none = infergate_json(&["plan", "spec", "--alpha", "0", "--k", "4", "--json"]).await;
    assert_close("E at alpha 0", float(&none, "expected_tokens"), 1.0, 1e-12);
    assert_close(
        "bound at alpha 0",
        float(&none, "speedup_bound"),
        1.0 / 1.2,
        1e-9,
    );
}

#[tokio::test]
async fn sim_reports_are_complete_and_deterministic() {
    let _machine = shared_machine().await;
    let dir = TempDir::new("tools-sim");
    let (a, b) = (dir.path.join("a.json"), dir.path.join("b.json"));
    let args = |out: &str| {
        [
            "sim",
            "--workload",
            "chat",
            "--workers",
            "4",
            "--duration",
            "20s",
            "--rate",
            "5",
            "--seed",
            "9",
            "--out",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain([out.to_owned()])
        .collect::<Vec<_>>()
    };
    for out in [&a, &b] {
        let args = args(&out.to_string_lossy());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        infergate(&args, Duration::from_secs(30)).await.ok("sim");
    }
    let report = read_report(&a);
    assert!(report.requests > 50, "{report:?}");
    assert_eq!(report.requests, report.ok, "{report:?}");
    assert!(report.ttft.p50 > 0.0 && report.itl.p50 > 0.0, "{report:?}");
    let hit = report.extra.get("prefix_cache_hit_rate").copied();
    assert!(
        hit.is_some_and(|h| h > 0.0 && h <= 1.0),
        "{:?}",
        report.extra
    );
    let (ja, jb) = (
        std::fs::read_to_string(&a).unwrap(),
        std::fs::read_to_string(&b).unwrap(),
    );
    assert_eq!(ja, jb, "two runs with the same seed differ");

    let run = infergate(
        &[
            "sim",
            "--workload",
            "chat",
            "--workers",
            "4",
            "--duration",
            "20s",
            "--rate",
            "5",
            "--compare-policies",
            "prefix,round_robin",
        ],
        Duration::from_secs(30),
    )
    .await;
    let text = run.ok("sim --compare-policies");
    let header = text
        .lines()
        .find(|l| l.starts_with("policy"))
        .unwrap_or_else(|| panic!("no policy header:\n{text}"));
    assert!(
        header.contains("prefix") && header.contains("round_robin"),
        "{header}"
    );
}

#[tokio::test]
async fn plan_capacity_adds_one_replica_of_headroom() {
    let _machine = shared_machine().await;
    let run = infergate(
        &[
            "plan",
            "capacity",
            "--workload",
            "chat",
            "--rate",
            "300",
            "--duration",
            "5s",
        ],
        Duration::from_secs(50),
    )
    .await;
    let text = run.ok("plan capacity");
    let line = text
        .lines()
        .find(|l| l.starts_with("replicas needed:"))
        .unwrap_or_else(|| panic!("no `replicas needed:` line:\n{text}"));
    // `replicas needed: N (M with headroom for one replica lost)`
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let [needed, headroom] = numbers[..] else {
        panic!("expected two numbers in {line:?}");
    };
    assert!(needed > 1, "300 requests/s need more than one h100: {text}");
    assert_eq!(headroom, needed + 1, "{line}");
}

#[tokio::test]
async fn bench_measures_a_live_engine() {
    let _machine = shared_machine().await;
    let dir = TempDir::new("tools-bench");
    let shape = ShortWorkload {
        rate: 10.0,
        seconds: 3,
        prompt: (40, 80),
        output: 20,
        seed: 17,
    };
    let path = shape.write(&dir.path, "short");
    let planned = workload::load_file(&path)
        .and_then(|w| w.plan(&Overrides::default()))
        .expect("plan the workload");
    assert!(planned.len() > 10, "{} requests planned", planned.len());
    let planned_tokens: u64 = planned.iter().map(|r| u64::from(r.output_tokens)).sum();

    let engine = Engine::start(&["--gpu", "h100"]).await;
    let mut reports: Vec<(std::path::PathBuf, Report)> = Vec::new();
    for (name, seed) in [("a", "17"), ("b", "18")] {
        let path_s = path.to_string_lossy().into_owned();
        let args = [
            "bench",
            "--url",
            &engine.url,
            "--workload",
            &path_s,
            "--seed",
            seed,
            "--quiet",
        ];
        let report = report_of(&dir.path, name, &args, Duration::from_secs(30)).await;
        reports.push((dir.path.join(format!("{name}.json")), report));
    }
    let a = &reports[0].1;
    assert_eq!(a.requests, planned.len() as u64, "{a:?}");
    assert_eq!(a.ok, a.requests, "{a:?}");
    for (name, p) in [("TTFT", &a.ttft), ("ITL", &a.itl), ("E2E", &a.e2e)] {
        assert!(
            p.p50 > 0.0 && p.p50 <= p.p90 && p.p90 <= p.p99 && p.p99 <= p.max,
            "{name} {p:?}"
        );
    }
    // Every planned token came back, over the run's wall time.
    assert_close(
        "tokens out",
        a.tokens_out_per_s * a.duration_s,
        planned_tokens as f64,
        0.5,
    );
    let planned_rate = planned_tokens as f64 / f64::from(shape.seconds);
    let ratio = a.tokens_out_per_s / planned_rate;
    assert!(
        (0.7..=1.3).contains(&ratio),
        "tokens/s out {:.1} vs planned {planned_rate:.1} ({} tokens / {} s)",
        a.tokens_out_per_s,
        planned_tokens,
        shape.seconds
    );

    let (pa, pb) = (
        reports[0].0.to_string_lossy().into_owned(),
        reports[1].0.to_string_lossy().into_owned(),
    );
    let run = infergate(&["bench", "diff", &pa, &pb], Duration::from_secs(30)).await;
    let table = run.ok("bench diff");
    assert!(table.contains("TTFT"), "{table}");
}

/// The live run and the simulation of one workload, side by side for failure messages.
fn side_by_side(live: &Report, sim: &Report) -> String {
    let row = |name: &str, r: &Report| {
        format!(
            "{name}: requests {} ok {} duration {:.2} s · tokens/s in {:.1} out {:.1} · \
             TTFT p50 {:.1} p90 {:.1} mean {:.1} ms · ITL p50 {:.1} mean {:.1} ms · E2E p50 {:.1} ms",
            r.requests,
            r.ok,
            r.duration_s,
            r.tokens_in_per_s,
            r.tokens_out_per_s,
            r.ttft.p50 * 1e3,
            r.ttft.p90 * 1e3,
            r.ttft.mean * 1e3,
            r.itl.p50 * 1e3,
            r.itl.mean * 1e3,
            r.e2e.p50 * 1e3,
        )
    };
    format!("\n{}\n{}", row("live", live), row("sim ", sim))
}

/// `b / a − 1`.
fn rel(a: f64, b: f64) -> f64 {
    b / a - 1.0
}

/// Runs `shape` through `bench` against a gateway over two `--gpu l4` engines routed round robin,
/// and through `sim` with the same fleet; returns (live, sim).
async fn live_and_sim(dir: &TempDir, shape: ShortWorkload, endpoint: &str) -> (Report, Report) {
    let path = shape.write(&dir.path, "faithful");
    let path_s = path.to_string_lossy().into_owned();
    let slow = ["--gpu", "l4", "--fault-latency-multiplier", SLOWDOWN];
    let e1 = Engine::start(&slow).await;
    let e2 = Engine::start(&slow).await;
    dir.write_routing(&routing_yaml("round_robin", &[]));
    dir.write_config(&config_yaml(&[&e1.url, &e2.url], ""));
    let gateway = Gateway::start(&dir.config(), &[("RUST_LOG", "warn")]).await;

    let bench = [
        "bench",
        "--url",
        &gateway.url,
        "--workload",
        &path_s,
        "--endpoint",
        endpoint,
        "--quiet",
    ];
    let limit = Duration::from_secs(u64::from(shape.seconds) + 30);
    let live = report_of(&dir.path, &format!("live-{endpoint}"), &bench, limit).await;
    drop(gateway);
    drop((e1, e2));

    let sim = [
        "sim",
        "--workload",
        &path_s,
        "--workers",
        "2",
        "--gpu",
        "l4",
        "--policy",
        "round_robin",
        "--fault-latency-multiplier",
        SLOWDOWN,
        "--endpoint",
        endpoint,
    ];
    let sim = report_of(&dir.path, "sim", &sim, Duration::from_secs(30)).await;
    (live, sim)
}

/// ~60 requests of ~500 prompt tokens and 16 output tokens over 15 s on two L4s slowed 4x (both
/// sides): step times (~300 ms) dwarf the ~30 ms of fixed HTTP, tokenizer and debug-build CPU cost
/// per request that a loaded 2-core CI machine adds to every live TTFT.
const FAITHFUL: ShortWorkload = ShortWorkload {
    rate: 4.0,
    seconds: 15,
    prompt: (400, 600),
    output: 16,
    seed: 5,
};

/// Step-time multiplier of both the live engines and the simulated ones.
const SLOWDOWN: &str = "4";

/// The simulator agrees with the live gateway within 15% on throughput and TTFT p50. The
/// completions endpoint sends the planned prompt as is, so both sides prefill the same tokens.
#[tokio::test]
async fn sim_agrees_with_the_live_gateway() {
    let _machine = whole_machine().await;
    let dir = TempDir::new("tools-faithful");
    let (live, sim) = live_and_sim(&dir, FAITHFUL, "completions").await;
    let numbers = side_by_side(&live, &sim);
    assert!(live.requests > 40, "{numbers}");
    assert_eq!(live.requests, sim.requests, "{numbers}");
    assert_eq!(
        (live.ok, sim.ok),
        (live.requests, sim.requests),
        "{numbers}"
    );
    // Same prompts token for token.
    let (tin_live, tin_sim) = (
        live.tokens_in_per_s * live.duration_s,
        sim.tokens_in_per_s * sim.duration_s,
    );
    assert_close("prompt tokens", tin_live, tin_sim, 0.5 + tin_sim * 1e-9);
    let tput = rel(sim.tokens_out_per_s, live.tokens_out_per_s);
    assert!(
        tput.abs() <= 0.15,
        "tokens/s out differ by {:+.1}%{numbers}",
        tput * 100.0
    );
    let ttft = rel(sim.ttft.p50, live.ttft.p50);
    assert!(
        ttft.abs() <= 0.15,
        "TTFT p50 differs by {:+.1}% (live vs sim){numbers}",
        ttft * 100.0
    );
}

/// `bench` defaults to the chat endpoint, where the engine wraps the planned prompt in its chat
/// template; the simulator must prefill the same prompt tokens the live engine does.
#[tokio::test]
async fn sim_prefills_the_prompt_tokens_bench_sends() {
    let _machine = shared_machine().await;
    let dir = TempDir::new("tools-chat-tokens");
    let shape = ShortWorkload {
        rate: 10.0,
        seconds: 2,
        prompt: (400, 600),
        output: 4,
        seed: 23,
    };
    let path = shape.write(&dir.path, "chat-tokens");
    let path_s = path.to_string_lossy().into_owned();
    let engine = Engine::start(&["--gpu", "h100"]).await;
    let bench = [
        "bench",
        "--url",
        &engine.url,
        "--workload",
        &path_s,
        "--quiet",
    ];
    let live = report_of(&dir.path, "live", &bench, Duration::from_secs(30)).await;
    let sim = ["sim", "--workload", &path_s, "--workers", "1"];
    let sim = report_of(&dir.path, "sim", &sim, Duration::from_secs(30)).await;
    assert_eq!((live.ok, sim.ok), (live.requests, sim.requests));
    assert_eq!(live.requests, sim.requests);
    let live_in = (live.tokens_in_per_s * live.duration_s).round();
    let sim_in = (sim.tokens_in_per_s * sim.duration_s).round();
    let per_request = (live_in - sim_in) / live.requests as f64;
    assert!(
        (live_in - sim_in).abs() <= 0.01 * sim_in,
        "the live engine prefilled {live_in} prompt tokens, the simulation {sim_in} \
         ({per_request:+.1} per request, {:+.1}%): sim does not model the chat template \
         bench's default endpoint goes through",
        100.0 * rel(sim_in, live_in)
    );
}

#[tokio::test]
async fn a_public_admin_listen_flag_needs_an_admin_key() {
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args([
                "gateway",
                "--config",
                &format!("{}/config/infergate.yaml", crate::common::REPO),
            ])
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "0.0.0.0:0"])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("exits at once")
    .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not a loopback address"), "{stderr}");
}

#[tokio::test]
async fn bench_without_a_key_against_up_stops_with_the_fix_and_fails() {
    let _machine = shared_machine().await;
    let gw = Gateway::up(None).await;
    let dir = TempDir::new("tools-bench-401");
    let out = dir.path.join("report.json").to_string_lossy().into_owned();
    let started = std::time::Instant::now();
    let run = infergate(
        &[
            "bench",
            "--url",
            &gw.url,
            "--workload",
            "chat",
            "--duration",
            "20s",
            "--out",
            &out,
            "--quiet",
        ],
        Duration::from_secs(60),
    )
    .await;
    assert_ne!(run.code, Some(0), "{}", run.stdout);
    assert!(
        run.stderr.contains("401/403") && run.stderr.contains("pass --api-key"),
        "{}",
        run.stderr
    );
    // Stopped after the first refusals, not after the 20 s asked for.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn logs_written_to_a_file_carry_no_colour_codes() {
    use tokio::io::AsyncBufReadExt;
    let dir = TempDir::new("tools-nocolor");
    let log = dir.path.join("engine.log");
    let file = std::fs::File::create(&log).expect("log file");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(["engine", "--backend", "sim", "--port", "0"])
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the engine");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
    assert!(matches!(first, Ok(Ok(Some(_)))), "{first:?}");
    let text =
        common::gateway::eventually("the engine's log line", Duration::from_secs(10), || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            async move { text.contains("engine ready").then_some(text) }
        })
        .await;
    let _ = child.start_kill();
    assert!(
        !text.contains('\u{1b}'),
        "ANSI escapes in a log file:\n{text:?}"
    );
}

#[tokio::test]
async fn config_check_reports_every_error_of_every_section_with_its_line() {
    // The shipped config and policies, with one error in each of four sections: routing.yaml's
    // pools:, its canary models: and its shadows:, and degradation.yaml's levels.
    let dir = TempDir::new("config-check-lines");
    let root = std::path::Path::new(crate::common::REPO);
    std::fs::create_dir_all(dir.path.join("config")).unwrap();
    std::fs::copy(
        root.join("config/infergate.yaml"),
        dir.path.join("config/infergate.yaml"),
    )
    .unwrap();
    for f in ["tenants.yaml", "prices.yaml"] {
        std::fs::copy(
            root.join("policies").join(f),
            dir.path.join("policies").join(f),
        )
        .unwrap();
    }
    let routing = std::fs::read_to_string(root.join("policies/routing.yaml"))
        .unwrap()
        .replace("min_match_blocks: 1 ", "min_match_blocks: 0 ")
        .replace("max_error_rate_delta: 0.02", "max_error_rate_delta: 2.5")
        .replace(
            "# shadows:\n#   llama-3-8b: {model: llama-3-8b-next, share: 0.05, max_concurrency: 8}",
            "shadows:\n  llama-3-8b: {model: llama-3-8b, share: 1.5, max_concurrency: 8}",
        );
    let degradation = std::fs::read_to_string(root.join("policies/degradation.yaml"))
        .unwrap()
        .replace("- shed: {tiers: [free]}", "- shed: {tiers: [gold]}");
    std::fs::write(dir.path.join("policies/routing.yaml"), &routing).unwrap();
    std::fs::write(dir.path.join("policies/degradation.yaml"), &degradation).unwrap();

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(["config", "check", "--config"])
        .arg(dir.path.join("config/infergate.yaml"))
        .output()
        .expect("run infergate config check");
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let expect = [
        (
            "routing.yaml",
            line_of(&routing, "min_match_blocks: 0"),
            "min_match_blocks",
        ),
        (
            "routing.yaml",
            line_of(&routing, "max_error_rate_delta: 2.5"),
            "max_error_rate_delta 2.5",
        ),
        (
            "routing.yaml",
            line_of(&routing, "share: 1.5"),
            "share must be in 0..=1, got 1.5",
        ),
        (
            "degradation.yaml",
            line_of(&degradation, "tiers: [gold]"),
            "unknown tier `gold`",
        ),
    ];
    for (file, line, what) in expect {
        let found = text
            .lines()
            .any(|l| l.contains(what) && l.contains(&format!("{file}:{line}:")));
        assert!(found, "no `{file}:{line}:` line saying {what:?}:\n{text}");
    }
}
