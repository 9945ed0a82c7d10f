//! The comparison of one window: the canary's error rate, TTFT p99 and inter-token p99 against
//! stable's, under the analysis thresholds. A latency metric is compared only when both versions
//! have at least `min_samples` values of it (non-streamed requests have no inter-token gaps).
//! Quality signals (refusal, empty, repetition, invalid JSON, malformed tool arguments) are
//! compared when both versions have at least `min_samples` scored answers, by a one-sided
//! two-proportion z-test: the canary's rate is worse when `z > 2.326` (significance 1%).

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
    found.extend(quality_breaches(spec, stable, canary));
    found
}

/// Signals a canary is rolled back for (a length-limit hit follows the client's `max_tokens`,
/// so it is counted but not judged).
pub const JUDGED_SIGNALS: [&str; 5] = [
    "refusal",
    "empty",
    "repetition",
    "invalid_json",
    "malformed_tool_args",
];

/// One-sided critical value of the standard normal at 1% significance.
pub const Z_CRITICAL: f64 = 2.326;

/// Each judged signal whose rate is significantly higher on the canary than on stable.
fn quality_breaches(
    spec: &AnalysisSpec,
    stable: &VersionWindow,
    canary: &VersionWindow,
) -> Vec<String> {
    if stable.quality_sampled < spec.min_samples || canary.quality_sampled < spec.min_samples {
        return Vec::new();
    }
    let mut found = Vec::new();
    for signal in JUDGED_SIGNALS {
        let (s, c) = (stable.quality(signal), canary.quality(signal));
        let z = two_proportion_z(s, c);
        if z > Z_CRITICAL {
            found.push(format!(
                "{signal} rate {} on canary vs {} on stable ({} vs {} scored answers; \
                 one-sided two-proportion z = {z:.2} > {Z_CRITICAL})",
                pct(c.0 as f64 / c.1 as f64),
                pct(s.0 as f64 / s.1 as f64),
                c.1,
                s.1
            ));
        }
    }
    found
}

/// The two-proportion z statistic of `canary` (raised, scored) over `stable`, with the pooled
/// rate's standard error; 0 when the pooled rate is 0 or 1 (nothing tells them apart).
pub fn two_proportion_z(stable: (u64, u64), canary: (u64, u64)) -> f64 {
    let ((xs, ns), (xc, nc)) = (stable, canary);
    if ns == 0 || nc == 0 {
        return 0.0;
    }
    let (ns, nc) = (ns as f64, nc as f64);
    let pooled = (xs + xc) as f64 / (ns + nc);
    let se = (pooled * (1.0 - pooled) * (1.0 / ns + 1.0 / nc)).sqrt();
    if se == 0.0 {
        return 0.0;
    }
    (xc as f64 / nc - xs as f64 / ns) / se
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
    let min = spec.min_samples;
    parts.push(
        if stable.quality_sampled < min || canary.quality_sampled < min {
            format!(
                "quality not compared ({} vs {} scored answers, need {min})",
                canary.quality_sampled, stable.quality_sampled
            )
        } else {
            format!(
                "quality over {} vs {} scored answers",
                canary.quality_sampled, stable.quality_sampled
            )
        },
    );
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

    fn scored(n: u64, refusals: u64) -> VersionWindow {
        let mut w = fill(n, 0, 100, 20);
        for i in 0..n {
            let raised = crate::quality::signals::Signals {
                refusal: i < refusals,
                ..Default::default()
            };
            w.record_quality(&raised);
        }
        w
    }

    #[test]
    fn the_z_statistic_matches_a_hand_calculation() {
        // 0 of 100 against 10 of 100: pooled 0.05, se = sqrt(0.05 * 0.95 * 0.02) = 0.030822,
        // z = 0.1 / 0.030822 = 3.2444.
        let z = two_proportion_z((0, 100), (10, 100));
        assert!(
            (z - 0.1 / (0.05f64 * 0.95 * 0.02).sqrt()).abs() < 1e-12,
            "{z}"
        );
        assert!((z - 3.2444).abs() < 1e-3);
        assert_eq!(two_proportion_z((0, 100), (0, 100)), 0.0);
        assert_eq!(two_proportion_z((0, 0), (5, 10)), 0.0);
        assert!(
            two_proportion_z((10, 100), (0, 100)) < 0.0,
            "one-sided: better is no breach"
        );
    }

    #[test]
    fn a_significantly_worse_quality_signal_is_a_breach_naming_it() {
        let spec = analysis();
        let found = breaches(&spec, &scored(100, 0), &scored(100, 10));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("refusal rate 10.00% on canary vs 0.00% on stable"),
            "{found:?}"
        );
        assert!(found[0].contains("z = 3.24 > 2.326"), "{found:?}");
        // 2 in 100 against 1 in 100 is noise.
        assert!(breaches(&spec, &scored(100, 1), &scored(100, 2)).is_empty());
        // Too few scored answers: not judged, and the summary says so.
        let (s, c) = (scored(20, 0), scored(20, 20));
        assert!(breaches(&spec, &s, &c).is_empty());
        assert!(
            summary(&spec, &s, &c)
                .contains("quality not compared (20 vs 20 scored answers, need 50)")
        );
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
