//! The engine's flight record as the gateway reads it: a worker is not trusted (issue 41), so a
//! record is bounded in bytes, parsed into [`FlightRecord`] and every number checked against a
//! plausible range. A record that fails is dropped whole (and counted), never half-used.

use infergate_engine::flight::{FlightRecord, MAX_FLIGHT_BYTES};

/// What an answer said about its flight.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Flight {
    /// No record came (another worker, an error answer).
    #[default]
    Absent,
    /// A record that passed the checks.
    Valid(Box<FlightRecord>),
    /// A record came but was too big, not JSON of the record's shape, or had an implausible
    /// number: ignored.
    Invalid,
}

impl Flight {
    /// The `result` label of `infergate_flight_records_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Flight::Absent => "absent",
            Flight::Valid(_) => "ok",
            Flight::Invalid => "invalid",
        }
    }

    /// The record, when valid.
    pub fn record(&self) -> Option<&FlightRecord> {
        match self {
            Flight::Valid(r) => Some(r),
            _ => None,
        }
    }
}

/// Most steps, batch size, preemptions, features count one record may report.
const MAX_COUNT: u64 = 100_000_000;
/// Most tokens of one kind.
const MAX_TOKENS: u64 = 10_000_000_000;
/// Longest time, ms (one day).
const MAX_MS: f64 = 86_400_000.0;
/// Longest string member.
const MAX_TEXT: usize = 64;
/// Most capture sizes listed.
const MAX_CAPTURE: usize = 128;

/// Parses and checks a raw record (a header value or an SSE comment's payload).
pub fn parse(raw: &[u8]) -> Flight {
    if raw.len() > MAX_FLIGHT_BYTES {
        return Flight::Invalid;
    }
    match serde_json::from_slice::<FlightRecord>(raw) {
        Ok(r) if check(&r).is_ok() => Flight::Valid(Box::new(r)),
        _ => Flight::Invalid,
    }
}

/// Why a parsed record is implausible.
fn check(r: &FlightRecord) -> Result<(), &'static str> {
    let count = |x: u64| x <= MAX_COUNT;
    if r.v == 0 || r.v > 1000 {
        return Err("format version");
    }
    let printable = |s: &str| s.len() <= MAX_TEXT && s.bytes().all(|b| b.is_ascii_graphic());
    if !printable(&r.engine) || !printable(&r.backend) {
        return Err("text");
    }
    if r.capture.len() > MAX_CAPTURE || !r.capture.iter().all(|&c| count(c.into())) {
        return Err("capture sizes");
    }
    let steps = u64::from(r.steps.graph) + u64::from(r.steps.eager);
    if !count(steps) || !count(r.preemptions.into()) {
        return Err("steps");
    }
    // Shared steps are eager steps in which the request only decoded (format 3; 0 before).
    if r.eager_shared > r.steps.eager {
        return Err("eager_shared");
    }
    // Off-path steps are eager steps past the budget, shared ones among them (format 4).
    if r.v >= 4 && (r.off_path > r.steps.eager || r.eager_shared > r.off_path) {
        return Err("off_path");
    }
    let b = &r.batch;
    if !count(b.max.into()) || b.min > b.max || !b.mean.is_finite() {
        return Err("batch");
    }
    let mean_ok = if steps == 0 {
        b.mean == 0.0 && b.max == 0
    } else {
        b.min >= 1 && b.mean >= f64::from(b.min) - 1e-6 && b.mean <= f64::from(b.max) + 1e-6
    };
    if !mean_ok {
        return Err("batch mean");
    }
    check_hist(r)?;
    let t = &r.tokens;
    if t.prompt > MAX_TOKENS || t.decode > MAX_TOKENS || t.cached > t.prompt {
        return Err("tokens");
    }
    let f = &r.features;
    if ![f.prompts, f.n, f.best_of, f.images]
        .iter()
        .all(|&x| count(x.into()))
    {
        return Err("features");
    }
    let time_ok = |ms: f64| ms.is_finite() && (0.0..=MAX_MS).contains(&ms);
    if !(time_ok(r.queue_ms) && time_ok(r.prefill_ms) && time_ok(r.decode_ms)) {
        return Err("times");
    }
    Ok(())
}

/// The histogram agrees with the counts beside it: the same steps (a record of format 2 or
/// later must carry it; an older engine's may not), no more graph steps than decode-only ones
/// (unless steps with prefill replay piecewise graphs),
/// every bin within `batch.min..=batch.max` and the mean within what the bins allow. Its own
/// shape (bins, widths, order) was checked as it parsed.
fn check_hist(r: &FlightRecord) -> Result<(), &'static str> {
    let h = &r.batch_hist;
    if r.v < 2 && h.is_empty() {
        return Ok(());
    }
    let steps = u64::from(r.steps.graph) + u64::from(r.steps.eager);
    let graph_ok = r.piecewise || u64::from(r.steps.graph) <= h.decode.steps();
    if h.steps() != steps || !graph_ok {
        return Err("batch_hist steps");
    }
    let (min, max) = (u64::from(r.batch.min), u64::from(r.batch.max));
    let (mut lo, mut hi) = (0u64, 0u64);
    for hist in [&h.decode, &h.mixed] {
        let w = u64::from(hist.width());
        for &(size, k) in hist.bins() {
            let (size, k) = (u64::from(size), u64::from(k));
            // The bin holds batches in (size - w, size]: it must meet [min, max].
            if size < min || size - w >= max {
                return Err("batch_hist range");
            }
            lo += (size - w + 1) * k;
            hi += size * k;
        }
    }
    if steps > 0 {
        let (lo, hi) = (lo as f64 / steps as f64, hi as f64 / steps as f64);
        if r.batch.mean < lo - 1e-3 || r.batch.mean > hi + 1e-3 {
            return Err("batch_hist mean");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use infergate_engine::flight::{BatchHist, BatchStats, EngineInfo, Features, PathSteps};

    fn good() -> FlightRecord {
        let mut r = FlightRecord::build(
            &EngineInfo::new("sim", &[1, 2, 4]),
            Features::default(),
            12,
            8,
            std::iter::empty(),
        );
        r.steps = PathSteps { graph: 5, eager: 1 };
        r.batch = BatchStats {
            min: 1,
            max: 3,
            mean: 2.5,
        };
        r.batch_hist = hist(&[(2, 1), (3, 4)], &[(1, 1)]);
        r.decode_ms = 40.0;
        r
    }

    fn hist(decode: &[(u32, u32)], mixed: &[(u32, u32)]) -> BatchHist {
        let mut h = BatchHist::default();
        for (list, decode_only) in [(decode, true), (mixed, false)] {
            for &(size, k) in list {
                (0..k).for_each(|_| h.add(size, decode_only));
            }
        }
        h
    }

    fn with(f: impl FnOnce(&mut FlightRecord)) -> Flight {
        let mut r = good();
        f(&mut r);
        parse(r.to_json().as_bytes())
    }

    #[test]
    fn a_sound_record_is_kept() {
        let r = good();
        assert_eq!(parse(r.to_json().as_bytes()), Flight::Valid(Box::new(r)));
        assert_eq!(parse(b"{\"v\":1}").label(), "ok", "missing members default");
    }

    #[test]
    fn graph_steps_with_prefill_are_kept_only_from_a_piecewise_engine() {
        // Six graph steps, one of them its prefill: more than its five decode-only steps.
        let mut r = good();
        r.steps = PathSteps { graph: 6, eager: 0 };
        assert_eq!(check(&r), Err("batch_hist steps"));
        r.piecewise = true;
        assert_eq!(
            parse(r.to_json().as_bytes()),
            Flight::Valid(Box::new(r.clone()))
        );
        assert!(r.to_json().contains("\"piecewise\":true"));
        assert!(!good().to_json().contains("piecewise"), "absent when false");
    }

    #[test]
    fn broken_records_are_ignored() {
        assert_eq!(parse(b"not json"), Flight::Invalid);
        assert_eq!(
            parse(b"{\"v\":1,\"steps\":{\"graph\":-1}}"),
            Flight::Invalid
        );
        assert_eq!(parse(b"{\"v\":1,\"queue_ms\":\"x\"}"), Flight::Invalid);
        let huge = format!(
            "{{\"v\":1,\"engine\":\"{}\"}}",
            "x".repeat(MAX_FLIGHT_BYTES)
        );
        assert_eq!(parse(huge.as_bytes()), Flight::Invalid);
        assert_eq!(with(|r| r.v = 0), Flight::Invalid);
        assert_eq!(with(|r| r.engine = "a b".into()), Flight::Invalid);
        assert_eq!(with(|r| r.batch.mean = 9.0), Flight::Invalid);
        assert_eq!(with(|r| r.batch.min = 4), Flight::Invalid);
        assert_eq!(with(|r| r.tokens.cached = 13), Flight::Invalid);
        assert_eq!(with(|r| r.decode_ms = -1.0), Flight::Invalid);
        assert_eq!(with(|r| r.queue_ms = 1e12), Flight::Invalid);
        assert_eq!(with(|r| r.capture = vec![1; 200]), Flight::Invalid);
        assert_eq!(with(|r| r.preemptions = u32::MAX), Flight::Invalid);
        assert_eq!(
            with(|r| r.eager_shared = 2),
            Flight::Invalid,
            "more than eager"
        );
        assert_eq!(
            with(|r| {
                r.eager_shared = 1;
                r.off_path = 1;
            })
            .label(),
            "ok"
        );
        // More off-path steps than eager ones, or fewer than the shared ones among them.
        assert_eq!(with(|r| r.off_path = 99), Flight::Invalid);
        assert_eq!(with(|r| r.eager_shared = 1), Flight::Invalid);
        assert_eq!(
            with(|r| r.steps = PathSteps::default()),
            Flight::Invalid,
            "a batch without steps"
        );
        // The histogram must agree with the counts beside it.
        let bad_hists = [
            hist(&[(2, 1), (3, 3)], &[(1, 1)]),
            hist(&[(2, 1)], &[(1, 1), (3, 4)]),
            hist(&[(2, 1), (4, 4)], &[(1, 1)]),
            hist(&[(3, 5)], &[(1, 1)]),
        ];
        for h in bad_hists {
            assert_eq!(with(|r| r.batch_hist = h), Flight::Invalid, "{h:?}");
        }
        assert_eq!(
            with(|r| r.batch_hist = BatchHist::default()),
            Flight::Invalid,
            "format 2 carries its histogram"
        );
        let old = with(|r| {
            r.v = 1;
            r.batch_hist = BatchHist::default();
        });
        assert_eq!(old.label(), "ok", "an older engine's record has none");
        let bins = |n: usize| {
            (1..=n)
                .map(|i| format!("[{i},1]"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let raw = |n: usize| {
            format!(
                r#"{{"v":2,"steps":{{"eager":{n}}},"batch":{{"min":1,"max":{n},"mean":{}}},"batch_hist":{{"mixed":{{"width":1,"bins":[{}]}}}}}}"#,
                (n + 1) as f64 / 2.0,
                bins(n)
            )
        };
        assert_eq!(parse(raw(16).as_bytes()).label(), "ok");
        assert_eq!(parse(raw(17).as_bytes()), Flight::Invalid, "too many bins");
        // JSON has no NaN: a string or null in its place fails to parse.
        assert_eq!(parse(b"{\"v\":1,\"decode_ms\":null}"), Flight::Invalid);
    }
}
