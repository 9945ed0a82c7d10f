//! Flight records, kept: the engine reports what it did for each request (paths, steps, batch
//! sizes, tokens, features, queue/prefill/decode times; see `infergate_engine::flight`) in a
//! header or a final SSE comment; the gateway checks it ([`record`]), adds what only it knows
//! (tenant, pool, worker, model, version, status, its own timings) and writes one JSON line per
//! request to a rotated trace file (`trace:` in the config) through a bounded writer thread,
//! and/or exports it as OpenTelemetry spans over OTLP/HTTP ([`otlp`], `trace.otlp`).

pub mod features;
mod file;
pub mod otlp;
pub mod record;
mod writer;

use std::path::PathBuf;

use infergate_engine::flight::FlightRecord;
use serde::Serialize;

pub use features::TraceFeatures;
pub use file::RotatingFile;
pub use record::Flight;
pub use writer::{QUEUE_LINES, TraceWriter, sampled};

/// Default size at which the trace file rotates: 100 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 100 * 1024 * 1024;
/// Default number of rotated files kept.
pub const DEFAULT_KEEP: u32 = 5;

/// `trace:` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceConfig {
    /// The live file (absolute); rotated ones are `path.1` ... `path.<keep>`.
    pub path: PathBuf,
    /// Share of requests written, 0 to 1.
    pub sample: f64,
    /// Size past which the file rotates.
    pub max_bytes: u64,
    /// Rotated files kept.
    pub keep: u32,
}

/// One line of the trace file: a request as the gateway saw it, with the engine's record.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TraceLine {
    /// `x-request-id`.
    pub request_id: String,
    /// Arrival, Unix ms.
    pub start_ms: i64,
    /// Tenant.
    pub tenant: String,
    /// The endpoint's path, e.g. `/v1/chat/completions`.
    pub endpoint: &'static str,
    /// The model the client asked for.
    pub model: String,
    /// The model that served it (the canary version's, else `model`).
    pub served_model: String,
    /// The completion bound the request went upstream with (absent for embeddings).
    pub max_tokens: Option<u64>,
    /// The client's W3C `traceparent`, when it sent a well-formed one.
    pub traceparent: Option<String>,
    /// The canary version that served it (empty without a split).
    pub version: String,
    /// Pool.
    pub pool: String,
    /// The shape class routing.yaml put it in (`unclassified` when none matched); absent when
    /// the config declares no classes. A replay keeps it as the request's class.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Worker URL.
    pub worker: String,
    /// Status the client got (502 for a body the worker broke off, 499 for a client that left).
    pub status: u16,
    /// Streamed answer.
    pub stream: bool,
    /// Time in the gateway's admission queue, ms.
    pub queue_ms: Option<u64>,
    /// Arrival to the first body byte, ms.
    pub ttft_ms: Option<f64>,
    /// Arrival to the end of the answer, ms.
    pub total_ms: f64,
    /// Prompt tokens the worker reported.
    pub prompt_tokens: Option<u64>,
    /// Completion tokens the worker reported.
    pub completion_tokens: Option<u64>,
    /// The gateway's own estimate of the prompt's tokens (kept for a request refused before
    /// any worker counted it, so a replay still sends it).
    pub prompt_estimate: Option<u64>,
    /// Bytes of the prompt as the router reads it (messages' roles and contents): with the
    /// token counts, how many tokens a prefix block held.
    pub prompt_bytes: Option<u64>,
    /// The session key's hash (hex), when the request named a session: a replay keeps the turns
    /// of one session together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Prefix marks: the chained hashes (hex) of the prompt's first 1, 2, 4, ... 256 blocks of
    /// [`PREFIX_MARK_BLOCK_BYTES`] (as many as it has). Two requests sharing a mark share that
    /// many leading blocks, so a replay rebuilds prefix groups without keeping any text.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prefix: Vec<String>,
    /// What the request asked for that changes the engine's path (`n`, logprobs, tools,
    /// `response_format`, image parts), as the gateway validated it; absent for a request
    /// refused before validation. A replay sends them again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub features: Option<TraceFeatures>,
    /// `ok`, `invalid` (a record came and was ignored) or `absent`.
    pub flight_status: &'static str,
    /// The engine's record, when one came and passed the checks.
    pub flight: Option<FlightRecord>,
    /// The attempts on workers: those that failed before any answer (each retried), then the
    /// one that answered.
    pub attempts: Vec<AttemptLine>,
}

/// One attempt on a worker, as the trace line keeps it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AttemptLine {
    /// Worker URL.
    pub worker: String,
    /// Sent, ms after the request's arrival.
    pub start_ms: f64,
    /// Duration, ms (the answering attempt's: to the end of its body).
    pub ms: f64,
    /// HTTP status the worker answered, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Why it failed: `connect`, `send`, `first_byte_timeout`, `status_503`, `ejected`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'static str>,
    /// Another worker was tried after it.
    pub retried: bool,
}

/// Bytes of one prefix block of the marks (the router's block).
pub const PREFIX_MARK_BLOCK_BYTES: usize = crate::routing::features::DEFAULT_BLOCK_BYTES;

/// The prefix marks of a prompt from its chained block hashes: the hashes at 1, 2, 4, ...
/// blocks, as hex.
pub fn prefix_marks(block_hashes: &[u64]) -> Vec<String> {
    std::iter::successors(Some(1usize), |n| n.checked_mul(2))
        .take_while(|&n| n <= block_hashes.len())
        .map(|n| format!("{:016x}", block_hashes[n - 1]))
        .collect()
}

impl TraceLine {
    /// The line as JSON (no newline).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Milliseconds of `d`, to the microsecond.
pub fn millis(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_marks_are_the_hashes_at_powers_of_two_blocks() {
        let hashes: Vec<u64> = (1..=9).collect();
        let marks = prefix_marks(&hashes);
        assert_eq!(marks.len(), 4, "1, 2, 4 and 8 blocks of 9");
        assert_eq!(marks[0], "0000000000000001");
        assert_eq!(marks[3], "0000000000000008");
        assert!(prefix_marks(&[]).is_empty());
    }

    #[test]
    fn a_line_is_one_json_object_with_the_record_nested() {
        let line = TraceLine {
            request_id: "r1".into(),
            tenant: "t".into(),
            status: 200,
            flight_status: "ok",
            flight: Some(FlightRecord {
                v: 1,
                ..FlightRecord::default()
            }),
            ttft_ms: Some(millis(std::time::Duration::from_micros(1500))),
            ..TraceLine::default()
        };
        let json = line.to_json();
        assert!(!json.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["request_id"], "r1");
        assert_eq!(v["flight"]["v"], 1);
        assert_eq!(v["ttft_ms"], 1.5);
        assert_eq!(v["flight_status"], "ok");
    }
}
