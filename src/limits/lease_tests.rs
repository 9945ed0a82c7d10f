use super::*;

const CFG: LeaseSettings = LeaseSettings {
    requests: 5,
    tokens: 1_000,
    slots: 2,
    hold: Duration::from_secs(10),
};

fn rpm(n: u64) -> TierLimits {
    TierLimits {
        requests_per_minute: Some(n),
        ..TierLimits::default()
    }
}

fn both(r: u64, t: u64) -> TierLimits {
    TierLimits {
        requests_per_minute: Some(r),
        tokens_per_minute: Some(t),
        max_concurrent: None,
    }
}

/// Redis granting what it was asked for, `left` units still in each cell.
fn grant(ask: Ask, left: (u64, u64)) -> Answer {
    Answer::Granted {
        granted: (
            ask.requests_need + ask.requests_more,
            ask.tokens_need + ask.tokens_more,
        ),
        left,
        reset: (Duration::from_secs(60), Duration::from_secs(60)),
        next: (Duration::from_secs(1), Duration::from_secs(1)),
        slots: ask.slots(),
        slots_left: 10,
    }
}

fn fetch(step: Step) -> Ask {
    match step {
        Step::Fetch(ask) => ask,
        other => panic!("expected a fetch, got {other:?}"),
    }
}

#[test]
fn the_first_request_fetches_its_need_and_one_block_then_admits_locally() {
    let (mut l, now, limits) = (TenantLease::default(), Instant::now(), rpm(60));
    let ask = fetch(l.admit(CFG, &limits, 10, now));
    assert_eq!((ask.requests_need, ask.requests_more), (1, 5));
    assert_eq!((ask.tokens_need, ask.tokens_more), (0, 0));
    let step = l.fetched((CFG, &limits), (ask, grant(ask, (54, 0))), 10, now);
    assert!(matches!(step, Step::Admitted(_)), "{step:?}");
    assert_eq!(l.held(), (5, 0));
    // The next five pass without Redis; the headers count the fleet's cell plus the lease.
    for left in (0..5).rev() {
        match l.admit(CFG, &limits, 10, now) {
            Step::Admitted(h) => assert_eq!(h.remaining_requests, Some(54 + left)),
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(l.admit(CFG, &limits, 10, now), Step::Fetch(_)));
}

#[test]
fn a_renewal_tops_up_below_half_a_block_once_at_a_time() {
    let (mut l, now, limits) = (TenantLease::default(), Instant::now(), rpm(60));
    let ask = fetch(l.admit(CFG, &limits, 1, now));
    l.fetched((CFG, &limits), (ask, grant(ask, (50, 0))), 1, now);
    assert_eq!(l.renewal(CFG, &limits, now), None, "5 of 5 held");
    for _ in 0..3 {
        assert!(matches!(l.admit(CFG, &limits, 1, now), Step::Admitted(_)));
    }
    // 2 held: below half of 5.
    let renew = l.renewal(CFG, &limits, now).expect("a renewal");
    assert_eq!((renew.requests_need, renew.requests_more), (0, 3));
    assert_eq!(l.renewal(CFG, &limits, now), None, "one at a time");
    // A fetch while the renewal is under way counts it: it asks only for its need.
    assert!(matches!(l.admit(CFG, &limits, 1, now), Step::Admitted(_)));
    assert!(matches!(l.admit(CFG, &limits, 1, now), Step::Admitted(_)));
    let ask = fetch(l.admit(CFG, &limits, 1, now));
    assert_eq!((ask.requests_need, ask.requests_more), (1, 2));
    l.renewed(CFG, renew, Some(grant(renew, (40, 0))), now);
    assert_eq!(l.held(), (3, 0));
    l.fetched((CFG, &limits), (ask, grant(ask, (37, 0))), 1, now);
    // Never more than one block held.
    assert_eq!(l.held(), (5, 0));
}

#[test]
fn a_dry_cell_refuses_locally_until_redis_said_it_refills() {
    let (mut l, now, limits) = (TenantLease::default(), Instant::now(), rpm(60));
    let ask = fetch(l.admit(CFG, &limits, 1, now));
    // The cell had only 2 left: granted 2, now dry for 1 s.
    let answer = Answer::Granted {
        granted: (2, 0),
        left: (0, 0),
        reset: (Duration::from_secs(60), Duration::ZERO),
        next: (Duration::from_secs(1), Duration::ZERO),
        slots: 0,
        slots_left: 0,
    };
    assert!(matches!(
        l.fetched((CFG, &limits), (ask, answer), 1, now),
        Step::Admitted(_)
    ));
    assert!(matches!(l.admit(CFG, &limits, 1, now), Step::Admitted(_)));
    let later = now + Duration::from_millis(400);
    match l.admit(CFG, &limits, 1, later) {
        Step::Refused {
            which, retry_after, ..
        } => {
            assert_eq!(which, LimitKind::Requests);
            assert_eq!(retry_after, Duration::from_millis(600));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        l.renewal(CFG, &limits, later),
        None,
        "no renewal of a dry cell"
    );
    // Once Redis's wait is over the next request asks again.
    assert!(matches!(
        l.admit(CFG, &limits, 1, now + Duration::from_secs(1)),
        Step::Fetch(_)
    ));
}

#[test]
fn a_refused_fetch_takes_nothing_and_keeps_the_exact_wait() {
    let (mut l, now, limits) = (TenantLease::default(), Instant::now(), both(60, 1_000));
    let ask = fetch(l.admit(CFG, &limits, 900, now));
    assert_eq!((ask.tokens_need, ask.tokens_more), (900, 1_000));
    let refused = Answer::Refused {
        which: LimitKind::Tokens,
        retry_after: Duration::from_millis(2_500),
    };
    match l.fetched((CFG, &limits), (ask, refused), 900, now) {
        Step::Refused {
            which, retry_after, ..
        } => assert_eq!(
            (which, retry_after),
            (LimitKind::Tokens, Duration::from_millis(2_500))
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(l.held(), (0, 0));
    // The next request short of tokens is refused locally with the rest of that wait.
    match l.admit(CFG, &limits, 10, now + Duration::from_secs(1)) {
        Step::Refused { retry_after, .. } => {
            assert_eq!(retry_after, Duration::from_millis(1_500));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_request_larger_than_the_token_burst_never_passes() {
    let mut l = TenantLease::default();
    assert_eq!(
        l.admit(CFG, &both(10, 500), 501, Instant::now()),
        Step::TooLarge { burst: 500 }
    );
}

#[test]
fn blocks_are_capped_by_the_limit() {
    let (mut l, now, limits) = (TenantLease::default(), Instant::now(), rpm(2));
    let ask = fetch(l.admit(CFG, &limits, 1, now));
    assert_eq!((ask.requests_need, ask.requests_more), (1, 2));
}

#[test]
fn settling_returns_unused_tokens_to_the_lease_and_trims_past_two_blocks() {
    let (mut l, now, limits) = (TenantLease::default(), Instant::now(), both(60, 10_000));
    let ask = fetch(l.admit(CFG, &limits, 900, now));
    l.fetched((CFG, &limits), (ask, grant(ask, (50, 8_100))), 900, now);
    assert_eq!(l.held().1, 1_000);
    assert_eq!(l.settle(CFG, Some(10_000), (900, 100)), 0);
    assert_eq!(l.held().1, 1_800);
    // Past two blocks: back to one, the rest goes back to Redis.
    assert_eq!(l.settle(CFG, Some(10_000), (900, 600)), 2_100 - 1_000);
    assert_eq!(l.held().1, 1_000);
    // A charge past the reservation is a debt the lease pays.
    assert_eq!(l.settle(CFG, Some(10_000), (100, 1_500)), 0);
    assert_eq!(l.held().1, -400);
    let ask = fetch(l.admit(CFG, &limits, 10, now));
    assert_eq!((ask.tokens_need, ask.tokens_more), (410, 1_000));
    assert_eq!(
        l.settle(CFG, None, (5, 1)),
        0,
        "no token limit, nothing held"
    );
}

#[test]
fn an_unused_lease_expires_after_its_hold_and_gives_its_units_back() {
    let (mut l, now, limits) = (TenantLease::default(), Instant::now(), both(60, 10_000));
    let ask = fetch(l.admit(CFG, &limits, 100, now));
    l.fetched((CFG, &limits), (ask, grant(ask, (50, 8_000))), 100, now);
    assert_eq!(l.expire(now + Duration::from_secs(9)), None);
    assert_eq!(l.expire(now + CFG.hold), Some(((5, 1_000), Vec::new())));
    assert_eq!(l.held(), (0, 0));
    assert_eq!(l.expire(now + Duration::from_secs(30)), None, "once");
}

#[test]
fn a_fetch_redis_never_answered_is_forgotten() {
    let (mut l, now, limits) = (TenantLease::default(), Instant::now(), rpm(60));
    let ask = fetch(l.admit(CFG, &limits, 1, now));
    l.abandon(ask);
    assert_eq!(l, TenantLease::default());
}

#[test]
fn the_fleet_admits_at_most_the_limit_plus_one_block_per_replica_in_a_window() {
    // Four replicas lease from one cell of 60 a minute (no refill inside the burst): whatever
    // the order, the fleet admits the cell's 60 and no more; what a replica still holds is what
    // it may carry into the next window (at most one block each).
    let (now, limits) = (Instant::now(), rpm(60));
    let mut cell = 60u64;
    let mut replicas = vec![TenantLease::default(); 4];
    let mut admitted = 0u64;
    for i in 0..400usize {
        let l = &mut replicas[(i * 7 + i / 3) % 4];
        match l.admit(CFG, &limits, 1, now) {
            Step::Admitted(_) => admitted += 1,
            Step::Refused { .. } => {}
            Step::Fetch(ask) => {
                let answer = if ask.requests_need > cell {
                    Answer::Refused {
                        which: LimitKind::Requests,
                        retry_after: Duration::from_secs(1),
                    }
                } else {
                    let g = (ask.requests_need + ask.requests_more).min(cell);
                    cell -= g;
                    Answer::Granted {
                        granted: (g, 0),
                        left: (cell, 0),
                        reset: (Duration::from_secs(60), Duration::ZERO),
                        next: (Duration::from_secs(1), Duration::ZERO),
                        slots: 0,
                        slots_left: 0,
                    }
                };
                if matches!(
                    l.fetched((CFG, &limits), (ask, answer), 1, now),
                    Step::Admitted(_)
                ) {
                    admitted += 1;
                }
            }
            other => panic!("{other:?}"),
        }
    }
    let held: i64 = replicas.iter().map(|l| l.held().0).sum();
    assert_eq!(admitted + u64::try_from(held).expect("held"), 60);
    assert!(held <= 4 * 5, "{held}");
}

fn conc(n: u32) -> TierLimits {
    TierLimits {
        max_concurrent: Some(n),
        ..TierLimits::default()
    }
}

#[test]
fn slots_are_leased_a_few_at_a_time_and_counted_by_redis_when_none_is_idle() {
    let (mut l, now, limits) = (TenantLease::default(), Instant::now(), conc(4));
    let mut ask = fetch(l.admit(CFG, &limits, 1, now));
    assert_eq!((ask.slots_need, ask.slots_more), (1, 2));
    ask.slot_base = 100;
    let step = l.fetched((CFG, &limits), (ask, grant(ask, (0, 0))), 1, now);
    assert!(matches!(step, Step::Admitted(_)), "{step:?}");
    assert_eq!(l.slot_ids(), &[100, 101, 102]);
    // Two idle slots: two more requests pass locally, the fourth asks Redis.
    assert!(matches!(l.admit(CFG, &limits, 1, now), Step::Admitted(_)));
    assert!(matches!(l.admit(CFG, &limits, 1, now), Step::Admitted(_)));
    let ask = fetch(l.admit(CFG, &limits, 1, now));
    assert_eq!((ask.slots_need, ask.slots_more), (1, 2));
    // The fleet is full: refused, nothing taken, and the next one asks again.
    assert_eq!(
        l.fetched((CFG, &limits), (ask, Answer::Full), 1, now),
        Step::Concurrency { limit: 4 }
    );
    assert!(matches!(l.admit(CFG, &limits, 1, now), Step::Fetch(_)));
}

#[test]
fn idle_slots_are_trimmed_to_the_recent_peak_plus_a_block_or_all_near_the_limit() {
    let (mut l, now, limits) = (TenantLease::default(), Instant::now(), conc(100));
    let mut ask = fetch(l.admit(CFG, &limits, 1, now));
    ask.slots_more = 7;
    ask.slot_base = 1;
    l.fetched((CFG, &limits), (ask, grant(ask, (0, 0))), 1, now);
    assert_eq!(l.slot_ids().len(), 8);
    for _ in 0..5 {
        assert!(matches!(l.admit(CFG, &limits, 1, now), Step::Admitted(_)));
    }
    // Six in use at the peak; as they end, the slots stay leased until the trim.
    for _ in 0..5 {
        assert!(l.release_slot(Some(100)).is_empty());
    }
    // Peak 6 + a block of 2: the 8 are kept once; the next trim keeps 1 in use + 2.
    assert!(l.trim_slots(CFG, Some(100)).is_empty());
    assert_eq!(l.trim_slots(CFG, Some(100)), vec![4, 5, 6, 7, 8]);
    assert_eq!(l.slot_ids(), &[1, 2, 3]);
    assert_eq!(l.renewal(CFG, &limits, now), None, "two idle: a full block");
    // Unused past the hold: the idle slots go back, the one in use stays.
    let (units, slots) = l.expire(now + CFG.hold).expect("expired");
    assert_eq!((units, slots), ((0, 0), vec![2, 3]));
    assert_eq!(l.slot_ids(), &[1]);
    // The fleet is full: from now on only the need is asked for and idle slots go back at once.
    let ask = fetch(l.admit(CFG, &limits, 1, now));
    assert_eq!((ask.slots_need, ask.slots_more), (1, 2));
    l.fetched((CFG, &limits), (ask, Answer::Full), 1, now);
    let ask = fetch(l.admit(CFG, &limits, 1, now));
    assert_eq!((ask.slots_need, ask.slots_more), (1, 0));
    l.abandon(ask);
    assert_eq!(l.release_slot(Some(100)), vec![1]);
    assert_eq!(l.renewal(CFG, &limits, now), None);
}
