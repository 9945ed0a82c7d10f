//! Validation of one model's canary entry: every error is reported (each naming the model and
//! the field) before a `CanarySpec` is built.

use std::collections::BTreeSet;
use std::time::Duration;

use super::spec::{
    AnalysisSpec, CanarySpec, DEFAULT_MAX_ERROR_RATE_DELTA, DEFAULT_MAX_P99_RATIO,
    DEFAULT_MIN_SAMPLES, DEFAULT_SCHEDULE, DEFAULT_WINDOW, RawAnalysis, RawCanary, VersionSpec,
};

/// Checks one model's entry; `Err` lists every problem found.
pub fn check(model: &str, raw: &RawCanary) -> Result<CanarySpec, Vec<String>> {
    let at = format!("model `{model}`");
    let mut errors = Vec::new();
    if raw.versions.len() != 2 {
        errors.push(format!(
            "{at}: versions has {} entries; a canary has exactly two (stable and canary)",
            raw.versions.len()
        ));
    }
    let mut names = BTreeSet::new();
    for (i, v) in raw.versions.iter().enumerate() {
        let here = format!("{at} version {}", i + 1);
        if v.name.trim().is_empty() {
            errors.push(format!("{here}: name is empty"));
        } else if !names.insert(v.name.as_str()) {
            errors.push(format!("{here}: name `{}` is used twice", v.name));
        }
        if v.model.trim().is_empty() {
            errors.push(format!(
                "{here}: model is empty; name the config model that serves it"
            ));
        }
    }
    let sum: u64 = raw.versions.iter().map(|v| u64::from(v.weight)).sum();
    if sum != 100 {
        errors.push(format!("{at}: weights sum to {sum}; they must sum to 100"));
    }
    let stable = match &raw.stable {
        None => 0,
        Some(name) => match raw.versions.iter().position(|v| &v.name == name) {
            Some(i) => i,
            None => {
                errors.push(format!("{at}: stable `{name}` is not one of the versions"));
                0
            }
        },
    };
    let analysis = analysis(&at, &raw.analysis, &mut errors);
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

/// The analysis settings with defaults filled in; problems go to `errors`.
fn analysis(at: &str, raw: &RawAnalysis, errors: &mut Vec<String>) -> AnalysisSpec {
    let at = format!("{at} analysis");
    let window = match raw.window.as_deref().map(crate::duration::parse) {
        None => DEFAULT_WINDOW,
        Some(Ok(w)) if !w.is_zero() => w,
        Some(Ok(_)) => {
            errors.push(format!("{at}: window must be above 0"));
            Duration::ZERO
        }
        Some(Err(e)) => {
            errors.push(format!("{at}: window: {e}"));
            Duration::ZERO
        }
    };
    let min_samples = raw.min_samples.unwrap_or(DEFAULT_MIN_SAMPLES);
    if min_samples == 0 {
        errors.push(format!("{at}: min_samples must be at least 1"));
    }
    let delta = raw
        .max_error_rate_delta
        .unwrap_or(DEFAULT_MAX_ERROR_RATE_DELTA);
    if !(0.0..=1.0).contains(&delta) {
        errors.push(format!(
            "{at}: max_error_rate_delta {delta} is not a fraction in 0..=1 (0.02 = 2 points)"
        ));
    }
    let ttft = ratio(&at, "max_ttft_p99_ratio", raw.max_ttft_p99_ratio, errors);
    let itl = ratio(&at, "max_itl_p99_ratio", raw.max_itl_p99_ratio, errors);
    let schedule = raw
        .schedule
        .clone()
        .unwrap_or_else(|| DEFAULT_SCHEDULE.to_vec());
    if schedule.is_empty() {
        errors.push(format!("{at}: schedule is empty; give at least one step"));
    }
    if let Some(&over) = schedule.iter().find(|&&s| s > 100) {
        errors.push(format!("{at}: schedule step {over} is above 100"));
    }
    if schedule.windows(2).any(|w| w[0] >= w[1]) {
        errors.push(format!(
            "{at}: schedule {schedule:?} must be strictly increasing"
        ));
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

/// A p99 ratio with its default; below 1 (or not a number) is an error.
fn ratio(at: &str, key: &str, given: Option<f64>, errors: &mut Vec<String>) -> f64 {
    let value = given.unwrap_or(DEFAULT_MAX_P99_RATIO);
    if !(value.is_finite() && value >= 1.0) {
        errors.push(format!("{at}: {key} {value} must be a number ≥ 1"));
    }
    value
}
