//! Tests of tenant tiers in the simulator: the admission stage's priority queue and graded
//! degradation on virtual time, on a deliberately tiny fleet so overload is cheap to reach.

use std::path::Path;
use std::time::Duration;

use clap::Parser;

use super::*;
use crate::workload;

/// Chat-like traffic from two tiers, 70% free and 30% paid, short answers.
const TIERS: &str = "name: tiers-test\nseed: 3\nduration: 20s\narrival: {poisson: {rate: 60}}\n\
                     prompt_tokens: {dist: lognormal, mean: 120, sigma: 0.6, min: 8, max: 2000}\n\
                     output_tokens: {dist: lognormal, mean: 60, sigma: 0.4, min: 1, max: 1024}\n\
                     prefix_groups: {count: 8, tokens: 1800, zipf: 1.1, share: 1.0}\n\
                     tenants: [{name: free, weight: 0.7}, {name: paid, weight: 0.3}]\n\
                     slo: {ttft: 500ms, itl: 50ms}\n";

/// Two levels on the admission queue's depth, short dwell: cap free's answers, then shed free.
const POLICY: &str = concat!(
    "pools:\n",
    "  local:\n",
    "    window: 2s\n",
    "    tick: 250ms\n",
    "    levels:\n",
    "      - name: cap_free\n",
    "        enter: {queue_depth: 4}\n",
    "        exit: {queue_depth: 1}\n",
    "        min_dwell: 1s\n",
    "        actions: [{cap_max_tokens: {tiers: [free], max_tokens: 16}}]\n",
    "      - name: shed_free\n",
    "        enter: {queue_depth: 8}\n",
    "        exit: {queue_depth: 2}\n",
    "        min_dwell: 1s\n",
    "        actions: [{shed: {tiers: [free]}}]\n",
);

/// Two workers of 4 sequences each: 60 requests/s is several times what they serve.
fn tiny_fleet(degradation: Option<DegradationPolicy>) -> SimConfig {
    SimConfig {
        workers: 2,
        max_num_seqs: 4,
        admission_per_worker: 4,
        max_queue: 64,
        max_wait: Duration::from_secs(2),
        priorities: [("free".to_owned(), 1), ("paid".to_owned(), 10)].into(),
        degradation,
        ..SimConfig::default()
    }
}

fn policy() -> DegradationPolicy {
    let mut pools = infergate::degrade::parse(POLICY).expect("valid policy");
    pools.remove("local").expect("pool local")
}

fn run_tiers(cfg: &SimConfig) -> Report {
    let w = workload::parse(TIERS, Path::new("tiers.yaml"), "tiers", None).expect("valid");
    let o = Overrides {
        duration: Some(Duration::from_secs(10)),
        ..Overrides::default()
    };
    simulate(cfg, &w, &o, &policy_config("least_load").expect("known"))
        .expect("runs")
        .report
}

#[test]
fn degradation_sheds_free_before_paid() {
    let r = run_tiers(&tiny_fleet(Some(policy())));
    let (free, paid) = (&r.by_tenant["free"], &r.by_tenant["paid"]);
    println!("{}", r.render_text());
    assert!(r.extra["degradation_max_level"] >= 2.0, "{:?}", r.extra);
    assert!(r.extra["degradation_transitions"] >= 2.0, "{:?}", r.extra);
    assert!(r.extra["degradation_shed"] > 0.0, "{:?}", r.extra);
    assert!(
        paid.goodput >= free.goodput,
        "paid {} vs free {}",
        paid.goodput,
        free.goodput
    );
    // Every paid request is served; the 429s (shed, queue full or timed out) are all free's.
    assert_eq!(paid.ok, paid.requests, "{paid:?}");
    assert!(r.rate_limited > 0);
    assert!(free.requests - free.ok >= r.rate_limited, "{free:?}");
    assert_eq!(r.ok + r.rate_limited + r.server_errors, r.requests);
}

#[test]
fn priority_admission_serves_paid_first_without_degradation() {
    let r = run_tiers(&tiny_fleet(None));
    let (free, paid) = (&r.by_tenant["free"], &r.by_tenant["paid"]);
    assert!(!r.extra.contains_key("degradation_max_level"));
    assert!(r.extra["admission_queue_full"] + r.extra["admission_queue_timeouts"] > 0.0);
    assert!(paid.ok as f64 / paid.requests as f64 > free.ok as f64 / free.requests as f64);
    assert_eq!(r.ok + r.rate_limited, r.requests, "only queue refusals");
}

#[test]
fn runs_repeat_exactly_with_degradation_on() {
    let cfg = tiny_fleet(Some(policy()));
    assert_eq!(run_tiers(&cfg).to_json(), run_tiers(&cfg).to_json());
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    sim: SimArgs,
}

#[test]
fn tier_flags_parse_and_default_to_off() {
    let parse = |extra: &[&str]| {
        let base = ["sim"].iter().chain(extra);
        Cli::try_parse_from(base).map(|c| c.sim.config())
    };
    let plain = parse(&[]).expect("no flags");
    assert_eq!(plain, SimConfig::default());
    let cfg = parse(&[
        "--tier",
        "free=1",
        "--tier",
        "paid=10",
        "--admission-per-worker",
        "64",
        "--max-wait",
        "5s",
    ])
    .expect("valid");
    assert_eq!(cfg.priorities.get("paid"), Some(&10));
    assert_eq!(cfg.priorities.get("free"), Some(&1));
    assert_eq!(
        (cfg.admission_per_worker, cfg.max_wait),
        (64, Duration::from_secs(5))
    );
    for bad in ["paid", "=3", "paid=-1", "paid=high"] {
        assert!(parse(&["--tier", bad]).is_err(), "{bad}");
    }
}

#[test]
fn a_degradation_file_gives_pool_local_or_the_only_pool() {
    let dir = std::env::temp_dir().join(format!("infergate-sim-deg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let local = dir.join("local.yaml");
    std::fs::write(&local, POLICY).expect("write");
    assert_eq!(load_policy(&local).expect("loads"), policy());
    let other = dir.join("other.yaml");
    std::fs::write(&other, POLICY.replace("local", "gpu")).expect("write");
    assert_eq!(load_policy(&other).expect("the only pool"), policy());
    let two = dir.join("two.yaml");
    let second = POLICY.replace("pools:\n", "").replace("local", "b");
    std::fs::write(&two, format!("{}{second}", POLICY.replace("local", "a"))).expect("write");
    assert!(load_policy(&two).is_err());
    assert!(load_policy(&dir.join("missing.yaml")).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `noisy-neighbour` on one worker of 16 slots, 120 s: `a` sends 20 of its 24 requests/s.
fn noisy(cfg: &SimConfig) -> Report {
    let w = workload::load("noisy-neighbour").expect("shipped");
    let o = Overrides {
        duration: Some(Duration::from_secs(120)),
        ..Overrides::default()
    };
    simulate(cfg, &w, &o, &policy_config("least_load").expect("known"))
        .expect("runs")
        .report
}

fn noisy_fleet(gateway: Option<Box<Snapshot>>) -> SimConfig {
    SimConfig {
        workers: 1,
        admission_per_worker: 16,
        max_queue: 256,
        max_wait: Duration::from_secs(60),
        gateway,
        ..SimConfig::default()
    }
}

/// Tenant `a` on a tier of 300k tokens per minute (about 9 of its 20 requests/s), `b` and `c`
/// unlimited: the three comparisons of issue 45 in one place. First come serves the backlog in
/// arrival order (Jain's index over the backlogged near 0.47); rate limits alone refuse `a` only,
/// and only once its minute's burst is spent; fair share turns the same flood into equal turns.
#[test]
fn first_come_rate_limits_and_fair_share_on_a_noisy_neighbour() {
    let key = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    let config = format!(
        "models: [{{name: llama-3-8b, pool: local}}]\n\
         pools: [{{name: local, workers: [{{url: \"http://127.0.0.1:9\"}}]}}]\n\
         tenants:\n  - {{name: a, tier: heavy, keys: [\"{}\"]}}\n  \
         - {{name: b, tier: std, keys: [\"{}\"]}}\n  - {{name: c, tier: std, keys: [\"{}\"]}}\n",
        key('a'),
        key('b'),
        key('c')
    );
    let tiers = "tiers:\n  heavy: {tokens_per_minute: 300000}\n  std: {}\n";
    let snapshot = infergate::config::load_str_with(
        &config,
        Path::new("infergate.yaml"),
        None,
        Some((tiers, Path::new("policies/tenants.yaml"))),
    )
    .expect("valid config");

    let fcfs = noisy(&noisy_fleet(Some(Box::new(snapshot.clone()))));
    assert_eq!(fcfs.extra.get("rate_limited"), None);
    assert!(
        fcfs.extra["jain_backlogged_windows"] > 10.0,
        "{:?}",
        fcfs.extra
    );
    assert!(fcfs.extra["jain_backlogged_mean"] < 0.7, "{:?}", fcfs.extra);

    let limited = noisy(&SimConfig {
        rate_limits: true,
        ..noisy_fleet(Some(Box::new(snapshot)))
    });
    let (a, b) = (&limited.by_tenant["a"], &limited.by_tenant["b"]);
    let refused = limited.extra["rate_limited"];
    assert!(refused > 100.0, "{:?}", limited.extra);
    // Only `a`'s tier is limited: every rate refusal is one of its requests.
    assert!((a.requests - a.ok) as f64 >= refused, "{a:?}");
    // Refused past its limit, `a` leaves the worker to the others: they wait less.
    assert!(b.ttft_p50 < fcfs.by_tenant["b"].ttft_p50, "{b:?}");

    let fair = noisy(&SimConfig {
        fair_share: Some(infergate::admission::FairWeights {
            borrow_slots: 4,
            ..Default::default()
        }),
        ..noisy_fleet(None)
    });
    assert!(
        fair.by_tenant["b"].ttft_p99 < fcfs.by_tenant["b"].ttft_p99 / 10.0,
        "fair {} vs first come {}",
        fair.by_tenant["b"].ttft_p99,
        fcfs.by_tenant["b"].ttft_p99
    );
    assert!(fair.tokens_out_per_s >= 0.95 * fcfs.tokens_out_per_s);
    assert_eq!(fair.extra.get("rate_limited"), None);
}
