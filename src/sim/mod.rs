//! `infergate sim`: a discrete-event simulation of a fleet on a virtual clock. Each worker runs
//! the real engine core (scheduler, paged KV block manager with prefix cache, sim backend's
//! roofline step times) on its own [`VirtualClock`](infergate_engine::clock::VirtualClock);
//! requests from a seeded workload pass a fleet admission bound and the real routing policy. The
//! output is the same report as `infergate bench`, plus prefix-cache hit rate, KV usage,
//! preemptions and the execution-path mix in `extra`.

mod args;
mod compare;
mod fleet;
mod record;
mod sink;
mod worker;

#[cfg(test)]
mod tests;

use std::time::Instant;

pub use args::{SimArgs, policy_config, policy_name, run};

use crate::report::{self, Report};
use crate::routing::{self, PolicyConfig};
use crate::workload::{Overrides, Workload};
use fleet::{Clients, Fleet};
use worker::{SimWorker, WorkerSpec};

/// The simulated fleet: how many workers and how each engine is configured.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Engine workers (default 16).
    pub workers: usize,
    /// GPU preset of every worker (default `h100`).
    pub gpu: String,
    /// Model preset (default `llama-3-8b`).
    pub model: String,
    /// Most sequences per batch (default 256).
    pub max_num_seqs: usize,
    /// Token budget of one step (default 8192; raised to the context length without chunking).
    pub max_num_batched_tokens: usize,
    /// Split long prompts across steps (default true).
    pub chunked_prefill: bool,
    /// Reuse cached KV blocks of shared prefixes (default true).
    pub prefix_caching: bool,
    /// KV blocks per worker instead of the memory budget's.
    pub num_gpu_blocks_override: Option<usize>,
    /// Most requests queued over the fleet (routed, never yet scheduled); beyond, 429. 0 = unbounded.
    pub max_queue: usize,
    /// Tokens per KV block (default 16).
    pub block_size: usize,
    /// Share of GPU memory the engine may use (default 0.9).
    pub gpu_memory_utilization: f64,
    /// Wrap each prompt in the engine's default chat template (ChatML), as the engine does for
    /// `/v1/chat/completions` (what `infergate bench` sends by default). Default true.
    pub chat_template: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            workers: 16,
            gpu: "h100".into(),
            model: "llama-3-8b".into(),
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            chunked_prefill: true,
            prefix_caching: true,
            num_gpu_blocks_override: None,
            max_queue: 0,
            block_size: 16,
            gpu_memory_utilization: 0.9,
            chat_template: true,
        }
    }
}

/// A finished simulation.
#[derive(Debug, Clone)]
pub struct SimResult {
    /// The report, with the simulator's numbers in `extra`.
    pub report: Report,
    /// Wall time the simulation took, seconds.
    pub wall_seconds: f64,
    /// Engine steps run over all workers.
    pub steps: u64,
}

/// Simulates `workload` (with `overrides`) on the fleet `cfg` routed by `policy`.
pub fn simulate(
    cfg: &SimConfig,
    workload: &Workload,
    overrides: &Overrides,
    policy: &PolicyConfig,
) -> Result<SimResult, String> {
    let started = Instant::now();
    let spec = WorkerSpec::new(cfg)?;
    let workers = (0..cfg.workers)
        .map(|i| SimWorker::new(i, &spec))
        .collect::<Result<Vec<_>, _>>()?;
    let plan = workload.requests(overrides)?;
    let duration = overrides
        .duration
        .unwrap_or(workload.duration)
        .as_secs_f64();
    let clients = match workload.concurrency() {
        Some(n) => Clients::Closed(n, duration),
        None => Clients::Open,
    };
    let fleet = Fleet::new(
        workers,
        routing::build(policy),
        plan,
        clients,
        cfg.max_queue,
    )
    .with_chat_template(cfg.chat_template)?;
    let outcome = fleet.run();

    let title = format!(
        "infergate sim · workload {} · {} × {} {} · policy {}",
        workload.name,
        cfg.workers,
        cfg.gpu,
        cfg.model,
        policy_name(policy)
    );
    let slo = workload.slo;
    let mut report = report::summarize(&title, &outcome.records, outcome.end, slo.ttft, slo.itl);
    let sum = |f: fn(&worker::WorkerStats) -> f64| outcome.stats.iter().map(f).sum::<f64>();
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let graph = sum(|s| s.graph_steps as f64);
    let steps = graph + sum(|s| s.eager_steps as f64);
    let worker_seconds = outcome.end * cfg.workers as f64;
    let extra = [
        (
            "prefix_cache_hit_rate",
            ratio(sum(|s| s.prefix_hits), sum(|s| s.prefix_queries)),
        ),
        ("kv_usage_mean", ratio(sum(|s| s.kv_area), worker_seconds)),
        ("preemptions", sum(|s| s.preemptions)),
        ("steps_graph_share", ratio(graph, steps)),
        ("steps", steps),
    ];
    report
        .extra
        .extend(extra.into_iter().map(|(k, v)| (k.to_owned(), v)));
    Ok(SimResult {
        report,
        wall_seconds: started.elapsed().as_secs_f64(),
        steps: outcome.steps,
    })
}
