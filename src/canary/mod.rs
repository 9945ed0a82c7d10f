//! Canary releases per model: a sticky split between a stable and a canary version, ramped up a
//! schedule by automated analysis of each window (error rate, TTFT p99, inter-token p99 against
//! stable) and rolled back at once on a regression; the admin's kill switch wins over automation.
//!
//! Everything here is pure and driven by injected `Instant`s:
//! - `spec`: the `models:` section of `policies/routing.yaml` and the validated `CanarySpec`;
//! - `validate`: the one pass from a model's entry to its spec, reporting every error;
//! - `assign`: sticky keys and the weighted, monotone split of keys over versions;
//! - `samples`: one window's counts and bounded latency reservoirs per version;
//! - `judge`: the canary-vs-stable comparison of one window;
//! - `analysis`: the `Canary` state machine (`record`, `tick`, `Decision`);
//! - `admin`: set weights, pause, resume, promote, roll back, status.

pub mod admin;
pub mod analysis;
pub mod assign;
pub mod judge;
pub mod samples;
pub mod spec;
pub mod validate;

#[cfg(test)]
mod analysis_tests;
#[cfg(test)]
mod spec_tests;
#[cfg(test)]
mod testkit;

pub use admin::{CanaryStatus, VersionSamples};
pub use analysis::{Canary, Decision};
pub use assign::{choose, key_of};
pub use spec::{AnalysisSpec, CanarySpec, StickyKey, VersionSpec, check_models};

/// One canary version's analysis window, fed the quality signals of its sampled answers.
pub struct VersionWindow {
    /// The canary.
    pub canary: std::sync::Arc<std::sync::Mutex<Canary>>,
    /// The version's index in it.
    pub index: usize,
}

impl crate::quality::sampler::SignalWindow for VersionWindow {
    fn record(&self, raised: &crate::quality::signals::Signals, at: std::time::Instant) {
        if let Ok(mut c) = self.canary.lock() {
            c.record_quality(self.index, raised, at);
        }
    }
}
