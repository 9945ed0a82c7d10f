//! The degradation state machine of one pool. Each tick it moves at most one level: up when any
//! entry threshold of the next level is met, down when every exit threshold of the current level
//! is, and only once the current level has dwelled its minimum time. Exit thresholds sit below
//! entry ones, so a signal between the two keeps the level (no flapping). An admin override pins
//! a level until released. Pure: time comes in as `Instant`s, effects go out as `Transition`s.

use std::fmt::Debug;
use std::time::Instant;

use super::actions::Actions;
use super::policy::{DegradationPolicy, Level};
use super::signals::Signals;

/// The current level of one pool and how it got there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Degrader {
    /// 0 is normal service; N applies the actions of levels 1..=N.
    level: usize,
    /// When the current level was entered (dwell time counts from here).
    entered_at: Instant,
    /// Admin override: the level to hold regardless of signals.
    forced: Option<usize>,
    /// Level changes so far, for the transitions counter.
    transitions: u64,
}

/// One level change, to be logged and counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// Level before.
    pub from: usize,
    /// Level after.
    pub to: usize,
    /// Why, naming each signal and the threshold it crossed (or "forced … by admin").
    pub reason: String,
}

impl Degrader {
    /// Normal service from `now`, no override.
    pub fn new(now: Instant) -> Self {
        Degrader {
            level: 0,
            entered_at: now,
            forced: None,
            transitions: 0,
        }
    }

    /// The current level; 0 is normal service.
    pub fn level(&self) -> usize {
        self.level
    }

    /// When the current level was entered.
    pub fn entered_at(&self) -> Instant {
        self.entered_at
    }

    /// The admin override in force, if any.
    pub fn forced(&self) -> Option<usize> {
        self.forced
    }

    /// Level changes since creation.
    pub fn transitions(&self) -> u64 {
        self.transitions
    }

    /// What the current level does to requests under `policy`.
    pub fn actions(&self, policy: &DegradationPolicy) -> Actions {
        Actions::at(policy, self.level)
    }

    /// Sets (`Some`) or releases (`None`) the admin override. A forced level takes effect at once
    /// and holds whatever the signals say; one past the policy's last level is held at the last
    /// from the next tick, so the admin API should refuse it. On release the level stays where it
    /// is and automation resumes from there, dwell counted from when the level was entered.
    pub fn force(&mut self, level: Option<usize>, now: Instant) -> Option<Transition> {
        self.forced = level;
        let to = level?;
        self.move_to(to, format!("forced to level {to} by admin"), now)
    }

    /// Reconsiders the level given this tick's signals; returns the change, if any.
    pub fn tick(
        &mut self,
        policy: &DegradationPolicy,
        signals: &Signals,
        now: Instant,
    ) -> Option<Transition> {
        let top = policy.levels.len();
        if let Some(forced) = self.forced {
            let reason = format!("forced to level {forced} by admin (policy has {top} levels)");
            return self.move_to(forced.min(top), reason, now);
        }
        if self.level > top {
            return self.move_to(top, format!("policy now has {top} levels"), now);
        }
        if !self.dwelled(policy, now) {
            return None;
        }
        if let Some(next) = policy.levels.get(self.level)
            && let Some(reason) = entry_reason(next, signals)
        {
            return self.move_to(self.level + 1, reason, now);
        }
        let current = policy.levels.get(self.level.checked_sub(1)?)?;
        let reason = exit_reason(current, signals)?;
        self.move_to(self.level - 1, reason, now)
    }

    /// True when the current level has been held for its minimum dwell (level 0 has none).
    fn dwelled(&self, policy: &DegradationPolicy, now: Instant) -> bool {
        let current = self.level.checked_sub(1).and_then(|i| policy.levels.get(i));
        current.is_none_or(|l| now.saturating_duration_since(self.entered_at) >= l.min_dwell)
    }

    /// Moves to `to` (no-op when already there), restarting the dwell clock.
    fn move_to(&mut self, to: usize, reason: String, now: Instant) -> Option<Transition> {
        if to == self.level {
            return None;
        }
        let from = std::mem::replace(&mut self.level, to);
        self.entered_at = now;
        self.transitions += 1;
        Some(Transition { from, to, reason })
    }
}

/// Why `level` is entered: every signal at or above its entry threshold; `None` when none is.
fn entry_reason(level: &Level, s: &Signals) -> Option<String> {
    let t = &level.enter;
    let met: Vec<String> = [
        at_or_above("queue_depth", s.queue_depth, t.queue_depth),
        at_or_above("queue_wait_p95", s.queue_wait_p95, t.queue_wait_p95),
        at_or_above("kv_usage", s.kv_usage, t.kv_usage),
        at_or_above("ttft_p95", s.ttft_p95, t.ttft_p95),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!met.is_empty()).then(|| format!("enter `{}`: {}", level.name, met.join(", ")))
}

/// Why `level` is left: each signal below its exit threshold; `None` unless all are.
fn exit_reason(level: &Level, s: &Signals) -> Option<String> {
    let t = &level.exit;
    let all: Option<Vec<String>> = [
        below("queue_depth", s.queue_depth, t.queue_depth),
        below("queue_wait_p95", s.queue_wait_p95, t.queue_wait_p95),
        below("kv_usage", s.kv_usage, t.kv_usage),
        below("ttft_p95", s.ttft_p95, t.ttft_p95),
    ]
    .into_iter()
    .collect();
    let said: Vec<String> = all?.into_iter().filter(|p| !p.is_empty()).collect();
    Some(format!("leave `{}`: {}", level.name, said.join(", ")))
}

/// `value ≥ threshold`, described; `None` when not met or either is missing.
fn at_or_above<T: PartialOrd + Debug>(
    name: &str,
    value: Option<T>,
    t: Option<T>,
) -> Option<String> {
    let (value, t) = (value?, t?);
    (value >= t).then(|| format!("{name} {value:?} ≥ {t:?}"))
}

/// `None` when `value` is at or above the exit threshold; otherwise what to say about it (empty
/// without a threshold; a signal without samples counts as below).
fn below<T: PartialOrd + Debug>(name: &str, value: Option<T>, t: Option<T>) -> Option<String> {
    match (value, t) {
        (_, None) => Some(String::new()),
        (None, Some(t)) => Some(format!("{name} no samples (exit < {t:?})")),
        (Some(value), Some(t)) => (value < t).then(|| format!("{name} {value:?} < {t:?}")),
    }
}
