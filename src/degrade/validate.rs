//! Validation of `policies/degradation.yaml`: one pass over a pool's entry that reports every
//! error (each naming the pool, level and field) and only then yields a `DegradationPolicy`.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use crate::diagnostics::{Problem, YamlPath};

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
    let (pools, problems) = check(&raw);
    crate::diagnostics::into_messages(pools, problems)
}

/// Validates a parsed file: every pool's policy (with bad values replaced by defaults, so the
/// caller can still cross-check names) and every problem, each with its place in the file.
pub fn check(raw: &RawDegradationFile) -> (BTreeMap<String, DegradationPolicy>, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut pools = BTreeMap::new();
    let root = YamlPath::root().key("pools");
    for (pool, entry) in &raw.pools {
        let (policy, found) = DegradationPolicy::checked(pool, &root.key(pool), entry);
        problems.extend(found);
        pools.insert(pool.clone(), policy);
    }
    (pools, problems)
}

impl DegradationPolicy {
    /// Checks one pool's entry; every error is reported, each prefixed with where it is.
    pub fn from_raw(pool: &str, raw: &RawPoolPolicy) -> Result<Self, Vec<String>> {
        let (policy, problems) = Self::checked(pool, &YamlPath::root(), raw);
        crate::diagnostics::into_messages(policy, problems)
    }

    /// Checks one pool's entry, written at `path`: the policy (bad values replaced by their
    /// defaults) and every problem.
    fn checked(pool: &str, path: &YamlPath, raw: &RawPoolPolicy) -> (Self, Vec<Problem>) {
        let mut errors = Vec::new();
        let at = Place {
            text: format!("pool `{pool}`"),
            path: path.clone(),
        };
        let window = duration(
            &at,
            "window",
            raw.window.as_ref(),
            DEFAULT_WINDOW,
            &mut errors,
        );
        let tick = duration(&at, "tick", raw.tick.as_ref(), DEFAULT_TICK, &mut errors);
        if window.is_zero() || tick.is_zero() {
            at.push(
                "tick",
                format!("{}: window and tick must be above 0", at.text),
                &mut errors,
            );
        } else if tick > window {
            at.push(
                "tick",
                format!(
                    "{}: tick {tick:?} is longer than window {window:?}; the tick must be ≤ the window",
                    at.text
                ),
                &mut errors,
            );
        }
        if raw.levels.is_empty() {
            at.push(
                "levels",
                format!("{}: levels is empty: give at least one level", at.text),
                &mut errors,
            );
        }
        let levels: Vec<Level> = raw
            .levels
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let place = Place {
                    text: format!("{} level {}", at.text, i + 1),
                    path: path.key("levels").index(i),
                };
                level(&place, l, &mut errors)
            })
            .collect();
        for (i, l) in levels.iter().enumerate() {
            if levels[..i].iter().any(|earlier| earlier.name == l.name) {
                errors.push(Problem::at(
                    &path.key("levels").index(i).key("name"),
                    format!(
                        "{} level {}: name `{}` is used twice",
                        at.text,
                        i + 1,
                        l.name
                    ),
                ));
            }
        }
        (
            DegradationPolicy {
                window,
                tick,
                levels,
            },
            errors,
        )
    }
}

/// A place to report problems at: its words for messages and its path in the file.
struct Place {
    text: String,
    path: YamlPath,
}

impl Place {
    /// Records `message` at this place's `key`.
    fn push(&self, key: &str, message: String, errors: &mut Vec<Problem>) {
        errors.push(Problem::at(&self.path.key(key), message));
    }
}

/// One level; errors are pushed and the level is returned anyway.
fn level(at: &Place, raw: &RawLevel, errors: &mut Vec<Problem>) -> Level {
    let at = Place {
        text: format!("{} `{}`", at.text, raw.name),
        path: at.path.clone(),
    };
    let text = &at.text;
    if raw.name.trim().is_empty() {
        at.push("name", format!("{text}: name is empty"), errors);
    }
    let enter = thresholds(&at, "enter", &raw.enter, errors);
    let exit = thresholds(&at, "exit", &raw.exit, errors);
    let (given_enter, given_exit) = (given(&raw.enter), given(&raw.exit));
    if !given_enter.contains(&true) {
        at.push(
            "enter",
            format!(
                "{text}: enter gives no threshold: set at least one of {}",
                SIGNALS.join(", ")
            ),
            errors,
        );
    }
    for ((signal, on_enter), on_exit) in SIGNALS.iter().zip(given_enter).zip(given_exit) {
        if on_enter && !on_exit {
            at.push(
                "exit",
                format!(
                    "{text}: exit gives no {signal} threshold; every entry signal needs a lower exit one"
                ),
                errors,
            );
        } else if on_exit && !on_enter {
            errors.push(Problem::at(
                &at.path.key("exit").key(signal),
                format!("{text}: exit.{signal} has no matching enter.{signal}"),
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
        let place = Place {
            text: format!("{text} action {} ({})", i + 1, a.label()),
            path: at.path.key("actions").index(i).key(a.label()),
        };
        action(&place, a, errors);
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
fn thresholds(at: &Place, key: &str, raw: &RawThresholds, errors: &mut Vec<Problem>) -> Thresholds {
    let text = &at.text;
    let set = at.path.key(key);
    let mut span = |field: &str, value: Option<&String>| {
        value.and_then(|t| match parse_duration(t) {
            Ok(d) => Some(d),
            Err(e) => {
                errors.push(Problem::at(
                    &set.key(field),
                    format!("{text}: {key}.{field}: {e}"),
                ));
                None
            }
        })
    };
    let queue_wait_p95 = span("queue_wait_p95", raw.queue_wait_p95.as_ref());
    let ttft_p95 = span("ttft_p95", raw.ttft_p95.as_ref());
    let kv_usage = raw.kv_usage.filter(|kv| {
        let ok = (0.0..=1.0).contains(kv);
        if !ok {
            errors.push(Problem::at(
                &set.key("kv_usage"),
                format!("{text}: {key}.kv_usage {kv} is outside 0..=1"),
            ));
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
fn not_above<T>(
    at: &Place,
    signal: &str,
    enter: Option<T>,
    exit: Option<T>,
    errors: &mut Vec<Problem>,
) where
    T: PartialOrd + Debug,
{
    if let (Some(enter), Some(exit)) = (enter, exit)
        && exit > enter
    {
        errors.push(Problem::at(
            &at.path.key("exit").key(signal),
            format!(
                "{}: exit.{signal} {exit:?} is above enter.{signal} {enter:?}; exit thresholds \
                 must be ≤ entry thresholds",
                at.text
            ),
        ));
    }
}

/// Checks one action's values.
fn action(at: &Place, action: &Action, errors: &mut Vec<Problem>) {
    let text = &at.text;
    let tiers = action.tiers();
    if tiers.is_empty() {
        at.push(
            "tiers",
            format!("{text}: tiers is empty: list the tiers it applies to"),
            errors,
        );
    }
    if tiers.iter().any(|t| t.trim().is_empty()) {
        at.push("tiers", format!("{text}: a tier name is empty"), errors);
    }
    match action {
        Action::CapMaxTokens { max_tokens: 0, .. } => {
            at.push(
                "max_tokens",
                format!("{text}: max_tokens must be ≥ 1"),
                errors,
            );
        }
        Action::RefuseLongPrompts {
            max_prompt_tokens: 0,
            ..
        } => at.push(
            "max_prompt_tokens",
            format!("{text}: max_prompt_tokens must be ≥ 1"),
            errors,
        ),
        Action::Fallback { model, .. } if model.trim().is_empty() => {
            at.push("model", format!("{text}: model is empty"), errors);
        }
        _ => {}
    }
}

/// A duration field with its default; a bad value is reported and replaced by the default.
fn duration(
    at: &Place,
    key: &str,
    value: Option<&String>,
    default: Duration,
    errors: &mut Vec<Problem>,
) -> Duration {
    match value.map(|t| parse_duration(t)) {
        None => default,
        Some(Ok(d)) => d,
        Some(Err(e)) => {
            at.push(key, format!("{}: {key}: {e}", at.text), errors);
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
