//! Test doubles shared by the canary tests: hand-built specs and filled sample windows.

use std::time::Duration;

use super::samples::VersionWindow;
use super::spec::{AnalysisSpec, CanarySpec, StickyKey, VersionSpec};

/// Seconds as a `Duration`.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The default analysis: 60s windows, 50 samples, +2 points, 1.5× p99s, 1/5/25/50/100.
pub fn analysis() -> AnalysisSpec {
    AnalysisSpec {
        window: secs(60),
        min_samples: 50,
        max_error_rate_delta: 0.02,
        max_ttft_p99_ratio: 1.5,
        max_itl_p99_ratio: 1.5,
        schedule: vec![1, 5, 25, 50, 100],
    }
}

/// `stable` (model llama) and `canary` (model llama-canary) at the given canary weight.
pub fn spec(canary_weight: u32) -> CanarySpec {
    let version = |name: &str, model: &str, weight| VersionSpec {
        name: name.into(),
        model: model.into(),
        weight,
    };
    CanarySpec {
        versions: vec![
            version("stable", "llama", 100 - canary_weight),
            version("canary", "llama-canary", canary_weight),
        ],
        stable: 0,
        sticky: StickyKey::Session,
        analysis: analysis(),
    }
}

/// A window of `requests` requests, `errors` of them failed, all with the same TTFT and
/// largest inter-token gap (in milliseconds).
pub fn fill(requests: u64, errors: u64, ttft_ms: u64, itl_ms: u64) -> VersionWindow {
    let mut w = VersionWindow::default();
    for i in 0..requests {
        w.record(
            i >= errors,
            Some(Duration::from_millis(ttft_ms)),
            Some(Duration::from_millis(itl_ms)),
        );
    }
    w
}
