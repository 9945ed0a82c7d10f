//! Tests for the in-process limiter, on injected time.

use std::time::{Duration, Instant};

use super::*;

const S: Duration = Duration::from_secs(1);

fn tier(rpm: Option<u64>, tpm: Option<u64>, conc: Option<u32>) -> TierLimits {
    TierLimits {
        requests_per_minute: rpm,
        tokens_per_minute: tpm,
        max_concurrent: conc,
    }
}

fn wait_of(r: Result<Reservation, Rejection>) -> (Duration, LimitKind) {
    match r {
        Err(Rejection::RateLimited {
            retry_after, which, ..
        }) => (retry_after, which),
        other => panic!("expected RateLimited, got {other:?}"),
    }
}

#[test]
fn request_burst_then_exact_wait() {
    let (l, t0, limits) = (
        InProcessLimiter::new(),
        Instant::now(),
        tier(Some(3), None, None),
    );
    for _ in 0..3 {
        assert!(l.acquire("a", &limits, 10, t0).is_ok());
    }
    assert_eq!(
        wait_of(l.acquire("a", &limits, 10, t0)),
        (20 * S, LimitKind::Requests)
    );
    assert!(
        l.acquire("a", &limits, 10, t0 + 20 * S - Duration::from_nanos(1))
            .is_err()
    );
    assert!(l.acquire("a", &limits, 10, t0 + 20 * S).is_ok());
}

#[test]
fn long_prompts_throttle_one_tenant_and_not_another() {
    let (l, t0) = (InProcessLimiter::new(), Instant::now());
    let limits = tier(Some(100), Some(10_000), None);
    let (mut long_ok, mut short_ok) = (0, 0);
    for round in 0..5 {
        let now = t0 + round * 6 * S; // 1000 tokens replenish per round
        long_ok += u32::from(l.acquire("long", &limits, 4000, now).is_ok());
        short_ok += u32::from(l.acquire("short", &limits, 500, now).is_ok());
    }
    assert_eq!((long_ok, short_ok), (3, 5));
    let (wait, which) = wait_of(l.acquire("long", &limits, 4000, t0 + 24 * S));
    assert_eq!((wait, which), (12 * S, LimitKind::Tokens)); // round 3 reserved up to 36 s
}

#[test]
fn token_refusal_does_not_consume_a_request() {
    let (l, t0, limits) = (
        InProcessLimiter::new(),
        Instant::now(),
        tier(Some(2), Some(1000), None),
    );
    assert!(l.acquire("a", &limits, 900, t0).is_ok());
    assert_eq!(
        wait_of(l.acquire("a", &limits, 200, t0)).1,
        LimitKind::Tokens
    );
    assert!(l.acquire("a", &limits, 100, t0).is_ok());
    assert_eq!(
        wait_of(l.acquire("a", &limits, 0, t0)).1,
        LimitKind::Requests
    );
}

#[test]
fn reconcile_refunds_unused_tokens() {
    let (l, t0, limits) = (
        InProcessLimiter::new(),
        Instant::now(),
        tier(None, Some(1000), None),
    );
    let r = l.acquire("a", &limits, 1000, t0);
    assert!(matches!(r, Ok(Reservation { tokens: 1000, .. })));
    assert!(l.acquire("a", &limits, 900, t0).is_err());
    l.reconcile("a", 1000, 100, t0);
    assert!(l.acquire("a", &limits, 900, t0).is_ok());
    assert!(l.acquire("a", &limits, 1, t0).is_err());
}

#[test]
fn reconcile_charges_over_use() {
    let (l, t0, limits) = (
        InProcessLimiter::new(),
        Instant::now(),
        tier(None, Some(600), None),
    );
    assert!(l.acquire("a", &limits, 100, t0).is_ok());
    l.reconcile("a", 100, 700, t0); // 700 used of a 600 burst: 100 tokens of debt
    let (wait, _) = wait_of(l.acquire("a", &limits, 1, t0));
    assert_eq!(wait, Duration::from_millis(10_100)); // 101 tokens at 10 per second
    l.reconcile("nobody", 1, 2, t0); // unknown tenants are ignored
}

#[test]
fn concurrency_cap_release_and_no_request_consumed() {
    let (l, t0, limits) = (
        InProcessLimiter::new(),
        Instant::now(),
        tier(Some(3), None, Some(1)),
    );
    assert!(l.acquire_slot("a", &limits).is_ok());
    assert_eq!(
        l.acquire_slot("a", &limits),
        Err(Rejection::Concurrency { limit: 1 })
    );
    assert_eq!(l.in_flight("a"), 1);
    // The slot and the request budget are separate: the refused slot took no request.
    assert!(l.acquire("a", &limits, 1, t0).is_ok());
    l.release_concurrency("a");
    assert!(l.acquire_slot("a", &limits).is_ok());
    assert!(l.acquire("a", &limits, 1, t0).is_ok());
    l.release_concurrency("a");
    assert!(l.acquire_slot("a", &limits).is_ok());
    assert!(l.acquire("a", &limits, 1, t0).is_ok()); // third of three
    l.release_concurrency("a");
    assert_eq!(
        wait_of(l.acquire("a", &limits, 1, t0)).1,
        LimitKind::Requests
    );
    assert_eq!(l.in_flight("a"), 0);
    // A slot guard gives its slot back when dropped.
    let shared: std::sync::Arc<dyn Limiter> = std::sync::Arc::new(InProcessLimiter::new());
    let slot = crate::limits::ConcurrencySlot::take(shared.clone(), "b", &limits);
    assert!(slot.is_ok());
    assert!(crate::limits::ConcurrencySlot::take(shared.clone(), "b", &limits).is_err());
    drop(slot);
    assert!(crate::limits::ConcurrencySlot::take(shared, "b", &limits).is_ok());
}

#[test]
fn a_tier_without_a_concurrency_limit_counts_no_slots() {
    let l = std::sync::Arc::new(InProcessLimiter::new());
    let shared: std::sync::Arc<dyn Limiter> = l.clone();
    let unlimited = TierLimits::default();
    let slots: Vec<_> = (0..3)
        .map(|_| crate::limits::ConcurrencySlot::take(shared.clone(), "c", &unlimited))
        .collect();
    assert!(slots.iter().all(Result::is_ok));
    assert_eq!(l.tenant_count(), 0, "no state kept for an unlimited tier");
    drop(slots);
    // With a limit, slots count again and the limit holds.
    let one = TierLimits {
        max_concurrent: Some(1),
        ..TierLimits::default()
    };
    let held = crate::limits::ConcurrencySlot::take(shared.clone(), "c", &one);
    assert!(held.is_ok());
    assert_eq!(l.in_flight("c"), 1);
    assert!(crate::limits::ConcurrencySlot::take(shared, "c", &one).is_err());
    drop(held);
    assert_eq!(l.in_flight("c"), 0);
}

#[test]
fn larger_than_the_token_burst_never_passes() {
    let (l, t0, limits) = (
        InProcessLimiter::new(),
        Instant::now(),
        tier(Some(10), Some(1000), None),
    );
    let r = l.acquire("a", &limits, 1001, t0);
    assert_eq!(
        r,
        Err(Rejection::TooLarge {
            tokens: 1001,
            burst: 1000
        })
    );
    assert!(
        r.err()
            .is_some_and(|e| e.to_string().contains("never pass"))
    );
    assert_eq!(
        l.acquire("a", &limits, 1, t0)
            .map(|r| r.headers.remaining_requests),
        Ok(Some(9))
    );
}

#[test]
fn headers_on_success_and_refusal() {
    let (l, t0, limits) = (
        InProcessLimiter::new(),
        Instant::now(),
        tier(Some(60), Some(6000), None),
    );
    let Ok(res) = l.acquire("a", &limits, 1000, t0) else {
        panic!("must pass")
    };
    let want = RateHeaders {
        limit_requests: Some(60),
        remaining_requests: Some(59),
        reset_requests: Some(S),
        limit_tokens: Some(6000),
        remaining_tokens: Some(5000),
        reset_tokens: Some(10 * S),
    };
    assert_eq!(res.headers, want);
    let pairs = res.headers.header_pairs();
    assert!(pairs.contains(&("x-ratelimit-reset-tokens", "10s".to_owned())));
    assert!(pairs.contains(&("x-ratelimit-remaining-requests", "59".to_owned())));
    assert_eq!(pairs.len(), 6);

    let Err(Rejection::RateLimited {
        retry_after,
        headers,
        ..
    }) = l.acquire("a", &limits, 5500, t0)
    else {
        panic!("must wait")
    };
    assert_eq!(retry_after, 5 * S); // 500 tokens short at 100 per second
    assert_eq!(
        (headers.remaining_tokens, headers.remaining_requests),
        (Some(5000), Some(59))
    );
}

#[test]
fn unlimited_tier_always_passes_with_no_headers() {
    let (l, t0) = (InProcessLimiter::new(), Instant::now());
    for _ in 0..1000 {
        let r = l.acquire("a", &TierLimits::default(), 1_000_000, t0);
        assert!(r.is_ok_and(|r| r.headers.header_pairs().is_empty()));
    }
}

#[test]
fn changed_tier_rebuilds_cells() {
    let (l, t0) = (InProcessLimiter::new(), Instant::now());
    assert!(l.acquire("a", &tier(Some(1), None, None), 1, t0).is_ok());
    assert!(l.acquire("a", &tier(Some(1), None, None), 1, t0).is_err());
    assert!(l.acquire("a", &tier(Some(2), None, None), 1, t0).is_ok());
    assert!(l.acquire("a", &tier(None, None, None), 1, t0).is_ok());
}

#[test]
fn a_thousand_tenants_are_independent() {
    let (l, t0, limits) = (
        InProcessLimiter::new(),
        Instant::now(),
        tier(Some(5), Some(500), None),
    );
    let names: Vec<String> = (0..1000).map(|i| format!("tenant-{i}")).collect();
    for name in &names {
        for _ in 0..5 {
            assert!(l.acquire(name, &limits, 100, t0).is_ok());
        }
    }
    for name in &names {
        assert!(l.acquire(name, &limits, 1, t0).is_err());
        l.reconcile(name, 100, 0, t0);
    }
    assert_eq!(l.tenant_count(), 1000);
    assert!(
        names
            .iter()
            .all(|n| l.acquire(n, &limits, 100, t0 + 12 * S).is_ok())
    );
}
