//! Validation of one model's canary entry: every error is reported (each naming the model and
//! the field) before a `CanarySpec` is built.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::diagnostics::{Problem, YamlPath};

use super::spec::{
    AnalysisSpec, CanarySpec, DEFAULT_MAX_ERROR_RATE_DELTA, DEFAULT_MAX_P99_RATIO,
    DEFAULT_MIN_SAMPLES, DEFAULT_SCHEDULE, DEFAULT_WINDOW, RawAnalysis, RawCanary, VersionSpec,
};

/// Checks one model's entry, written at `path`; model names are checked with `known` (the
/// config's models). `Err` lists every problem found, each with its place.
pub fn check(
    model: &str,
    path: &YamlPath,
    raw: &RawCanary,
    known: &dyn Fn(&str) -> bool,
) -> Result<CanarySpec, Vec<Problem>> {
    let at = format!("model `{model}`");
    let mut errors = Vec::new();
    let mut push = |path: YamlPath, message: String| errors.push(Problem::at(&path, message));
    if !known(model) {
        push(
            path.clone(),
            format!("models: `{model}` is not a model of the config"),
        );
    }
    if raw.versions.len() != 2 {
        push(
            path.key("versions"),
            format!(
                "{at}: versions has {} entries; a canary has exactly two (stable and canary)",
                raw.versions.len()
            ),
        );
    }
    let mut names = BTreeSet::new();
    for (i, v) in raw.versions.iter().enumerate() {
        let here = format!("{at} version {}", i + 1);
        let item = path.key("versions").index(i);
        if v.name.trim().is_empty() {
            push(item.key("name"), format!("{here}: name is empty"));
        } else if !names.insert(v.name.as_str()) {
            push(
                item.key("name"),
                format!("{here}: name `{}` is used twice", v.name),
            );
        }
        if v.model.trim().is_empty() {
            push(
                item.key("model"),
                format!("{here}: model is empty; name the config model that serves it"),
            );
        } else if !known(&v.model) {
            push(
                item.key("model"),
                format!(
                    "model `{model}` version `{}`: `{}` is not a model of the config",
                    v.name, v.model
                ),
            );
        }
    }
    let sum: u64 = raw.versions.iter().map(|v| u64::from(v.weight)).sum();
    if sum != 100 {
        push(
            path.key("versions"),
            format!("{at}: weights sum to {sum}; they must sum to 100"),
        );
    }
    let stable = match &raw.stable {
        None => 0,
        Some(name) => match raw.versions.iter().position(|v| &v.name == name) {
            Some(i) => i,
            None => {
                push(
                    path.key("stable"),
                    format!("{at}: stable `{name}` is not one of the versions"),
                );
                0
            }
        },
    };
    let analysis = analysis(&at, &path.key("analysis"), &raw.analysis, &mut errors);
    if !errors.is_empty() {
        return Err(errors);
    }
    let versions = raw
        .versions
        .iter()
        .map(|v| VersionSpec {
            name: v.name.clone(),
            model: v.model.clone(),
            weight: v.weight,
        })
        .collect();
    Ok(CanarySpec {
        versions,
        stable,
        sticky: raw.sticky,
        analysis,
    })
}

/// The analysis settings (written at `path`) with defaults filled in; problems go to `errors`.
fn analysis(
    at: &str,
    path: &YamlPath,
    raw: &RawAnalysis,
    errors: &mut Vec<Problem>,
) -> AnalysisSpec {
    let at = format!("{at} analysis");
    let mut push = |key: &str, message: String| errors.push(Problem::at(&path.key(key), message));
    let window = match raw.window.as_deref().map(crate::duration::parse) {
        None => DEFAULT_WINDOW,
        Some(Ok(w)) if !w.is_zero() => w,
        Some(Ok(_)) => {
            push("window", format!("{at}: window must be above 0"));
            Duration::ZERO
        }
        Some(Err(e)) => {
            push("window", format!("{at}: window: {e}"));
            Duration::ZERO
        }
    };
    let min_samples = raw.min_samples.unwrap_or(DEFAULT_MIN_SAMPLES);
    if min_samples == 0 {
        push(
            "min_samples",
            format!("{at}: min_samples must be at least 1"),
        );
    }
    let delta = raw
        .max_error_rate_delta
        .unwrap_or(DEFAULT_MAX_ERROR_RATE_DELTA);
    if !(0.0..=1.0).contains(&delta) {
        push(
            "max_error_rate_delta",
            format!(
                "{at}: max_error_rate_delta {delta} is not a fraction in 0..=1 (0.02 = 2 points)"
            ),
        );
    }
    let mut ratio = |key: &str, given: Option<f64>| {
        let value = given.unwrap_or(DEFAULT_MAX_P99_RATIO);
        if !(value.is_finite() && value >= 1.0) {
            push(key, format!("{at}: {key} {value} must be a number ≥ 1"));
        }
        value
    };
    let ttft = ratio("max_ttft_p99_ratio", raw.max_ttft_p99_ratio);
    let itl = ratio("max_itl_p99_ratio", raw.max_itl_p99_ratio);
    let schedule = raw
        .schedule
        .clone()
        .unwrap_or_else(|| DEFAULT_SCHEDULE.to_vec());
    if schedule.is_empty() {
        push(
            "schedule",
            format!("{at}: schedule is empty; give at least one step"),
        );
    }
    if let Some(&over) = schedule.iter().find(|&&s| s > 100) {
        push(
            "schedule",
            format!("{at}: schedule step {over} is above 100"),
        );
    }
    if schedule.windows(2).any(|w| w[0] >= w[1]) {
        push(
            "schedule",
            format!("{at}: schedule {schedule:?} must be strictly increasing"),
        );
    }
    AnalysisSpec {
        window,
        min_samples,
        max_error_rate_delta: delta,
        max_ttft_p99_ratio: ttft,
        max_itl_p99_ratio: itl,
        schedule,
    }
}
