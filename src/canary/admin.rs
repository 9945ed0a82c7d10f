//! Admin operations on a canary and its status. The kill switch wins over automation: after
//! `rollback` (or an automated one) no window promotes again until `resume` or `set_weights`.
//! Every change of weights makes the next `tick` start a fresh window, so a window never mixes
//! two splits.

use serde::Serialize;

use super::analysis::{Canary, Decision};

/// A canary's state for the admin API and logs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CanaryStatus {
    /// (version name, percent) in version order.
    pub weights: Vec<(String, u32)>,
    /// Schedule steps reached (0 before the first).
    pub step: usize,
    /// Healthy windows hold instead of promoting.
    pub paused: bool,
    /// Promotion is disarmed after a rollback.
    pub rolled_back: bool,
    /// The latest decision, by a window or by the admin.
    pub last_decision: Option<Decision>,
    /// The current window's samples, per version in version order.
    pub samples: Vec<VersionSamples>,
}

/// One version's samples in the current window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionSamples {
    /// Version name.
    pub version: String,
    /// Requests finished in the window.
    pub requests: u64,
    /// Of those, the failed ones.
    pub errors: u64,
}

impl Canary {
    /// Sets every version's weight by name (each version exactly once, percents summing to
    /// 100) and re-arms promotion after a rollback. Nothing changes on error.
    pub fn set_weights(&mut self, weights: &[(String, u32)]) -> Result<(), String> {
        let mut next = self.weights.clone();
        let mut given = vec![false; next.len()];
        for (name, w) in weights {
            let Some(i) = next.iter().position(|(n, _)| n == name) else {
                let known: Vec<&str> = next.iter().map(|(n, _)| n.as_str()).collect();
                return Err(format!("unknown version `{name}`; versions are {known:?}"));
            };
            if given[i] {
                return Err(format!("version `{name}` is given twice"));
            }
            given[i] = true;
            next[i].1 = *w;
        }
        if let Some(i) = given.iter().position(|g| !g) {
            return Err(format!(
                "version `{}` has no weight; give every version",
                next[i].0
            ));
        }
        let sum: u64 = next.iter().map(|(_, w)| u64::from(*w)).sum();
        if sum != 100 {
            return Err(format!("weights sum to {sum}; they must sum to 100"));
        }
        self.weights = next;
        self.rolled_back = false;
        self.restart = true;
        Ok(())
    }

    /// Healthy windows hold instead of promoting; breaches still roll back.
    pub fn pause(&mut self) {
        self.paused = true;
    }

    /// Lifts a pause and re-arms promotion after a rollback. The weights are unchanged: a
    /// rolled-back canary (weight 0) restarts its ramp with `promote` or `set_weights`.
    pub fn resume(&mut self) {
        self.paused = false;
        self.rolled_back = false;
    }

    /// Moves the canary to the next schedule step now. Refused after a rollback (resume or set
    /// weights first) and at the schedule's end.
    pub fn promote(&mut self) -> Result<Decision, String> {
        if self.rolled_back {
            return Err(
                "the canary was rolled back: resume or set weights before promoting".into(),
            );
        }
        let from = self.canary_weight();
        let Some(to) = self.next_step() else {
            return Err(format!(
                "the canary is at the schedule's last step ({from}%)"
            ));
        };
        self.set_canary_weight(to);
        self.restart = true;
        Ok(self.decided(Decision::Promote {
            from,
            to,
            reason: "admin".into(),
        }))
    }

    /// The kill switch: canary weight 0 at once, promotion disarmed until `resume` or
    /// `set_weights`.
    pub fn rollback(&mut self, reason: &str) -> Decision {
        self.set_canary_weight(0);
        self.rolled_back = true;
        self.restart = true;
        self.decided(Decision::Rollback {
            reason: format!("admin: {reason}"),
        })
    }

    /// Whether healthy windows hold instead of promoting.
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// Whether promotion is disarmed by a rollback.
    pub fn rolled_back(&self) -> bool {
        self.rolled_back
    }

    /// The state for the admin API.
    pub fn status(&self) -> CanaryStatus {
        let samples = self
            .weights
            .iter()
            .zip(&self.windows)
            .map(|((name, _), w)| VersionSamples {
                version: name.clone(),
                requests: w.requests,
                errors: w.errors,
            })
            .collect();
        CanaryStatus {
            weights: self.weights(),
            step: self.step(),
            paused: self.paused,
            rolled_back: self.rolled_back,
            last_decision: self.last_decision.clone(),
            samples,
        }
    }

    /// Remembers an admin decision as the latest and returns it.
    fn decided(&mut self, decision: Decision) -> Decision {
        self.last_decision = Some(decision.clone());
        decision
    }
}
