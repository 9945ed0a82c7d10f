//! One simulated engine worker: the real engine core (scheduler, KV block manager, sim backend)
//! on its own virtual clock, assembled as `infergate engine` assembles it, plus an inbox for the
//! requests routed to it while it is mid-step.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use infergate_engine::backend::sim::SimBackend;
use infergate_engine::block_manager::BlockManager;
use infergate_engine::clock::{Clock, VirtualClock};
use infergate_engine::core::EngineCore;
use infergate_engine::exec_path::CaptureSizes;
use infergate_engine::flight::EngineInfo;
use infergate_engine::host_time::HostCost;
use infergate_engine::kv_events::{KvEventBatch, PrefixKeys};
use infergate_engine::metrics::EngineMetrics;
use infergate_engine::presets;
use infergate_engine::request::SamplingParams;
use infergate_engine::roofline::{RooflineConfig, RooflineModel, kv_block_budget};
use infergate_engine::scheduler::{Scheduler, SchedulerConfig};
use infergate_engine::sequence::NewRequest;
use infergate_engine::tokenizer::SimTokenizer;

use super::SimConfig;
use super::sink::{Note, NoteLog, RecordingSink, take_notes};
use infergate::routing::WorkerView;
use infergate::routing::features::session_hash;

/// Engine ids of sibling sequences start above this (plan ids count up from 0).
const SIBLING_IDS: u64 = 1 << 62;

/// Mean answer length of the backend's EOS draw; unused, since every request sets `ignore_eos`.
const MEAN_OUTPUT_TOKENS: f64 = 256.0;

/// What every worker of a fleet is built from, checked once.
pub(super) struct WorkerSpec {
    roofline: RooflineModel,
    vocab: Vec<u32>,
    eos: u32,
    sched: SchedulerConfig,
    num_blocks: usize,
    block_size: usize,
    prefix_caching: bool,
    kv_protected_fraction: f64,
    kv_events: bool,
    host_cost: HostCost,
    model: String,
    /// The model preset's context length: the engines refuse longer requests.
    pub(super) max_model_len: usize,
}

impl WorkerSpec {
    /// Presets → KV budget → scheduler settings, with the same rules as the engine's launcher.
    pub(super) fn new(cfg: &SimConfig) -> Result<Self, String> {
        let gpu = presets::gpu(&cfg.gpu).ok_or_else(|| {
            let known = presets::gpu_names().join(", ");
            format!("unknown --gpu {:?}; known: {known}", cfg.gpu)
        })?;
        let model = presets::model(&cfg.model).ok_or_else(|| {
            let known = presets::model_names().join(", ");
            format!("unknown --model {:?}; known: {known}", cfg.model)
        })?;
        if cfg.workers == 0
            || cfg.max_num_seqs == 0
            || cfg.block_size == 0
            || cfg.tensor_parallel_size == 0
        {
            return Err(
                "--workers, --max-num-seqs, --tensor-parallel-size and the block size must be at least 1"
                    .into(),
            );
        }
        // Sharding as the engine shards it: the same budget and step-time model, per GPU.
        let budget = kv_block_budget(
            gpu,
            model,
            cfg.tensor_parallel_size,
            cfg.gpu_memory_utilization,
            cfg.block_size,
        )
        .map_err(|e| e.to_string())?;
        let num_blocks = cfg.num_gpu_blocks_override.unwrap_or(budget.num_blocks);
        if num_blocks == 0 {
            return Err("the KV cache would have no blocks".into());
        }
        let mut batched = cfg.max_num_batched_tokens;
        if !cfg.chunked_prefill {
            // Whole prompts only: the budget must hold the longest one (as the engine requires).
            batched = batched.max(model.max_model_len);
        }
        if batched == 0 {
            return Err("--max-num-batched-tokens must be at least 1".into());
        }
        let roofline = RooflineModel::new(
            gpu,
            model,
            RooflineConfig {
                tensor_parallel_size: cfg.tensor_parallel_size,
                max_num_seqs: cfg.max_num_seqs,
                latency_multiplier: cfg.latency_multiplier,
                ..RooflineConfig::default()
            },
        )
        .with_capture_sizes(
            CaptureSizes::from_flags(&cfg.cuda_graph_sizes, cfg.enforce_eager, cfg.max_num_seqs)?
                .with_mode(cfg.cudagraph_mode),
        );
        cfg.host_cost.check()?;
        let tokenizer = SimTokenizer::shared()?;
        Ok(Self {
            roofline,
            vocab: tokenizer.word_tokens().to_vec(),
            eos: tokenizer.eos(),
            sched: SchedulerConfig {
                max_num_seqs: cfg.max_num_seqs,
                max_num_batched_tokens: batched,
                chunked_prefill: cfg.chunked_prefill,
            },
            num_blocks,
            block_size: cfg.block_size,
            prefix_caching: cfg.prefix_caching,
            kv_protected_fraction: cfg.kv_protected_fraction,
            kv_events: cfg.kv_events,
            host_cost: cfg.host_cost,
            model: cfg.model.clone(),
            max_model_len: model.max_model_len,
        })
    }
}

impl WorkerSpec {
    /// The engine-wide part of every flight record these workers would send.
    pub(super) fn engine_info(&self) -> EngineInfo {
        EngineInfo::new("sim", self.roofline.capture_sizes())
            .with_piecewise(self.roofline.is_piecewise())
    }
}

/// Counters of one worker at the end of a run.
#[derive(Debug, Clone, Default)]
pub(super) struct WorkerStats {
    /// The worker's label (`w00`, …).
    pub name: String,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: f64,
    /// Of which were found.
    pub prefix_hits: f64,
    /// Sequences preempted.
    pub preemptions: f64,
    /// Steps on the CUDA-graph path.
    pub graph_steps: u64,
    /// Steps on the eager path.
    pub eager_steps: u64,
    /// KV usage integrated over simulated time (usage × seconds).
    pub kv_area: f64,
    /// Time inside steps (`infergate_engine_busy_seconds_total`).
    pub busy_seconds: f64,
    /// Host time between steps while work was pending (`infergate_engine_host_seconds_total`).
    pub host_seconds: f64,
    /// Tokens computed again after preemptions (`infergate_engine_recomputed_tokens_total`).
    pub recomputed_tokens: f64,
    /// Steps by batch size: `batch_counts[n]` steps ran `n` sequences.
    pub batch_counts: Vec<u64>,
    /// Engine queue length integrated over simulated time (requests × seconds).
    pub queue_area: f64,
}

impl WorkerStats {
    /// Mean sequences per step (0 without steps).
    pub(super) fn batch_mean(&self) -> f64 {
        let steps: u64 = self.batch_counts.iter().sum();
        let seqs: u64 = self
            .batch_counts
            .iter()
            .enumerate()
            .map(|(n, c)| n as u64 * c)
            .sum();
        if steps == 0 {
            0.0
        } else {
            seqs as f64 / steps as f64
        }
    }
}

/// Nearest-rank `p`-th percentile of a histogram of whole numbers (`counts[n]` times `n`).
pub(super) fn count_percentile(counts: &[u64], p: f64) -> f64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (n, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return n as f64;
        }
    }
    (counts.len().saturating_sub(1)) as f64
}

/// One engine worker of the simulated fleet.
pub(super) struct SimWorker {
    /// Label in the report (`w00`, `w01`, …).
    pub name: String,
    /// Routing identity (hash of a made-up URL).
    pub key: u64,
    /// Requests routed here and not finished.
    pub in_flight: u32,
    /// True while a step is under way (its end is in the event queue).
    pub busy: bool,
    /// Prompt tokens routed here whose first token has not come out (as the gateway counts it).
    pub pending_prefill: u64,
    /// KV capacity in tokens (what the live engine exports in `vllm:cache_config_info`).
    kv_capacity: u64,
    /// Protected tokens of the engine's segmented LRU (`kv_protected_blocks × block_size`).
    kv_protected: u64,
    core: EngineCore,
    clock: Arc<VirtualClock>,
    metrics: Arc<EngineMetrics>,
    pending: Arc<AtomicUsize>,
    log: NoteLog,
    /// Requests routed here mid-step, each the group of its sequences.
    inbox: Vec<Vec<NewRequest>>,
    /// The last engine id given to a sibling sequence.
    next_sibling: u64,
    kv_area: f64,
    kv_last: f64,
    kv_since: f64,
    /// Steps by batch size, and the engine queue integrated like KV usage.
    batch_counts: Vec<u64>,
    queue_area: f64,
    queue_last: f64,
}

impl SimWorker {
    /// Worker number `i`, idle at time zero.
    pub(super) fn new(i: usize, spec: &WorkerSpec) -> Result<Self, String> {
        let backend = SimBackend::new(
            spec.roofline.clone(),
            spec.vocab.clone(),
            spec.eos,
            MEAN_OUTPUT_TOKENS,
            spec.block_size,
        )
        .with_host_cost(spec.host_cost);
        let mut kv = BlockManager::new(spec.num_blocks, spec.block_size, spec.prefix_caching);
        kv.set_protected_fraction(spec.kv_protected_fraction);
        let kv_protected = (kv.protected_cap() * spec.block_size) as u64;
        if spec.kv_events {
            kv.enable_events();
        }
        let sched = Scheduler::new(spec.sched, kv);
        let clock = Arc::new(VirtualClock::new());
        let metrics = Arc::new(EngineMetrics::new(&spec.model).map_err(|e| e.to_string())?);
        let pending = Arc::new(AtomicUsize::new(0));
        let core = EngineCore::new(
            sched,
            Box::new(backend),
            clock.clone(),
            metrics.clone(),
            pending.clone(),
        );
        Ok(Self {
            name: format!("w{i:02}"),
            key: session_hash(&format!("sim://worker-{i}")),
            in_flight: 0,
            busy: false,
            pending_prefill: 0,
            kv_capacity: (spec.num_blocks * spec.block_size) as u64,
            kv_protected,
            core,
            clock,
            metrics,
            pending,
            log: NoteLog::default(),
            inbox: Vec::new(),
            next_sibling: SIBLING_IDS,
            kv_area: 0.0,
            kv_last: 0.0,
            kv_since: 0.0,
            batch_counts: Vec::new(),
            queue_area: 0.0,
            queue_last: 0.0,
        })
    }

    /// The worker as routing sees it; the simulator's view is always fresh (no polling lag).
    pub(super) fn view(&self) -> WorkerView {
        let sched = self.core.scheduler();
        WorkerView {
            key: self.key,
            healthy: true,
            in_flight: self.in_flight,
            waiting: (self.inbox.len() + sched.waiting.len()) as f64,
            running: sched.running.len() as f64,
            polled_in_flight: self.in_flight,
            kv_usage: sched.kv.usage(),
            pending_prefill: self.pending_prefill,
            kv_capacity: Some(self.kv_capacity),
            kv_protected: Some(self.kv_protected).filter(|&t| t > 0),
        }
    }

    /// Requests submitted and not yet scheduled for the first time (inbox and engine queue).
    pub(super) fn queued(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Hands a request to the worker; it reaches the engine at the next step start.
    pub(super) fn submit(
        &mut self,
        id: u64,
        prompt: Vec<u32>,
        output_tokens: u32,
        prefix_keys: Option<PrefixKeys>,
    ) {
        let params = SamplingParams {
            max_tokens: output_tokens.max(1) as usize,
            ignore_eos: true,
            seed: Some(id),
            ..SamplingParams::default()
        };
        self.submit_sequences(id, prompt, vec![params], prefix_keys);
    }

    /// Hands a request of one sequence per `params` (its `n` choices) to the worker, as the
    /// engine's server queues them: one group sharing the prompt, the first sequence with the
    /// router's keys. The first keeps the request's id as its engine id; siblings get ids of
    /// their own, above any plan's.
    pub(super) fn submit_sequences(
        &mut self,
        id: u64,
        prompt: Vec<u32>,
        params: Vec<SamplingParams>,
        mut prefix_keys: Option<PrefixKeys>,
    ) {
        let size = params.len();
        if size == 0 {
            return;
        }
        self.pending.fetch_add(size, Ordering::AcqRel);
        self.in_flight += 1;
        let sinks = RecordingSink::group(id, &self.log, size);
        let mut group = Vec::with_capacity(size);
        for (j, (params, sink)) in params.into_iter().zip(sinks).enumerate() {
            let engine_id = if j == 0 {
                id
            } else {
                self.next_sibling += 1;
                self.next_sibling
            };
            group.push(NewRequest {
                id: engine_id,
                prompt: prompt.clone(),
                params,
                sink: Box::new(sink),
                prefix_keys: prefix_keys.take(),
            });
        }
        self.inbox.push(group);
    }

    /// Whether this worker's engine publishes KV events.
    pub(super) fn kv_events(&self) -> bool {
        self.core.scheduler().kv.events_enabled()
    }

    /// The net change of resident router keys since the last call (empty without events).
    pub(super) fn take_kv_events(&mut self) -> KvEventBatch {
        self.core.take_kv_events()
    }

    /// True while requests wait in the inbox or the engine has anything to do.
    pub(super) fn has_work(&self) -> bool {
        !self.inbox.is_empty() || self.core.has_work()
    }

    /// Moves the clock to `t` and hands the inbox to the engine (which may refuse some at once).
    pub(super) fn admit(&mut self, t: f64) {
        self.clock.advance_to(t);
        for group in self.inbox.drain(..) {
            self.core.add_group(group);
        }
    }

    /// Runs one engine step from the clock's time; returns its end, or `None` if nothing ran.
    pub(super) fn step(&mut self) -> Option<f64> {
        let report = self.core.step();
        report.cost?;
        if self.batch_counts.len() <= report.scheduled {
            self.batch_counts.resize(report.scheduled + 1, 0);
        }
        self.batch_counts[report.scheduled] += 1;
        self.note_kv(report.end);
        Some(report.end)
    }

    /// The worker clock's time.
    pub(super) fn now(&self) -> f64 {
        self.clock.now()
    }

    /// Moves the notes written since the last call into `into`.
    pub(super) fn take_notes(&self, into: &mut Vec<(u64, Note)>) {
        take_notes(&self.log, into);
    }

    /// Integrates KV usage and the engine queue up to `t`, then samples them afresh (the queue
    /// as the step left it: requests not in its batch, and those routed here meanwhile).
    fn note_kv(&mut self, t: f64) {
        if t > self.kv_since {
            self.kv_area += self.kv_last * (t - self.kv_since);
            self.queue_area += self.queue_last * (t - self.kv_since);
            self.kv_since = t;
        }
        let sched = self.core.scheduler();
        self.kv_last = sched.kv.usage();
        self.queue_last = (sched.waiting.len() + self.inbox.len()) as f64;
    }

    /// The worker's counters, with KV usage integrated up to `end`.
    pub(super) fn stats(&mut self, end: f64) -> WorkerStats {
        self.note_kv(end);
        let m = &self.metrics;
        WorkerStats {
            name: self.name.clone(),
            prefix_queries: m.prefix_queries.get(),
            prefix_hits: m.prefix_hits.get(),
            preemptions: m.preemptions.get(),
            graph_steps: m.steps.with_label_values(&["graph"]).get(),
            eager_steps: m.steps.with_label_values(&["eager"]).get(),
            kv_area: self.kv_area,
            busy_seconds: m.busy_seconds.get(),
            host_seconds: m.host_seconds.get(),
            recomputed_tokens: m.recomputed_tokens.get(),
            batch_counts: self.batch_counts.clone(),
            queue_area: self.queue_area,
        }
    }
}
