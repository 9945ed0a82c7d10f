//! The run report shared by `infergate bench` (live HTTP) and `infergate sim` (virtual clock):
//! one record per request, summarized into latency percentiles, throughput, goodput against an
//! SLO and breakdowns by tenant, worker and execution path; rendered as text tables or JSON, and
//! two reports compared side by side.

mod diff;
mod render;
mod stats;
mod victims;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use diff::diff;
pub use stats::summarize;
pub use victims::{ClassBreakdown, Victims};

/// What happened to one request, as measured by the client (or the simulator).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RequestRecord {
    /// Position in the plan.
    pub id: u64,
    /// Tenant the request was sent as, if the workload has tenants.
    pub tenant: Option<String>,
    /// The workload class it was planned from, if known.
    #[serde(default)]
    pub class: Option<String>,
    /// Worker that served it (`x-infergate-worker`), if reported.
    pub worker: Option<String>,
    /// Execution path of its steps: `graph`, `eager` or `mixed`, if reported.
    pub path: Option<String>,
    /// Whether it shared a step with an off-path step: it only decoded in a step that ran
    /// eagerly for the others in it (another request's prefill chunk, or a batch past the
    /// largest capture size). `None` when the engine's flight record did not reach the client.
    #[serde(default)]
    pub shared: Option<bool>,
    /// HTTP status; 0 for a transport error (connect failure, reset, timeout).
    pub status: u16,
    /// Send time, seconds since the start of the run.
    pub start: f64,
    /// Time to the first content chunk, seconds; `None` when no content arrived.
    pub ttft: Option<f64>,
    /// Every gap between consecutive content chunks, seconds.
    pub itl: Vec<f64>,
    /// Send to end of response, seconds.
    pub e2e: f64,
    /// Prompt tokens (from the usage chunk, else as planned).
    pub prompt_tokens: u64,
    /// Generated tokens (from the usage chunk, else the content chunks counted).
    pub output_tokens: u64,
    /// Output tokens the request asked for (its `max_tokens`): with the prompt, its demand.
    #[serde(default)]
    pub asked_output_tokens: u64,
    /// Its cached prompt tokens three ways, when the gateway said what routing expected
    /// (`x-infergate-route-cached`, with `debug_headers`) and the usage said what was cached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached: Option<CachedTokens>,
}

/// One answer's cached prompt tokens as the gateway's explained hit rate counts them
/// (`infergate_route_cached_tokens_total{kind}`, README "Reading the explained hit rate").
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CachedTokens {
    /// What routing expected on the worker it chose.
    pub predicted: u64,
    /// What that worker reported (`usage.prompt_tokens_details.cached_tokens`).
    pub delivered: u64,
    /// The most routing knew of on any healthy worker at the pick.
    pub available: u64,
}

/// The run's explained hit rate: cached prompt tokens three ways, summed over the successful
/// answers that carried all three (see [`CachedTokens`]).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct CachedSummary {
    /// Answers counted.
    pub answers: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Cached tokens routing expected on the chosen workers.
    pub predicted: u64,
    /// Cached tokens the workers reported.
    pub delivered: u64,
    /// Cached tokens routing knew of on the best worker.
    pub available: u64,
}

impl RequestRecord {
    /// Whether the request succeeded (a 2xx status).
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// Whether it succeeded within the SLO: TTFT ≤ `ttft` and every inter-token gap ≤ `itl`.
    pub fn good(&self, ttft: f64, itl: f64) -> bool {
        self.ok() && self.ttft.is_some_and(|t| t <= ttft) && self.itl.iter().all(|&gap| gap <= itl)
    }
}

/// Nearest-rank percentiles of a sample, with its maximum and mean (all 0 when empty).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

/// Headline numbers of one slice of the requests (a tenant, a worker, an execution path).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Breakdown {
    /// Requests in the slice.
    pub requests: u64,
    /// Of which succeeded.
    pub ok: u64,
    /// Median TTFT of the successful ones, seconds.
    pub ttft_p50: f64,
    /// 99th percentile TTFT, seconds.
    pub ttft_p99: f64,
    /// 99th percentile inter-token gap, seconds.
    pub itl_p99: f64,
    /// Longest inter-token gap, seconds.
    #[serde(default)]
    pub itl_max: f64,
    /// 99th percentile over the successful requests of each one's longest gap, seconds: how
    /// badly the worst answers froze (a few frozen answers barely move `itl_p99`, whose gaps
    /// are mostly the healthy answers').
    #[serde(default)]
    pub worst_gap_p99: f64,
    /// 99th percentile end-to-end latency, seconds.
    pub e2e_p99: f64,
    /// Share of the slice's requests that met the SLO.
    pub goodput: f64,
    /// Tokens served to the slice's successful requests (prompt and output).
    #[serde(default)]
    pub served_tokens: u64,
    /// Tokens the slice's requests asked for, all of them (prompt and `max_tokens`): its demand.
    #[serde(default)]
    pub asked_tokens: u64,
}

/// The summary of a run. Latencies are seconds; percentiles are over successful requests, ITL over
/// every gap of every successful request.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// What was run (workload, target).
    pub title: String,
    /// Length of the run, seconds (the divisor of the rates).
    pub duration_s: f64,
    /// Requests sent.
    pub requests: u64,
    /// Answered 2xx.
    pub ok: u64,
    /// Answered 429.
    pub rate_limited: u64,
    /// Answered another 4xx.
    pub client_errors: u64,
    /// Answered 5xx, or failed in transport.
    pub server_errors: u64,
    /// Time to first token.
    pub ttft: Percentiles,
    /// Inter-token latency (every gap).
    pub itl: Percentiles,
    /// Mean time per output token after the first, averaged over requests, seconds.
    pub tpot_mean: f64,
    /// Time per output token after the first, per request (its percentiles across requests).
    #[serde(default)]
    pub tpot: Percentiles,
    /// End-to-end latency.
    pub e2e: Percentiles,
    /// Prompt tokens of successful requests per second.
    pub tokens_in_per_s: f64,
    /// Generated tokens of successful requests per second.
    pub tokens_out_per_s: f64,
    /// Share of all requests that succeeded with TTFT ≤ `slo_ttft_s` and every gap ≤ `slo_itl_s`.
    pub goodput: f64,
    /// TTFT objective, seconds.
    pub slo_ttft_s: f64,
    /// Inter-token objective, seconds.
    pub slo_itl_s: f64,
    /// Per tenant.
    pub by_tenant: BTreeMap<String, Breakdown>,
    /// Jain's fairness index over tenants of served tokens against each one's max-min fair
    /// share of what was served (water-filled over their demands): 1 when every tenant got its
    /// fair share, towards 1/n as one takes the others'. 1 with fewer than two tenants.
    #[serde(default)]
    pub jain_index: f64,
    /// Per worker.
    pub by_worker: BTreeMap<String, Breakdown>,
    /// Per execution path.
    pub by_path: BTreeMap<String, Breakdown>,
    /// Per workload class: its figures, and the same per execution path (issue 43).
    #[serde(default)]
    pub by_class: BTreeMap<String, ClassBreakdown>,
    /// The common class's requests split by whether they shared a step with an off-path step:
    /// are the rare requests slow, or do they slow the common ones beside them?
    #[serde(default)]
    pub victims: Victims,
    /// What each engine did (the simulator's workers: busy and host time, batch sizes, queue,
    /// preemptions); empty for a live run.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_engine: BTreeMap<String, EngineBreakdown>,
    /// Further numbers (the simulator adds prefix hit rate, KV usage, preemptions).
    #[serde(default)]
    pub extra: BTreeMap<String, f64>,
    /// The explained hit rate over the answers that carried it (bench against a gateway with
    /// `debug_headers`, and sim); absent when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<CachedSummary>,
}

/// One engine's step loop over a run: the numbers that tell a GPU-bound engine from a host-bound
/// one or one whose batches are capped (issue 44's deciding panels).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EngineBreakdown {
    /// Time inside steps over the run's length (the "GPU utilisation" an operator sees).
    pub busy_fraction: f64,
    /// Host time between steps while work was pending, over the run's length.
    pub host_fraction: f64,
    /// Mean sequences per step.
    pub batch_mean: f64,
    /// 95th percentile of sequences per step.
    pub batch_p95: f64,
    /// Requests waiting in the engine's queue, averaged over the run (sampled at each step).
    pub queue_mean: f64,
    /// Sequences preempted.
    pub preemptions: f64,
    /// Tokens computed again after a preemption.
    pub recomputed_tokens: f64,
}

impl Report {
    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// Reads a report written by [`Report::to_json`].
    pub fn from_json(s: &str) -> Result<Report, String> {
        serde_json::from_str(s).map_err(|e| format!("not an infergate report: {e}"))
    }
}

/// Records as JSON Lines, one request per line.
pub fn records_jsonl(records: &[RequestRecord]) -> String {
    let mut out = String::new();
    for r in records {
        if let Ok(line) = serde_json::to_string(r) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// Reads records written by [`records_jsonl`]; errors name the line.
pub fn parse_records(text: &str) -> Result<Vec<RequestRecord>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}
