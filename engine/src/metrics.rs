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
    /// `vllm:request_queue_time_seconds`.
    pub queue_time: Histogram,
    /// `infergate_engine_steps_total` by execution `path` (graph / eager).
    pub steps: IntCounterVec,
    /// `infergate_engine_rejected_total` by `reason`.
    pub rejected: IntCounterVec,
    /// `vllm:cache_config_info`: value 1, the KV cache's shape in its labels (as vLLM exports it),
    /// so a router can size its view of this worker's cache.
    pub cache_config: GaugeVec,
    /// `process_start_time_seconds`: Unix time this engine started (a router sees restarts).
    pub start_time: Gauge,
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

impl EngineMetrics {
    /// Registers all metrics with the served model's name as `model_name`.
    pub fn new(model_name: &str) -> Result<Self, prometheus::Error> {
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
            &[
                "block_size",
                "num_gpu_blocks",
                "enable_prefix_caching",
                "kv_protected_blocks",
            ],
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
        registry.register(Box::new(steps.clone()))?;
        registry.register(Box::new(rejected.clone()))?;
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
            steps,
            rejected,
            cache_config,
            start_time,
        })
    }

    /// Publishes the KV cache's shape in `vllm:cache_config_info`, plus our own label
    /// `kv_protected_blocks` (the segmented LRU's protected cap) so a router can model eviction.
    pub fn set_cache_config(&self, kv: &BlockManager) {
        let labels = [
            kv.block_size().to_string(),
            kv.num_blocks().to_string(),
            if kv.prefix_caching() { "True" } else { "False" }.to_string(),
            kv.protected_cap().to_string(),
        ];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        self.cache_config.reset();
        self.cache_config.with_label_values(&labels).set(1.0);
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
