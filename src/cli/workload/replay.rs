//! `bench --replay TRACE` and `sim --replay TRACE`: the gateway's own trace file (`trace:` in
//! its config, one JSON line per request) as a workload, keeping each request's arrival, prompt
//! and answer lengths, tenant, session and prefix group together: the traffic's joint shape,
//! not its marginals.
//!
//! Lengths: the worker's usage when it answered, else the engine's flight record, else the
//! gateway's prompt estimate and the request's completion bound (a request refused before any
//! worker counted it is still sent). Prefix groups come from the line's prefix marks (chained
//! hashes of its first 1, 2, 4, ... blocks): a request's group is its deepest mark another
//! request shares, and the group's shared prefix is that many blocks. No text is in a trace, so
//! the replayed prompts are synthetic words of the same lengths and the same sharing.
//!
//! Features that change the engine's path (`n`, logprobs, tools, `response_format`, image
//! parts) come from the line's `features` (the gateway's view of the validated request), else
//! from the engine's flight record (which knows tools and formats only as present or not, and
//! no logprob alternatives); a replay sends them again (see `body`). Answer lengths are per
//! choice: the usage of `n` choices, and a record's tokens of `best_of` sequences, are divided.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::model::{Arrival, Slo, TraceEntry, TraceGroup, TracePrompt, Workload};
use infergate::trace::TraceFeatures;
use infergate::trace::features::ResponseFormat;
use infergate_engine::flight::Features as FlightFeatures;

/// Bytes of a prefix block (the gateway's mark block).
const BLOCK_BYTES: f64 = infergate::trace::PREFIX_MARK_BLOCK_BYTES as f64;
/// Longest class name a line may give (longer ones are left out: the request is `replay`).
const MAX_CLASS_BYTES: usize = 64;
/// Bytes a token takes when a line does not say (the gateway's own estimate).
const DEFAULT_BYTES_PER_TOKEN: f64 = 4.0;

/// The members of a gateway trace line a replay reads.
#[derive(Deserialize)]
struct GatewayLine {
    request_id: String,
    start_ms: i64,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_estimate: Option<u64>,
    #[serde(default)]
    prompt_bytes: Option<u64>,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    prefix: Vec<String>,
    #[serde(default)]
    features: Option<TraceFeatures>,
    #[serde(default)]
    flight: Option<FlightTokens>,
    /// The shape class the gateway put it in (a simulator's trace: its workload class).
    #[serde(default)]
    class: Option<String>,
}

/// The token counts and features of a flight record.
#[derive(Deserialize)]
struct FlightTokens {
    #[serde(default)]
    tokens: Option<Counts>,
    #[serde(default)]
    features: Option<FlightFeatures>,
}

#[derive(Deserialize)]
struct Counts {
    #[serde(default)]
    prompt: u64,
    #[serde(default)]
    decode: u64,
}

/// Whether a trace line is the gateway's (rather than a workload trace line).
pub(super) fn is_gateway_line(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line)
        .is_ok_and(|v| v.get("request_id").is_some() && v.get("start_ms").is_some())
}

/// One usable line, before groups are known.
struct Parsed {
    start_ms: i64,
    tenant: String,
    session: Option<String>,
    prompt: u32,
    output: u32,
    /// Bytes per prompt token, from the line's bytes and tokens.
    bytes_per_token: f64,
    marks: Vec<String>,
    features: Option<TraceFeatures>,
    class: Option<String>,
}

/// The features of a line: the gateway's, else what the engine's record says of them.
fn features_of(line: Option<TraceFeatures>, flight: Option<&FlightFeatures>) -> TraceFeatures {
    match (line, flight) {
        (Some(f), _) => f.bounded(),
        (None, Some(f)) => TraceFeatures {
            n: f.n.max(1),
            logprobs: f.logprobs,
            top_logprobs: 0,
            tools: u32::from(f.tools),
            response_format: f.response_format.then_some(ResponseFormat::JsonObject),
            images: f.images,
        }
        .bounded(),
        (None, None) => TraceFeatures::default(),
    }
}

/// The entries of a gateway trace's lines (`(line number, text)`), sorted by arrival; lines
/// that are not gateway trace lines or carry no lengths are counted in the second value.
pub(super) fn entries(lines: &[(usize, &str)]) -> Result<(Vec<TraceEntry>, u64), String> {
    let mut parsed = Vec::new();
    let mut skipped = 0u64;
    for (_, text) in lines {
        let Ok(l) = serde_json::from_str::<GatewayLine>(text) else {
            skipped += 1;
            continue;
        };
        let flight_features = l.flight.as_ref().and_then(|f| f.features);
        let features = features_of(l.features, flight_features.as_ref());
        // Usage counts every choice, a record every sequence (`best_of` of them): one choice's.
        let n = u64::from(features.n);
        let sequences = flight_features.map_or(n, |f| u64::from(f.best_of).max(n));
        let counts = l.flight.and_then(|f| f.tokens);
        let prompt = l
            .prompt_tokens
            .or(counts.as_ref().map(|c| c.prompt).filter(|&n| n > 0))
            .or(l.prompt_estimate);
        let output = l
            .completion_tokens
            .map(|c| c.div_ceil(n))
            .or(counts
                .as_ref()
                .map(|c| c.decode.div_ceil(sequences))
                .filter(|&n| n > 0))
            .or(l.max_tokens);
        let (Some(prompt), Some(output)) = (prompt, output) else {
            skipped += 1;
            continue;
        };
        if l.request_id.is_empty() || prompt == 0 {
            skipped += 1;
            continue;
        }
        let bytes_per_token = l
            .prompt_bytes
            .map(|b| b as f64 / prompt as f64)
            .filter(|r| r.is_finite() && *r > 0.0)
            .unwrap_or(DEFAULT_BYTES_PER_TOKEN);
        parsed.push(Parsed {
            bytes_per_token,
            start_ms: l.start_ms,
            tenant: l.tenant,
            session: l.session,
            prompt: u32::try_from(prompt).unwrap_or(u32::MAX),
            output: u32::try_from(output).unwrap_or(u32::MAX).max(1),
            marks: l.prefix,
            features: (!features.is_plain()).then_some(features),
            // A name to report and check under, not text to keep: short ones only.
            class: l
                .class
                .filter(|c| !c.is_empty() && c.len() <= MAX_CLASS_BYTES),
        });
    }
    let Some(first) = parsed.iter().map(|p| p.start_ms).min() else {
        return Err("no gateway trace line with a prompt and answer length".into());
    };
    parsed.sort_by_key(|p| p.start_ms);
    let groups = Groups::of(&parsed);
    let entries = parsed
        .iter()
        .map(|p| TraceEntry {
            at: Duration::from_millis(u64::try_from(p.start_ms - first).unwrap_or(0)),
            tenant: (!p.tenant.is_empty()).then(|| p.tenant.clone()),
            session: p.session.clone(),
            prompt: TracePrompt::Tokens(p.prompt),
            output_tokens: p.output,
            group: groups.of_request(p),
            features: p.features,
            class: Some(
                p.class
                    .clone()
                    .unwrap_or_else(|| super::model::REPLAY_CLASS.to_owned()),
            ),
        })
        .collect();
    Ok((entries, skipped))
}

/// Prefix groups: each mark (depth, hash) shared by two or more requests.
struct Groups {
    /// How many requests carry each mark.
    counts: HashMap<String, u32>,
    /// Group ids by mark, in first-seen order (ids are stable for a given trace).
    ids: HashMap<String, usize>,
}

impl Groups {
    fn of(parsed: &[Parsed]) -> Self {
        let mut counts: HashMap<String, u32> = HashMap::new();
        for p in parsed {
            for m in &p.marks {
                *counts.entry(m.clone()).or_default() += 1;
            }
        }
        let mut ids = HashMap::new();
        for p in parsed {
            if let Some((_, mark)) = deepest_shared(&p.marks, &counts) {
                let next = ids.len();
                ids.entry(mark.clone()).or_insert(next);
            }
        }
        Self { counts, ids }
    }

    /// The request's group: its deepest shared mark and the tokens of that many blocks at the
    /// request's own bytes per token (never more than its prompt).
    fn of_request(&self, p: &Parsed) -> Option<TraceGroup> {
        let (depth, mark) = deepest_shared(&p.marks, &self.counts)?;
        let bytes = f64::from(1u32 << depth) * BLOCK_BYTES;
        let tokens = (bytes / p.bytes_per_token).floor() as u32;
        Some(TraceGroup {
            id: *self.ids.get(mark)?,
            tokens: tokens.min(p.prompt),
        })
    }
}

/// The deepest of `marks` (index = log2 of its blocks) that another request shares.
fn deepest_shared<'a>(
    marks: &'a [String],
    counts: &HashMap<String, u32>,
) -> Option<(u32, &'a String)> {
    marks
        .iter()
        .enumerate()
        .rev()
        .find(|(_, m)| counts.get(*m).is_some_and(|&n| n >= 2))
        .map(|(i, m)| (u32::try_from(i).unwrap_or(0), m))
}

/// The workload replaying the gateway trace at `path`, its time scaled by `speed` (2: twice as
/// fast).
pub fn replay(path: &Path, speed: f64) -> Result<Workload, String> {
    if !(speed.is_finite() && speed > 0.0) {
        return Err(format!("--speed must be a number > 0, got {speed}"));
    }
    let mut trace = super::trace::read(path)?;
    if speed != 1.0 {
        for e in &mut trace.entries {
            e.at = Duration::from_secs_f64(e.at.as_secs_f64() / speed);
        }
    }
    let duration = trace
        .entries
        .last()
        .map_or(Duration::from_secs(1), |e| e.at + Duration::from_millis(1));
    Ok(Workload {
        // A file name part: `bench` names its default report after it.
        name: format!(
            "replay-{}",
            path.file_stem().and_then(|s| s.to_str()).unwrap_or("trace")
        ),
        seed: 0,
        duration,
        arrival: Arrival::Trace(trace),
        slo: Slo::default(),
        mix: None,
        requests: None,
    })
}

/// The workload of a run: the trace `replay` at `speed` when given, else the workload `name`.
pub fn load_or_replay(name: &str, replay: Option<&Path>, speed: f64) -> Result<Workload, String> {
    match replay {
        Some(path) => self::replay(path, speed),
        None => super::load(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str, ms: i64, prompt: u64, marks: &[&str]) -> String {
        serde_json::json!({
            "request_id": id, "start_ms": ms, "tenant": "acme", "status": 200,
            "prompt_tokens": prompt, "completion_tokens": 7, "max_tokens": 64,
            "prefix": marks,
        })
        .to_string()
    }

    #[test]
    fn groups_are_the_deepest_marks_two_requests_share() {
        let texts = [
            line("a", 1_000, 900, &["h1", "h2a", "h4a"]),
            line("b", 1_500, 900, &["h1", "h2a", "h4b"]),
            line("c", 2_000, 900, &["h1", "h2c"]),
            line("d", 2_500, 300, &["x1"]),
            "not json".to_owned(),
        ];
        let lines: Vec<(usize, &str)> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| (i + 1, t.as_str()))
            .collect();
        let (e, skipped) = entries(&lines).unwrap();
        assert_eq!((e.len(), skipped), (4, 1));
        assert_eq!(e[0].at, Duration::ZERO);
        assert_eq!(e[3].at, Duration::from_millis(1_500));
        assert_eq!(e[0].tenant.as_deref(), Some("acme"));
        assert_eq!(e[0].output_tokens, 7);
        // a and b share two blocks; c shares one with them; d shares nothing.
        let g: Vec<Option<(usize, u32)>> = e
            .iter()
            .map(|x| x.group.map(|g| (g.id, g.tokens)))
            .collect();
        assert_eq!(g[0], g[1]);
        // No bytes in these lines: four bytes a token, 64 tokens a block.
        assert_eq!(g[0].map(|g| g.1), Some(128));
        assert_eq!(g[2].map(|g| g.1), Some(64));
        assert_ne!(g[2].map(|g| g.0), g[0].map(|g| g.0));
        assert_eq!(g[3], None);
    }

    #[test]
    fn a_refused_request_is_sent_with_the_gateways_estimate_and_its_bound() {
        let text = serde_json::json!({
            "request_id": "r", "start_ms": 5, "tenant": "t", "status": 429,
            "prompt_estimate": 120, "max_tokens": 32,
        })
        .to_string();
        let (e, _) = entries(&[(1, text.as_str())]).unwrap();
        assert_eq!(e[0].prompt, TracePrompt::Tokens(120));
        assert_eq!(e[0].output_tokens, 32);
        assert!(entries(&[(1, "{}")]).is_err());
    }

    #[test]
    fn features_come_from_the_line_else_the_record_and_lengths_are_per_choice() {
        let gateway = serde_json::json!({
            "request_id": "g", "start_ms": 0, "prompt_tokens": 50, "completion_tokens": 16,
            "features": {"n": 2, "logprobs": true, "top_logprobs": 2, "tools": 3,
                         "response_format": "json_schema", "images": 1},
            "flight": {"v": 4, "features": {"n": 2, "best_of": 2, "tools": true}},
        })
        .to_string();
        let engine_only = serde_json::json!({
            "request_id": "e", "start_ms": 1, "max_tokens": 64,
            "flight": {"v": 4, "tokens": {"prompt": 40, "decode": 30},
                       "features": {"prompts": 1, "n": 1, "best_of": 3, "logprobs": true,
                                    "response_format": true, "images": 2}},
        })
        .to_string();
        let plain = serde_json::json!({
            "request_id": "p", "start_ms": 2, "prompt_tokens": 9, "completion_tokens": 4,
            "features": {"n": 1, "logprobs": false, "top_logprobs": 0, "tools": 0, "images": 0},
        })
        .to_string();
        let lines = [
            (1, gateway.as_str()),
            (2, engine_only.as_str()),
            (3, plain.as_str()),
        ];
        let (e, _) = entries(&lines).unwrap();
        let g = e[0].features.expect("the gateway's features");
        assert_eq!((g.n, g.top_logprobs, g.tools, g.images), (2, 2, 3, 1));
        assert_eq!(g.response_format, Some(ResponseFormat::JsonSchema));
        assert_eq!(e[0].output_tokens, 8, "16 tokens over two choices");
        let f = e[1].features.expect("the record's features");
        assert!(f.logprobs && f.tools == 0 && f.images == 2);
        assert_eq!(f.response_format, Some(ResponseFormat::JsonObject));
        assert_eq!(e[1].output_tokens, 10, "30 tokens over three sequences");
        assert_eq!(e[2].features, None, "a plain request stays plain");
        assert_eq!(e[2].output_tokens, 4);
    }

    #[test]
    fn a_block_holds_the_tokens_of_the_lines_own_bytes_per_token() {
        let texts: Vec<String> = ["a", "b"]
            .iter()
            .map(|id| {
                serde_json::json!({
                    "request_id": id, "start_ms": 0, "prompt_tokens": 1000,
                    "prompt_bytes": 8000, "completion_tokens": 1, "prefix": ["m1", "m2"],
                })
                .to_string()
            })
            .collect();
        let lines: Vec<(usize, &str)> = texts.iter().map(|t| (1, t.as_str())).collect();
        let (e, _) = entries(&lines).unwrap();
        // Two blocks of 256 bytes at 8 bytes a token.
        assert_eq!(e[0].group.map(|g| g.tokens), Some(64));
    }
}
