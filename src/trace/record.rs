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

#[cfg(test)]
mod tests {
    use super::*;
    use infergate_engine::flight::{BatchStats, EngineInfo, Features, PathSteps};

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
        r.decode_ms = 40.0;
        r
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
            with(|r| r.steps = PathSteps::default()),
            Flight::Invalid,
            "a batch without steps"
        );
        // JSON has no NaN: a string or null in its place fails to parse.
        assert_eq!(parse(b"{\"v\":1,\"decode_ms\":null}"), Flight::Invalid);
    }
}
