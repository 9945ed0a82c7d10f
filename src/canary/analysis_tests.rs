//! The canary state machine, window by window on injected `Instant`s.

use std::time::{Duration, Instant};

use super::analysis::{Canary, Decision};
use super::testkit::{secs, spec};

/// Requests, errors, TTFT ms and largest inter-token gap ms of one version in one window.
type Load = (u64, u64, u64, u64);

const HEALTHY: Load = (100, 1, 100, 20);

/// Records `stable` and `canary` at `at`, then ticks 60s later; returns the tick's decision.
fn window(c: &mut Canary, at: Instant, stable: Load, canary: Load) -> Option<Decision> {
    for (version, (n, errors, ttft, itl)) in [(0, stable), (1, canary)] {
        for i in 0..n {
            let (ttft, itl) = (Duration::from_millis(ttft), Duration::from_millis(itl));
            c.record(version, i >= errors, Some(ttft), Some(itl), at);
        }
    }
    c.tick(at + secs(60))
}

fn canary_weight(c: &Canary) -> u32 {
    c.weights()[1].1
}

fn reason(d: &Option<Decision>) -> String {
    match d {
        Some(Decision::Hold { reason } | Decision::Rollback { reason }) => reason.clone(),
        Some(Decision::Promote { reason, .. } | Decision::Done { reason }) => reason.clone(),
        None => String::new(),
    }
}

#[test]
fn a_healthy_canary_is_promoted_through_the_schedule() {
    let t0 = Instant::now();
    let mut c = Canary::new(&spec(1), t0);
    assert_eq!(c.step(), 1);
    let mut seen = vec![canary_weight(&c)];
    for i in 0..4 {
        let d = window(&mut c, t0 + secs(60 * i), HEALTHY, HEALTHY);
        assert_eq!(d.as_ref().map(Decision::label), Some("promote"), "{d:?}");
        seen.push(canary_weight(&c));
    }
    assert_eq!(seen, [1, 5, 25, 50, 100]);
    assert_eq!(c.weights(), [("stable".into(), 0), ("canary".into(), 100)]);
    assert_eq!(c.step(), 5);
    let d = window(&mut c, t0 + secs(240), (0, 0, 0, 0), HEALTHY);
    assert_eq!(d.as_ref().map(Decision::label), Some("done"));
    assert_eq!(canary_weight(&c), 100);
}

#[test]
fn ticks_decide_once_per_window() {
    let t0 = Instant::now();
    let mut c = Canary::new(&spec(5), t0);
    c.record(0, true, None, None, t0);
    assert_eq!(c.tick(t0 + secs(59)), None);
    assert_eq!(c.status().samples[0].requests, 1);
    assert!(c.tick(t0 + secs(60)).is_some());
    assert_eq!(c.tick(t0 + secs(61)), None);
    // A request that finished before the new window began belongs to the judged one.
    c.record(1, false, None, None, t0 + secs(59));
    assert_eq!(c.status().samples[1].requests, 0);
}

#[test]
fn too_little_data_holds_and_never_promotes() {
    let t0 = Instant::now();
    let mut c = Canary::new(&spec(5), t0);
    let d = window(&mut c, t0, HEALTHY, (49, 0, 100, 20));
    assert_eq!(d.as_ref().map(Decision::label), Some("hold"));
    assert_eq!(
        reason(&d),
        "too little data: canary 49 and stable 100 requests, need 50 each"
    );
    let d = window(&mut c, t0 + secs(60), (10, 0, 100, 20), HEALTHY);
    assert_eq!(d.as_ref().map(Decision::label), Some("hold"));
    assert_eq!(canary_weight(&c), 5);
}

#[test]
fn errors_roll_back_at_once() {
    let t0 = Instant::now();
    let mut c = Canary::new(&spec(25), t0);
    let d = window(&mut c, t0, HEALTHY, (100, 10, 100, 20));
    assert_eq!(d.as_ref().map(Decision::label), Some("rollback"));
    assert_eq!(
        reason(&d),
        "error rate 10.00% on canary vs 1.00% on stable, above stable + 2.00 points"
    );
    assert_eq!(c.weights(), [("stable".into(), 100), ("canary".into(), 0)]);
    assert!(c.rolled_back());
    // Stragglers look healthy now; the rolled-back canary still never promotes.
    let d = window(&mut c, t0 + secs(60), HEALTHY, HEALTHY);
    assert!(reason(&d).starts_with("rolled back"), "{d:?}");
    assert_eq!(canary_weight(&c), 0);
}

#[test]
fn a_latency_regression_rolls_back() {
    let t0 = Instant::now();
    let mut c = Canary::new(&spec(5), t0);
    let d = window(&mut c, t0, HEALTHY, (100, 1, 160, 20));
    assert_eq!(d.as_ref().map(Decision::label), Some("rollback"));
    assert_eq!(
        reason(&d),
        "ttft p99 160.0ms on canary vs 100.0ms on stable, above 1.5× stable"
    );
    let mut c = Canary::new(&spec(5), t0);
    let d = window(&mut c, t0, HEALTHY, (100, 1, 100, 31));
    assert!(reason(&d).starts_with("inter-token p99 31.0ms on canary vs 20.0ms"));
    assert_eq!(canary_weight(&c), 0);
}

#[test]
fn the_kill_switch_mid_ramp_wins_over_a_healthy_window() {
    let t0 = Instant::now();
    let mut c = Canary::new(&spec(5), t0);
    assert!(window(&mut c, t0, HEALTHY, HEALTHY).is_some());
    assert_eq!(canary_weight(&c), 25);
    // Healthy traffic in the window, then the admin pulls the switch before it is judged.
    for v in [0, 1] {
        for _ in 0..100 {
            c.record(v, true, Some(secs(0)), None, t0 + secs(70));
        }
    }
    let d = c.rollback("bad outputs reported");
    assert_eq!(d.label(), "rollback");
    assert_eq!(canary_weight(&c), 0);
    // The next tick starts a fresh window; healthy windows after it still hold.
    assert_eq!(c.tick(t0 + secs(120)), None);
    let d = window(&mut c, t0 + secs(120), HEALTHY, HEALTHY);
    assert!(reason(&d).starts_with("rolled back"), "{d:?}");
    assert_eq!(canary_weight(&c), 0);
    assert!(c.promote().is_err());
    let status = c.status();
    assert!(status.rolled_back);
    assert_eq!(
        reason(&status.last_decision),
        "rolled back: promotion disarmed until resume or set weights"
    );
    // Resume re-arms; the admin restarts the ramp at its first step.
    c.resume();
    assert_eq!(c.promote().map(|d| d.label()), Ok("promote"));
    assert_eq!(canary_weight(&c), 1);
    assert_eq!(c.tick(t0 + secs(180)), None);
    window(&mut c, t0 + secs(180), HEALTHY, HEALTHY);
    assert_eq!(canary_weight(&c), 5);
}

#[test]
fn pause_holds_but_a_breach_still_rolls_back() {
    let t0 = Instant::now();
    let mut c = Canary::new(&spec(5), t0);
    c.pause();
    let d = window(&mut c, t0, HEALTHY, HEALTHY);
    assert!(reason(&d).starts_with("paused; canary vs stable"), "{d:?}");
    assert_eq!(canary_weight(&c), 5);
    c.resume();
    window(&mut c, t0 + secs(60), HEALTHY, HEALTHY);
    assert_eq!(canary_weight(&c), 25);
    c.pause();
    let d = window(&mut c, t0 + secs(120), HEALTHY, (100, 50, 100, 20));
    assert_eq!(d.as_ref().map(Decision::label), Some("rollback"));
    assert!(c.paused() && c.rolled_back());
}

#[test]
fn set_weights_validates_and_rearms() {
    let t0 = Instant::now();
    let mut c = Canary::new(&spec(5), t0);
    c.rollback("test");
    let w = |s: u32, k: u32| vec![("stable".to_string(), s), ("canary".to_string(), k)];
    assert!(
        c.set_weights(&w(90, 20))
            .unwrap_err()
            .contains("sum to 110")
    );
    assert!(
        c.set_weights(&[("stable".into(), 100)])
            .unwrap_err()
            .contains("no weight")
    );
    assert!(
        c.set_weights(&[("beta".into(), 100)])
            .unwrap_err()
            .contains("unknown")
    );
    assert!(c.rolled_back());
    c.set_weights(&[("canary".into(), 30), ("stable".into(), 70)])
        .unwrap();
    assert!(!c.rolled_back());
    assert_eq!(c.weights(), w(70, 30));
    assert_eq!(c.step(), 3);
    assert_eq!(c.tick(t0 + secs(1)), None);
    window(&mut c, t0 + secs(1), HEALTHY, HEALTHY);
    assert_eq!(canary_weight(&c), 50);
}

#[test]
fn a_schedule_ending_below_100_is_done_there() {
    let t0 = Instant::now();
    let mut s = spec(25);
    s.analysis.schedule = vec![10, 25];
    let mut c = Canary::new(&s, t0);
    let d = window(&mut c, t0, HEALTHY, HEALTHY);
    assert!(reason(&d).starts_with("schedule complete at 25%"), "{d:?}");
    assert!(c.promote().unwrap_err().contains("last step (25%)"));
    let status = c.status();
    assert_eq!((status.step, status.paused), (2, false));
    assert_eq!(c.name(1), Some("canary"));
    assert_eq!(c.model(1), Some("llama-canary"));
    assert_eq!(c.model(2), None);
}

/// Records `scored` quality-scored answers of `version` at `at`, `refusals` of them refusals.
fn score(c: &mut Canary, at: Instant, version: usize, scored: u64, refusals: u64) {
    for i in 0..scored {
        let raised = crate::quality::signals::Signals {
            refusal: i < refusals,
            ..Default::default()
        };
        c.record_quality(version, &raised, at);
    }
}

#[test]
fn a_canary_that_refuses_significantly_more_is_rolled_back_naming_the_signal() {
    let t0 = Instant::now();
    let mut c = Canary::new(&spec(25), t0);
    score(&mut c, t0, 0, 100, 1);
    score(&mut c, t0, 1, 100, 12);
    let d = window(&mut c, t0, HEALTHY, HEALTHY);
    assert_eq!(d.as_ref().map(Decision::label), Some("rollback"), "{d:?}");
    assert!(
        reason(&d).starts_with("refusal rate 12.00% on canary vs 1.00% on stable"),
        "{d:?}"
    );
    assert_eq!(canary_weight(&c), 0);
}

#[test]
fn equal_quality_or_too_few_scored_answers_do_not_stop_a_healthy_canary() {
    let t0 = Instant::now();
    let mut c = Canary::new(&spec(25), t0);
    score(&mut c, t0, 0, 100, 2);
    score(&mut c, t0, 1, 100, 3);
    let d = window(&mut c, t0, HEALTHY, HEALTHY);
    assert_eq!(d.as_ref().map(Decision::label), Some("promote"), "{d:?}");
    assert!(
        reason(&d).contains("quality over 100 vs 100 scored answers"),
        "{d:?}"
    );
    // All refusals, but 10 scored answers are under min_samples (50): not judged.
    let t1 = t0 + secs(60);
    score(&mut c, t1, 0, 10, 0);
    score(&mut c, t1, 1, 10, 10);
    let d = window(&mut c, t1, HEALTHY, HEALTHY);
    assert_eq!(d.as_ref().map(Decision::label), Some("promote"), "{d:?}");
    assert!(reason(&d).contains("quality not compared"), "{d:?}");
    // Scored before the current window began: ignored.
    let before = c.windows[1].quality_sampled;
    c.record_quality(1, &Default::default(), t0);
    assert_eq!(c.windows[1].quality_sampled, before);
}
