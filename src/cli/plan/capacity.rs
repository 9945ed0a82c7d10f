//! `plan capacity`: the fewest replicas that meet a workload's latency SLOs, found by running the
//! fleet simulator at growing replica counts, plus one replica of headroom so the SLOs still hold
//! with one replica lost.

use std::time::Duration;

use crate::bench::parse_duration;
use crate::report::Report;
use crate::sim::{SimConfig, policy_config, simulate};
use crate::workload::{Overrides, load};

/// Flags of `infergate plan capacity`.
#[derive(Debug, Clone, clap::Args)]
pub struct CapacityArgs {
    /// Workload name (config/workloads/NAME.yaml) or path.
    #[arg(long, default_value = "chat")]
    pub workload: String,
    /// SLO on the 95th percentile of time to first token (e.g. 500ms).
    #[arg(long, value_parser = parse_duration, default_value = "500ms")]
    pub slo_ttft_p95: Duration,
    /// SLO on the 99th percentile of inter-token latency (e.g. 50ms).
    #[arg(long, value_parser = parse_duration, default_value = "50ms")]
    pub slo_itl_p99: Duration,
    /// GPU preset of every replica.
    #[arg(long, default_value = "h100")]
    pub gpu: String,
    /// Model preset.
    #[arg(long, default_value = "llama-3-8b")]
    pub model: String,
    /// Routing policy.
    #[arg(long, default_value = "prefix")]
    pub policy: String,
    /// Simulated time per trial (default: the workload's duration).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Override the workload's arrival rate (requests/s).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Largest replica count to try.
    #[arg(long, default_value_t = 256)]
    pub max_replicas: usize,
}

/// One simulated fleet size.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    /// Replicas simulated.
    pub replicas: usize,
    /// TTFT p95 in seconds.
    pub ttft_p95: f64,
    /// ITL p99 in seconds.
    pub itl_p99: f64,
    /// Share of requests that succeeded.
    pub ok_share: f64,
    /// Whether both SLOs held (and nothing failed).
    pub meets: bool,
}

/// The answer: replicas needed, and with headroom.
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityPlan {
    /// Fewest replicas meeting the SLOs.
    pub needed: usize,
    /// `needed` + 1: the SLOs hold with one replica lost.
    pub with_headroom: usize,
    /// Every trial, in the order run.
    pub trials: Vec<Trial>,
}

fn trial(replicas: usize, report: &Report, args: &CapacityArgs) -> Trial {
    let ok_share = if report.requests == 0 {
        0.0
    } else {
        report.ok as f64 / report.requests as f64
    };
    let meets = ok_share >= 0.999
        && report.ttft.p95 <= args.slo_ttft_p95.as_secs_f64()
        && report.itl.p99 <= args.slo_itl_p99.as_secs_f64();
    Trial {
        replicas,
        ttft_p95: report.ttft.p95,
        itl_p99: report.itl.p99,
        ok_share,
        meets,
    }
}

/// Finds the fewest replicas meeting the SLOs: doubling until one size passes, then bisecting.
pub fn capacity_plan(args: &CapacityArgs) -> Result<CapacityPlan, String> {
    let workload = load(&args.workload)?;
    let policy = policy_config(&args.policy)?;
    let overrides = Overrides {
        duration: args.duration,
        rate: args.rate,
        seed: None,
    };
    let mut trials = Vec::new();
    let mut run = |replicas: usize| -> Result<bool, String> {
        let cfg = SimConfig {
            workers: replicas,
            gpu: args.gpu.clone(),
            model: args.model.clone(),
            ..SimConfig::default()
        };
        let result = simulate(&cfg, &workload, &overrides, &policy)?;
        let t = trial(replicas, &result.report, args);
        let meets = t.meets;
        trials.push(t);
        Ok(meets)
    };
    // Double until a size meets the SLOs; the answer lies between the last failing size and it.
    let (mut low, mut high) = (0usize, 1usize);
    while !run(high)? {
        low = high;
        high *= 2;
        if high > args.max_replicas {
            return Err(format!(
                "even {} replicas miss the SLOs (TTFT p95 ≤ {:?}, ITL p99 ≤ {:?}); raise --max-replicas or relax the SLOs",
                args.max_replicas, args.slo_ttft_p95, args.slo_itl_p99
            ));
        }
    }
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if run(mid)? {
            high = mid;
        } else {
            low = mid;
        }
    }
    Ok(CapacityPlan {
        needed: high,
        with_headroom: high + 1,
        trials,
    })
}

/// Runs `plan capacity` and renders the answer.
pub fn run_capacity(args: &CapacityArgs) -> Result<String, String> {
    let plan = capacity_plan(args)?;
    let mut out = format!(
        "plan capacity: workload {} on {} x {}, policy {}, SLO TTFT p95 <= {:?}, ITL p99 <= {:?}\n",
        args.workload, args.gpu, args.model, args.policy, args.slo_ttft_p95, args.slo_itl_p99
    );
    out.push_str("  replicas  TTFT p95 ms  ITL p99 ms  ok      meets\n");
    let mut trials = plan.trials.clone();
    trials.sort_by_key(|t| t.replicas);
    for t in &trials {
        out.push_str(&format!(
            "  {:>8}  {:>11.1}  {:>10.1}  {:>5.1}%  {}\n",
            t.replicas,
            t.ttft_p95 * 1000.0,
            t.itl_p99 * 1000.0,
            t.ok_share * 100.0,
            if t.meets { "yes" } else { "no" }
        ));
    }
    out.push_str(&format!(
        "replicas needed: {} ({} with headroom for one replica lost)\n",
        plan.needed, plan.with_headroom
    ));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(rate: f64, seconds: u64) -> CapacityArgs {
        CapacityArgs {
            workload: "chat".into(),
            slo_ttft_p95: Duration::from_millis(500),
            slo_itl_p99: Duration::from_millis(50),
            gpu: "h100".into(),
            model: "llama-3-8b".into(),
            policy: "prefix".into(),
            duration: Some(Duration::from_secs(seconds)),
            rate: Some(rate),
            max_replicas: 64,
        }
    }

    #[test]
    fn finds_the_smallest_passing_size_and_adds_one() {
        let plan = capacity_plan(&args(5.0, 10)).unwrap();
        assert!(plan.needed >= 1);
        assert_eq!(plan.with_headroom, plan.needed + 1);
        // The answer passed; one fewer (when tried) failed.
        let at = |n: usize| plan.trials.iter().find(|t| t.replicas == n).cloned();
        assert!(at(plan.needed).is_some_and(|t| t.meets));
        if plan.needed > 1 {
            assert!(
                at(plan.needed - 1).is_some_and(|t| !t.meets),
                "{:?}",
                plan.trials
            );
        }
    }

    #[test]
    fn more_traffic_needs_at_least_as_many_replicas() {
        let light = capacity_plan(&args(2.0, 5)).unwrap();
        let heavy = capacity_plan(&args(300.0, 5)).unwrap();
        assert!(heavy.needed >= light.needed, "{light:?} vs {heavy:?}");
        // ~18,000 output tokens/s of chat is far past one H100's decode throughput.
        assert!(
            heavy.needed > 1,
            "300 req/s on one H100 should miss the SLOs: {heavy:?}"
        );
    }
}
