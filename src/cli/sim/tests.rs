//! Tests of the simulator on small fleets and short runs (debug builds: seconds, not minutes).

use std::path::Path;
use std::time::Duration;

use clap::Parser;
use infergate_engine::presets;

use super::*;
use crate::workload::{self, Workload};
use infergate::routing::PolicyConfig;

/// Four workers; everything else as `infergate sim` defaults.
fn small_fleet() -> SimConfig {
    SimConfig {
        workers: 4,
        ..SimConfig::default()
    }
}

/// The chat workload for 20 s at 5 requests/s.
fn chat() -> (Workload, Overrides) {
    let w = workload::load("chat").expect("chat ships");
    let o = Overrides {
        duration: Some(Duration::from_secs(20)),
        rate: Some(5.0),
        seed: None,
    };
    (w, o)
}

fn policy(name: &str) -> PolicyConfig {
    policy_config(name).expect("known policy")
}

#[test]
fn same_seed_gives_the_same_report() {
    let (w, o) = chat();
    let a = simulate(&small_fleet(), &w, &o, &policy("prefix")).expect("runs");
    let b = simulate(&small_fleet(), &w, &o, &policy("prefix")).expect("runs");
    assert_eq!(a.report.to_json(), b.report.to_json());
    assert_eq!(a.steps, b.steps);
    let other = Overrides { seed: Some(7), ..o };
    let c = simulate(&small_fleet(), &w, &other, &policy("prefix")).expect("runs");
    assert_ne!(a.report.to_json(), c.report.to_json(), "the seed matters");
}

#[test]
fn every_planned_request_is_recorded_and_served() {
    let (w, o) = chat();
    let planned = w.plan(&o).expect("plan").len() as u64;
    let r = simulate(&small_fleet(), &w, &o, &policy("least_load"))
        .expect("runs")
        .report;
    assert!(planned > 50, "{planned}");
    assert_eq!(r.requests, planned);
    assert_eq!(r.ok, planned, "an unloaded fleet serves everything");
    assert!(r.duration_s >= 19.0, "{}", r.duration_s);
    assert_eq!(r.by_worker.len(), 4);
    let served: u64 = r.by_worker.values().map(|b| b.requests).sum();
    assert_eq!(served, planned);
    // Answers are exactly the planned lengths (ignore_eos), first token included in TTFT.
    let planned_out: u64 = w
        .plan(&o)
        .expect("plan")
        .iter()
        .map(|p| p.output_tokens as u64)
        .sum();
    let out = r.tokens_out_per_s * r.duration_s;
    assert!(
        (out - planned_out as f64).abs() < 1.0,
        "{out} vs {planned_out}"
    );
    for key in [
        "prefix_cache_hit_rate",
        "kv_usage_mean",
        "preemptions",
        "steps_graph_share",
    ] {
        assert!(r.extra.contains_key(key), "{key}");
    }
    let graph = r.extra["steps_graph_share"];
    assert!(graph > 0.5 && graph < 1.0, "mostly decode steps: {graph}");
}

#[test]
fn prefix_routing_hits_the_cache_more_than_round_robin() {
    let (w, o) = chat();
    let hit = |name| {
        let r = simulate(&small_fleet(), &w, &o, &policy(name)).expect("runs");
        r.report.extra["prefix_cache_hit_rate"]
    };
    let (prefix, rr) = (hit("prefix"), hit("round_robin"));
    assert!(prefix > rr, "prefix {prefix} vs round_robin {rr}");
    assert!(
        prefix > 0.8,
        "chat prompts are ~94% shared system prompt: {prefix}"
    );
}

/// A single client sending 2,000-token prompts of fresh words one after another: every request
/// finds an idle fleet and a cold cache, so its TTFT is one prefill step.
const IDLE: &str = "name: idle\nseed: 1\nduration: 5s\narrival: {closed: {concurrency: 1}}\n\
                    prompt_tokens: {dist: fixed, value: 2000}\noutput_tokens: {dist: fixed, value: 4}\n";

#[test]
fn ttft_on_an_idle_fleet_is_the_roofline_prefill_time() {
    let w = workload::parse(IDLE, Path::new("idle.yaml"), "idle", None).expect("valid");
    let r = simulate(
        &small_fleet(),
        &w,
        &Overrides::default(),
        &policy("round_robin"),
    )
    .expect("runs")
    .report;
    assert_eq!(r.requests, 5, "closed loop: concurrency × seconds");
    assert_eq!(r.ok, 5);
    // By hand: compute-bound prefill of n tokens on the decoder body (embedding and LM head
    // excluded), causal attention over n²/2 pairs, at 60% of peak BF16; plus eager launches
    // (12 kernels × 32 layers × 5 µs) and 1 ms of prefill preparation.
    let (gpu, m) = (
        presets::gpu("h100").expect("h100"),
        presets::model("llama-3-8b").expect("8b"),
    );
    let n = 2000.0;
    let body = m.num_params as f64 - 2.0 * (m.vocab_size * m.hidden_size) as f64;
    let attn = 4.0 * (m.num_layers * m.num_heads * m.head_dim) as f64 * n * n / 2.0;
    let compute = (2.0 * body * n + attn) / (0.6 * gpu.bf16_flops_per_s);
    let expect = compute + 12.0 * 32.0 * 5e-6 + 1e-3;
    println!(
        "TTFT p50 {:.2} ms, max {:.2} ms, by hand {:.2} ms",
        r.ttft.p50 * 1e3,
        r.ttft.max * 1e3,
        expect * 1e3
    );
    for ttft in [r.ttft.p50, r.ttft.max] {
        assert!(
            (ttft / expect - 1.0).abs() < 0.10,
            "TTFT {ttft} vs {expect}"
        );
    }
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    sim: SimArgs,
}

fn args(extra: &[&str]) -> SimArgs {
    let base = ["sim", "--workers", "4", "--duration", "10s", "--rate", "5"];
    let all = base.iter().chain(extra);
    Cli::try_parse_from(all).expect("valid flags").sim
}

#[test]
fn compare_policies_shows_every_policy() {
    let a = args(&[
        "--compare-policies",
        "prefix,round_robin,least_load,session",
    ]);
    assert_eq!(a.compare_policies.len(), 4);
    let text = run(&a).expect("runs");
    let header = text
        .lines()
        .find(|l| l.starts_with("policy"))
        .expect("table");
    for name in ["prefix", "round_robin", "least_load", "session"] {
        assert!(header.contains(name), "{name} in {header}");
    }
    assert!(text.contains("prefix cache hit rate"), "{text}");
    assert!(run(&args(&["--policy", "random"])).is_err());
}

#[test]
fn a_bounded_queue_refuses_overload_with_429() {
    let (w, _) = chat();
    let o = Overrides {
        duration: Some(Duration::from_secs(5)),
        rate: Some(100.0),
        seed: None,
    };
    let cfg = SimConfig {
        workers: 2,
        max_num_seqs: 4,
        max_queue: 8,
        ..SimConfig::default()
    };
    let r = simulate(&cfg, &w, &o, &policy("least_load"))
        .expect("runs")
        .report;
    assert_eq!(r.requests, w.plan(&o).expect("plan").len() as u64);
    assert!(
        r.rate_limited > r.requests / 2,
        "{} of {}",
        r.rate_limited,
        r.requests
    );
    assert_eq!(r.ok + r.rate_limited, r.requests);
    let unbounded = SimConfig {
        max_queue: 0,
        ..cfg
    };
    let r = simulate(&unbounded, &w, &o, &policy("least_load"))
        .expect("runs")
        .report;
    assert_eq!((r.rate_limited, r.ok), (0, r.requests));
}

/// The speed target: an hour of 16 workers at 50 requests/s of chat. Run it in release:
/// `cargo test --release --lib sim::tests::one_hour -- --ignored --nocapture`.
#[test]
#[ignore = "minutes in a debug build; a measurement, not a check"]
fn one_hour_of_sixteen_workers_at_fifty_per_second() {
    let w = workload::load("chat").expect("chat ships");
    let o = Overrides {
        duration: Some(Duration::from_secs(3600)),
        rate: Some(50.0),
        seed: None,
    };
    let r = simulate(&SimConfig::default(), &w, &o, &policy("prefix")).expect("runs");
    println!("{}", r.report.render_text());
    println!("wall {:.1} s, {} steps", r.wall_seconds, r.steps);
}

#[test]
fn kv_events_mode_routes_on_the_engines_residency_as_well_as_the_index() {
    // Small caches that must evict: the simulator's one router sees every request, so its
    // approximate index is already close to the engines' real residency; the events keep it so.
    let (w, o) = chat();
    let fleet = |kv_events| SimConfig {
        num_gpu_blocks_override: Some(200),
        kv_events,
        ..small_fleet()
    };
    let hit = |cfg: &SimConfig, name| {
        simulate(cfg, &w, &o, &policy(name))
            .expect("runs")
            .report
            .extra["prefix_cache_hit_rate"]
    };
    let (precise, approx) = (hit(&fleet(true), "prefix"), hit(&fleet(false), "prefix"));
    let rr = hit(&fleet(true), "round_robin");
    assert!(precise > rr + 0.1, "precise {precise} vs round_robin {rr}");
    assert!(
        (precise - approx).abs() < 0.05,
        "precise {precise} vs approximate {approx}"
    );
}

/// Fixed lengths on an open loop: `prompt` tokens of fresh words, `output` tokens answered.
fn fixed(prompt: u32, output: u32) -> Workload {
    let yaml = format!(
        "name: fixed\nseed: 3\nduration: 5s\narrival: {{poisson: {{rate: 4}}}}\n\
         prompt_tokens: {{dist: fixed, value: {prompt}}}\noutput_tokens: {{dist: fixed, value: {output}}}\n"
    );
    workload::parse(&yaml, Path::new("fixed.yaml"), "fixed", None).expect("valid")
}

/// The report of `w` on a small fleet of `model`, routed round robin.
fn run_on(model: &str, w: &Workload) -> crate::report::Report {
    let cfg = SimConfig {
        model: model.into(),
        ..small_fleet()
    };
    simulate(&cfg, w, &Overrides::default(), &policy("round_robin"))
        .expect("runs")
        .report
}

#[test]
fn a_request_over_the_context_is_counted_refused_not_ok() {
    // 9,000 prompt tokens: over the embedded config's max_context of llama-3-8b (8,192).
    let over = fixed(9000, 16);
    let r = run_on("llama-3-8b", &over);
    assert!(r.requests > 5, "{}", r.requests);
    assert_eq!((r.ok, r.client_errors), (0, r.requests), "{r:?}");
    assert_eq!(r.extra["gateway_refused_context"], r.requests as f64);
    assert!(r.by_worker.is_empty(), "refused before any worker");
    // 8,000 prompt tokens pass the gateway, but 8,000 + 14 (chat template) + 500 is over the
    // engine's context: the engine's 400.
    let r = run_on("llama-3-8b", &fixed(8000, 500));
    assert_eq!((r.ok, r.client_errors), (0, r.requests), "{r:?}");
    assert_eq!(r.extra["engine_refused_context"], r.requests as f64);
    // A max_tokens over the demo tier's ceiling (paid: 4,096) is refused by validation.
    let r = run_on("llama-3-8b", &fixed(100, 5000));
    assert_eq!((r.ok, r.client_errors), (0, r.requests), "{r:?}");
    assert_eq!(r.extra["gateway_refused_invalid"], r.requests as f64);
    // A 32k model serves the same 9,000-token prompts; the counters are there, at zero.
    let r = run_on("mistral-7b", &over);
    assert_eq!(r.ok, r.requests, "{r:?}");
    for key in [
        "gateway_refused_body_size",
        "gateway_refused_invalid",
        "gateway_refused_context",
        "engine_refused_context",
    ] {
        assert_eq!(r.extra[key], 0.0, "{key}");
    }
}

#[test]
fn a_small_body_limit_refuses_with_413() {
    let mut snapshot = infergate::config::load_default().expect("embedded config");
    snapshot.max_body_bytes = 8 * 1024;
    let cfg = SimConfig {
        gateway: Some(Box::new(snapshot)),
        ..small_fleet()
    };
    let run = |w: &Workload| {
        simulate(&cfg, w, &Overrides::default(), &policy("least_load"))
            .expect("runs")
            .report
    };
    let r = run(&fixed(3000, 16));
    assert_eq!(r.ok, 0);
    assert_eq!(r.extra["gateway_refused_body_size"], r.requests as f64);
    let small = run(&fixed(200, 16));
    assert_eq!(small.ok, small.requests);
}

#[test]
fn the_shipped_rag_fits_the_default_model_and_mixed_long_needs_a_long_one() {
    let o = Overrides {
        duration: Some(Duration::from_secs(120)),
        ..Overrides::default()
    };
    let sim = |model: &str, name: &str| {
        let cfg = SimConfig {
            model: model.into(),
            ..small_fleet()
        };
        let w = workload::load(name).expect("shipped");
        simulate(&cfg, &w, &o, &policy("prefix"))
            .expect("runs")
            .report
    };
    let rag = sim("llama-3-8b", "rag");
    assert_eq!((rag.ok, rag.client_errors), (rag.requests, 0), "{rag:?}");
    let long = sim("llama-3-8b", "mixed-long");
    let plan = workload::load("mixed-long")
        .expect("shipped")
        .plan(&o)
        .expect("plan");
    let summaries = plan.iter().filter(|r| r.prompt.len() >= 28_000).count() as u64;
    assert!(summaries > 0);
    assert_eq!(
        long.client_errors, summaries,
        "every summary refused, nothing else"
    );
    assert_eq!(long.ok, long.requests - summaries);
    let fits = sim("mistral-7b", "mixed-long");
    assert_eq!(fits.ok, fits.requests);
}

#[test]
fn tensor_parallel_shards_the_model_as_the_engine_does() {
    // llama-3-70b's 141 GB of weights do not fit one H100: the engine's error, with its advice.
    let big = |tp: usize| SimConfig {
        workers: 1,
        model: "llama-3-70b".into(),
        tensor_parallel_size: tp,
        ..SimConfig::default()
    };
    let w = fixed(1000, 32);
    let err = simulate(&big(1), &w, &Overrides::default(), &policy("least_load"))
        .expect_err("does not fit");
    assert!(err.contains("--tensor-parallel-size 2"), "{err}");
    let r = simulate(&big(4), &w, &Overrides::default(), &policy("least_load"))
        .expect("fits on four")
        .report;
    assert_eq!(r.ok, r.requests);
    assert!(r.title.contains("4×h100 llama-3-70b"), "{}", r.title);
    // On 8B, two GPUs stream half the weights per step: decode is faster despite all-reduces.
    let itl = |tp: usize| {
        let cfg = SimConfig {
            tensor_parallel_size: tp,
            ..small_fleet()
        };
        simulate(&cfg, &w, &Overrides::default(), &policy("least_load"))
            .expect("runs")
            .report
            .itl
            .p50
    };
    let (one, two) = (itl(1), itl(2));
    assert!(two < one * 0.8, "ITL p50 TP2 {two} vs TP1 {one}");
    let zero = simulate(&big(0), &w, &Overrides::default(), &policy("least_load"));
    assert!(zero.is_err_and(|e| e.contains("--tensor-parallel-size")));
    assert_eq!(
        args(&["--tensor-parallel-size", "2"])
            .config()
            .tensor_parallel_size,
        2
    );
}

/// `--gateway-config` brings its pool's policy settings, admission and degradation; flags win.
#[test]
fn gateway_config_pool_settings_are_simulated_unless_flags_override_them() {
    let dir = std::env::temp_dir().join(format!("infergate-sim-gw-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("policies")).expect("mkdir");
    let config = dir.join("infergate.yaml");
    std::fs::write(
        &config,
        "policies: policies\nmodels:\n  - {name: llama-3-8b, pool: tuned}\n  - {name: other, pool: plain}\n\
         pools:\n  - name: tuned\n    workers: [{url: \"http://127.0.0.1:9\"}]\n    \
         admission: {max_in_flight_per_worker: 4, max_queue: 7, max_wait: 2s}\n  \
         - name: plain\n    workers: [{url: \"http://127.0.0.1:10\"}]\n",
    )
    .expect("write config");
    std::fs::write(
        dir.join("policies/routing.yaml"),
        "pools:\n  tuned:\n    policy: prefix\n    balance_tolerance: 0.9\n  plain:\n    policy: least_load\n",
    )
    .expect("write routing");
    std::fs::write(
        dir.join("policies/degradation.yaml"),
        "pools:\n  tuned:\n    levels:\n      - name: shed\n        enter: {queue_depth: 5}\n        \
         exit: {queue_depth: 1}\n        actions: [{shed: {tiers: [default]}}]\n",
    )
    .expect("write degradation");
    let path = config.to_string_lossy().into_owned();

    let (cfg, policy) = args::resolve(&args(&["--gateway-config", &path])).expect("resolves");
    match policy {
        PolicyConfig::Prefix(p) => assert_eq!(p.balance_tolerance, 0.9),
        other => panic!("the pool's prefix settings, got {other:?}"),
    }
    assert_eq!(
        (cfg.admission_per_worker, cfg.max_queue, cfg.max_wait),
        (4, 7, Duration::from_secs(2))
    );
    assert!(cfg.degradation.is_some(), "the pool's degradation policy");

    let flags = args(&[
        "--gateway-config",
        &path,
        "--policy",
        "round_robin",
        "--max-queue",
        "0",
    ]);
    let (cfg, policy) = args::resolve(&flags).expect("resolves");
    assert_eq!(policy, PolicyConfig::RoundRobin);
    assert_eq!((cfg.admission_per_worker, cfg.max_queue), (4, 0));

    let (cfg, policy) =
        args::resolve(&args(&["--gateway-config", &path, "--pool", "plain"])).expect("resolves");
    assert_eq!(policy, PolicyConfig::LeastLoad);
    assert!(cfg.degradation.is_none());
    let err = args::resolve(&args(&["--gateway-config", &path, "--pool", "nope"])).unwrap_err();
    assert!(err.contains("plain") && err.contains("tuned"), "{err}");
    let err = args::resolve(&args(&["--pool", "plain"])).unwrap_err();
    assert!(err.contains("--gateway-config"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn modelled_host_time_passes_through_and_stretches_every_token() {
    let a = args(&[
        "--sim-host-us-per-step",
        "20000",
        "--sim-host-us-per-seq",
        "5",
    ]);
    let host = HostCost::from_micros(20_000.0, 5.0, 0.0, 0.0);
    assert_eq!(a.config().host_cost, host);
    let (w, o) = chat();
    let fast = simulate(&small_fleet(), &w, &o, &policy("least_load"))
        .expect("runs")
        .report;
    let cfg = SimConfig {
        host_cost: host,
        ..small_fleet()
    };
    let slow = simulate(&cfg, &w, &o, &policy("least_load"))
        .expect("runs")
        .report;
    // Every step waits 20 ms of host work on the virtual clock, so every token does.
    assert!(
        slow.itl.p50 >= fast.itl.p50 + 0.02,
        "{} vs {}",
        slow.itl.p50,
        fast.itl.p50
    );
    let bad = SimConfig {
        host_cost: HostCost::from_micros(-1.0, 0.0, 0.0, 0.0),
        ..small_fleet()
    };
    let err = simulate(&bad, &w, &o, &policy("least_load")).err();
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("--sim-host-us-per-step")),
        "{err:?}"
    );
}
