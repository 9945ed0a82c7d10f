//! The five on-call symptoms of issue 44, each a shipped scenario (`config/scenarios/NAME/` and
//! `config/workloads/NAME.yaml`): `infergate sim` on the scenario's own engines
//! (`--engine-args-from-config`) shows the symptom's deciding numbers, and the scenario's
//! `lever.yaml` moves them. Short simulated runs (seeded, deterministic); every config passes
//! `infergate config check`.

use crate::tools_support;

use std::path::PathBuf;
use std::time::Duration;

use crate::common::gateway::TempDir;
use infergate_cli::report::Report;
use tools_support::{infergate, report_of};

const NAMES: [&str; 6] = [
    "tpot-at-peak",
    "host-bound",
    "small-batches",
    "long-context",
    "itl-freeze",
    "shared-system-prompt",
];

fn root() -> PathBuf {
    PathBuf::from(crate::common::REPO)
}

/// A path under the repository, as a string for the command line.
fn at(rel: &str) -> String {
    root().join(rel).to_string_lossy().into_owned()
}

/// `infergate sim` of `workload` on the engines and pool of scenario `name`'s `config`
/// (`infergate.yaml` or `lever.yaml`) for `seconds` simulated seconds, plus `extra` flags.
async fn sim(
    dir: &TempDir,
    name: &str,
    config: &str,
    workload: &str,
    seconds: u32,
    extra: &[&str],
) -> Report {
    let workload = at(&format!("config/workloads/{workload}.yaml"));
    let config = at(&format!("config/scenarios/{name}/{config}"));
    let duration = format!("{seconds}s");
    let mut args = vec![
        "sim",
        "--workload",
        &workload,
        "--gateway-config",
        &config,
        "--engine-args-from-config",
        "--duration",
        &duration,
    ];
    args.extend_from_slice(extra);
    let tag = format!(
        "{name}-{}-{}",
        config.len(),
        extra.join("_").replace('-', "")
    );
    report_of(&dir.path, &tag, &args, Duration::from_secs(60)).await
}

/// A fleet number of the simulator's `extra`.
fn x(r: &Report, key: &str) -> f64 {
    *r.extra
        .get(key)
        .unwrap_or_else(|| panic!("no `{key}` in {:?}", r.extra))
}

/// Requests waiting, engine queues and the gateway's admission queue together.
fn queue(r: &Report) -> f64 {
    x(r, "engine_queue_mean") + r.extra.get("admission_queue_mean").copied().unwrap_or(0.0)
}

#[tokio::test]
async fn every_scenario_config_passes_config_check() {
    for name in NAMES {
        for file in ["infergate.yaml", "lever.yaml"] {
            let path = root().join(format!("config/scenarios/{name}/{file}"));
            let path = path.to_string_lossy().into_owned();
            let args = ["config", "check", "--config", &path];
            infergate(&args, Duration::from_secs(30)).await.ok(&path);
        }
        let workload = root().join(format!("config/workloads/{name}.yaml"));
        assert!(workload.is_file(), "{} missing", workload.display());
    }
}

#[tokio::test]
async fn tpot_at_peak_grows_tpot_not_ttft_and_a_step_budget_holds_it() {
    let dir = TempDir::new("scenario-tpot");
    let low = sim(
        &dir,
        "tpot-at-peak",
        "infergate.yaml",
        "tpot-at-peak",
        40,
        &["--rate", "1"],
    )
    .await;
    let peak = sim(
        &dir,
        "tpot-at-peak",
        "infergate.yaml",
        "tpot-at-peak",
        40,
        &[],
    )
    .await;
    let fixed = sim(&dir, "tpot-at-peak", "lever.yaml", "tpot-at-peak", 40, &[]).await;
    let numbers = format!(
        "TPOT p95 ms low {:.1} peak {:.1} lever {:.1}; TTFT p95 peak {:.0} ms; busy {:.2}; batch {:.0}",
        low.tpot.p95 * 1e3,
        peak.tpot.p95 * 1e3,
        fixed.tpot.p95 * 1e3,
        peak.ttft.p95 * 1e3,
        x(&peak, "busy_fraction"),
        x(&peak, "batch_mean")
    );
    assert!(peak.tpot.p95 > 3.0 * low.tpot.p95, "{numbers}");
    assert!(
        peak.ttft.p95 < peak.slo_ttft_s / 2.0,
        "TTFT stays fine: {numbers}"
    );
    assert!(
        x(&peak, "busy_fraction") > 0.9 && x(&peak, "batch_mean") > 30.0,
        "{numbers}"
    );
    // The lever: TPOT p95 down by a third at least, throughput kept, TTFT still inside its SLO.
    assert!(fixed.tpot.p95 < 0.67 * peak.tpot.p95, "{numbers}");
    assert!(
        fixed.tokens_out_per_s > 0.95 * peak.tokens_out_per_s,
        "{numbers}"
    );
    assert!(fixed.ttft.p95 < fixed.slo_ttft_s, "{numbers}");
}

/// The two 3.2 mechanisms: both ~1/3 busy with a long queue; the batch and the step gap tell
/// them apart. Each lever empties the queue.
#[tokio::test]
async fn host_bound_and_small_batches_look_alike_but_for_batch_and_gaps() {
    let dir = TempDir::new("scenario-32");
    let host = sim(&dir, "host-bound", "infergate.yaml", "host-bound", 30, &[]).await;
    let small = sim(
        &dir,
        "small-batches",
        "infergate.yaml",
        "small-batches",
        30,
        &[],
    )
    .await;
    for (name, r) in [("host-bound", &host), ("small-batches", &small)] {
        let busy = x(r, "busy_fraction");
        assert!((0.2..0.5).contains(&busy), "{name}: busy {busy}");
        assert!(queue(r) > 100.0, "{name}: queue {}", queue(r));
        assert!(r.ttft.p50 > 2.0, "{name}: TTFT p50 {}", r.ttft.p50);
    }
    // Host-bound: large batches, long gaps between steps (host seconds per step).
    let gap = |r: &Report| x(r, "host_fraction") * r.duration_s / (x(r, "steps") / 2.0);
    assert!(x(&host, "batch_mean") > 100.0, "{:?}", host.extra);
    // Small batches: every step at the cap of 4, gaps of about a millisecond.
    assert!(
        x(&small, "batch_p95") <= 4.0 && x(&small, "batch_mean") > 3.5,
        "{:?}",
        small.extra
    );
    assert!(
        gap(&host) > 10.0 * gap(&small),
        "gaps {} vs {}",
        gap(&host),
        gap(&small)
    );

    let host_fixed = sim(&dir, "host-bound", "lever.yaml", "host-bound", 30, &[]).await;
    assert!(
        x(&host_fixed, "busy_fraction") > 0.7,
        "{:?}",
        host_fixed.extra
    );
    assert!(queue(&host_fixed) < 5.0 && host_fixed.rate_limited == 0);
    assert!(host_fixed.tokens_out_per_s > 1.3 * host.tokens_out_per_s);
    let small_fixed = sim(
        &dir,
        "small-batches",
        "lever.yaml",
        "small-batches",
        30,
        &[],
    )
    .await;
    assert!(x(&small_fixed, "batch_p95") > 4.0 && queue(&small_fixed) < 5.0);
    assert!(small_fixed.ttft.p99 < small_fixed.slo_ttft_s && small_fixed.rate_limited == 0);
}

#[tokio::test]
async fn long_context_preempts_only_with_the_long_prompts() {
    let dir = TempDir::new("scenario-long");
    let mixed = sim(
        &dir,
        "long-context",
        "infergate.yaml",
        "long-context",
        60,
        &[],
    )
    .await;
    // The lever: the summaries on a pool of their own; the chat pool's engines serve chat alone.
    let chat = sim(
        &dir,
        "long-context",
        "lever.yaml",
        "long-context-chat",
        60,
        &["--pool", "chat"],
    )
    .await;
    assert!(
        x(&mixed, "preemptions") > 5.0 && x(&mixed, "recomputed_tokens") > 1000.0,
        "{:?}",
        mixed.extra
    );
    assert_eq!(x(&chat, "preemptions"), 0.0, "{:?}", chat.extra);
    assert_eq!(x(&chat, "recomputed_tokens"), 0.0);
    assert!(
        chat.ttft.p99 < mixed.ttft.p99 / 10.0,
        "{} vs {}",
        chat.ttft.p99,
        mixed.ttft.p99
    );
}

#[tokio::test]
async fn itl_freeze_hides_in_the_mean_and_chunked_prefill_removes_it() {
    let dir = TempDir::new("scenario-itl");
    let frozen = sim(&dir, "itl-freeze", "infergate.yaml", "itl-freeze", 60, &[]).await;
    let chunked = sim(&dir, "itl-freeze", "lever.yaml", "itl-freeze", 60, &[]).await;
    assert!(
        frozen.tpot_mean < 0.015,
        "TPOT mean looks healthy: {}",
        frozen.tpot_mean
    );
    assert!(frozen.itl.max > 50.0 * frozen.tpot_mean, "{:?}", frozen.itl);
    assert!(
        chunked.itl.max < frozen.itl.max / 2.0,
        "{} vs {}",
        chunked.itl.max,
        frozen.itl.max
    );
}

#[tokio::test]
async fn shared_system_prompt_costs_less_with_prefix_caching_and_routing() {
    let dir = TempDir::new("scenario-cost");
    let before = sim(
        &dir,
        "shared-system-prompt",
        "infergate.yaml",
        "shared-system-prompt",
        20,
        &[],
    )
    .await;
    let after = sim(
        &dir,
        "shared-system-prompt",
        "lever.yaml",
        "shared-system-prompt",
        20,
        &[],
    )
    .await;
    assert!(before.title.contains("round_robin") && after.title.contains("prefix"));
    assert!(x(&before, "cached_share") < 0.05, "{:?}", before.extra);
    assert!(x(&after, "cached_share") > 0.8, "{:?}", after.extra);
    let (b, a) = (
        x(&before, "cost_per_1k_tokens_usd"),
        x(&after, "cost_per_1k_tokens_usd"),
    );
    assert!(b > 2.0 * a && a > 0.0, "cost per 1k tokens {b} → {a}");
    assert!(before.ok == before.requests && after.ok == after.requests);
}
