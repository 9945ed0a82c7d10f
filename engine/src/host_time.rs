//! Where the step loop's time goes: the accelerator busy inside steps, or the host working
//! between them (scheduling, tokenising, detokenising, streaming output). The busy fraction
//! (busy seconds over wall seconds) is the "GPU utilisation" an operator sees; a low one with a
//! long queue is a host-bound engine, unless the batches are small.
//!
//! [`StepAccounting`] splits time into busy and host (pure, times passed in). [`HostCost`] is the
//! sim backend's model of host time per step, so that a host-bound engine can be simulated: the
//! real backends' host time is whatever the clock measures.

use crate::scheduler::Batch;
use crate::sequence::Sequence;

/// One step's share of the loop's time, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    /// Time inside the step (the accelerator busy).
    pub busy: f64,
    /// Time since the previous step ended (or since the loop turned to this step's work) during
    /// which work was pending: the host's time between steps.
    pub gap: f64,
}

/// Splits the step loop's time into busy and host time. Idle time, when no request waits or
/// runs, is neither.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepAccounting {
    /// End of the last step that left work pending; `None` when the engine went idle after it.
    pending_since: Option<f64>,
}

impl StepAccounting {
    /// A step that ran from `start` to `end`; `called` is when the loop began preparing it (the
    /// gap's origin when nothing was pending before) and `work_left` whether any request still
    /// waits or runs after it.
    pub fn ran(&mut self, called: f64, start: f64, end: f64, work_left: bool) -> StepTimes {
        let from = self.pending_since.unwrap_or(called);
        self.pending_since = work_left.then_some(end);
        StepTimes {
            busy: (end - start).max(0.0),
            gap: (start - from).max(0.0),
        }
    }

    /// A pass of the loop that ran no step. With work pending the accelerator idles on the host's
    /// account (the time joins the next step's gap); without, the engine is idle and what
    /// follows is not host time.
    pub fn skipped(&mut self, work_left: bool) {
        if !work_left {
            self.pending_since = None;
        }
    }
}

/// The host work a step brings, as [`HostCost`] prices it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostWork {
    /// Sequences in the batch (each scheduled, its output buffered and streamed).
    pub seqs: usize,
    /// Prompt tokens computed for the first time in the step (they were tokenised).
    pub prompt_tokens: usize,
    /// Sequences that sample a token in the step (each token detokenised).
    pub output_tokens: usize,
}

impl HostWork {
    /// The host work of `batch` over `running` (before the step is committed).
    pub fn of(batch: &Batch, running: &[Sequence]) -> Self {
        let mut work = Self::default();
        for s in &batch.seqs {
            let Some(seq) = running.get(s.index) else {
                continue;
            };
            work.seqs += 1;
            let from = seq.num_computed;
            let to = from + s.num_tokens;
            // Positions past the prompt are outputs computed again after a preemption: tokenised
            // once already, they cost nothing here. Prompt positions count once per admission.
            work.prompt_tokens += to.min(seq.prompt_len).saturating_sub(from);
            if to >= seq.tokens.len() {
                work.output_tokens += 1;
            }
        }
        work
    }
}

/// The sim backend's host time per step: a fixed overhead, plus per sequence (scheduling,
/// output), per new prompt token (tokenising) and per output token (detokenising). All zero by
/// default: the host work overlaps the modelled accelerator fully, as before this model existed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostCost {
    /// Seconds of every step.
    pub per_step: f64,
    /// Seconds per sequence in the batch.
    pub per_seq: f64,
    /// Seconds per prompt token computed for the first time.
    pub per_prompt_token: f64,
    /// Seconds per token sampled.
    pub per_output_token: f64,
}

impl HostCost {
    /// From the microseconds of the `--sim-host-us-*` flags (see [`check`](Self::check)).
    pub fn from_micros(
        per_step: f64,
        per_seq: f64,
        per_prompt_token: f64,
        per_output_token: f64,
    ) -> Self {
        Self {
            per_step: per_step * 1e-6,
            per_seq: per_seq * 1e-6,
            per_prompt_token: per_prompt_token * 1e-6,
            per_output_token: per_output_token * 1e-6,
        }
    }

    /// Refuses a negative or non-finite cost, naming its flag.
    pub fn check(&self) -> Result<(), String> {
        for (name, v) in [
            ("--sim-host-us-per-step", self.per_step),
            ("--sim-host-us-per-seq", self.per_seq),
            ("--sim-host-us-per-prompt-token", self.per_prompt_token),
            ("--sim-host-us-per-output-token", self.per_output_token),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!(
                    "{name} must be a non-negative number of microseconds, not {}",
                    v * 1e6
                ));
            }
        }
        Ok(())
    }

    /// Whether every cost is zero (the model adds nothing).
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    /// Host seconds before a step with `work` can start.
    pub fn seconds(&self, work: &HostWork) -> f64 {
        self.per_step
            + self.per_seq * work.seqs as f64
            + self.per_prompt_token * work.prompt_tokens as f64
            + self.per_output_token * work.output_tokens as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_to_back_steps_are_all_busy() {
        let mut a = StepAccounting::default();
        assert_eq!(
            a.ran(0.0, 0.0, 1.0, true),
            StepTimes {
                busy: 1.0,
                gap: 0.0
            }
        );
        let t = a.ran(1.0, 1.0, 3.0, true);
        assert_eq!((t.busy, t.gap), (2.0, 0.0));
    }

    #[test]
    fn the_gap_while_work_is_pending_is_host_time() {
        let mut a = StepAccounting::default();
        a.ran(0.0, 0.0, 1.0, true);
        // The loop turned to the next step at 1.0 but the accelerator started at 1.3.
        let t = a.ran(1.0, 1.3, 2.0, true);
        assert!((t.gap - 0.3).abs() < 1e-12, "{t:?}");
        assert!((t.busy - 0.7).abs() < 1e-12, "{t:?}");
        // A pass that ran nothing with work still pending: the wait joins the next gap.
        a.skipped(true);
        let t = a.ran(2.5, 2.6, 3.0, false);
        assert!((t.gap - 0.6).abs() < 1e-12, "{t:?}");
    }

    #[test]
    fn idle_time_is_not_host_time() {
        let mut a = StepAccounting::default();
        // The last request finished with this step: the wait for the next one is idle.
        a.ran(0.0, 0.0, 1.0, false);
        let t = a.ran(5.0, 5.2, 6.0, true);
        // Only the time from the loop picking the new request up to the step's start counts.
        assert!((t.gap - 0.2).abs() < 1e-12, "{t:?}");
        // Work left, then a pass found nothing left (aborted): idle again.
        a.skipped(false);
        let t = a.ran(9.0, 9.0, 9.5, true);
        assert_eq!(t.gap, 0.0);
    }

    #[test]
    fn clock_noise_never_makes_negative_times() {
        let mut a = StepAccounting::default();
        a.ran(0.0, 0.0, 1.0, true);
        let t = a.ran(0.9, 0.95, 0.94, true);
        assert_eq!((t.busy, t.gap), (0.0, 0.0));
    }

    #[test]
    fn host_cost_is_the_sum_of_its_parts() {
        let cost = HostCost::from_micros(1000.0, 10.0, 1.0, 50.0);
        assert_eq!(cost.check(), Ok(()));
        let work = HostWork {
            seqs: 4,
            prompt_tokens: 100,
            output_tokens: 3,
        };
        // 1 ms + 4 × 10 µs + 100 × 1 µs + 3 × 50 µs.
        let want = 1e-3 + 40e-6 + 100e-6 + 150e-6;
        assert!((cost.seconds(&work) - want).abs() < 1e-12);
        assert!(!cost.is_zero());
    }

    #[test]
    fn the_default_host_cost_adds_nothing() {
        let cost = HostCost::default();
        assert!(cost.is_zero());
        let work = HostWork {
            seqs: 256,
            prompt_tokens: 8192,
            output_tokens: 256,
        };
        assert_eq!(cost.seconds(&work), 0.0);
    }

    #[test]
    fn bad_host_cost_flags_are_refused_by_name() {
        let err = HostCost::from_micros(0.0, -1.0, 0.0, 0.0)
            .check()
            .unwrap_err();
        assert!(err.contains("--sim-host-us-per-seq"), "{err}");
        let err = HostCost::from_micros(f64::NAN, 0.0, 0.0, 0.0)
            .check()
            .unwrap_err();
        assert!(err.contains("--sim-host-us-per-step"), "{err}");
    }
}
