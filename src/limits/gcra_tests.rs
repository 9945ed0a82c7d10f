//! Tests for the GCRA cell, with hand-computed values on injected time.

use super::*;

const S: Duration = Duration::from_secs(1);

#[test]
fn burst_of_n_passes_then_waits_exactly_one_interval() {
    let t0 = Instant::now();
    let mut g = Gcra::new(10, 0);
    for i in 0..10 {
        assert!(
            matches!(g.check(1, t0), Decision::Allowed { remaining, .. } if remaining == 9 - i)
        );
    }
    let d = g.check(1, t0);
    assert_eq!(
        d,
        Decision::Wait {
            retry_after: 6 * S,
            remaining: 0,
            reset: 60 * S
        }
    );
    // Just before: still waits (100 ms); at exactly 6 s: passes.
    let almost = t0 + 6 * S - Duration::from_millis(100);
    assert!(
        matches!(g.check(1, almost), Decision::Wait { retry_after, .. } if retry_after == Duration::from_millis(100))
    );
    assert!(matches!(
        g.check(1, t0 + 6 * S),
        Decision::Allowed { remaining: 0, .. }
    ));
}

#[test]
fn uneven_interval_rounds_up_and_waiting_it_is_enough() {
    let t0 = Instant::now();
    let mut g = Gcra::new(7, 0);
    assert!(matches!(
        g.check(7, t0),
        Decision::Allowed { remaining: 0, .. }
    ));
    let Decision::Wait { retry_after, .. } = g.check(1, t0) else {
        panic!("must wait")
    };
    assert_eq!(retry_after, Duration::from_nanos(8_571_428_572)); // 60/7 s, rounded up
    assert_eq!(g.emission_interval(), retry_after);
    assert!(matches!(
        g.check(1, t0 + retry_after),
        Decision::Allowed { .. }
    ));
}

#[test]
fn weighted_costs_and_never() {
    let t0 = Instant::now();
    let mut g = Gcra::new(6000, 0); // 100 units per second
    assert_eq!(g.check(6001, t0), Decision::Never { burst: 6000 });
    assert_eq!(
        g.check(5000, t0),
        Decision::Allowed {
            remaining: 1000,
            reset: 50 * S
        }
    );
    // 2000 needs 1000 more units: 10 s.
    assert_eq!(
        g.check(2000, t0),
        Decision::Wait {
            retry_after: 10 * S,
            remaining: 1000,
            reset: 50 * S
        }
    );
    assert_eq!(g.remaining(t0 + 5 * S), 1500);
    assert_eq!(g.reset(t0 + 5 * S), 45 * S);
    assert_eq!(g.remaining(t0 + 120 * S), 6000);
}

#[test]
fn explicit_burst_smaller_than_rate() {
    let t0 = Instant::now();
    let mut g = Gcra::new(60, 5);
    assert_eq!(g.remaining(t0), 5);
    assert!(matches!(g.check(5, t0), Decision::Allowed { remaining: 0, reset } if reset == 5 * S));
    assert!(matches!(g.check(1, t0), Decision::Wait { retry_after, .. } if retry_after == S));
    assert_eq!(g.check(6, t0), Decision::Never { burst: 5 });
}

#[test]
fn refund_makes_room_but_never_beyond_full() {
    let t0 = Instant::now();
    let mut g = Gcra::new(1000, 0);
    assert!(matches!(
        g.check(1000, t0),
        Decision::Allowed { remaining: 0, .. }
    ));
    g.refund(900, t0);
    assert_eq!(g.remaining(t0), 900);
    assert!(matches!(
        g.check(900, t0),
        Decision::Allowed { remaining: 0, .. }
    ));
    g.refund(5000, t0);
    assert_eq!(g.remaining(t0), 1000);
    assert_eq!(g.reset(t0), Duration::ZERO);
}

#[test]
fn charge_goes_into_debt_and_delays() {
    let t0 = Instant::now();
    let mut g = Gcra::new(60, 0); // one unit per second
    g.charge(90, t0); // 30 units of debt beyond the burst
    assert_eq!(g.remaining(t0), 0);
    assert_eq!(g.reset(t0), 90 * S);
    assert!(matches!(g.check(1, t0), Decision::Wait { retry_after, .. } if retry_after == 31 * S));
    assert!(matches!(g.check(1, t0 + 31 * S), Decision::Allowed { .. }));
}

#[test]
fn fresh_cell_and_zero_cost() {
    let t0 = Instant::now();
    let mut g = Gcra::new(0, 0);
    assert_eq!((g.per_minute(), g.burst()), (1, 1));
    assert_eq!(g.remaining(t0), 1);
    assert_eq!(
        g.check(0, t0),
        Decision::Allowed {
            remaining: 1,
            reset: Duration::ZERO
        }
    );
}
