//! The canary state machine of one model. Requests are recorded per version into the current
//! window; once per window `tick` judges it: too little data holds (never promotes), a breach
//! rolls the canary back to weight 0 at once, a healthy window promotes it to the next step of
//! the schedule unless paused, and the ramp is done at 100% or at the schedule's last step.
//! A rollback (automated or admin) disarms promotion until `resume` or `set_weights` (see
//! `admin`). Pure: time comes in as `Instant`s, effects go out as `Decision`s.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::assign;
use super::judge;
use super::samples::VersionWindow;
use super::spec::{AnalysisSpec, CanarySpec};

/// What one window (or one admin action) decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// Weights unchanged: too little data, paused, or rolled back.
    Hold {
        /// Why, with the figures.
        reason: String,
    },
    /// The canary moved up the schedule.
    Promote {
        /// Canary weight before, in percent.
        from: u32,
        /// Canary weight after, in percent.
        to: u32,
        /// The window's figures, or "admin".
        reason: String,
    },
    /// The canary went to weight 0 and promotion is disarmed.
    Rollback {
        /// Each breached metric with both values, or the admin's reason.
        reason: String,
    },
    /// The ramp is complete; weights unchanged.
    Done {
        /// Where it ended.
        reason: String,
    },
}

impl Decision {
    /// Short name for logs and metric labels: `hold`, `promote`, `rollback` or `done`.
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Hold { .. } => "hold",
            Decision::Promote { .. } => "promote",
            Decision::Rollback { .. } => "rollback",
            Decision::Done { .. } => "done",
        }
    }
}

/// One model's canary: its split, its ramp state and the current window's samples.
#[derive(Debug, Clone)]
pub struct Canary {
    /// Analysis settings from the spec.
    pub(super) analysis: AnalysisSpec,
    /// (version name, percent) in version order; sums to 100.
    pub(super) weights: Vec<(String, u32)>,
    /// Config model serving each version, in version order.
    pub(super) models: Vec<String>,
    /// Index of the stable version.
    pub(super) stable: usize,
    /// Index of the canary version.
    pub(super) canary: usize,
    /// Admin pause: healthy windows hold instead of promoting (breaches still roll back).
    pub(super) paused: bool,
    /// Set by any rollback: no promotion until `resume` or `set_weights`.
    pub(super) rolled_back: bool,
    /// The weights changed outside `tick`: the next tick starts a fresh window.
    pub(super) restart: bool,
    /// The latest decision, by a window or by the admin.
    pub(super) last_decision: Option<Decision>,
    /// When the current window began.
    pub(super) window_start: Instant,
    /// The current window's samples, per version.
    pub(super) windows: Vec<VersionWindow>,
}

impl Canary {
    /// The spec's initial split, a window starting at `now`, not paused.
    pub fn new(spec: &CanarySpec, now: Instant) -> Self {
        Canary {
            analysis: spec.analysis.clone(),
            weights: spec.weights(),
            models: spec.versions.iter().map(|v| v.model.clone()).collect(),
            stable: spec.stable,
            canary: spec.canary(),
            paused: false,
            rolled_back: false,
            restart: false,
            last_decision: None,
            window_start: now,
            windows: vec![VersionWindow::default(); spec.versions.len()],
        }
    }

    /// Index of the version a sticky key lands on under the current weights.
    pub fn choose(&self, key: u64) -> usize {
        assign::choose(&self.weights, key)
    }

    /// Name of version `i` (for `x-infergate-version`), if it exists.
    pub fn name(&self, i: usize) -> Option<&str> {
        self.weights.get(i).map(|(n, _)| n.as_str())
    }

    /// Config model serving version `i`, if it exists.
    pub fn model(&self, i: usize) -> Option<&str> {
        self.models.get(i).map(String::as_str)
    }

    /// Records one finished request of version `i` at `now`. Requests finishing before the
    /// current window began (it was already judged) and unknown versions are ignored.
    pub fn record(
        &mut self,
        version: usize,
        ok: bool,
        ttft: Option<Duration>,
        max_itl: Option<Duration>,
        now: Instant,
    ) {
        if now < self.window_start {
            return;
        }
        if let Some(w) = self.windows.get_mut(version) {
            w.record(ok, ttft, max_itl);
        }
    }

    /// Records the quality signals `raised` by one scored answer of version `i` at `now` (same
    /// window rule as [`Self::record`]).
    pub fn record_quality(
        &mut self,
        version: usize,
        raised: &crate::quality::signals::Signals,
        now: Instant,
    ) {
        if now < self.window_start {
            return;
        }
        if let Some(w) = self.windows.get_mut(version) {
            w.record_quality(raised);
        }
    }

    /// Call often (e.g. each second). Once a full window has passed, judges it, applies the
    /// decision, starts the next window at `now` and returns the decision; `None` otherwise.
    pub fn tick(&mut self, now: Instant) -> Option<Decision> {
        if self.restart {
            self.start_window(now);
            return None;
        }
        if now.saturating_duration_since(self.window_start) < self.analysis.window {
            return None;
        }
        let decision = self.decide();
        match &decision {
            Decision::Promote { to, .. } => self.set_canary_weight(*to),
            Decision::Rollback { .. } => {
                self.set_canary_weight(0);
                self.rolled_back = true;
            }
            Decision::Hold { .. } | Decision::Done { .. } => {}
        }
        self.start_window(now);
        self.last_decision = Some(decision.clone());
        Some(decision)
    }

    /// The current weights as (version name, percent), in version order.
    pub fn weights(&self) -> Vec<(String, u32)> {
        self.weights.clone()
    }

    /// The canary's current weight, in percent.
    pub fn canary_weight(&self) -> u32 {
        self.weights.get(self.canary).map_or(0, |(_, w)| *w)
    }

    /// Schedule steps reached: how many steps are ≤ the canary's weight (0 before the first).
    pub fn step(&self) -> usize {
        let w = self.canary_weight();
        self.analysis.schedule.iter().filter(|&&s| s <= w).count()
    }

    /// The first schedule step above the canary's weight, if any.
    pub(super) fn next_step(&self) -> Option<u32> {
        let w = self.canary_weight();
        self.analysis.schedule.iter().copied().find(|&s| s > w)
    }

    /// The window's verdict; changes nothing.
    fn decide(&self) -> Decision {
        let hold = |reason: String| Decision::Hold { reason };
        if self.rolled_back {
            return hold("rolled back: promotion disarmed until resume or set weights".into());
        }
        let weight = self.canary_weight();
        if weight >= 100 {
            let reason = "canary serves 100%; nothing left to compare".into();
            return Decision::Done { reason };
        }
        let (Some(stable), Some(canary)) =
            (self.windows.get(self.stable), self.windows.get(self.canary))
        else {
            return hold("no stable and canary versions to compare".into());
        };
        let min = self.analysis.min_samples;
        if stable.requests < min || canary.requests < min {
            return hold(format!(
                "too little data: canary {} and stable {} requests, need {min} each",
                canary.requests, stable.requests
            ));
        }
        let breaches = judge::breaches(&self.analysis, stable, canary);
        if !breaches.is_empty() {
            return Decision::Rollback {
                reason: breaches.join("; "),
            };
        }
        let figures = judge::summary(&self.analysis, stable, canary);
        if self.paused {
            return hold(format!("paused; {figures}"));
        }
        match self.next_step() {
            Some(to) => Decision::Promote {
                from: weight,
                to,
                reason: figures,
            },
            None => Decision::Done {
                reason: format!("schedule complete at {weight}%; {figures}"),
            },
        }
    }

    /// Sets the canary to `weight` percent and stable to the rest.
    pub(super) fn set_canary_weight(&mut self, weight: u32) {
        let weight = weight.min(100);
        if let Some(c) = self.weights.get_mut(self.canary) {
            c.1 = weight;
        }
        if let Some(s) = self.weights.get_mut(self.stable) {
            s.1 = 100 - weight;
        }
    }

    /// Empties every version's samples and starts the window at `now`.
    fn start_window(&mut self, now: Instant) {
        self.window_start = now;
        self.restart = false;
        for w in &mut self.windows {
            *w = VersionWindow::default();
        }
    }
}
