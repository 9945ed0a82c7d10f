//! The degradation state machine, tick by tick on injected `Instant`s.

use std::time::Instant;

use super::machine::Degrader;
use super::signals::Signals;
use super::testkit::{depth, secs, three_levels};

/// Ticks once a second over `from..to` seconds after `t0` with the same signals; returns the
/// level after each tick.
fn run(d: &mut Degrader, t0: Instant, from: u64, to: u64, s: &Signals) -> Vec<usize> {
    let policy = three_levels();
    (from..to)
        .map(|i| {
            d.tick(&policy, s, t0 + secs(i));
            d.level()
        })
        .collect()
}

/// The seconds (relative to `from`) at which the level changed, and the levels it changed to.
fn changes(levels: &[usize], start: usize) -> Vec<(usize, usize)> {
    let mut last = start;
    let mut out = Vec::new();
    for (i, &l) in levels.iter().enumerate() {
        if l != last {
            out.push((i, l));
            last = l;
        }
    }
    out
}

#[test]
fn a_flood_raises_one_level_per_dwell() {
    let t0 = Instant::now();
    let mut d = Degrader::new(t0);
    let levels = run(&mut d, t0, 0, 120, &depth(10_000));
    // Level 0 has no dwell; each later level holds 30s before the next.
    assert_eq!(changes(&levels, 0), [(0, 1), (30, 2), (60, 3)]);
    assert_eq!(d.transitions(), 3);
}

#[test]
fn every_rise_names_the_signal_and_threshold() {
    let policy = three_levels();
    let t0 = Instant::now();
    let mut d = Degrader::new(t0);
    let flood = Signals {
        queue_depth: Some(75),
        kv_usage: Some(0.97),
        ..Signals::default()
    };
    let up = d.tick(&policy, &flood, t0).expect("enters level 1");
    assert_eq!((up.from, up.to), (0, 1));
    assert_eq!(
        up.reason,
        "enter `cap_free`: queue_depth 75 ≥ 50, kv_usage 0.97 ≥ 0.9"
    );
    let up = d
        .tick(&policy, &flood, t0 + secs(30))
        .expect("enters level 2");
    assert_eq!(up.reason, "enter `refuse_long`: kv_usage 0.97 ≥ 0.95");
}

#[test]
fn dwell_holds_a_level_even_when_signals_clear_at_once() {
    let t0 = Instant::now();
    let mut d = Degrader::new(t0);
    assert_eq!(run(&mut d, t0, 0, 1, &depth(60)), [1]);
    let levels = run(&mut d, t0, 1, 40, &depth(0));
    assert_eq!(
        changes(&levels, 1),
        [(29, 0)],
        "falls at t0 + 30s, not before"
    );
}

#[test]
fn recovery_steps_down_in_reverse_order_one_dwell_apart() {
    let t0 = Instant::now();
    let mut d = Degrader::new(t0);
    run(&mut d, t0, 0, 61, &depth(10_000));
    assert_eq!(d.level(), 3);
    // No samples at all counts as clear, like a depth below every exit threshold.
    let levels = run(&mut d, t0, 61, 200, &Signals::default());
    assert_eq!(changes(&levels, 3), [(29, 2), (59, 1), (89, 0)]);
    let policy = three_levels();
    let mut again = Degrader::new(t0);
    run(&mut again, t0, 0, 61, &depth(10_000));
    let down = again
        .tick(&policy, &depth(3), t0 + secs(90))
        .expect("leaves 3");
    assert_eq!((down.from, down.to), (3, 2));
    assert_eq!(
        down.reason,
        "leave `shed_free`: queue_depth 3 < 150, kv_usage no samples (exit < 0.96)"
    );
}

#[test]
fn partial_recovery_stops_at_the_level_still_warranted() {
    let t0 = Instant::now();
    let mut d = Degrader::new(t0);
    run(&mut d, t0, 0, 61, &depth(10_000));
    // 120 is below level 3's exit (150) and level 2's entry (100) is still met, but not below
    // level 2's exit (60): settle at 2.
    let levels = run(&mut d, t0, 61, 300, &depth(120));
    assert_eq!(changes(&levels, 3), [(29, 2)]);
}

#[test]
fn a_signal_between_exit_and_entry_never_flaps() {
    let policy = three_levels();
    let t0 = Instant::now();
    let mut d = Degrader::new(t0);
    // Oscillates across level 1's entry (50) and inside its hysteresis band (20..50).
    for i in 0..600 {
        let s = depth(if i % 2 == 0 { 50 } else { 20 + (i % 30) });
        d.tick(&policy, &s, t0 + secs(i));
        assert_eq!(d.level(), 1, "tick {i}");
    }
    assert_eq!(d.transitions(), 1);
    // Same at level 2: oscillating between its exit (60) and entry (100) holds it.
    let mut d = Degrader::new(t0);
    run(&mut d, t0, 0, 31, &depth(100));
    assert_eq!(d.level(), 2);
    for i in 31..400 {
        let s = depth(if i % 3 == 0 { 99 } else { 60 });
        d.tick(&policy, &s, t0 + secs(i));
        assert_eq!(d.level(), 2, "tick {i}");
    }
}

#[test]
fn entry_is_at_or_above_and_exit_strictly_below() {
    let policy = three_levels();
    let t0 = Instant::now();
    let mut d = Degrader::new(t0);
    assert_eq!(d.tick(&policy, &depth(49), t0), None);
    let kv_at = Signals {
        kv_usage: Some(0.9),
        ..Signals::default()
    };
    assert!(
        d.tick(&policy, &kv_at, t0).is_some(),
        "kv exactly 0.9 enters"
    );
    let mut d = Degrader::new(t0);
    assert!(
        d.tick(&policy, &depth(50), t0).is_some(),
        "exactly 50 enters"
    );
    let later = t0 + secs(31);
    assert_eq!(
        d.tick(&policy, &depth(20), later),
        None,
        "exactly the exit threshold stays"
    );
    assert!(
        d.tick(&policy, &depth(19), later).is_some(),
        "19 < 20 leaves"
    );
}

#[test]
fn a_forced_level_wins_and_release_returns_to_automation() {
    let policy = three_levels();
    let t0 = Instant::now();
    let mut d = Degrader::new(t0);
    let forced = d.force(Some(3), t0).expect("jumps at once");
    assert_eq!((forced.from, forced.to), (0, 3));
    assert!(forced.reason.contains("admin"), "{}", forced.reason);
    assert_eq!(d.actions(&policy).level(), 3);
    // Clear signals for long past the dwell: still held.
    assert!(run(&mut d, t0, 1, 100, &depth(0)).iter().all(|&l| l == 3));
    // Forced low under a flood: held low.
    assert!(d.force(Some(1), t0 + secs(100)).is_some());
    assert!(
        run(&mut d, t0, 100, 200, &depth(10_000))
            .iter()
            .all(|&l| l == 1)
    );
    assert_eq!(
        d.force(Some(1), t0 + secs(200)),
        None,
        "same level: no transition"
    );
    // Released: the flood takes it up again, one dwell at a time from the forced entry.
    assert_eq!(d.force(None, t0 + secs(200)), None);
    assert_eq!(d.forced(), None);
    let levels = run(&mut d, t0, 200, 260, &depth(10_000));
    assert_eq!(changes(&levels, 1), [(0, 2), (30, 3)]);
}

#[test]
fn a_level_past_a_shrunk_policy_is_brought_down_to_its_last() {
    let mut policy = three_levels();
    let t0 = Instant::now();
    let mut d = Degrader::new(t0);
    d.force(Some(7), t0);
    let clamp = d.tick(&policy, &depth(0), t0 + secs(1)).expect("clamped");
    assert_eq!(clamp.to, 3);
    d.force(None, t0 + secs(2));
    policy.levels.truncate(1);
    let shrunk = d.tick(&policy, &depth(0), t0 + secs(3)).expect("shrunk");
    assert_eq!((shrunk.from, shrunk.to), (3, 1));
    assert!(d.actions(&policy).for_tier("free").cap_max_tokens.is_some());
}
