//! Reads the triage metrics of an engine's scrape (busy and host time, batch size, step gaps,
//! preemptions, prompt lengths, ITL, TPOT, prefix cache, configured caps) so the gateway can
//! carry them into its own `/metrics` (see [`super::triage_export`]) and `infergate doctor`
//! needs only the gateway's admin URL.
//!
//! The names are our engine's (`infergate_engine_*`) and vLLM's (`vllm:*`): a vLLM worker has
//! no busy or host time, and those series are simply absent. The numbers come from a worker and
//! are checked like the queue metrics of [`super::load_metrics`]: a value that is NaN,
//! infinite, negative or past its ceiling, a histogram whose buckets are not cumulative or too
//! many, makes the scrape invalid.

use std::collections::HashMap;

use super::load_metrics::{PollError, PollFailure, samples};

/// Largest value a mirrored counter may hold (1e15: a decade of a million tokens a second is
/// 3e14). Past it the exporter is broken.
pub const MAX_COUNTER: f64 = 1e15;
/// Largest configured cap a worker may report (sequences or tokens per step).
pub const MAX_CAP: f64 = 1e9;
/// Most buckets a mirrored histogram may have (summed over label sets): vLLM's have about 20;
/// a bound keeps the gateway's series per worker bounded.
pub const MAX_BUCKETS: usize = 64;

/// One mirrored metric: the worker's sample name and the name the gateway exports it under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mirror {
    /// The name in the worker's scrape (for a histogram, without `_bucket`/`_sum`/`_count`).
    pub source: &'static str,
    /// The name in the gateway's `/metrics`, labelled `{pool,worker}`.
    pub export: &'static str,
    /// The exported family's help text.
    pub help: &'static str,
}

const fn m(source: &'static str, export: &'static str, help: &'static str) -> Mirror {
    Mirror {
        source,
        export,
        help,
    }
}

/// Counters mirrored as counters (a worker restart resets them; Prometheus' `rate` and doctor
/// both treat a drop as a reset).
pub const COUNTERS: [Mirror; 8] = [
    m(
        "infergate_engine_busy_seconds_total",
        "infergate_worker_busy_seconds_total",
        "Seconds the worker's engine spent inside steps (its rate is the busy fraction; polled).",
    ),
    m(
        "infergate_engine_host_seconds_total",
        "infergate_worker_host_seconds_total",
        "Seconds of host time between the worker's steps while work was pending (polled).",
    ),
    m(
        "infergate_engine_recomputed_tokens_total",
        "infergate_worker_recomputed_tokens_total",
        "Tokens the worker computed again after a preemption (polled).",
    ),
    m(
        "vllm:num_preemptions_total",
        "infergate_worker_preemptions_total",
        "Preemptions in the worker's engine (polled).",
    ),
    m(
        "vllm:prompt_tokens_total",
        "infergate_worker_prompt_tokens_total",
        "Prompt tokens the worker's engine processed (polled).",
    ),
    m(
        "vllm:generation_tokens_total",
        "infergate_worker_generation_tokens_total",
        "Tokens the worker's engine generated (polled).",
    ),
    m(
        "vllm:prefix_cache_hits_total",
        "infergate_worker_prefix_cache_hits_total",
        "Prompt tokens found in the worker's prefix cache (polled).",
    ),
    m(
        "vllm:prefix_cache_queries_total",
        "infergate_worker_prefix_cache_queries_total",
        "Prompt tokens looked up in the worker's prefix cache (polled).",
    ),
];

/// Index of each counter in [`COUNTERS`].
pub mod counter {
    /// Busy seconds.
    pub const BUSY: usize = 0;
    /// Host seconds.
    pub const HOST: usize = 1;
    /// Recomputed tokens.
    pub const RECOMPUTED: usize = 2;
    /// Preemptions.
    pub const PREEMPTIONS: usize = 3;
    /// Prompt tokens.
    pub const PROMPT: usize = 4;
    /// Generated tokens.
    pub const GENERATION: usize = 5;
    /// Prefix cache hits (tokens).
    pub const CACHE_HITS: usize = 6;
    /// Prefix cache queries (tokens).
    pub const CACHE_QUERIES: usize = 7;
}

/// Gauges mirrored as gauges: the engine's configured caps.
pub const GAUGES: [Mirror; 2] = [
    m(
        "infergate_engine_max_num_seqs",
        "infergate_worker_max_num_seqs",
        "The worker's configured cap on sequences per step (polled).",
    ),
    m(
        "infergate_engine_max_num_batched_tokens",
        "infergate_worker_max_num_batched_tokens",
        "The worker's configured cap on tokens per step (polled).",
    ),
];

/// Histograms mirrored bucket for bucket, with the worker's own bounds (at most
/// [`MAX_BUCKETS`]).
pub const HISTOGRAMS: [Mirror; 6] = [
    m(
        "infergate_engine_step_gap_seconds",
        "infergate_worker_step_gap_seconds",
        "Host time between the worker's engine steps (polled).",
    ),
    m(
        "infergate_engine_batch_size",
        "infergate_worker_batch_size",
        "Sequences per step in the worker's engine (polled).",
    ),
    m(
        "vllm:iteration_tokens_total",
        "infergate_worker_iteration_tokens",
        "Tokens per step in the worker's engine (polled).",
    ),
    m(
        "vllm:request_prompt_tokens",
        "infergate_worker_request_prompt_tokens",
        "Prompt tokens per finished request in the worker's engine (polled).",
    ),
    m(
        "vllm:inter_token_latency_seconds",
        "infergate_worker_inter_token_latency_seconds",
        "Inter-token latency in the worker's engine (polled).",
    ),
    m(
        "vllm:request_time_per_output_token_seconds",
        "infergate_worker_time_per_output_token_seconds",
        "Time per output token of finished requests in the worker's engine (polled).",
    ),
];

/// A histogram as scraped: cumulative counts by upper bound (ascending, `+Inf` last when
/// exported), sum and count, summed over label sets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramData {
    /// `(le, cumulative count)`, ascending by `le`.
    pub buckets: Vec<(f64, f64)>,
    /// `_sum`.
    pub sum: f64,
    /// `_count`.
    pub count: f64,
}

/// The triage metrics of one scrape; `None` where the worker does not export the metric.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineTriage {
    /// By [`COUNTERS`] index.
    pub counters: [Option<f64>; COUNTERS.len()],
    /// By [`GAUGES`] index.
    pub gauges: [Option<f64>; GAUGES.len()],
    /// By [`HISTOGRAMS`] index.
    pub histograms: [Option<HistogramData>; HISTOGRAMS.len()],
}

fn invalid(name: &str, value: impl std::fmt::Display) -> PollError {
    PollError::new(
        PollFailure::InvalidValue,
        format!("{name} = {value} is out of range"),
    )
}

/// `value` if finite and in `0..=max`.
fn bounded(name: &str, value: f64, max: f64) -> Result<f64, PollError> {
    if value.is_finite() && (0.0..=max).contains(&value) {
        Ok(value)
    } else {
        Err(invalid(name, value))
    }
}

/// The value of a sample line (after its labels; a timestamp may follow).
fn sample_value(line: &str, name_end: usize, name: &str) -> Result<f64, PollError> {
    let rest = match line[name_end..].rfind('}') {
        Some(i) => &line[name_end + i + 1..],
        None => &line[name_end..],
    };
    let raw = rest.split_whitespace().next().unwrap_or("");
    raw.parse::<f64>()
        .map_err(|_| invalid(name, format!("{raw:?}")))
}

/// The `le` label of a bucket line.
fn le_of(line: &str, name: &str) -> Result<f64, PollError> {
    let open = line.find('{');
    let close = line.rfind('}');
    let labels = match (open, close) {
        (Some(o), Some(c)) if o < c => &line[o + 1..c],
        _ => "",
    };
    let le = labels
        .split(',')
        .find_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            (k.trim() == "le").then(|| v.trim().trim_matches('"'))
        })
        .ok_or_else(|| invalid(name, "a bucket without le"))?;
    match le.parse::<f64>() {
        Ok(v) if !v.is_nan() => Ok(v),
        _ => Err(invalid(&format!("{name} le"), format!("{le:?}"))),
    }
}

/// A bucket line's labels but `le`: which label set (series) it belongs to.
fn series_key(line: &str) -> String {
    let (Some(open), Some(close)) = (line.find('{'), line.rfind('}')) else {
        return String::new();
    };
    line.get(open + 1..close)
        .unwrap_or("")
        .split(',')
        .filter(|pair| pair.split_once('=').is_none_or(|(k, _)| k.trim() != "le"))
        .collect::<Vec<_>>()
        .join(",")
}

/// What a sample line is, among the mirrored metrics.
enum Part {
    Counter(usize),
    Gauge(usize),
    Bucket(usize),
    Sum(usize),
    Count(usize),
}

fn part_of(name: &str) -> Option<Part> {
    if let Some(i) = COUNTERS.iter().position(|c| c.source == name) {
        return Some(Part::Counter(i));
    }
    if let Some(i) = GAUGES.iter().position(|g| g.source == name) {
        return Some(Part::Gauge(i));
    }
    HISTOGRAMS.iter().enumerate().find_map(|(i, h)| {
        let suffix = name.strip_prefix(h.source)?;
        match suffix {
            "_bucket" => Some(Part::Bucket(i)),
            "_sum" => Some(Part::Sum(i)),
            "_count" => Some(Part::Count(i)),
            _ => None,
        }
    })
}

/// Parses the triage metrics of a scrape in our engine's or vLLM's names. Values of one metric
/// under several label sets are summed (caps: the largest). Errors with
/// [`PollFailure::InvalidValue`] on a value that is not a finite, non-negative number within
/// its ceiling ([`MAX_COUNTER`], [`MAX_CAP`]), a histogram with more than [`MAX_BUCKETS`]
/// bounds or whose cumulative counts fall as `le` grows.
pub fn parse_triage(text: &str) -> Result<EngineTriage, PollError> {
    let mut out = EngineTriage::default();
    // Each histogram label set's buckets, to check that each is cumulative.
    let mut series: HashMap<(usize, String), Vec<(f64, f64)>> = HashMap::new();
    for (line, name, name_end) in samples(text) {
        let Some(part) = part_of(name) else {
            continue;
        };
        let value = sample_value(line, name_end, name)?;
        match part {
            Part::Counter(i) => {
                let v = bounded(name, value, MAX_COUNTER)?;
                let sum = out.counters[i].unwrap_or(0.0) + v;
                out.counters[i] = Some(bounded(name, sum, MAX_COUNTER)?);
            }
            Part::Gauge(i) => {
                let v = bounded(name, value, MAX_CAP)?;
                out.gauges[i] = Some(out.gauges[i].map_or(v, |g: f64| g.max(v)));
            }
            Part::Bucket(i) => {
                let count = bounded(name, value, MAX_COUNTER)?;
                let le = le_of(line, name)?;
                series
                    .entry((i, series_key(line)))
                    .or_default()
                    .push((le, count));
                let h = out.histograms[i].get_or_insert_with(HistogramData::default);
                let full = h.buckets.len() >= MAX_BUCKETS;
                match h.buckets.iter_mut().find(|(b, _)| *b == le) {
                    Some((_, c)) => *c = bounded(name, *c + count, MAX_COUNTER)?,
                    None if full => {
                        return Err(invalid(name, format!("more than {MAX_BUCKETS} buckets")));
                    }
                    None => h.buckets.push((le, count)),
                }
            }
            Part::Sum(i) => {
                let h = out.histograms[i].get_or_insert_with(HistogramData::default);
                h.sum = bounded(
                    name,
                    h.sum + bounded(name, value, MAX_COUNTER)?,
                    MAX_COUNTER,
                )?;
            }
            Part::Count(i) => {
                let h = out.histograms[i].get_or_insert_with(HistogramData::default);
                h.count = bounded(
                    name,
                    h.count + bounded(name, value, MAX_COUNTER)?,
                    MAX_COUNTER,
                )?;
            }
        }
    }
    // Each label set's buckets must be cumulative: that is the worker's own arithmetic.
    for ((i, _), mut buckets) in series {
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
            return Err(invalid(
                HISTOGRAMS[i].source,
                "buckets that are not cumulative",
            ));
        }
    }
    // Label sets with different bounds sum to counts that can dip at a bound only some have;
    // a cumulative count never falls, so the sum is read as its running maximum.
    for h in out.histograms.iter_mut().flatten() {
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut seen = 0.0_f64;
        for (_, c) in &mut h.buckets {
            seen = seen.max(*c);
            *c = seen;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(text: &str) -> Option<PollFailure> {
        parse_triage(text).err().map(|e| e.reason)
    }

    #[test]
    fn reads_our_engine_names_and_sums_label_sets() {
        let text = "# TYPE infergate_engine_busy_seconds_total counter\n\
infergate_engine_busy_seconds_total 12.5\n\
infergate_engine_host_seconds_total 3\n\
vllm:num_preemptions_total{engine=\"0\"} 2\n\
vllm:num_preemptions_total{engine=\"1\"} 3\n\
infergate_engine_max_num_seqs 8\n\
infergate_engine_batch_size_bucket{le=\"4\"} 1\n\
infergate_engine_batch_size_bucket{le=\"8\"} 5\n\
infergate_engine_batch_size_bucket{le=\"+Inf\"} 5\n\
infergate_engine_batch_size_sum 30\n\
infergate_engine_batch_size_count 5\n\
vllm:num_requests_running 3\n";
        let t = parse_triage(text).unwrap();
        assert_eq!(t.counters[counter::BUSY], Some(12.5));
        assert_eq!(t.counters[counter::HOST], Some(3.0));
        assert_eq!(t.counters[counter::PREEMPTIONS], Some(5.0));
        assert_eq!(t.counters[counter::PROMPT], None);
        assert_eq!(t.gauges[0], Some(8.0));
        let h = t.histograms[1].as_ref().unwrap();
        assert_eq!(
            h.buckets,
            vec![(4.0, 1.0), (8.0, 5.0), (f64::INFINITY, 5.0)]
        );
        assert_eq!((h.sum, h.count), (30.0, 5.0));
        assert!(t.histograms[0].is_none());
    }

    #[test]
    fn a_vllm_scrape_has_no_busy_time() {
        let text = "vllm:iteration_tokens_total_bucket{le=\"1.0\",model_name=\"m\"} 0\n\
vllm:iteration_tokens_total_bucket{le=\"+Inf\",model_name=\"m\"} 4\n\
vllm:iteration_tokens_total_sum{model_name=\"m\"} 100\n\
vllm:iteration_tokens_total_count{model_name=\"m\"} 4\n";
        let t = parse_triage(text).unwrap();
        assert_eq!(t.counters[counter::BUSY], None);
        assert_eq!(t.histograms[2].as_ref().unwrap().count, 4.0);
    }

    #[test]
    fn label_sets_of_a_histogram_are_summed_by_bound() {
        let text = "vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"10\"} 1\n\
vllm:request_prompt_tokens_bucket{engine=\"1\",le=\"10\"} 2\n\
vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"+Inf\"} 3\n\
vllm:request_prompt_tokens_bucket{engine=\"1\",le=\"+Inf\"} 4\n";
        let t = parse_triage(text).unwrap();
        let h = t.histograms[3].as_ref().unwrap();
        assert_eq!(h.buckets, vec![(10.0, 3.0), (f64::INFINITY, 7.0)]);
    }

    #[test]
    fn values_out_of_range_make_the_scrape_invalid() {
        let invalid = Some(PollFailure::InvalidValue);
        for bad in ["NaN", "+Inf", "-1", "1e16", "lots"] {
            let text = format!("infergate_engine_busy_seconds_total {bad}\n");
            assert_eq!(reason(&text), invalid, "counter {bad}");
            let text = format!("infergate_engine_max_num_seqs {bad}\n");
            assert_eq!(reason(&text), invalid, "gauge {bad}");
            let text = format!("infergate_engine_batch_size_bucket{{le=\"1\"}} {bad}\n");
            assert_eq!(reason(&text), invalid, "bucket {bad}");
            let text = format!("infergate_engine_batch_size_sum {bad}\n");
            assert_eq!(reason(&text), invalid, "sum {bad}");
        }
        // Each label set within the ceiling, their sum past it.
        let text =
            "vllm:prompt_tokens_total{a=\"1\"} 6e14\nvllm:prompt_tokens_total{a=\"2\"} 6e14\n";
        assert_eq!(reason(text), invalid);
    }

    #[test]
    fn label_sets_with_different_bounds_sum_without_a_dip() {
        // Each set cumulative; their sum at 1.5 (only B has it) would dip below A's count at 1.
        let text = "infergate_engine_batch_size_bucket{e=\"a\",le=\"1\"} 5\n\
infergate_engine_batch_size_bucket{e=\"a\",le=\"+Inf\"} 5\n\
infergate_engine_batch_size_bucket{e=\"b\",le=\"1.5\"} 1\n\
infergate_engine_batch_size_bucket{e=\"b\",le=\"+Inf\"} 2\n";
        let t = parse_triage(text).unwrap();
        let h = t.histograms[1].as_ref().unwrap();
        assert_eq!(
            h.buckets,
            vec![(1.0, 5.0), (1.5, 5.0), (f64::INFINITY, 7.0)]
        );
        // One set falling is the worker's own error.
        let falling = "infergate_engine_batch_size_bucket{e=\"a\",le=\"1\"} 5\n\
infergate_engine_batch_size_bucket{e=\"a\",le=\"2\"} 4\n\
infergate_engine_batch_size_bucket{e=\"b\",le=\"1\"} 0\n";
        assert_eq!(reason(falling), Some(PollFailure::InvalidValue));
    }

    #[test]
    fn histograms_must_be_cumulative_bounded_and_labelled() {
        let invalid = Some(PollFailure::InvalidValue);
        let falling = "infergate_engine_batch_size_bucket{le=\"1\"} 5\n\
infergate_engine_batch_size_bucket{le=\"2\"} 3\n";
        assert_eq!(reason(falling), invalid);
        let no_le = "infergate_engine_batch_size_bucket 5\n";
        assert_eq!(reason(no_le), invalid);
        let nan_le = "infergate_engine_batch_size_bucket{le=\"NaN\"} 5\n";
        assert_eq!(reason(nan_le), invalid);
        let many: String = (0..=MAX_BUCKETS)
            .map(|i| format!("infergate_engine_batch_size_bucket{{le=\"{i}\"}} {i}\n"))
            .collect();
        assert_eq!(reason(&many), invalid);
        let enough: String = (0..MAX_BUCKETS)
            .map(|i| format!("infergate_engine_batch_size_bucket{{le=\"{i}\"}} {i}\n"))
            .collect();
        assert!(parse_triage(&enough).is_ok());
    }

    #[test]
    fn mirrored_names_are_distinct() {
        let mut names: Vec<&str> = COUNTERS
            .iter()
            .chain(&GAUGES)
            .chain(&HISTOGRAMS)
            .map(|m| m.export)
            .collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(
            names.len(),
            COUNTERS.len() + GAUGES.len() + HISTOGRAMS.len()
        );
    }
}
