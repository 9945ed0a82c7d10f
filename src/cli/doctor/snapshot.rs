//! The numbers doctor's rules read, computed once from a window of metrics: rates from counter
//! increases, means and quantiles from histogram increases, gauges averaged over the window's
//! ends. Every field is `None` when the data was not there (the rules then say what they lacked).

use serde::Serialize;

use super::window::WindowData;

/// Prompts this long or longer are the "long context" of symptom 3.3 (tokens).
pub const LONG_PROMPT_TOKENS: f64 = 30_000.0;

/// One window of the gateway's (or one pool's) triage numbers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Snapshot {
    /// Seconds the window lasted.
    pub window_s: f64,
    /// Workers polled (series of `infergate_worker_running`).
    pub workers: usize,
    /// Workers whose busy time was read (the others export none: vLLM, SGLang, TGI).
    pub busy_workers: usize,
    /// Mean share of wall time the reporting workers' engines spent inside steps, 0..1.
    pub busy_fraction: Option<f64>,
    /// Host seconds between steps (work pending) over host plus busy seconds, 0..1.
    pub host_share: Option<f64>,
    /// Mean host gap between steps, seconds.
    pub step_gap_mean_s: Option<f64>,
    /// Mean sequences per step.
    pub batch_size_mean: Option<f64>,
    /// Smallest `max_num_seqs` among the workers.
    pub max_num_seqs: Option<f64>,
    /// Mean tokens per step.
    pub tokens_per_step_mean: Option<f64>,
    /// Smallest `max_num_batched_tokens` among the workers.
    pub max_num_batched_tokens: Option<f64>,
    /// Highest KV-cache usage among the workers, 0..1.
    pub kv_usage_max: Option<f64>,
    /// Requests running per worker (mean).
    pub running_per_worker: Option<f64>,
    /// Requests waiting per worker: in the engines plus the gateway's admission queue.
    pub queue_per_worker: Option<f64>,
    /// Preemptions in the window.
    pub preemptions: Option<f64>,
    /// Tokens recomputed after preemptions, per second.
    pub recomputed_tokens_per_s: Option<f64>,
    /// Finished requests in the window (prompt-length histogram count).
    pub requests: Option<f64>,
    /// Share of finished requests with prompts of [`LONG_PROMPT_TOKENS`] or more.
    pub long_prompt_share: Option<f64>,
    /// p99 prompt length, tokens.
    pub prompt_p99_tokens: Option<f64>,
    /// Mean prompt length, tokens.
    pub prompt_mean_tokens: Option<f64>,
    /// p99 inter-token latency, seconds (engine; the gateway's chunk gaps otherwise).
    pub itl_p99_s: Option<f64>,
    /// Upper bound of the largest inter-token latency, seconds.
    pub itl_max_s: Option<f64>,
    /// Mean time per output token of finished requests, seconds.
    pub tpot_mean_s: Option<f64>,
    /// p95 time per output token, seconds.
    pub tpot_p95_s: Option<f64>,
    /// p95 time to first byte at the gateway, seconds.
    pub ttft_p95_s: Option<f64>,
    /// Cost per 1,000 tokens (prompt plus completion), USD, at the prices in force.
    pub cost_usd_per_1k_tokens: Option<f64>,
    /// Share of prompt tokens served from prefix caches, 0..1.
    pub cached_share: Option<f64>,
    /// Prompt tokens per completion token.
    pub prompt_per_completion: Option<f64>,
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    }
}

fn min(values: Option<&Vec<f64>>) -> Option<f64> {
    values?.iter().copied().reduce(f64::min)
}

fn max(values: Option<&Vec<f64>>) -> Option<f64> {
    values?.iter().copied().reduce(f64::max)
}

impl Snapshot {
    /// The numbers of one window.
    pub fn of(w: &WindowData) -> Self {
        let gauge = |name: &str| w.gauges.get(name);
        let workers = gauge("infergate_worker_running").map_or(0, Vec::len);
        let busy = w.counters.get("infergate_worker_busy_seconds_total");
        let busy_fraction = busy
            .filter(|b| b.series > 0 && w.window_s > 0.0)
            .map(|b| (b.total / (w.window_s * b.series as f64)).clamp(0.0, 1.0));
        let host = w.increase("infergate_worker_host_seconds_total");
        let host_share = match (host, busy.map(|b| b.total)) {
            (Some(h), Some(b)) if h + b > 0.0 => Some(h / (h + b)),
            _ => None,
        };
        let sum = |name: &str| gauge(name).map(|v| v.iter().sum::<f64>());
        let waiting = match (
            sum("infergate_worker_waiting"),
            sum("infergate_queue_depth"),
        ) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
        let prompts = w.hist("infergate_worker_request_prompt_tokens");
        let itl = w
            .hist("infergate_worker_inter_token_latency_seconds")
            .or_else(|| w.hist("infergate_inter_chunk_seconds"));
        let tpot = w.hist("infergate_worker_time_per_output_token_seconds");
        // Tokens and cache by tenant at the gateway; by worker when no tenant was billed.
        let tenant_prompt = w.increase("infergate_tenant_prompt_tokens_total");
        let tenant_completion = w.increase("infergate_tenant_completion_tokens_total");
        let billed = tenant_prompt.unwrap_or(0.0) + tenant_completion.unwrap_or(0.0) > 0.0;
        let (prompt, completion, cached_share) = if billed {
            (
                tenant_prompt,
                tenant_completion,
                ratio(
                    w.increase("infergate_tenant_cached_tokens_total"),
                    tenant_prompt,
                ),
            )
        } else {
            (
                w.increase("infergate_worker_prompt_tokens_total"),
                w.increase("infergate_worker_generation_tokens_total"),
                ratio(
                    w.increase("infergate_worker_prefix_cache_hits_total"),
                    w.increase("infergate_worker_prefix_cache_queries_total"),
                ),
            )
        };
        let cost = w
            .increase("infergate_tenant_cost_nanousd_total")
            .filter(|c| *c > 0.0);
        let tokens = match (tenant_prompt, tenant_completion) {
            (Some(p), Some(c)) => Some(p + c),
            _ => None,
        };
        Snapshot {
            window_s: w.window_s,
            workers,
            busy_workers: busy.map_or(0, |b| b.series),
            busy_fraction,
            host_share,
            step_gap_mean_s: w
                .hist("infergate_worker_step_gap_seconds")
                .and_then(|h| h.mean()),
            batch_size_mean: w.hist("infergate_worker_batch_size").and_then(|h| h.mean()),
            max_num_seqs: min(gauge("infergate_worker_max_num_seqs")),
            tokens_per_step_mean: w
                .hist("infergate_worker_iteration_tokens")
                .and_then(|h| h.mean()),
            max_num_batched_tokens: min(gauge("infergate_worker_max_num_batched_tokens")),
            kv_usage_max: max(gauge("infergate_worker_kv_usage")),
            running_per_worker: gauge("infergate_worker_running")
                .filter(|v| !v.is_empty())
                .map(|v| v.iter().sum::<f64>() / v.len() as f64),
            queue_per_worker: waiting.map(|q| q / workers.max(1) as f64),
            preemptions: w.increase("infergate_worker_preemptions_total"),
            recomputed_tokens_per_s: w.rate("infergate_worker_recomputed_tokens_total"),
            requests: prompts.map(|h| h.count),
            long_prompt_share: prompts.and_then(|h| h.share_above(LONG_PROMPT_TOKENS)),
            prompt_p99_tokens: prompts.and_then(|h| h.quantile(0.99)),
            prompt_mean_tokens: prompts.and_then(|h| h.mean()),
            itl_p99_s: itl.and_then(|h| h.quantile(0.99)),
            itl_max_s: itl.and_then(|h| h.max_bound()),
            tpot_mean_s: tpot.and_then(|h| h.mean()),
            tpot_p95_s: tpot.and_then(|h| h.quantile(0.95)),
            ttft_p95_s: w
                .hist("infergate_ttft_seconds")
                .and_then(|h| h.quantile(0.95)),
            cost_usd_per_1k_tokens: ratio(cost, tokens).map(|c| c / 1e9 * 1000.0),
            cached_share,
            prompt_per_completion: ratio(prompt, completion),
        }
    }
}
