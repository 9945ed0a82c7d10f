//! `infergate sim`: a discrete-event simulation of a fleet on a virtual clock. Each worker runs
//! the real engine core (scheduler, paged KV block manager with prefix cache, sim backend's
//! roofline step times) on its own [`VirtualClock`](infergate_engine::clock::VirtualClock);
//! requests from a seeded workload meet the gateway's own refusals first (body size, the tier's
//! `max_tokens` ceiling, the model's context; the engines' context check when routed), then
//! optional graded degradation by tenant tier, a fleet admission stage (a bound on engine queues,
//! or the gateway's slots and priority queue) and the real routing policy. The output is the same
//! report as `infergate bench`, plus prefix-cache hit rate, KV usage, preemptions, the
//! execution-path mix and the refusals per check (and admission and degradation counts when
//! those are on) in `extra`.

mod admit;
mod args;
mod compare;
mod degradation;
mod engines;
mod features;
mod fleet;
mod gate;
mod rate_limits;
mod record;
mod sink;
mod spawn;
mod worker;

#[cfg(test)]
mod replay_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tier_tests;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use admit::Admission;
pub use args::{SimArgs, policy_config, run};
pub use degradation::load_policy;

use crate::report::{self, Report};
use crate::workload::{Overrides, Workload};
use degradation::SimDegradation;
use fleet::{Clients, Fleet};
use gate::Gate;
use infergate::config::Snapshot;
use infergate::degrade::DegradationPolicy;
use infergate::routing::{self, PolicyConfig};
use infergate_engine::host_time::HostCost;
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
    /// GPUs each worker's model is sharded over (the engine's `--tensor-parallel-size`, default 1).
    pub tensor_parallel_size: usize,
    /// The gateway config whose checks every request meets (body size, tier ceilings, the
    /// model's context); `None` = the embedded config `infergate up` serves (default).
    pub gateway: Option<Box<Snapshot>>,
    /// The pool of `gateway` simulated (its shape classes send other requests elsewhere).
    pub pool: Option<String>,
    /// Most sequences per batch (default 256).
    pub max_num_seqs: usize,
    /// Token budget of one step (default 8192; raised to the context length without chunking).
    pub max_num_batched_tokens: usize,
    /// Split long prompts across steps (default true).
    pub chunked_prefill: bool,
    /// Reuse cached KV blocks of shared prefixes (default true).
    pub prefix_caching: bool,
    /// Share of KV blocks kept for reused cached blocks (the engine's `--kv-protected-fraction`).
    pub kv_protected_fraction: f64,
    /// Engines publish KV events and routing applies them (precise mode).
    pub kv_events: bool,
    /// KV blocks per worker instead of the memory budget's.
    pub num_gpu_blocks_override: Option<usize>,
    /// Most requests queued over the fleet (routed, never yet scheduled); beyond, 429. 0 = unbounded.
    /// With the admission stage on, it bounds the admission queue instead.
    pub max_queue: usize,
    /// Requests in flight per worker (the gateway's `max_in_flight_per_worker`) before arrivals
    /// wait in the fleet's priority queue; 0 = no admission stage (default).
    pub admission_per_worker: usize,
    /// Longest wait in the admission queue before a 429 (default 30 s, as the gateway's).
    pub max_wait: Duration,
    /// Admission priority per tenant, higher first; tenants not listed get 0.
    pub priorities: BTreeMap<String, u32>,
    /// Token-weighted fair share among tenants in the admission queue (the gateway's
    /// `admission.fair_share`); `None` = first come (default).
    pub fair_share: Option<infergate::admission::FairWeights>,
    /// Graded degradation by tier (tier = tenant name) on virtual time; `None` = off (default).
    pub degradation: Option<DegradationPolicy>,
    /// Apply the gateway config's per-tenant rate limits (each tenant's tier's requests and
    /// tokens per minute) on virtual time with the gateway's limiter. Default false.
    pub rate_limits: bool,
    /// Tokens per KV block (default 16).
    pub block_size: usize,
    /// Share of GPU memory the engine may use (default 0.9).
    pub gpu_memory_utilization: f64,
    /// Wrap each prompt in the engine's default chat template (ChatML), as the engine does for
    /// `/v1/chat/completions` (what `infergate bench` sends by default). Default true.
    pub chat_template: bool,
    /// Multiplies every step time, as the engine's `--fault-latency-multiplier` does. Default 1.
    pub latency_multiplier: f64,
    /// Host time per step, as the engine's `--sim-host-us-*` flags model it. Default none.
    pub host_cost: HostCost,
    /// Decode batch sizes with a captured CUDA graph, as the engine's `--cuda-graph-sizes`
    /// (empty: vLLM's default up to `max_num_seqs`).
    pub cuda_graph_sizes: Vec<usize>,
    /// Every step eager, as the engine's `--enforce-eager`.
    pub enforce_eager: bool,
    /// Which steps replay graphs, as the engine's `--cudagraph-mode`.
    pub cudagraph_mode: infergate_engine::exec_path::CudagraphMode,
    /// Keep each finished request's engine flight record as a trace line
    /// ([`SimResult::trace`]), for `infergate shapes`. Default false.
    pub record_flights: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            workers: 16,
            gpu: "h100".into(),
            model: "llama-3-8b".into(),
            tensor_parallel_size: 1,
            gateway: None,
            pool: None,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            chunked_prefill: true,
            prefix_caching: true,
            kv_protected_fraction: infergate_engine::block_manager::DEFAULT_PROTECTED_FRACTION,
            kv_events: false,
            num_gpu_blocks_override: None,
            max_queue: 0,
            admission_per_worker: 0,
            max_wait: Duration::from_secs(30),
            priorities: BTreeMap::new(),
            fair_share: None,
            degradation: None,
            rate_limits: false,
            block_size: 16,
            gpu_memory_utilization: 0.9,
            chat_template: true,
            latency_multiplier: 1.0,
            host_cost: HostCost::default(),
            cuda_graph_sizes: Vec::new(),
            enforce_eager: false,
            cudagraph_mode: Default::default(),
            record_flights: false,
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
    /// With [`SimConfig::record_flights`]: one trace line per request the engines finished, by
    /// end time, in the gateway trace file's shape as far as `infergate shapes` reads it
    /// (`start_ms`: the virtual arrival; `flight`: the engine's record).
    pub trace: Vec<String>,
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
    let snapshot = match &cfg.gateway {
        Some(s) => (**s).clone(),
        None => infergate::config::load_default().map_err(|e| e.to_string())?,
    };
    // Clients name the model as the preset calls it (what `bench --model` sends by default).
    let model = infergate_engine::presets::model(&cfg.model).map_or(cfg.model.as_str(), |m| m.name);
    let prices = snapshot.prices.clone();
    let gate = Gate::new(snapshot, model, cfg.chat_template, spec.max_model_len)?
        .for_pool(cfg.pool.as_deref());
    let plan = workload.requests(overrides)?;
    let duration = overrides
        .duration
        .unwrap_or(workload.duration)
        .as_secs_f64();
    let clients = match workload.concurrency() {
        Some(n) => Clients::Closed(n, duration),
        None => Clients::Open,
    };
    let admission = match cfg.admission_per_worker {
        0 => Admission::off(),
        per_worker => Admission::new(
            per_worker * cfg.workers,
            cfg.max_queue,
            cfg.max_wait.as_secs_f64(),
            cfg.priorities.clone(),
        )
        .with_fair_share(cfg.fair_share),
    };
    let fleet = Fleet::new(
        workers,
        routing::build(policy),
        plan,
        clients,
        cfg.max_queue,
    )
    .with_chat_template(cfg.chat_template)?
    .with_admission(admission)
    .with_degradation(cfg.degradation.clone().map(SimDegradation::new))
    .with_gate(Some(gate))
    .with_rate_limits(cfg.rate_limits)
    .with_flights(cfg.record_flights.then(|| spec.engine_info()));
    let outcome = fleet.run();

    let gpus = match cfg.tensor_parallel_size {
        1 => cfg.gpu.clone(),
        tp => format!("{tp}×{}", cfg.gpu),
    };
    let title = format!(
        "infergate sim · workload {} · {} × {gpus} {} · policy {}",
        workload.name,
        cfg.workers,
        cfg.model,
        policy.name()
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
    let cached = outcome
        .extra
        .iter()
        .find(|(k, _)| *k == "cached_tokens")
        .map_or(0, |(_, v)| *v as u64);
    report.by_engine = engines::by_engine(&outcome.stats, outcome.end);
    report.extra.extend(
        extra
            .into_iter()
            .chain(engines::fleet_extra(&outcome.stats, outcome.end))
            .chain(engines::cost_extra(
                &prices,
                model,
                &outcome.records,
                cached,
            ))
            .chain(outcome.extra)
            .map(|(k, v)| (k.to_owned(), v)),
    );
    Ok(SimResult {
        report,
        wall_seconds: started.elapsed().as_secs_f64(),
        steps: outcome.steps,
        trace: outcome.trace,
    })
}
