//! Validation of `policies/degradation.yaml`: one pass over a pool's entry that reports every
//! error (each naming the pool, level and field) and only then yields a `DegradationPolicy`.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use super::policy::{
    Action, DEFAULT_MIN_DWELL, DEFAULT_TICK, DEFAULT_WINDOW, DegradationPolicy, Level,
    RawDegradationFile, RawLevel, RawPoolPolicy, RawThresholds, Thresholds,
};

/// The signal keys, in the order `Thresholds::signals` lists them.
const SIGNALS: [&str; 4] = ["queue_depth", "queue_wait_p95", "kv_usage", "ttft_p95"];

/// Parses and validates the whole file: pool name → policy, or every error found.
/// Pool and tier names are not checked here: that needs the main config and tenants.yaml.
pub fn parse(text: &str) -> Result<BTreeMap<String, DegradationPolicy>, Vec<String>> {
    let raw: RawDegradationFile = serde_saphyr::from_str(text).map_err(|e| vec![e.to_string()])?;
    let mut errors = Vec::new();
    let mut pools = BTreeMap::new();
    for (pool, entry) in &raw.pools {
        match DegradationPolicy::from_raw(pool, entry) {
            Ok(policy) => {
                pools.insert(pool.clone(), policy);
            }
            Err(found) => errors.extend(found),
        }
    }
    if errors.is_empty() {
        Ok(pools)
    } else {
        Err(errors)
    }
}

impl DegradationPolicy {
    /// Checks one pool's entry; every error is reported, each prefixed with where it is.
    pub fn from_raw(pool: &str, raw: &RawPoolPolicy) -> Result<Self, Vec<String>> {
        let mut errors = Vec::new();
        let at = format!("pool `{pool}`");
        let window = duration(
            &at,
            "window",
            raw.window.as_ref(),
            DEFAULT_WINDOW,
            &mut errors,
        );
        let tick = duration(&at, "tick", raw.tick.as_ref(), DEFAULT_TICK, &mut errors);
        if window.is_zero() || tick.is_zero() {
            errors.push(format!("{at}: window and tick must be above 0"));
        } else if tick > window {
            errors.push(format!(
                "{at}: tick {tick:?} is longer than window {window:?}; the tick must be ≤ the window"
            ));
        }
        if raw.levels.is_empty() {
            errors.push(format!("{at}: levels is empty: give at least one level"));
        }
        let levels: Vec<Level> = raw
            .levels
            .iter()
            .enumerate()
            .map(|(i, l)| level(&format!("{at} level {}", i + 1), l, &mut errors))
            .collect();
        for (i, l) in levels.iter().enumerate() {
            if levels[..i].iter().any(|earlier| earlier.name == l.name) {
                errors.push(format!(
                    "{at} level {}: name `{}` is used twice",
                    i + 1,
                    l.name
                ));
            }
        }
        if errors.is_empty() {
            Ok(DegradationPolicy {
                window,
                tick,
                levels,
            })
        } else {
            Err(errors)
        }
    }
}

/// One level; errors are pushed and the level is returned anyway.
fn level(at: &str, raw: &RawLevel, errors: &mut Vec<String>) -> Level {
    let at = format!("{at} `{}`", raw.name);
    if raw.name.trim().is_empty() {
        errors.push(format!("{at}: name is empty"));
    }
    let enter = thresholds(&at, "enter", &raw.enter, errors);
    let exit = thresholds(&at, "exit", &raw.exit, errors);
    let (given_enter, given_exit) = (given(&raw.enter), given(&raw.exit));
    if !given_enter.contains(&true) {
        errors.push(format!(
            "{at}: enter gives no threshold: set at least one of {}",
            SIGNALS.join(", ")
        ));
    }
    for ((signal, on_enter), on_exit) in SIGNALS.iter().zip(given_enter).zip(given_exit) {
        if on_enter && !on_exit {
            errors.push(format!(
                "{at}: exit gives no {signal} threshold; every entry signal needs a lower exit one"
            ));
        } else if on_exit && !on_enter {
            errors.push(format!(
                "{at}: exit.{signal} has no matching enter.{signal}"
            ));
        }
    }
    not_above(
        &at,
        "queue_depth",
        enter.queue_depth,
        exit.queue_depth,
        errors,
    );
    not_above(
        &at,
        "queue_wait_p95",
        enter.queue_wait_p95,
        exit.queue_wait_p95,
        errors,
    );
    not_above(&at, "kv_usage", enter.kv_usage, exit.kv_usage, errors);
    not_above(&at, "ttft_p95", enter.ttft_p95, exit.ttft_p95, errors);
    let min_dwell = duration(
        &at,
        "min_dwell",
        raw.min_dwell.as_ref(),
        DEFAULT_MIN_DWELL,
        errors,
    );
    for (i, a) in raw.actions.iter().enumerate() {
        action(&format!("{at} action {} ({})", i + 1, a.label()), a, errors);
    }
    Level {
        name: raw.name.clone(),
        enter,
        exit,
        min_dwell,
        actions: raw.actions.clone(),
    }
}

/// Which signals a raw set gives, in `SIGNALS` order.
fn given(raw: &RawThresholds) -> [bool; 4] {
    [
        raw.queue_depth.is_some(),
        raw.queue_wait_p95.is_some(),
        raw.kv_usage.is_some(),
        raw.ttft_p95.is_some(),
    ]
}

/// One `enter:` or `exit:` set; unparsable values are reported and left out.
fn thresholds(at: &str, key: &str, raw: &RawThresholds, errors: &mut Vec<String>) -> Thresholds {
    let mut span = |field: &str, text: Option<&String>| {
        text.and_then(|t| match parse_duration(t) {
            Ok(d) => Some(d),
            Err(e) => {
                errors.push(format!("{at}: {key}.{field}: {e}"));
                None
            }
        })
    };
    let queue_wait_p95 = span("queue_wait_p95", raw.queue_wait_p95.as_ref());
    let ttft_p95 = span("ttft_p95", raw.ttft_p95.as_ref());
    let kv_usage = raw.kv_usage.filter(|kv| {
        let ok = (0.0..=1.0).contains(kv);
        if !ok {
            errors.push(format!("{at}: {key}.kv_usage {kv} is outside 0..=1"));
        }
        ok
    });
    Thresholds {
        queue_depth: raw.queue_depth,
        queue_wait_p95,
        kv_usage,
        ttft_p95,
    }
}

/// Reports an exit threshold above its entry threshold.
fn not_above<T>(at: &str, signal: &str, enter: Option<T>, exit: Option<T>, errors: &mut Vec<String>)
where
    T: PartialOrd + Debug,
{
    if let (Some(enter), Some(exit)) = (enter, exit)
        && exit > enter
    {
        errors.push(format!(
            "{at}: exit.{signal} {exit:?} is above enter.{signal} {enter:?}; exit thresholds must \
             be ≤ entry thresholds"
        ));
    }
}

/// Checks one action's values.
fn action(at: &str, action: &Action, errors: &mut Vec<String>) {
    let tiers = action.tiers();
    if tiers.is_empty() {
        errors.push(format!(
            "{at}: tiers is empty: list the tiers it applies to"
        ));
    }
    if tiers.iter().any(|t| t.trim().is_empty()) {
        errors.push(format!("{at}: a tier name is empty"));
    }
    match action {
        Action::CapMaxTokens { max_tokens: 0, .. } => {
            errors.push(format!("{at}: max_tokens must be ≥ 1"));
        }
        Action::RefuseLongPrompts {
            max_prompt_tokens: 0,
            ..
        } => errors.push(format!("{at}: max_prompt_tokens must be ≥ 1")),
        Action::Fallback { model, .. } if model.trim().is_empty() => {
            errors.push(format!("{at}: model is empty"));
        }
        _ => {}
    }
}

/// A duration field with its default; a bad value is reported and replaced by the default.
fn duration(
    at: &str,
    key: &str,
    text: Option<&String>,
    default: Duration,
    errors: &mut Vec<String>,
) -> Duration {
    match text.map(|t| parse_duration(t)) {
        None => default,
        Some(Ok(d)) => d,
        Some(Err(e)) => {
            errors.push(format!("{at}: {key}: {e}"));
            default
        }
    }
}

/// Durations in degradation.yaml (see [`crate::duration::parse`]).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    crate::duration::parse(text)
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
