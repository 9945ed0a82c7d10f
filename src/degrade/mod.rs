//! Graded degradation per pool: when demand exceeds capacity, step through ordered levels whose
//! actions accumulate (cap `max_tokens`, refuse long prompts, fall back to another model, shed),
//! protecting paid tiers longest, and step back down one level at a time when load clears.
//!
//! Everything here is pure and driven by injected `Instant`s, so the live gateway, the simulator
//! and the tests make identical decisions:
//! - `policy`: the `policies/degradation.yaml` schema and the validated `DegradationPolicy`;
//! - `validate`: the one pass from the file's text to policies, reporting every error;
//! - `signals`: a bounded sliding window of load samples, summarised as `Signals` each tick;
//! - `machine`: the `Degrader` state machine (hysteresis, dwell time, admin override);
//! - `actions`: what the current level means for one request of a given tier.

pub mod actions;
pub mod machine;
pub mod policy;
pub mod signals;
pub mod validate;

#[cfg(test)]
mod machine_tests;
#[cfg(test)]
mod testkit;

pub mod live;
pub use actions::{Actions, TierActions, Verdict};
pub use machine::{Degrader, Transition};
pub use policy::{Action, DegradationPolicy, Level, Thresholds};
pub use signals::{SignalWindow, Signals};
pub use validate::{check, parse};
