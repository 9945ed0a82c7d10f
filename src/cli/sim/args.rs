//! Flags of `infergate sim`, the policy names it accepts, and `run`: one simulation rendered as
//! the bench report, or several policies on the same seeded workload side by side.

use std::fmt::Write;
use std::path::PathBuf;
use std::time::Duration;

use super::compare::compare_table;
use super::{SimConfig, SimResult, load_policy, simulate};
use crate::bench::parse_duration;
use crate::workload::{self, Overrides};
use infergate::routing::{PolicyConfig, PrefixConfig};
use infergate_engine::host_time::HostCost;

/// Flags of `infergate sim`: a fleet on a virtual clock, the real router and engine schedulers.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Workload name (`config/workloads/NAME.yaml` or shipped) or path to a YAML file.
    #[arg(long, default_value = "chat")]
    pub workload: String,
    /// Replay the gateway's trace file (its `trace:` output) instead of a workload: arrivals,
    /// prompt and answer lengths, tenants, sessions and prefix groups as recorded.
    #[arg(long, value_name = "TRACE", conflicts_with = "workload")]
    pub replay: Option<std::path::PathBuf>,
    /// With --replay: time scale of the recorded arrivals (2 = twice as fast).
    #[arg(long, default_value_t = 1.0, requires = "replay")]
    pub speed: f64,
    /// Engine workers in the fleet [default: 16].
    #[arg(long)]
    pub workers: Option<usize>,
    /// GPU preset of every worker [default: h100].
    #[arg(long)]
    pub gpu: Option<String>,
    /// Model preset [default: llama-3-8b].
    #[arg(long)]
    pub model: Option<String>,
    /// GPUs each worker's model is sharded over, as the engine's `--tensor-parallel-size`
    /// (weights and KV cache split across them, all-reduces added to every step) [default: 1].
    #[arg(long)]
    pub tensor_parallel_size: Option<usize>,
    /// Gateway config whose checks every request meets first, as the live gateway applies them:
    /// body size (413), the tier's max_tokens ceiling (400), the model's max_context (400).
    /// Default: the embedded config `infergate up` serves. A tenant of the workload is checked
    /// under the configured tenant's tier, else the tier of its name, else `default_tier`.
    #[arg(long)]
    pub gateway_config: Option<PathBuf>,
    /// The pool of --gateway-config to simulate (its routing policy and settings, admission and
    /// degradation). Default: the pool serving --model, else the only pool.
    #[arg(long)]
    pub pool: Option<String>,
    /// Routing policy: prefix, round_robin, least_load or session (with default settings).
    /// Default: the --gateway-config pool's policy with its settings, else prefix.
    #[arg(long)]
    pub policy: Option<String>,
    /// Comma-separated policies to run on the same seeded workload and show side by side.
    #[arg(long, value_delimiter = ',')]
    pub compare_policies: Vec<String>,
    /// Simulated run length instead of the workload's, e.g. 3600s, 1h.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Mean arrival rate instead of the workload's, requests/s (open-loop workloads).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Seed instead of the workload's.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Most sequences per batch on each worker [default: 256].
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Token budget of one engine step [default: 8192].
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Prefill whole prompts in one step instead of chunking them.
    #[arg(long)]
    pub no_chunked_prefill: bool,
    /// Disable the engines' prefix cache.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Share of each engine's KV blocks that reused cached blocks keep ahead of blocks used once
    /// (0 is plain LRU), as the engine's `--kv-protected-fraction` [default: the engine's].
    #[arg(long)]
    pub kv_protected_fraction: Option<f64>,
    /// Route on the engines' KV events (precise mode, as in front of `infergate engine`) instead
    /// of the approximate index alone (as in front of vLLM).
    #[arg(long)]
    pub kv_events: bool,
    /// Endpoint the simulated clients call: `chat` wraps prompts in the chat template as the
    /// engine does (like `infergate bench`'s default); `completions` sends them as they are.
    #[arg(long, default_value = "chat", value_parser = ["chat", "completions"])]
    pub endpoint: String,
    /// Multiply every step time (to mirror engines run with `--fault-latency-multiplier`)
    /// [default: 1].
    #[arg(long)]
    pub fault_latency_multiplier: Option<f64>,
    /// Host microseconds before every engine step, as the engine's flag of that name (a
    /// host-bound engine idles its GPU between steps) [default: 0].
    #[arg(long)]
    pub sim_host_us_per_step: Option<f64>,
    /// Host microseconds per sequence in a step, as the engine's flag [default: 0].
    #[arg(long)]
    pub sim_host_us_per_seq: Option<f64>,
    /// Host microseconds per new prompt token (tokenising), as the engine's flag [default: 0].
    #[arg(long)]
    pub sim_host_us_per_prompt_token: Option<f64>,
    /// Host microseconds per generated token (detokenising), as the engine's flag [default: 0].
    #[arg(long)]
    pub sim_host_us_per_output_token: Option<f64>,
    /// Decode batch sizes with a captured CUDA graph, as the engine's flag (e.g. `1,2,4,8`;
    /// default: vLLM's, 1, 2, 4 and multiples of 8 up to --max-num-seqs). Other steps run
    /// eagerly, at the eager path's cost.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub cuda_graph_sizes: Vec<usize>,
    /// Never use CUDA graphs: every step runs eagerly, as the engine's flag.
    #[arg(long)]
    pub enforce_eager: bool,
    /// Which steps replay graphs, as the engine's flag: `full-and-piecewise` also runs steps
    /// with prefill as piecewise graphs up to the largest size (vLLM V1). Default: the
    /// engines' (`full-decode-only`, or a spawn entry's flag with --engine-args-from-config).
    #[arg(long, value_enum)]
    pub cudagraph_mode: Option<infergate_engine::exec_path::CudagraphMode>,
    /// Take the engines from the --gateway-config pool's sim `spawn` entries, as `infergate up`
    /// would start them: their count is --workers and their flags (--gpu, --model,
    /// --max-num-seqs, --max-num-batched-tokens, --no-chunked-prefill, --no-prefix-caching,
    /// --num-gpu-blocks-override, --cuda-graph-sizes, --enforce-eager, --sim-host-us-*, KV
    /// events, …) the engine settings. Engine
    /// flags given here override them.
    #[arg(long, requires = "gateway_config")]
    pub engine_args_from_config: bool,
    /// KV blocks per worker instead of the GPU memory budget's.
    #[arg(long)]
    pub num_gpu_blocks_override: Option<usize>,
    /// Most requests queued over the fleet before new ones get 429; 0 = unbounded. With
    /// --admission-per-worker, the bound of the admission queue (engine queues are then unbounded).
    /// Default: the --gateway-config pool's `max_queue`, else 0.
    #[arg(long)]
    pub max_queue: Option<usize>,
    /// Admission stage as in the gateway: requests in flight per worker before arrivals wait in a
    /// fleet-wide priority queue (priority, then arrival); 0 = off. Default: the --gateway-config
    /// pool's `max_in_flight_per_worker`, else 0.
    #[arg(long)]
    pub admission_per_worker: Option<usize>,
    /// Longest wait in the admission queue before a 429, e.g. 30s (with --admission-per-worker).
    /// Default: the --gateway-config pool's `max_wait`, else 30s.
    #[arg(long, value_parser = parse_duration)]
    pub max_wait: Option<Duration>,
    /// Tenants take turns in the admission queue by token-weighted fair share (input weight 1,
    /// output weight 2), as the gateway's `admission.fair_share`; `--fair-share off` for first
    /// come. Default: the --gateway-config pool's setting, else off.
    #[arg(long, value_parser = ["on", "off"])]
    pub fair_share: Option<String>,
    /// With fair share: weighted tokens a tenant may be ahead of the least served and still go
    /// first when a free worker holds its prefix (`admission.fair_share.locality_window`; 0:
    /// strict turns). Default: the --gateway-config pool's, else 2048.
    #[arg(long)]
    pub locality_window: Option<f64>,
    /// With fair share: slots past the capacity lent to a tenant holding less than its equal
    /// share (`admission.fair_share.borrow_slots`). Default: the --gateway-config pool's, else 0.
    #[arg(long)]
    pub borrow_slots: Option<usize>,
    /// Apply the per-tenant rate limits of the gateway config's tiers (requests and tokens per
    /// minute; a workload tenant's tier as for the other checks) with the gateway's limiter on
    /// virtual time: over them, a 429 (`extra.rate_limited`). Default: off.
    #[arg(long)]
    pub rate_limits: bool,
    /// Admission priority of a workload tenant, TENANT=PRIORITY (higher first; repeatable;
    /// tenants not named get 0). Also the tier degradation applies to: the tenant's name.
    #[arg(long = "tier", value_parser = parse_tier)]
    pub tiers: Vec<(String, u32)>,
    /// A degradation.yaml: the policy of pool `local` (or of the only pool) degrades requests by
    /// tier (the tenant's name) on virtual time. Fallback actions are not simulated. Default: the
    /// --gateway-config pool's degradation policy, if any.
    #[arg(long)]
    pub degradation: Option<PathBuf>,
    /// Write the JSON report (an object keyed by policy with --compare-policies) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write a trace file here: one line per request the engines finished, with its engine
    /// flight record, as the gateway's `trace:` writes them (what `infergate shapes` reads, e.g.
    /// to propose capture sizes from simulated traffic). Not with --compare-policies.
    #[arg(long, conflicts_with = "compare_policies")]
    pub trace: Option<PathBuf>,
}

impl SimArgs {
    /// The fleet these flags describe (without the degradation policy: see `run`).
    pub fn config(&self) -> SimConfig {
        self.over(SimConfig::default())
    }

    /// `base` with every engine and fleet flag given here in its place (`base` keeps the rest).
    fn over(&self, base: SimConfig) -> SimConfig {
        let mut c = base;
        let set = |slot: &mut usize, v: Option<usize>| *slot = v.unwrap_or(*slot);
        set(&mut c.workers, self.workers);
        set(&mut c.tensor_parallel_size, self.tensor_parallel_size);
        set(&mut c.max_num_seqs, self.max_num_seqs);
        set(&mut c.max_num_batched_tokens, self.max_num_batched_tokens);
        if let Some(gpu) = &self.gpu {
            c.gpu.clone_from(gpu);
        }
        if let Some(model) = &self.model {
            c.model.clone_from(model);
        }
        c.chunked_prefill &= !self.no_chunked_prefill;
        c.prefix_caching &= !self.no_prefix_caching;
        c.kv_events |= self.kv_events;
        c.kv_protected_fraction = self
            .kv_protected_fraction
            .unwrap_or(c.kv_protected_fraction);
        c.latency_multiplier = self
            .fault_latency_multiplier
            .unwrap_or(c.latency_multiplier);
        let host = [
            self.sim_host_us_per_step,
            self.sim_host_us_per_seq,
            self.sim_host_us_per_prompt_token,
            self.sim_host_us_per_output_token,
        ];
        if host.iter().any(Option::is_some) {
            // Any host flag replaces the whole model (unnamed terms are 0), as on the engine.
            let us = |v: Option<f64>| v.unwrap_or(0.0);
            c.host_cost = HostCost::from_micros(us(host[0]), us(host[1]), us(host[2]), us(host[3]));
        }
        if !self.cuda_graph_sizes.is_empty() {
            c.cuda_graph_sizes.clone_from(&self.cuda_graph_sizes);
        }
        c.enforce_eager |= self.enforce_eager;
        if let Some(mode) = self.cudagraph_mode {
            c.cudagraph_mode = mode;
        }
        if self.num_gpu_blocks_override.is_some() {
            c.num_gpu_blocks_override = self.num_gpu_blocks_override;
        }
        c.chat_template = self.endpoint == "chat";
        c.max_queue = self.max_queue.unwrap_or(0);
        c.admission_per_worker = self.admission_per_worker.unwrap_or(0);
        c.max_wait = self.max_wait.unwrap_or(Duration::from_secs(30));
        c.priorities = self.tiers.iter().cloned().collect();
        c.fair_share = self.fair_share_flag().flatten();
        c.rate_limits = self.rate_limits;
        c.fair_share = self.with_window(c.fair_share);
        c
    }

    /// `fair` with `--locality-window`, if given.
    fn with_window(
        &self,
        fair: Option<infergate::admission::FairWeights>,
    ) -> Option<infergate::admission::FairWeights> {
        fair.map(|mut f| {
            if let Some(window) = self.locality_window {
                f.locality_window = window.max(0.0);
            }
            if let Some(borrow) = self.borrow_slots {
                f.borrow_slots = borrow;
            }
            f
        })
    }

    /// `--fair-share`: `Some(None)` for off, `Some(Some(default weights))` for on.
    fn fair_share_flag(&self) -> Option<Option<infergate::admission::FairWeights>> {
        self.fair_share
            .as_deref()
            .map(|v| (v == "on").then(infergate::admission::FairWeights::default))
    }

    /// The model the flags name, else the default preset's.
    fn model_name(&self) -> &str {
        self.model.as_deref().unwrap_or("llama-3-8b")
    }
}

/// `TENANT=PRIORITY` of `--tier`.
fn parse_tier(text: &str) -> Result<(String, u32), String> {
    let (tenant, priority) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}`: expected TENANT=PRIORITY, e.g. paid=10"))?;
    let tenant = tenant.trim();
    if tenant.is_empty() {
        return Err(format!("`{text}`: the tenant name is empty"));
    }
    let priority = priority
        .trim()
        .parse()
        .map_err(|e| format!("`{text}`: priority must be a whole number ≥ 0: {e}"))?;
    Ok((tenant.to_owned(), priority))
}

/// The policy a name stands for (prefix with its default settings): the names are the routing
/// file's own (`PolicyConfig::name`).
pub fn policy_config(name: &str) -> Result<PolicyConfig, String> {
    let name = name.trim();
    PolicyConfig::defaults()
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| {
            let known: Vec<&str> = PolicyConfig::defaults().iter().map(|p| p.name()).collect();
            format!("unknown policy `{name}`; known: {}", known.join(", "))
        })
}

/// The pool of `snapshot` to simulate: `--pool`, else the one serving `model`, else the only one.
fn sim_pool<'a>(
    snapshot: &'a infergate::config::Snapshot,
    pool: Option<&str>,
    model: &str,
) -> Result<&'a infergate::config::PoolSpec, String> {
    let names = || {
        snapshot
            .pools
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let by_name = |name: &str| snapshot.pools.iter().find(|p| p.name == name);
    if let Some(name) = pool {
        return by_name(name).ok_or_else(|| {
            format!(
                "--pool {name}: the gateway config has no such pool (pools: {})",
                names()
            )
        });
    }
    if let Some(p) = snapshot
        .model(model)
        .and_then(|m| snapshot.pools.get(m.pool))
    {
        return Ok(p);
    }
    match snapshot.pools.as_slice() {
        [only] => Ok(only),
        _ => Err(format!(
            "the gateway config serves no model `{model}` and has several pools: name one with --pool ({})",
            names()
        )),
    }
}

/// The fleet and the routing policy to simulate: the flags, over the --gateway-config pool's
/// policy with its settings, admission and degradation (what the live gateway would apply)
/// when a gateway config is given.
pub(super) fn resolve(args: &SimArgs) -> Result<(SimConfig, PolicyConfig), String> {
    let mut cfg = args.config();
    // Without a flag, the gateway config's pool decides what the live gateway would do.
    let mut default_policy = PolicyConfig::Prefix(PrefixConfig::default());
    if let Some(path) = &args.gateway_config {
        let snapshot = infergate::config::load(path).map_err(|e| e.to_string())?;
        let pool = sim_pool(&snapshot, args.pool.as_deref(), args.model_name())?;
        if args.engine_args_from_config {
            let (workers, engine) = super::spawn::pool_engines(pool)?;
            let mut base = SimConfig::default();
            super::spawn::apply(&mut base, workers, &engine);
            cfg = args.over(base);
        }
        default_policy = pool.policy.clone();
        let a = &pool.admission;
        cfg.admission_per_worker = args
            .admission_per_worker
            .unwrap_or(a.max_in_flight_per_worker);
        cfg.max_queue = args.max_queue.unwrap_or(a.max_queue);
        cfg.max_wait = args.max_wait.unwrap_or(a.max_wait);
        cfg.fair_share = args.with_window(args.fair_share_flag().unwrap_or(a.fair_share));
        cfg.degradation = snapshot.degradation.get(&pool.name).cloned();
        cfg.pool = Some(pool.name.clone());
        cfg.gateway = Some(Box::new(snapshot));
    } else if args.pool.is_some() {
        return Err("--pool names a pool of --gateway-config: give that too".into());
    }
    if let Some(path) = &args.degradation {
        cfg.degradation = Some(load_policy(path)?);
    }
    let policy = match &args.policy {
        Some(name) => policy_config(name)?,
        None => default_policy,
    };
    Ok((cfg, policy))
}

/// Runs the simulation(s) the flags ask for; returns the text to print and writes `--out`.
pub fn run(args: &SimArgs) -> Result<String, String> {
    let workload = workload::load_or_replay(&args.workload, args.replay.as_deref(), args.speed)?;
    let overrides = Overrides {
        duration: args.duration,
        rate: args.rate,
        seed: args.seed,
    };
    let (mut cfg, policy) = resolve(args)?;
    cfg.record_flights = args.trace.is_some();
    if args.compare_policies.is_empty() {
        let result = simulate(&cfg, &workload, &overrides, &policy)?;
        let mut text = result.report.render_text();
        let _ = writeln!(text, "\n{}", speed_line(&result));
        if let Some(path) = &args.trace {
            let mut lines = result.trace.join("\n");
            lines.push('\n');
            write(path, &lines)?;
            let _ = writeln!(
                text,
                "trace: {} ({} requests)",
                path.display(),
                result.trace.len()
            );
        }
        if let Some(path) = &args.out {
            write(path, &result.report.to_json())?;
            let _ = writeln!(text, "report: {}", path.display());
        }
        return Ok(text);
    }
    let policies = args
        .compare_policies
        .iter()
        .map(|name| policy_config(name))
        .collect::<Result<Vec<_>, _>>()?;
    // Each policy runs on its own thread: the runs share nothing but the workload.
    let results: Vec<Result<SimResult, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = policies
            .iter()
            .map(|p| scope.spawn(|| simulate(&cfg, &workload, &overrides, p)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a simulation panicked".into()))
            })
            .collect()
    });
    let mut named = Vec::new();
    for (policy, result) in policies.iter().zip(results) {
        named.push((policy.name(), result?));
    }
    let mut text = compare_table(&named);
    if let Some(path) = &args.out {
        let reports: serde_json::Map<String, serde_json::Value> = named
            .iter()
            .map(|(name, r)| Ok(((*name).to_owned(), serde_json::to_value(&r.report)?)))
            .collect::<Result<_, serde_json::Error>>()
            .map_err(|e| e.to_string())?;
        let json = serde_json::to_string_pretty(&reports).map_err(|e| e.to_string())?;
        write(path, &json)?;
        let _ = writeln!(text, "report: {}", path.display());
    }
    Ok(text)
}

/// How long the simulation took against how much it simulated.
fn speed_line(r: &SimResult) -> String {
    format!(
        "simulated {:.1} s in {:.2} s of wall time ({} engine steps)",
        r.report.duration_s, r.wall_seconds, r.steps
    )
}

/// Writes `text` to `path`, naming the path in the error.
fn write(path: &std::path::Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
