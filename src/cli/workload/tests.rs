//! Plan tests: reproducibility, arrival counts and densities for every arrival kind, overrides.

use std::path::Path;
use std::time::Duration;

use super::*;

/// Parses a test workload from YAML.
pub(super) fn workload(yaml: &str) -> Workload {
    parse(yaml, Path::new("test.yaml"), "test", None).expect("test workload parses")
}

/// A minimal open-loop workload with tiny prompts, for counting arrivals.
pub(super) fn tiny(arrival: &str, duration: &str) -> Workload {
    workload(&format!(
        "seed: 1\nduration: {duration}\narrival: {arrival}\n\
         prompt_tokens: {{dist: fixed, value: 4}}\noutput_tokens: {{dist: fixed, value: 2}}\n"
    ))
}

/// Asserts `n` is within 3 sigma of a Poisson count with mean `expected`.
pub(super) fn within_3_sigma(n: usize, expected: f64) {
    let sigma = expected.sqrt();
    assert!(
        (n as f64 - expected).abs() <= 3.0 * sigma,
        "{n} arrivals, expected {expected} ± {:.1}",
        3.0 * sigma
    );
}

fn count_between(plan: &[PlannedRequest], from: f64, to: f64) -> usize {
    let secs = |r: &PlannedRequest| r.at.as_secs_f64();
    plan.iter()
        .filter(|r| secs(r) >= from && secs(r) < to)
        .count()
}

#[test]
fn seeded_plans_are_reproducible_and_differ_by_seed() {
    let w = load("chat").expect("chat loads");
    let o = Overrides {
        duration: Some(Duration::from_secs(10)),
        ..Overrides::default()
    };
    let a = w.plan(&o).expect("plan");
    let b = w.plan(&o).expect("plan");
    assert!(!a.is_empty());
    assert_eq!(a, b);
    let other = w
        .plan(&Overrides {
            seed: Some(43),
            ..o
        })
        .expect("plan");
    assert_ne!(a, other);
    let streamed: Vec<_> = w.requests(&o).expect("stream").collect();
    assert_eq!(a, streamed);
    assert!(
        a.windows(2)
            .all(|p| p[0].at <= p[1].at && p[0].id + 1 == p[1].id)
    );
}

#[test]
fn poisson_count_is_rate_times_duration() {
    let plan = tiny("{poisson: {rate: 20}}", "100s").plan(&Overrides::default());
    let plan = plan.expect("plan");
    within_3_sigma(plan.len(), 2000.0);
    assert!(plan.iter().all(|r| r.at < Duration::from_secs(100)));
    // The rate override replaces the Poisson rate, the duration override the run length.
    let o = Overrides {
        rate: Some(50.0),
        duration: Some(Duration::from_secs(40)),
        seed: Some(9),
    };
    let faster = tiny("{poisson: {rate: 20}}", "100s")
        .plan(&o)
        .expect("plan");
    within_3_sigma(faster.len(), 2000.0);
}

#[test]
fn burst_window_is_factor_times_denser() {
    let w = tiny(
        "{burst: {rate: 10, factor: 10, start: 20s, length: 10s}}",
        "60s",
    );
    let plan = w.plan(&Overrides::default()).expect("plan");
    let inside = count_between(&plan, 20.0, 30.0);
    let outside = plan.len() - inside;
    within_3_sigma(inside, 1000.0);
    within_3_sigma(outside, 500.0);
    let density = (inside as f64 / 10.0) / (outside as f64 / 50.0);
    assert!((density - 10.0).abs() < 1.5, "density ratio {density}");
    // A rate override moves the base rate; the window keeps its factor.
    let o = Overrides {
        rate: Some(20.0),
        ..Overrides::default()
    };
    let doubled = w.plan(&o).expect("plan");
    within_3_sigma(count_between(&doubled, 20.0, 30.0), 2000.0);
}

#[test]
fn stages_ramp_and_set_the_default_duration() {
    let w = tiny(
        "{stages: [{rate: 5, duration: 30s}, {rate: 40, duration: 30s}]}",
        "60s",
    );
    let plan = w.plan(&Overrides::default()).expect("plan");
    within_3_sigma(count_between(&plan, 0.0, 30.0), 150.0);
    within_3_sigma(count_between(&plan, 30.0, 60.0), 1200.0);
    // Scaling to a mean of 45/s multiplies each stage by 2.
    let o = Overrides {
        rate: Some(45.0),
        ..Overrides::default()
    };
    let scaled = w.plan(&o).expect("plan");
    within_3_sigma(count_between(&scaled, 0.0, 30.0), 300.0);
    let no_duration = workload(
        "arrival: {stages: [{rate: 1, duration: 5s}, {rate: 2, duration: 10s}]}\n\
         prompt_tokens: {dist: fixed, value: 1}\noutput_tokens: {dist: fixed, value: 1}\n",
    );
    assert_eq!(no_duration.duration, Duration::from_secs(15));
}

#[test]
fn closed_loop_plans_at_time_zero() {
    let w = tiny("{closed: {concurrency: 4}}", "10s");
    assert_eq!(w.concurrency(), Some(4));
    let plan = w.plan(&Overrides::default()).expect("plan");
    assert_eq!(plan.len(), 40);
    assert!(plan.iter().all(|r| r.at.is_zero()));
    let o = Overrides {
        rate: Some(3.0),
        ..Overrides::default()
    };
    assert!(w.plan(&o).expect_err("rate").contains("closed loop"));
    let capped = workload(
        "arrival: {closed: {concurrency: 2}}\nrequests: 7\n\
         prompt_tokens: {dist: fixed, value: 1}\noutput_tokens: {dist: fixed, value: 1}\n",
    );
    assert_eq!(capped.plan(&Overrides::default()).expect("plan").len(), 7);
    assert_eq!(tiny("{poisson: {rate: 1}}", "1s").concurrency(), None);
}

#[test]
fn bad_overrides_are_refused() {
    let o = Overrides {
        rate: Some(f64::NAN),
        ..Overrides::default()
    };
    assert!(tiny("{poisson: {rate: 1}}", "1s").plan(&o).is_err());
}
