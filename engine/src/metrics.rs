//! Prometheus metrics under vLLM's names and `model_name` label, so any router that understands
//! vLLM (ours included) reads our workers unchanged.

use crate::block_manager::BlockManager;
use prometheus::{
    Counter, Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounterVec, Opts, Registry,
};

/// Every metric the engine exports.
pub struct EngineMetrics {
    registry: Registry,
    /// `vllm:num_requests_running`.
    pub running: Gauge,
    /// `vllm:num_requests_waiting`.
    pub waiting: Gauge,
    /// `vllm:kv_cache_usage_perc` (0..1).
    pub kv_usage: Gauge,
    /// `vllm:prefix_cache_queries_total` (tokens).
    pub prefix_queries: Counter,
    /// `vllm:prefix_cache_hits_total` (tokens).
    pub prefix_hits: Counter,
    /// `vllm:num_preemptions_total`.
    pub preemptions: Counter,
    /// `vllm:prompt_tokens_total`.
    pub prompt_tokens: Counter,
    /// `vllm:generation_tokens_total`.
    pub generation_tokens: Counter,
    /// `vllm:request_success_total` by `finished_reason`.
    pub request_success: IntCounterVec,
    /// `vllm:time_to_first_token_seconds`.
    pub ttft: Histogram,
    /// `vllm:inter_token_latency_seconds`.
    pub itl: Histogram,
    /// `vllm:e2e_request_latency_seconds`.
    pub e2e: Histogram,
    /// `vllm:request_queue_time_seconds`: arrival to first scheduled, per finished request.
    pub queue_time: Histogram,
    /// `vllm:request_prefill_time_seconds`: first scheduled to first token.
    pub prefill_time: Histogram,
    /// `vllm:request_decode_time_seconds`: first token to last token.
    pub decode_time: Histogram,
    /// `vllm:request_inference_time_seconds`: first scheduled to last token.
    pub inference_time: Histogram,
    /// `vllm:request_time_per_output_token_seconds`: a finished request's decode time per token
    /// after the first.
    pub request_tpot: Histogram,
    /// `vllm:time_per_output_token_seconds`: vLLM's deprecated per-token name, observed with
    /// the same samples as `vllm:inter_token_latency_seconds` (as vLLM does).
    pub tpot: Histogram,
    /// `vllm:request_prompt_tokens`: prompt tokens per finished request.
    pub request_prompt_tokens: Histogram,
    /// `vllm:request_generation_tokens`: generated tokens per finished request.
    pub request_generation_tokens: Histogram,
    /// `vllm:request_max_num_generation_tokens`: the longest of a request's `n` completions
    /// (`n` is always 1 here, so the same as `vllm:request_generation_tokens`).
    pub request_max_generation_tokens: Histogram,
    /// `vllm:request_params_max_tokens`: the resolved `max_tokens` of each finished request.
    pub request_max_tokens: Histogram,
    /// `vllm:request_params_n`: the `n` of each finished request.
    pub request_n: Histogram,
    /// `vllm:iteration_tokens_total`: tokens computed per engine step (prefill and decode).
    pub iteration_tokens: Histogram,
    /// `infergate_engine_steps_total` by execution `path` (graph / eager).
    pub steps: IntCounterVec,
    /// `infergate_engine_rejected_total` by `reason`.
    pub rejected: IntCounterVec,
    /// `vllm:cache_config_info`: value 1, the KV cache's shape in its labels (as vLLM exports it),
    /// so a router can size its view of this worker's cache.
    pub cache_config: GaugeVec,
    /// `process_start_time_seconds`: Unix time this engine started (a router sees restarts).
    pub start_time: Gauge,
    /// `infergate_engine_busy_seconds_total`: time inside steps (the accelerator busy); its rate
    /// is the busy fraction an operator reads as "GPU utilisation".
    pub busy_seconds: Counter,
    /// `infergate_engine_host_seconds_total`: time between steps while work was pending (the
    /// host scheduling, tokenising, detokenising, streaming; idle time is not counted).
    pub host_seconds: Counter,
    /// `infergate_engine_step_gap_seconds`: that host time, per step.
    pub step_gap: Histogram,
    /// `infergate_engine_batch_size`: sequences in each step.
    pub batch_size: Histogram,
    /// `infergate_engine_recomputed_tokens_total`: tokens computed again after a preemption
    /// (recompute), prefix-cache hits excluded.
    pub recomputed_tokens: Counter,
    /// `infergate_engine_max_num_seqs`: the configured cap on sequences per step.
    pub max_num_seqs: Gauge,
    /// `infergate_engine_max_num_batched_tokens`: the configured cap on tokens per step.
    pub max_num_batched_tokens: Gauge,
}

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM's buckets of `vllm:iteration_tokens_total`.
const ITERATION_TOKEN_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// Buckets of `infergate_engine_step_gap_seconds`: 100 µs (a lean loop) to 10 s.
const STEP_GAP_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// Buckets of `infergate_engine_batch_size` (sequences per step).
const BATCH_SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0, 384.0, 512.0, 768.0,
    1024.0,
];
/// vLLM's buckets of `vllm:request_params_n`.
const N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
/// Context length the token-count buckets reach when the caller does not say (128Ki tokens).
const DEFAULT_MAX_MODEL_LEN: usize = 131_072;
/// `vllm:request_success_total` reasons this engine produces; exported at 0 from the start, as
/// vLLM does, so a rate over them exists before the first one happens.
const FINISHED_REASONS: [&str; 3] = ["stop", "length", "abort"];

/// vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to `max` (at least one bucket).
fn buckets_1_2_5(max: usize) -> Vec<f64> {
    let max = max.max(1) as f64;
    let mut out = Vec::new();
    let mut scale = 1.0;
    loop {
        for m in [1.0, 2.0, 5.0] {
            let v = m * scale;
            if v > max {
                return out;
            }
            out.push(v);
        }
        scale *= 10.0;
    }
}

/// One finished request, as the per-request histograms observe it. Times are seconds on the
/// engine's clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FinishedRequest {
    /// Arrival to finish.
    pub e2e: f64,
    /// Arrival to first scheduled.
    pub queued: f64,
    /// First scheduled to first token.
    pub prefill: f64,
    /// First token to last token.
    pub decode: f64,
    /// First scheduled to last token.
    pub inference: f64,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Tokens generated (the answer's `usage.completion_tokens`).
    pub generation_tokens: usize,
    /// The request's resolved `max_tokens`.
    pub max_tokens: usize,
}

/// Settings `vllm:cache_config_info` reports beside the block manager's own shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheSettings {
    /// `--gpu-memory-utilization`.
    pub gpu_memory_utilization: f64,
    /// `--num-gpu-blocks-override`, when given.
    pub num_gpu_blocks_override: Option<usize>,
}

impl Default for CacheSettings {
    fn default() -> Self {
        Self {
            gpu_memory_utilization: 0.9,
            num_gpu_blocks_override: None,
        }
    }
}

/// Label names of `vllm:cache_config_info`: vLLM's `CacheConfig` fields that apply to this
/// engine, plus our `kv_protected_blocks`. Values are in [`EngineMetrics::set_cache_config`]'s
/// order.
const CACHE_CONFIG_LABELS: [&str; 11] = [
    "block_size",
    "cache_dtype",
    "enable_prefix_caching",
    "gpu_memory_utilization",
    "is_attention_free",
    "kv_cache_size_tokens",
    "num_cpu_blocks",
    "num_gpu_blocks",
    "num_gpu_blocks_override",
    "sliding_window",
    "kv_protected_blocks",
];

impl EngineMetrics {
    /// Registers all metrics with the served model's name as `model_name`; token-count buckets
    /// reach 128Ki tokens.
    pub fn new(model_name: &str) -> Result<Self, prometheus::Error> {
        Self::with_max_model_len(model_name, DEFAULT_MAX_MODEL_LEN)
    }

    /// [`new`](Self::new) with token-count buckets up to `max_model_len`, as vLLM sizes them.
    pub fn with_max_model_len(
        model_name: &str,
        max_model_len: usize,
    ) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let opts =
            |name: &str, help: &str| Opts::new(name, help).const_label("model_name", model_name);
        let hist = |name: &str, help: &str, buckets: &[f64]| {
            HistogramOpts::new(name, help)
                .const_label("model_name", model_name)
                .buckets(buckets.to_vec())
        };
        let running = Gauge::with_opts(opts(
            "vllm:num_requests_running",
            "Requests in model execution batches.",
        ))?;
        let waiting = Gauge::with_opts(opts(
            "vllm:num_requests_waiting",
            "Requests waiting to be processed.",
        ))?;
        let kv_usage = Gauge::with_opts(opts(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
        ))?;
        let prefix_queries = Counter::with_opts(opts(
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
        ))?;
        let prefix_hits = Counter::with_opts(opts(
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.",
        ))?;
        let preemptions = Counter::with_opts(opts(
            "vllm:num_preemptions_total",
            "Cumulative number of preemptions from the engine.",
        ))?;
        let prompt_tokens = Counter::with_opts(opts(
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
        ))?;
        let generation_tokens = Counter::with_opts(opts(
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
        ))?;
        let request_success = IntCounterVec::new(
            opts(
                "vllm:request_success_total",
                "Count of successfully processed requests.",
            ),
            &["finished_reason"],
        )?;
        let ttft = Histogram::with_opts(hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        ))?;
        let itl = Histogram::with_opts(hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        ))?;
        let e2e = Histogram::with_opts(hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            E2E_BUCKETS,
        ))?;
        let queue_time = Histogram::with_opts(hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            E2E_BUCKETS,
        ))?;
        let prefill_time = Histogram::with_opts(hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            E2E_BUCKETS,
        ))?;
        let decode_time = Histogram::with_opts(hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            E2E_BUCKETS,
        ))?;
        let inference_time = Histogram::with_opts(hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            E2E_BUCKETS,
        ))?;
        let request_tpot = Histogram::with_opts(hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        ))?;
        let tpot = Histogram::with_opts(hist(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
            ITL_BUCKETS,
        ))?;
        let token_buckets = buckets_1_2_5(max_model_len);
        let request_prompt_tokens = Histogram::with_opts(hist(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            &token_buckets,
        ))?;
        let request_generation_tokens = Histogram::with_opts(hist(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            &token_buckets,
        ))?;
        let request_max_generation_tokens = Histogram::with_opts(hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            &token_buckets,
        ))?;
        let request_max_tokens = Histogram::with_opts(hist(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            &token_buckets,
        ))?;
        let request_n = Histogram::with_opts(hist(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            N_BUCKETS,
        ))?;
        let iteration_tokens = Histogram::with_opts(hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        ))?;
        for reason in FINISHED_REASONS {
            request_success.with_label_values(&[reason]);
        }
        let steps = IntCounterVec::new(
            opts(
                "infergate_engine_steps_total",
                "Engine steps by execution path (graph: padded CUDA-graph replay; eager: per-kernel launches).",
            ),
            &["path"],
        )?;
        let rejected = IntCounterVec::new(
            opts(
                "infergate_engine_rejected_total",
                "Requests refused before running, by reason.",
            ),
            &["reason"],
        )?;
        let cache_config = GaugeVec::new(
            opts(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig.",
            ),
            &CACHE_CONFIG_LABELS,
        )?;
        let start_time = Gauge::with_opts(Opts::new(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
        ))?;
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        start_time.set(since_epoch);
        registry.register(Box::new(cache_config.clone()))?;
        registry.register(Box::new(start_time.clone()))?;
        registry.register(Box::new(running.clone()))?;
        registry.register(Box::new(waiting.clone()))?;
        registry.register(Box::new(kv_usage.clone()))?;
        registry.register(Box::new(prefix_queries.clone()))?;
        registry.register(Box::new(prefix_hits.clone()))?;
        registry.register(Box::new(preemptions.clone()))?;
        registry.register(Box::new(prompt_tokens.clone()))?;
        registry.register(Box::new(generation_tokens.clone()))?;
        registry.register(Box::new(request_success.clone()))?;
        registry.register(Box::new(ttft.clone()))?;
        registry.register(Box::new(itl.clone()))?;
        registry.register(Box::new(e2e.clone()))?;
        registry.register(Box::new(queue_time.clone()))?;
        for h in [
            &prefill_time,
            &decode_time,
            &inference_time,
            &request_tpot,
            &tpot,
            &request_prompt_tokens,
            &request_generation_tokens,
            &request_max_generation_tokens,
            &request_max_tokens,
            &request_n,
            &iteration_tokens,
        ] {
            registry.register(Box::new(h.clone()))?;
        }
        registry.register(Box::new(steps.clone()))?;
        registry.register(Box::new(rejected.clone()))?;
        let busy_seconds = Counter::with_opts(opts(
            "infergate_engine_busy_seconds_total",
            "Seconds inside engine steps (the accelerator busy); its rate is the busy fraction.",
        ))?;
        let host_seconds = Counter::with_opts(opts(
            "infergate_engine_host_seconds_total",
            "Seconds between engine steps while requests waited or ran (host work: scheduling, tokenising, detokenising, streaming).",
        ))?;
        let step_gap = Histogram::with_opts(hist(
            "infergate_engine_step_gap_seconds",
            "Host time between the end of one step and the start of the next, while work was pending.",
            STEP_GAP_BUCKETS,
        ))?;
        let batch_size = Histogram::with_opts(hist(
            "infergate_engine_batch_size",
            "Sequences in each engine step.",
            BATCH_SIZE_BUCKETS,
        ))?;
        let recomputed_tokens = Counter::with_opts(opts(
            "infergate_engine_recomputed_tokens_total",
            "Tokens computed again after preemption by recompute.",
        ))?;
        let max_num_seqs = Gauge::with_opts(opts(
            "infergate_engine_max_num_seqs",
            "Configured most sequences per step (--max-num-seqs).",
        ))?;
        let max_num_batched_tokens = Gauge::with_opts(opts(
            "infergate_engine_max_num_batched_tokens",
            "Configured most tokens per step (--max-num-batched-tokens).",
        ))?;
        registry.register(Box::new(busy_seconds.clone()))?;
        registry.register(Box::new(host_seconds.clone()))?;
        registry.register(Box::new(step_gap.clone()))?;
        registry.register(Box::new(batch_size.clone()))?;
        registry.register(Box::new(recomputed_tokens.clone()))?;
        registry.register(Box::new(max_num_seqs.clone()))?;
        registry.register(Box::new(max_num_batched_tokens.clone()))?;
        Ok(Self {
            registry,
            running,
            waiting,
            kv_usage,
            prefix_queries,
            prefix_hits,
            preemptions,
            prompt_tokens,
            generation_tokens,
            request_success,
            ttft,
            itl,
            e2e,
            queue_time,
            prefill_time,
            decode_time,
            inference_time,
            request_tpot,
            tpot,
            request_prompt_tokens,
            request_generation_tokens,
            request_max_generation_tokens,
            request_max_tokens,
            request_n,
            iteration_tokens,
            steps,
            rejected,
            cache_config,
            start_time,
            busy_seconds,
            host_seconds,
            step_gap,
            batch_size,
            recomputed_tokens,
            max_num_seqs,
            max_num_batched_tokens,
        })
    }

    /// Publishes the scheduler's caps, so that a batch pinned at one can be recognised.
    pub fn set_limits(&self, max_num_seqs: usize, max_num_batched_tokens: usize) {
        self.max_num_seqs.set(max_num_seqs as f64);
        self.max_num_batched_tokens
            .set(max_num_batched_tokens as f64);
    }

    /// Records one step: its time inside and the host time before it, and its batch size.
    pub fn observe_step(&self, times: &crate::host_time::StepTimes, batch_size: usize) {
        self.busy_seconds.inc_by(times.busy);
        self.host_seconds.inc_by(times.gap);
        self.step_gap.observe(times.gap);
        self.batch_size.observe(batch_size as f64);
    }

    /// Publishes the KV cache's shape in `vllm:cache_config_info` under vLLM's label names,
    /// plus our own label `kv_protected_blocks` (the segmented LRU's protected cap) so a router
    /// can model eviction. Values are spelled as vLLM spells them (Python's `str()`).
    pub fn set_cache_config(&self, kv: &BlockManager, settings: &CacheSettings) {
        let py_bool = |b: bool| if b { "True" } else { "False" }.to_string();
        let labels = [
            kv.block_size().to_string(),
            // "auto": the KV cache is kept in the model's own dtype (there is no flag to change it).
            "auto".to_string(),
            py_bool(kv.prefix_caching()),
            settings.gpu_memory_utilization.to_string(),
            py_bool(false),
            (kv.num_blocks() * kv.block_size()).to_string(),
            // No CPU swap space and no sliding-window attention.
            "None".to_string(),
            kv.num_blocks().to_string(),
            settings
                .num_gpu_blocks_override
                .map_or_else(|| "None".to_string(), |n| n.to_string()),
            "None".to_string(),
            kv.protected_cap().to_string(),
        ];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        self.cache_config.reset();
        self.cache_config.with_label_values(&labels).set(1.0);
    }

    /// Observes one finished request in every per-request histogram.
    pub fn observe_finished(&self, r: &FinishedRequest) {
        self.e2e.observe(r.e2e);
        self.queue_time.observe(r.queued);
        self.prefill_time.observe(r.prefill);
        self.decode_time.observe(r.decode);
        self.inference_time.observe(r.inference);
        // As vLLM: the first token belongs to the prefill, so it is not in the per-token mean.
        let tpot = if r.generation_tokens > 1 {
            r.decode / (r.generation_tokens - 1) as f64
        } else {
            0.0
        };
        self.request_tpot.observe(tpot);
        self.request_prompt_tokens.observe(r.prompt_tokens as f64);
        self.request_generation_tokens
            .observe(r.generation_tokens as f64);
        self.request_max_tokens.observe(r.max_tokens as f64);
    }

    /// Observes a request's parallel sequences once the last has ended, as vLLM's parent
    /// request does: `n` sequences, the longest of which generated `max_generation` tokens.
    pub fn observe_group(&self, n: usize, max_generation: usize) {
        self.request_max_generation_tokens
            .observe(max_generation as f64);
        self.request_n.observe(n as f64);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = prometheus::TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut buf) {
            return format!("# error encoding metrics: {e}\n");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_buckets_are_vllms_1_2_5_series_up_to_the_context() {
        assert_eq!(
            buckets_1_2_5(2048),
            [
                1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0
            ]
        );
        assert_eq!(buckets_1_2_5(100).last(), Some(&100.0));
        assert_eq!(buckets_1_2_5(0), [1.0]);
    }

    #[test]
    fn cache_config_info_carries_vllms_labels_and_ours() {
        let m = EngineMetrics::with_max_model_len("m", 4096).unwrap();
        let mut kv = BlockManager::new(100, 16, true);
        kv.set_protected_fraction(0.5);
        m.set_cache_config(
            &kv,
            &CacheSettings {
                gpu_memory_utilization: 0.9,
                num_gpu_blocks_override: Some(100),
            },
        );
        let text = m.render();
        let line = text
            .lines()
            .find(|l| l.starts_with("vllm:cache_config_info{"))
            .unwrap();
        for label in [
            "block_size=\"16\"",
            "cache_dtype=\"auto\"",
            "enable_prefix_caching=\"True\"",
            "gpu_memory_utilization=\"0.9\"",
            "is_attention_free=\"False\"",
            "kv_cache_size_tokens=\"1600\"",
            "num_cpu_blocks=\"None\"",
            "num_gpu_blocks=\"100\"",
            "num_gpu_blocks_override=\"100\"",
            "sliding_window=\"None\"",
            "kv_protected_blocks=\"50\"",
            "model_name=\"m\"",
        ] {
            assert!(line.contains(label), "{label} missing in {line}");
        }
        assert!(line.ends_with(" 1"), "{line}");
    }

    #[test]
    fn every_vllm_family_is_exported_before_any_request() {
        let text = EngineMetrics::new("m").unwrap().render();
        for reason in FINISHED_REASONS {
            let series = format!(
                "vllm:request_success_total{{finished_reason=\"{reason}\",model_name=\"m\"}} 0"
            );
            assert!(text.contains(&series), "{series}");
        }
        for name in [
            "vllm:request_prompt_tokens",
            "vllm:request_generation_tokens",
            "vllm:request_max_num_generation_tokens",
            "vllm:request_params_max_tokens",
            "vllm:request_params_n",
            "vllm:request_queue_time_seconds",
            "vllm:request_prefill_time_seconds",
            "vllm:request_decode_time_seconds",
            "vllm:request_inference_time_seconds",
            "vllm:request_time_per_output_token_seconds",
            "vllm:time_per_output_token_seconds",
            "vllm:iteration_tokens_total",
            "vllm:inter_token_latency_seconds",
            "infergate_engine_step_gap_seconds",
            "infergate_engine_batch_size",
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} histogram")),
                "{name} in {text}"
            );
        }
        for (name, kind) in [
            ("infergate_engine_busy_seconds_total", "counter"),
            ("infergate_engine_host_seconds_total", "counter"),
            ("infergate_engine_recomputed_tokens_total", "counter"),
            ("vllm:num_preemptions_total", "counter"),
            ("infergate_engine_max_num_seqs", "gauge"),
            ("infergate_engine_max_num_batched_tokens", "gauge"),
            ("vllm:kv_cache_usage_perc", "gauge"),
            ("vllm:num_requests_running", "gauge"),
            ("vllm:num_requests_waiting", "gauge"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}")),
                "{name} in {text}"
            );
        }
    }

    #[test]
    fn a_step_adds_busy_and_host_time_and_the_caps_show() {
        let m = EngineMetrics::new("m").unwrap();
        m.set_limits(8, 2048);
        let times = crate::host_time::StepTimes {
            busy: 0.02,
            gap: 0.05,
        };
        m.observe_step(&times, 8);
        m.observe_step(&times, 4);
        assert!((m.busy_seconds.get() - 0.04).abs() < 1e-12);
        assert!((m.host_seconds.get() - 0.1).abs() < 1e-12);
        assert_eq!(m.step_gap.get_sample_count(), 2);
        assert_eq!(m.batch_size.get_sample_sum(), 12.0);
        let text = m.render();
        assert!(text.contains("infergate_engine_max_num_seqs{model_name=\"m\"} 8"));
        assert!(text.contains("infergate_engine_max_num_batched_tokens{model_name=\"m\"} 2048"));
    }
}
