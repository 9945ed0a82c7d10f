//! The workload file schema as plain serde structs, exactly as written in YAML. Sections keep
//! their place in the file (`Spanned`) so validation can name the line of a bad value.

use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

/// `config/workloads/NAME.yaml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorkload {
    pub name: Option<String>,
    pub seed: Option<u64>,
    pub duration: Option<Spanned<String>>,
    pub requests: Option<u64>,
    pub arrival: Option<Spanned<RawArrival>>,
    pub prompt_tokens: Option<Spanned<RawDist>>,
    pub output_tokens: Option<Spanned<RawDist>>,
    pub correlation: Option<Spanned<f64>>,
    pub classes: Option<Spanned<Vec<RawClass>>>,
    pub prefix_groups: Option<Spanned<RawGroups>>,
    pub sessions: Option<Spanned<RawSessions>>,
    pub tenants: Option<Spanned<Vec<RawTenant>>>,
    pub slo: Option<Spanned<RawSlo>>,
    pub trace: Option<Spanned<String>>,
}

/// `arrival:` exactly one of its keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawArrival {
    pub poisson: Option<RawPoisson>,
    pub burst: Option<RawBurst>,
    pub stages: Option<Vec<RawStage>>,
    pub closed: Option<RawClosed>,
}

/// `arrival.poisson:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPoisson {
    pub rate: f64,
}

/// `arrival.burst:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBurst {
    pub rate: f64,
    pub factor: f64,
    pub start: String,
    pub length: String,
}

/// One of `arrival.stages:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStage {
    pub rate: f64,
    pub duration: String,
}

/// `arrival.closed:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClosed {
    pub concurrency: usize,
}

/// A length distribution: `dist` names the kind, the other keys are its parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDist {
    pub dist: String,
    pub value: Option<f64>,
    pub mean: Option<f64>,
    pub sigma: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub parts: Option<Vec<RawDist>>,
    /// Only inside a mixture's `parts`.
    pub weight: Option<f64>,
}

/// One of `classes:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClass {
    pub name: Option<String>,
    pub weight: f64,
    pub prompt_tokens: RawDist,
    pub output_tokens: RawDist,
    pub correlation: Option<f64>,
}

/// `prefix_groups:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGroups {
    pub count: usize,
    pub tokens: u32,
    pub zipf: Option<f64>,
    pub share: Option<f64>,
}

/// `sessions:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSessions {
    pub count: usize,
    pub turns: RawDist,
    pub first_turn: Option<RawDist>,
}

/// One of `tenants:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTenant {
    pub name: String,
    pub weight: f64,
}

/// `slo:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSlo {
    pub ttft: Option<String>,
    pub itl: Option<String>,
}

/// One JSONL trace line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTraceLine {
    pub timestamp: f64,
    pub tenant: Option<String>,
    pub session: Option<String>,
    pub prompt_tokens: Option<u32>,
    pub prompt: Option<String>,
    pub output_tokens: u32,
}

/// Durations in workload files (see [`infergate::duration::parse`]).
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    infergate::duration::parse(text)
}
