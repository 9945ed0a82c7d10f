//! The joint shape distribution of a trace: engine steps by batch size (decode-only apart from
//! prefill, and the path each took), prompt x output length, features, cache state and path
//! shares. Pure over the requests `trace` read.
//!
//! Steps come from the requests' batch histograms: a step of batch `b` is counted once by each
//! of its `b` sequences, so `steps(b) = sum over requests of hist[b] / b`, exact when every
//! request was traced and no histogram coarsened (`exact`); a coarsened bin `(s - w, s]` is
//! divided by its middle.

use std::collections::BTreeMap;

use infergate_engine::flight::Hist;
use serde::Serialize;

use super::trace::{Request, Trace};

/// Upper edges of the prompt-length buckets, tokens (the last bucket is open).
pub const PROMPT_EDGES: [u64; 6] = [16, 64, 256, 1024, 4096, 16384];
/// Upper edges of the output-length buckets, tokens.
pub const OUTPUT_EDGES: [u64; 5] = [16, 64, 256, 1024, 4096];

/// Engine steps of one batch size.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepRow {
    /// Sequences in the step (a coarsened bin's top).
    pub batch: u32,
    /// Decode-only steps that replayed a graph.
    pub graph: f64,
    /// Decode-only steps larger than every capture size (eager).
    pub decode_eager: f64,
    /// Steps with prefill tokens (eager).
    pub mixed: f64,
}

/// Steps by path over the whole trace.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PathShares {
    /// Engine steps on the graph path (from the histograms).
    pub graph_steps: f64,
    /// Engine steps on the eager path.
    pub eager_steps: f64,
    /// Share of engine steps on the graph path.
    pub graph_share: f64,
    /// Sequence-steps on the graph path (the records' `steps.graph`, summed).
    pub graph_seq_steps: u64,
    /// Sequence-steps on the eager path.
    pub eager_seq_steps: u64,
}

/// Requests by prompt and output length.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Lengths {
    /// Row labels (prompt tokens).
    pub prompt_buckets: Vec<String>,
    /// Column labels (output tokens).
    pub output_buckets: Vec<String>,
    /// `requests[prompt bucket][output bucket]`.
    pub requests: Vec<Vec<u64>>,
}

/// Requests using each feature that changes the path.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FeatureCounts {
    /// Streamed answers.
    pub stream: u64,
    /// `n` > 1.
    pub n_gt_1: u64,
    /// `best_of` > `n`.
    pub best_of: u64,
    /// Logprobs asked for.
    pub logprobs: u64,
    /// Completions `echo`.
    pub echo: u64,
    /// `tools` given.
    pub tools: u64,
    /// `response_format` given.
    pub response_format: u64,
    /// Image parts.
    pub images: u64,
    /// Several prompts in one request.
    pub multi_prompt: u64,
}

/// Prefix-cache state of the requests' prompts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CacheState {
    /// Prompt tokens, all requests.
    pub prompt_tokens: u64,
    /// Of which read from the prefix cache.
    pub cached_tokens: u64,
    /// `cached_tokens / prompt_tokens` (0 without prompts).
    pub cached_share: f64,
    /// Requests by their own cached share: 0, (0,25%], (25,50%], (50,75%], (75,100%].
    pub requests_by_share: [u64; 5],
}

/// The joint distribution `infergate shapes TRACE` prints.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Distribution {
    /// Lines read.
    pub lines: u64,
    /// Lines skipped as not trace lines or with a record failing the checks.
    pub bad_lines: u64,
    /// Trace lines without an engine record.
    pub without_record: u64,
    /// Requests with a record.
    pub requests: u64,
    /// The capture sizes most requests were served with.
    pub capture: Vec<u32>,
    /// Whether step counts are exact (no histogram coarsened).
    pub exact: bool,
    /// Engine steps by batch size, ascending.
    pub steps: Vec<StepRow>,
    /// Steps by path.
    pub paths: PathShares,
    /// Prompt x output length.
    pub lengths: Lengths,
    /// Features.
    pub features: FeatureCounts,
    /// Cache state.
    pub cache: CacheState,
}

/// The steps one histogram bin stands for, divided among its `k` sequence-counts.
fn bin_steps(hist: &Hist, size: u32, k: u32) -> f64 {
    let w = f64::from(hist.width());
    let mid = if w <= 1.0 {
        f64::from(size)
    } else {
        f64::from(size) - (w - 1.0) / 2.0
    };
    f64::from(k) / mid.max(1.0)
}

/// Decode-only engine steps by batch size over `requests` (the input of a proposal).
pub fn decode_steps(requests: &[Request]) -> BTreeMap<u32, f64> {
    let mut out = BTreeMap::new();
    for r in requests {
        for &(size, k) in r.hist.decode.bins() {
            *out.entry(size).or_insert(0.0) += bin_steps(&r.hist.decode, size, k);
        }
    }
    out
}

/// `n` as "<=n" labels for `edges`, and ">last" for the open bucket.
fn labels(edges: &[u64]) -> Vec<String> {
    let mut v: Vec<String> = edges.iter().map(|e| format!("<={e}")).collect();
    v.push(format!(">{}", edges.last().copied().unwrap_or(0)));
    v
}

/// The bucket of `x` among `edges`.
fn bucket_of(x: u64, edges: &[u64]) -> usize {
    edges.partition_point(|&e| e < x)
}

/// The distribution of `trace`.
pub fn distribution(trace: &Trace) -> Distribution {
    let mut rows: BTreeMap<u32, StepRow> = BTreeMap::new();
    let mut d = Distribution {
        lines: trace.lines,
        bad_lines: trace.bad_lines,
        without_record: trace.without_record,
        requests: trace.requests.len() as u64,
        capture: trace.usual_capture().to_vec(),
        exact: true,
        lengths: Lengths {
            prompt_buckets: labels(&PROMPT_EDGES),
            output_buckets: labels(&OUTPUT_EDGES),
            requests: vec![vec![0; OUTPUT_EDGES.len() + 1]; PROMPT_EDGES.len() + 1],
        },
        ..Distribution::default()
    };
    for r in &trace.requests {
        let (decode, mixed) = (&r.hist.decode, &r.hist.mixed);
        d.exact &= decode.width() == 1 && mixed.width() == 1;
        for &(size, k) in decode.bins() {
            let row = rows.entry(size).or_default();
            let steps = bin_steps(decode, size, k);
            // As the engine picks: a decode-only batch up to its largest capture size replays.
            if size <= r.largest_capture {
                row.graph += steps;
            } else {
                row.decode_eager += steps;
            }
        }
        for &(size, k) in mixed.bins() {
            rows.entry(size).or_default().mixed += bin_steps(mixed, size, k);
        }
        d.paths.graph_seq_steps += r.graph_steps;
        d.paths.eager_seq_steps += r.eager_steps;
        let (p, o) = (
            bucket_of(r.prompt, &PROMPT_EDGES),
            bucket_of(r.output, &OUTPUT_EDGES),
        );
        d.lengths.requests[p][o] += 1;
        note_features(&mut d.features, r);
        d.cache.prompt_tokens += r.prompt;
        d.cache.cached_tokens += r.cached;
        let share = if r.prompt == 0 {
            0.0
        } else {
            r.cached as f64 / r.prompt as f64
        };
        let i = if share <= 0.0 {
            0
        } else {
            ((share * 4.0).ceil() as usize).clamp(1, 4)
        };
        d.cache.requests_by_share[i] += 1;
    }
    d.steps = rows
        .into_iter()
        .map(|(batch, row)| StepRow {
            batch,
            graph: round3(row.graph),
            decode_eager: round3(row.decode_eager),
            mixed: round3(row.mixed),
        })
        .collect();
    d.paths.graph_steps = round3(d.steps.iter().map(|r| r.graph).sum());
    d.paths.eager_steps = round3(d.steps.iter().map(|r| r.decode_eager + r.mixed).sum());
    d.paths.graph_share = share(
        d.paths.graph_steps,
        d.paths.graph_steps + d.paths.eager_steps,
    );
    d.cache.cached_share = share(d.cache.cached_tokens as f64, d.cache.prompt_tokens as f64);
    d
}

fn note_features(f: &mut FeatureCounts, r: &Request) {
    let x = &r.features;
    let count = |c: &mut u64, on: bool| *c += u64::from(on);
    count(&mut f.stream, x.stream);
    count(&mut f.n_gt_1, x.n > 1);
    count(&mut f.best_of, x.best_of > x.n.max(1));
    count(&mut f.logprobs, x.logprobs);
    count(&mut f.echo, x.echo);
    count(&mut f.tools, x.tools);
    count(&mut f.response_format, x.response_format);
    count(&mut f.images, x.images > 0);
    count(&mut f.multi_prompt, x.prompts > 1);
}

/// `part / whole` to 4 decimals, 0 when `whole` is 0.
pub fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        (part / whole * 1e4).round() / 1e4
    } else {
        0.0
    }
}

/// `x` to 3 decimals.
pub fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::super::trace::tests::line;
    use super::*;

    fn trace(lines: &[String]) -> Trace {
        let mut t = Trace::default();
        t.read_from(lines.join("\n").as_bytes()).unwrap();
        t.finish()
    }

    #[test]
    fn steps_per_batch_size_are_recovered_from_the_histograms() {
        // Three requests share a prefill step of 3; two decode together for 3 steps of 2
        // (past the capture size 1: eager), then the first alone for 2 steps of 1 (graph).
        let t = trace(&[
            line(1, 3, &[2, 2, 2, 1, 1], &[1]),
            line(2, 3, &[2, 2, 2], &[1]),
            line(3, 3, &[], &[1]),
        ]);
        let d = distribution(&t);
        assert!(d.exact);
        let row = |b: u32| d.steps.iter().find(|r| r.batch == b).cloned().unwrap();
        assert_eq!(row(1).graph, 2.0);
        assert_eq!(
            row(2).decode_eager,
            3.0,
            "batch 2 is past the capture size 1"
        );
        assert_eq!(row(3).mixed, 1.0);
        assert_eq!(d.paths.graph_steps, 2.0);
        assert_eq!(d.paths.eager_steps, 4.0);
        assert_eq!(d.paths.graph_share, 0.3333);
        assert_eq!(d.paths.graph_seq_steps, 2);
        assert_eq!(d.paths.eager_seq_steps, 4 + 4 + 1);
        assert_eq!(d.capture, vec![1]);
    }

    #[test]
    fn lengths_features_and_cache_are_tallied() {
        let t = trace(&[line(1, 1, &[1], &[1]), line(2, 1, &[1, 1], &[1])]);
        let d = distribution(&t);
        // 100 prompt tokens (<=256), 2 and 3 output tokens (<=16).
        assert_eq!(d.lengths.requests[2][0], 2);
        assert_eq!(d.lengths.requests.iter().flatten().sum::<u64>(), 2);
        assert_eq!(d.lengths.prompt_buckets[0], "<=16");
        assert_eq!(d.lengths.output_buckets.last().unwrap(), ">4096");
        assert_eq!(d.features.stream, 2);
        assert_eq!(d.features.n_gt_1, 0);
        assert_eq!(d.cache.cached_share, 0.5);
        assert_eq!(d.cache.requests_by_share, [0, 0, 2, 0, 0]);
        assert_eq!(bucket_of(16, &PROMPT_EDGES), 0);
        assert_eq!(bucket_of(17, &PROMPT_EDGES), 1);
        assert_eq!(bucket_of(1 << 20, &PROMPT_EDGES), 6);
    }

    #[test]
    fn a_coarsened_bin_is_divided_by_its_middle() {
        let mut h = Hist::default();
        (1..=40).for_each(|b| h.add(b));
        assert_eq!(h.width(), 4);
        // The bin (36, 40] of 4 counts: about one step of ~38.5.
        assert!((bin_steps(&h, 40, 4) - 4.0 / 38.5).abs() < 1e-9);
    }
}
