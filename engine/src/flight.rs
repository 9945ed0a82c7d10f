//! The flight record of a request: what the engine did for it (the execution paths its steps
//! took, the batch sizes of those steps, its tokens, the features that change its path, its time
//! in queue, prefill and decode, its preemptions) and what engine did it (version, backend,
//! capture sizes). It travels with the answer, so the gateway needs no second request: the
//! header [`FLIGHT_HEADER`] on a whole answer, an SSE comment line [`SSE_PREFIX`]`{json}` just
//! before `data: [DONE]` on a stream (OpenAI clients ignore comments). A plain serde struct, so
//! a trace file line or an exporter's span can be made from it.

use serde::{Deserialize, Serialize};

pub use crate::batch_hist::{BatchHist, Hist};
use crate::sequence::FinishInfo;

/// Response header carrying the record of a whole (non-streamed) answer.
pub const FLIGHT_HEADER: &str = "x-infergate-flight";
/// Start of the SSE comment line carrying the record of a stream.
pub const SSE_PREFIX: &str = ": flight ";
/// Format version, in the record's `v` (2: `batch_hist` added; 3: `eager_shared` added, so
/// a reader can tell "none" from "not counted"; 4: `off_path` added; 5: `piecewise` added).
pub const FORMAT_VERSION: u32 = 5;
/// Most capture sizes a record lists (vLLM's default has at most 67): keeps the record small.
pub const MAX_CAPTURE_LISTED: usize = 80;
/// Upper bound of one serialized record, in bytes; what the gateway accepts (a record past it
/// is ignored there).
pub const MAX_FLIGHT_BYTES: usize = 4096;

/// One request's flight record (compact JSON on the wire).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlightRecord {
    /// Format version ([`FORMAT_VERSION`]).
    pub v: u32,
    /// Engine version (the crate's).
    pub engine: String,
    /// Backend: `sim`, `cpu` or `cuda`.
    pub backend: String,
    /// CUDA-graph capture sizes, ascending (empty: every step eager).
    pub capture: Vec<u32>,
    /// Steps with prefill within the largest size replay piecewise graphs
    /// (`--cudagraph-mode full-and-piecewise`), so graph steps may carry prefill. Format 5;
    /// absent (false) otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub piecewise: bool,
    /// Steps by execution path, summed over the request's sequences.
    pub steps: PathSteps,
    /// Of the eager steps, those in which the request only decoded while the step went past
    /// the captured budget for others: another request's prefill chunk took it past the
    /// largest capture size in tokens, or the batch outgrew it in sequences (every eager step
    /// it only decoded in, when no graphs are captured). Summed over its sequences, as `steps`.
    pub eager_shared: u32,
    /// Of the eager steps, all those past the captured budget (the request prefilling or only
    /// decoding in them): the steps that took it off the fast path. Format 4; summed as `steps`.
    pub off_path: u32,
    /// Batch sizes (sequences) of the steps the request was in.
    pub batch: BatchStats,
    /// The same steps by batch size, decode-only apart from prefill (summed over its
    /// sequences: a step with two of them counts twice, as in `steps`). Over a trace,
    /// `steps(b) = sum of hist[b] / b` (see [`crate::batch_hist`]).
    pub batch_hist: BatchHist,
    /// Token counts.
    pub tokens: TokenCounts,
    /// Features that change the path.
    pub features: Features,
    /// Arrival to first scheduled, ms (the slowest of its sequences).
    pub queue_ms: f64,
    /// First scheduled to first token, ms (the slowest of its sequences).
    pub prefill_ms: f64,
    /// First to last token, ms (the slowest of its sequences).
    pub decode_ms: f64,
    /// Times its sequences were preempted and recomputed.
    pub preemptions: u32,
}

/// Steps by execution path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PathSteps {
    /// Decode steps replayed from a captured graph.
    pub graph: u32,
    /// Steps launched eagerly (prefill, mixed, larger than any capture size).
    pub eager: u32,
}

/// Batch sizes of the steps a request was in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BatchStats {
    /// Smallest (0 when it took no step).
    pub min: u32,
    /// Largest.
    pub max: u32,
    /// Mean over its steps.
    pub mean: f64,
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TokenCounts {
    /// Prompt tokens (each prompt once).
    pub prompt: u64,
    /// Generated tokens, every sequence's (also those `best_of` drops).
    pub decode: u64,
    /// Prompt tokens read from the prefix cache.
    pub cached: u64,
}

/// What the request asked for that changes how the engine runs it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Features {
    /// Prompts (a completions list prompt has several).
    pub prompts: u32,
    /// Choices per prompt.
    pub n: u32,
    /// Sequences per prompt.
    pub best_of: u32,
    /// Logprobs asked for.
    pub logprobs: bool,
    /// Completions `echo`.
    pub echo: bool,
    /// Streamed answer.
    pub stream: bool,
    /// `tools` given (non-empty).
    pub tools: bool,
    /// `response_format` given.
    pub response_format: bool,
    /// Image parts in the messages.
    pub images: u32,
}

impl Features {
    /// The request's `tools`, `response_format` and image parts, read from the body the request
    /// parser already parsed (`body`, its top-level members); `stream` as given.
    pub fn of(body: &serde_json::Map<String, serde_json::Value>, stream: bool) -> Self {
        let present = |key: &str| body.get(key).filter(|v| !v.is_null());
        let images = present("messages")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| m.get("content").and_then(serde_json::Value::as_array))
            .flatten()
            .filter(|part| {
                part.get("type")
                    .and_then(serde_json::Value::as_str)
                    .is_some_and(|k| k == "image_url" || k == "input_image")
            })
            .count();
        Self {
            stream,
            tools: present("tools")
                .and_then(serde_json::Value::as_array)
                .is_some_and(|t| !t.is_empty()),
            response_format: present("response_format").is_some(),
            images: u32::try_from(images).unwrap_or(u32::MAX),
            ..Self::default()
        }
    }
}

impl Features {
    /// These features with what the request's plan decides: its prompts, its choices and
    /// sequences per prompt, whether it asked for logprobs.
    pub fn with_plan(self, prompts: usize, n: usize, best_of: usize, logprobs: bool) -> Self {
        let clamp = |x: usize| u32::try_from(x).unwrap_or(u32::MAX);
        Self {
            prompts: clamp(prompts),
            n: clamp(n),
            best_of: clamp(best_of),
            logprobs,
            ..self
        }
    }
}

/// The engine-wide part of every record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineInfo {
    /// Backend name.
    pub backend: &'static str,
    /// Capture sizes (at most [`MAX_CAPTURE_LISTED`]).
    pub capture: Vec<u32>,
    /// Piecewise graphs for steps with prefill (`--cudagraph-mode full-and-piecewise`).
    pub piecewise: bool,
}

impl EngineInfo {
    /// The info of an engine on `backend` with capture sizes `sizes`.
    pub fn new(backend: &'static str, sizes: &[usize]) -> Self {
        let capture = sizes
            .iter()
            .take(MAX_CAPTURE_LISTED)
            .map(|&s| u32::try_from(s).unwrap_or(u32::MAX))
            .collect();
        Self {
            backend,
            capture,
            piecewise: false,
        }
    }

    /// This info with piecewise graphs for steps with prefill, or not.
    pub fn with_piecewise(mut self, on: bool) -> Self {
        self.piecewise = on;
        self
    }
}

impl FlightRecord {
    /// The request's path class (see [`crate::exec_path::request_path`]); a record older than
    /// format 4 does not count off-path steps, and is classed by its step counts alone.
    pub fn path(&self) -> &'static str {
        let off_path = (self.v >= 4).then_some(u64::from(self.off_path));
        crate::exec_path::request_path(self.steps.graph.into(), self.steps.eager.into(), off_path)
    }

    /// The record of a request with `features`, run on `engine`, whose sequences ended with
    /// `infos` (a sequence that did not end adds nothing).
    pub fn build<'a>(
        engine: &EngineInfo,
        features: Features,
        prompt_tokens: u64,
        cached_tokens: u64,
        infos: impl Iterator<Item = &'a FinishInfo>,
    ) -> Self {
        let mut r = Self {
            v: FORMAT_VERSION,
            engine: env!("CARGO_PKG_VERSION").to_owned(),
            backend: engine.backend.to_owned(),
            capture: engine.capture.clone(),
            piecewise: engine.piecewise,
            features,
            tokens: TokenCounts {
                prompt: prompt_tokens,
                decode: 0,
                cached: cached_tokens,
            },
            ..Self::default()
        };
        let mut batch_sum = 0u64;
        let mut min = u32::MAX;
        for info in infos {
            r.steps.graph = r.steps.graph.saturating_add(info.graph_steps);
            r.steps.eager = r.steps.eager.saturating_add(info.eager_steps);
            r.eager_shared = r.eager_shared.saturating_add(info.eager_shared_steps);
            r.off_path = r.off_path.saturating_add(info.off_path_steps);
            r.tokens.decode = r
                .tokens
                .decode
                .saturating_add(info.completion_tokens as u64);
            r.preemptions = r.preemptions.saturating_add(info.preemptions);
            batch_sum = batch_sum.saturating_add(info.batch_sum);
            r.batch_hist.merge(&info.batch_hist);
            if info.graph_steps > 0 || info.eager_steps > 0 {
                min = min.min(info.batch_min);
            }
            r.batch.max = r.batch.max.max(info.batch_max);
            r.queue_ms = r.queue_ms.max(ms(info.queue_s));
            r.prefill_ms = r.prefill_ms.max(ms(info.prefill_s));
            r.decode_ms = r.decode_ms.max(ms(info.decode_s));
        }
        let steps = u64::from(r.steps.graph) + u64::from(r.steps.eager);
        if steps > 0 {
            r.batch.min = min;
            r.batch.mean = round3(batch_sum as f64 / steps as f64);
        }
        r
    }

    /// Compact JSON (a header value or the SSE comment's payload).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The SSE comment event carrying the record, blank line included.
    pub fn sse_comment(&self) -> String {
        format!("{SSE_PREFIX}{}\n\n", self.to_json())
    }
}

/// Seconds as milliseconds, to the microsecond; 0 for anything not a finite non-negative time.
fn ms(secs: f64) -> f64 {
    if secs.is_finite() && secs > 0.0 {
        round3(secs * 1000.0)
    } else {
        0.0
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sequence::FinishReason;

    fn info(graph: u32, eager: u32, batches: (u32, u32, u64)) -> FinishInfo {
        FinishInfo {
            reason: FinishReason::Length,
            prompt_tokens: 10,
            completion_tokens: graph as usize + eager as usize,
            cached_tokens: 0,
            graph_steps: graph,
            eager_steps: eager,
            eager_shared_steps: eager / 2,
            off_path_steps: eager / 2,
            preemptions: 1,
            batch_min: batches.0,
            batch_max: batches.1,
            batch_sum: batches.2,
            batch_hist: BatchHist::default(),
            queue_s: 0.002,
            prefill_s: 0.010,
            decode_s: 0.5,
        }
    }

    #[test]
    fn a_record_sums_steps_and_spans_batches_over_sequences() {
        let engine = EngineInfo::new("sim", &[1, 2, 4, 8]);
        let infos = [info(3, 1, (1, 4, 10)), info(2, 2, (2, 9, 20))];
        let features = Features {
            prompts: 1,
            n: 2,
            best_of: 2,
            ..Features::default()
        };
        let r = FlightRecord::build(&engine, features, 10, 4, infos.iter());
        assert_eq!(r.v, FORMAT_VERSION);
        assert_eq!(r.backend, "sim");
        assert_eq!(r.capture, vec![1, 2, 4, 8]);
        assert_eq!(r.steps, PathSteps { graph: 5, eager: 3 });
        assert_eq!((r.eager_shared, r.off_path), (1, 1));
        assert_eq!((r.batch.min, r.batch.max), (1, 9));
        assert!((r.batch.mean - 30.0 / 8.0).abs() < 1e-9);
        assert_eq!(
            r.tokens,
            TokenCounts {
                prompt: 10,
                decode: 8,
                cached: 4
            }
        );
        assert_eq!(r.preemptions, 2);
        assert_eq!((r.queue_ms, r.prefill_ms, r.decode_ms), (2.0, 10.0, 500.0));
        assert_eq!(r.features.n, 2);
    }

    #[test]
    fn absorbed_sequences_count_as_the_record_counts_them() {
        let engine = EngineInfo::new("sim", &[1, 2, 4, 8]);
        let mut a = info(3, 1, (2, 4, 10));
        a.batch_hist.add(2, false);
        let mut b = info(2, 2, (1, 9, 20));
        b.batch_hist.add(9, true);
        b.queue_s = 0.004;
        let both = FlightRecord::build(&engine, Features::default(), 10, 0, [a, b].iter());
        let mut merged = a;
        merged.absorb(&b);
        let one = FlightRecord::build(&engine, Features::default(), 10, 0, [merged].iter());
        assert_eq!(one, both);
        assert_eq!(one.path(), both.path());
        // A sequence that took no step leaves the batch span alone.
        let mut idle = FinishInfo::default();
        idle.absorb(&a);
        assert_eq!((idle.batch_min, idle.batch_max), (2, 4));
        merged.absorb(&FinishInfo::default());
        assert_eq!(merged.batch_min, 1);
    }

    #[test]
    fn a_record_round_trips_and_stays_small() {
        let sizes: Vec<usize> = (1..=1000).collect();
        let engine = EngineInfo::new("cuda", &sizes);
        assert_eq!(engine.capture.len(), MAX_CAPTURE_LISTED);
        let r = FlightRecord::build(
            &engine,
            Features::default(),
            u64::MAX,
            u64::MAX,
            [FinishInfo {
                batch_hist: widest_hist(),
                eager_shared_steps: u32::MAX,
                off_path_steps: u32::MAX,
                ..info(u32::MAX, u32::MAX, (u32::MAX, u32::MAX, u64::MAX))
            }]
            .iter(),
        );
        assert_eq!(
            r.batch_hist.decode.bins().len(),
            crate::batch_hist::MAX_BINS
        );
        let json = r.to_json();
        assert!(json.len() < MAX_FLIGHT_BYTES, "{} bytes", json.len());
        assert!(!json.contains('\n'));
        let back: FlightRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        let c = r.sse_comment();
        assert!(c.starts_with(": flight {") && c.ends_with("}\n\n"));
    }

    /// Full histograms with the longest numbers there can be.
    fn widest_hist() -> BatchHist {
        let max = crate::batch_hist::MAX_SIZE;
        let bins: Vec<String> = (0..crate::batch_hist::MAX_BINS as u32)
            .rev()
            .map(|i| format!("[{},{}]", max - i * 1024, u32::MAX))
            .collect();
        let one = format!(r#"{{"width":1024,"bins":[{}]}}"#, bins.join(","));
        serde_json::from_str(&format!(r#"{{"decode":{one},"mixed":{one}}}"#)).unwrap()
    }

    #[test]
    fn the_histogram_sums_the_sequences_steps_by_batch_size() {
        let mut a = info(2, 1, (1, 3, 7));
        a.batch_hist.add(1, false);
        a.batch_hist.add(3, true);
        a.batch_hist.add(3, true);
        let mut b = info(1, 1, (2, 3, 5));
        b.batch_hist.add(2, false);
        b.batch_hist.add(3, true);
        let r = FlightRecord::build(
            &EngineInfo::new("sim", &[4]),
            Features::default(),
            5,
            0,
            [a, b].iter(),
        );
        assert_eq!(r.batch_hist.decode.bins(), &[(3, 3)]);
        assert_eq!(r.batch_hist.mixed.bins(), &[(1, 1), (2, 1)]);
        assert_eq!(
            r.batch_hist.steps(),
            u64::from(r.steps.graph + r.steps.eager)
        );
        let json = r.to_json();
        assert!(
            json.contains(r#""batch_hist":{"decode":{"width":1,"bins":[[3,3]]},"mixed":{"width":1,"bins":[[1,1],[2,1]]}}"#),
            "{json}"
        );
    }

    #[test]
    fn features_are_read_from_the_parsed_body() {
        let of = |body: &[u8], stream| {
            let value: serde_json::Value = serde_json::from_slice(body).unwrap();
            Features::of(value.as_object().unwrap(), stream)
        };
        let body = br#"{"model":"m","tools":[{"type":"function"}],"response_format":{"type":"json_object"},
            "messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]},
                        {"role":"user","content":"plain"}]}"#;
        let f = of(body, true);
        assert!(f.tools && f.response_format && f.stream);
        assert_eq!(f.images, 1);
        let f = of(
            br#"{"tools":[],"response_format":null,"prompt":"x"}"#,
            false,
        );
        assert_eq!(f, Features::default());
        assert_eq!(of(br#"{"messages":[1,2]}"#, false), Features::default());
    }

    #[test]
    fn a_request_that_took_no_step_has_an_empty_batch() {
        let r = FlightRecord::build(
            &EngineInfo::default(),
            Features::default(),
            3,
            0,
            std::iter::empty(),
        );
        assert_eq!(r.batch, BatchStats::default());
        assert_eq!(r.steps, PathSteps::default());
        assert_eq!(ms(f64::NAN), 0.0);
        assert_eq!(ms(-1.0), 0.0);
    }
}
