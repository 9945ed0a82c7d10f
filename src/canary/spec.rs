//! `models:` in `policies/routing.yaml`: per model, a canary split between a stable and a canary
//! version, the sticky key and the automated analysis. The `Raw*` types are the section as
//! written (the config parses routing.yaml once and hands the section over); `check_models`
//! checks every entry in one pass and yields the validated `CanarySpec`s, each version's `model`
//! checked against the config's models.

use crate::diagnostics::{Problem, YamlPath};
use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Analysis window of a model that gives none.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
/// Fewest requests per version in a window before any decision, when not given.
pub const DEFAULT_MIN_SAMPLES: u64 = 50;
/// Largest tolerated excess of the canary's error rate over stable's, when not given (2 points).
pub const DEFAULT_MAX_ERROR_RATE_DELTA: f64 = 0.02;
/// Largest tolerated canary p99 / stable p99 (TTFT and inter-token), when not given.
pub const DEFAULT_MAX_P99_RATIO: f64 = 1.5;
/// Canary weights of the promotion schedule, in percent, when not given.
pub const DEFAULT_SCHEDULE: [u32; 5] = [1, 5, 25, 50, 100];

/// One model's canary entry as written (routing.yaml `models:` maps a model name, as clients ask
/// for it, to one of these).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCanary {
    /// Exactly two versions: the stable one and the canary.
    pub versions: Vec<RawVersion>,
    /// Name of the stable version; default the first listed.
    pub stable: Option<String>,
    /// What keeps a client on one version; default `session`.
    #[serde(default)]
    pub sticky: StickyKey,
    /// Automated analysis; every field has a default.
    #[serde(default)]
    pub analysis: RawAnalysis,
}

/// One version as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVersion {
    /// Version name, reported in `x-infergate-version` and metrics; unique within the model.
    pub name: String,
    /// The model of the main config (with its pool) that serves this version.
    pub model: String,
    /// Share of sticky keys sent to this version, in percent; the weights sum to 100.
    pub weight: u32,
}

/// The analysis settings as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAnalysis {
    /// Length of one analysis window, e.g. `60s`; > 0; default 60s.
    pub window: Option<String>,
    /// Fewest requests of each version in a window before any decision; ≥ 1; default 50.
    pub min_samples: Option<u64>,
    /// Largest canary error rate above stable's, as a fraction (0.02 = 2 points); in 0..=1;
    /// default 0.02.
    pub max_error_rate_delta: Option<f64>,
    /// Largest canary TTFT p99 as a multiple of stable's; ≥ 1; default 1.5.
    pub max_ttft_p99_ratio: Option<f64>,
    /// Largest canary inter-token p99 as a multiple of stable's; ≥ 1; default 1.5.
    pub max_itl_p99_ratio: Option<f64>,
    /// Canary weights in percent, one step per healthy window; strictly increasing within
    /// 0..=100; default [1, 5, 25, 50, 100].
    pub schedule: Option<Vec<u32>>,
}

/// The key that keeps a client on one version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StickyKey {
    /// The `x-session-id` header, else the body's `user`, else the request itself.
    #[default]
    Session,
    /// The body's `user`, else the request itself.
    User,
    /// The tenant.
    Tenant,
}

/// One model's validated canary split.
#[derive(Debug, Clone, PartialEq)]
pub struct CanarySpec {
    /// The two versions in file order; their weights sum to 100.
    pub versions: Vec<VersionSpec>,
    /// Index of the stable version in `versions`; the other one is the canary.
    pub stable: usize,
    /// What keeps a client on one version.
    pub sticky: StickyKey,
    /// Automated analysis settings.
    pub analysis: AnalysisSpec,
}

/// One validated version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionSpec {
    /// Unique within the model.
    pub name: String,
    /// The config model that serves it.
    pub model: String,
    /// Initial weight in percent.
    pub weight: u32,
}

/// Validated analysis settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AnalysisSpec {
    /// Length of one analysis window.
    pub window: Duration,
    /// Fewest requests of each version (and latency samples per metric) before a decision.
    pub min_samples: u64,
    /// Largest canary error rate above stable's, as a fraction.
    pub max_error_rate_delta: f64,
    /// Largest canary TTFT p99 as a multiple of stable's.
    pub max_ttft_p99_ratio: f64,
    /// Largest canary inter-token p99 as a multiple of stable's.
    pub max_itl_p99_ratio: f64,
    /// Canary weights in percent, strictly increasing, each ≤ 100; never empty.
    pub schedule: Vec<u32>,
}

impl CanarySpec {
    /// Index of the canary version (the one that is not stable).
    pub fn canary(&self) -> usize {
        usize::from(self.stable == 0)
    }

    /// The initial weights, as (version name, percent) in version order.
    pub fn weights(&self) -> Vec<(String, u32)> {
        self.versions
            .iter()
            .map(|v| (v.name.clone(), v.weight))
            .collect()
    }
}

/// Reads only the `models:` key of routing.yaml text: each model's canary split, every problem
/// as a message (model names unchecked). For unit tests; the config hands over the parsed section.
#[cfg(test)]
pub fn parse_models(text: &str) -> Result<BTreeMap<String, CanarySpec>, Vec<String>> {
    #[derive(Deserialize)]
    struct ModelsOnly {
        models: Option<BTreeMap<String, RawCanary>>,
    }
    let blank = text
        .lines()
        .map(str::trim)
        .all(|l| l.is_empty() || l.starts_with('#') || l == "---");
    if blank {
        return Ok(BTreeMap::new());
    }
    let models = match serde_saphyr::from_str::<ModelsOnly>(text) {
        Ok(file) => file.models.unwrap_or_default(),
        Err(e) => return Err(vec![e.to_string()]),
    };
    let (specs, problems) = check_models(&models, &|_| true);
    crate::diagnostics::into_messages(specs, problems)
}

/// Checks routing.yaml's parsed `models:` section, model names against `known` (the config's
/// models): the valid splits and every problem, each with its place in the file.
pub fn check_models(
    models: &BTreeMap<String, RawCanary>,
    known: &dyn Fn(&str) -> bool,
) -> (BTreeMap<String, CanarySpec>, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut specs = BTreeMap::new();
    let root = YamlPath::root().key("models");
    for (model, entry) in models {
        match super::validate::check(model, &root.key(model), entry, known) {
            Ok(spec) => {
                specs.insert(model.clone(), spec);
            }
            Err(found) => problems.extend(found),
        }
    }
    (specs, problems)
}
