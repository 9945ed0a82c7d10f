//! The comparison of one window: the canary's error rate, TTFT p99 and inter-token p99 against
//! stable's, under the analysis thresholds. A latency metric is compared only when both versions
//! have at least `min_samples` values of it (non-streamed requests have no inter-token gaps).

use std::time::Duration;

use super::samples::VersionWindow;
use super::spec::AnalysisSpec;

/// Why each breached threshold was breached, naming the metric and both values; empty when the
/// canary is healthy.
pub fn breaches(
    spec: &AnalysisSpec,
    stable: &VersionWindow,
    canary: &VersionWindow,
) -> Vec<String> {
    let mut found = Vec::new();
    let (s_err, c_err) = (stable.error_rate(), canary.error_rate());
    if c_err > s_err + spec.max_error_rate_delta {
        found.push(format!(
            "error rate {} on canary vs {} on stable, above stable + {:.2} points",
            pct(c_err),
            pct(s_err),
            spec.max_error_rate_delta * 100.0
        ));
    }
    let metrics = [
        (
            "ttft p99",
            spec.max_ttft_p99_ratio,
            stable.ttft_p99(),
            canary.ttft_p99(),
        ),
        (
            "inter-token p99",
            spec.max_itl_p99_ratio,
            stable.itl_p99(),
            canary.itl_p99(),
        ),
    ];
    for (name, ratio, s, c) in metrics {
        let Some((s, c)) = comparable(spec, s, c) else {
            continue;
        };
        if c.as_secs_f64() > ratio * s.as_secs_f64() {
            found.push(format!(
                "{name} {} on canary vs {} on stable, above {ratio}× stable",
                ms(c),
                ms(s)
            ));
        }
    }
    found
}

/// The window's figures for a log line: error rates and p99s of canary vs stable.
pub fn summary(spec: &AnalysisSpec, stable: &VersionWindow, canary: &VersionWindow) -> String {
    let mut parts = vec![format!(
        "error rate {} vs {} ({} vs {} requests)",
        pct(canary.error_rate()),
        pct(stable.error_rate()),
        canary.requests,
        stable.requests
    )];
    let metrics = [
        ("ttft p99", stable.ttft_p99(), canary.ttft_p99()),
        ("inter-token p99", stable.itl_p99(), canary.itl_p99()),
    ];
    for (name, s, c) in metrics {
        parts.push(match comparable(spec, s, c) {
            Some((s, c)) => format!("{name} {} vs {}", ms(c), ms(s)),
            None => format!("{name} not compared (too few samples)"),
        });
    }
    format!("canary vs stable: {}", parts.join(", "))
}

/// Both p99s when each was taken over at least `min_samples` values.
fn comparable(
    spec: &AnalysisSpec,
    stable: (Option<Duration>, u64),
    canary: (Option<Duration>, u64),
) -> Option<(Duration, Duration)> {
    if stable.1 < spec.min_samples || canary.1 < spec.min_samples {
        return None;
    }
    Some((stable.0?, canary.0?))
}

/// A fraction as a percentage with two decimals.
fn pct(fraction: f64) -> String {
    format!("{:.2}%", fraction * 100.0)
}

/// A duration in milliseconds with one decimal.
fn ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canary::testkit::{analysis, fill};

    #[test]
    fn a_healthy_canary_breaches_nothing() {
        let spec = analysis();
        let (s, c) = (fill(100, 1, 100, 20), fill(100, 2, 110, 22));
        assert!(breaches(&spec, &s, &c).is_empty());
        let line = summary(&spec, &s, &c);
        assert!(line.contains("error rate 2.00% vs 1.00%"), "{line}");
        assert!(line.contains("ttft p99 110.0ms vs 100.0ms"), "{line}");
    }

    #[test]
    fn each_breach_names_its_metric_and_both_values() {
        let spec = analysis();
        let s = fill(100, 1, 100, 20);
        let errors = breaches(&spec, &s, &fill(100, 10, 100, 20));
        assert_eq!(
            errors,
            ["error rate 10.00% on canary vs 1.00% on stable, above stable + 2.00 points"]
        );
        let slow = breaches(&spec, &s, &fill(100, 1, 200, 40));
        assert_eq!(slow.len(), 2, "{slow:?}");
        assert!(slow[0].starts_with("ttft p99 200.0ms on canary vs 100.0ms on stable"));
        assert!(slow[1].starts_with("inter-token p99 40.0ms on canary vs 20.0ms"));
    }

    #[test]
    fn latency_with_too_few_samples_is_not_compared() {
        let spec = analysis();
        let s = fill(100, 0, 100, 20);
        let mut c = VersionWindow::default();
        for _ in 0..100 {
            c.record(true, None, None);
        }
        c.record(
            true,
            Some(Duration::from_secs(9)),
            Some(Duration::from_secs(9)),
        );
        assert!(breaches(&spec, &s, &c).is_empty());
        assert!(summary(&spec, &s, &c).contains("ttft p99 not compared"));
    }
}
