//! Admission queue tests on real (short) time, conditions polled with a deadline; the waits that
//! last `max_wait` run on tokio's paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::*;

fn queue(capacity: usize, max_queue: usize, max_wait: Duration) -> AdmissionQueue {
    AdmissionQueue::new(QueueConfig {
        capacity,
        max_queue,
        max_wait,
        fair_share: None,
    })
}

const LONG: Duration = Duration::from_secs(30);

/// A ticket of `priority` without tenant or cost (first come within a priority).
fn at(priority: u32) -> Ticket<'static> {
    Ticket {
        priority,
        tenant: "",
        cost: 0.0,
        due: None,
        prefix: &[],
    }
}

/// Polls `cond` until it holds, failing after five seconds.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn admitted(q: &AdmissionQueue, priority: u32) -> Permit {
    match q.admit(at(priority), None, Instant::now()).await {
        Ok(p) => p,
        Err(e) => panic!("refused: {e:?}"),
    }
}

/// Spawns a waiter that reports `label` when admitted and holds the permit until told.
fn spawn_waiter(q: &AdmissionQueue, priority: u32, label: u32, done: mpsc::UnboundedSender<u32>) {
    let q = q.clone();
    tokio::spawn(async move {
        let permit = admitted(&q, priority).await;
        let _ = done.send(label);
        drop(permit);
    });
}

#[tokio::test]
async fn capacity_is_respected_and_waiters_follow() {
    let q = queue(2, 10, LONG);
    let (a, b) = (admitted(&q, 0).await, admitted(&q, 0).await);
    assert_eq!((a.waited(), q.in_flight()), (Duration::ZERO, 2));
    let (tx, mut rx) = mpsc::unbounded_channel();
    spawn_waiter(&q, 0, 1, tx);
    until("one waiter", || q.depth() == 1).await;
    assert_eq!(q.in_flight(), 2);
    drop(a);
    assert_eq!(rx.recv().await, Some(1));
    drop(b);
    until("all free", || q.in_flight() == 0).await;
}

#[tokio::test]
async fn later_high_priority_goes_before_earlier_low_priority() {
    let q = queue(1, 10, LONG);
    let held = admitted(&q, 0).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    spawn_waiter(&q, 1, 1, tx.clone());
    until("low queued", || q.depth() == 1).await;
    spawn_waiter(&q, 1, 2, tx.clone());
    until("second low queued", || q.depth() == 2).await;
    spawn_waiter(&q, 10, 3, tx);
    until("high queued", || q.depth() == 3).await;
    drop(held);
    let order = [rx.recv().await, rx.recv().await, rx.recv().await];
    assert_eq!(order, [Some(3), Some(1), Some(2)]);
    until("all free", || q.in_flight() == 0).await;
}

#[tokio::test]
async fn full_queue_answers_at_once_with_position_based_retry() {
    let q = queue(1, 2, LONG);
    let _held = admitted(&q, 0).await;
    let (tx, _rx) = mpsc::unbounded_channel();
    spawn_waiter(&q, 0, 1, tx.clone());
    spawn_waiter(&q, 0, 2, tx);
    until("queue full", || q.depth() == 2).await;
    let started = Instant::now();
    let refusal = q.admit(at(0), None, Instant::now()).await.err();
    assert!(started.elapsed() < Duration::from_millis(100));
    // Prior: one second per request on one slot; position 2 → (2 + 1) / 1 per second.
    let want = Refusal::QueueFull {
        retry_after: Duration::from_secs(3),
        position: 2,
    };
    assert_eq!(refusal, Some(want));
    assert_eq!(q.depth(), 2);
}

#[tokio::test]
async fn higher_priority_displaces_the_worst_waiter_of_a_full_queue() {
    let q = queue(1, 1, LONG);
    let held = admitted(&q, 0).await;
    let low = tokio::spawn({
        let q = q.clone();
        async move { q.admit(at(1), None, Instant::now()).await.err() }
    });
    until("low queued", || q.depth() == 1).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    spawn_waiter(&q, 5, 5, tx);
    let refusal = low.await.ok().flatten();
    assert!(matches!(
        refusal,
        Some(Refusal::QueueFull { position: 0, .. })
    ));
    drop(held);
    assert_eq!(rx.recv().await, Some(5));
}

#[tokio::test]
async fn waiting_past_max_wait_times_out() {
    let q = queue(1, 10, Duration::from_millis(50));
    let _held = admitted(&q, 0).await;
    let started = Instant::now();
    let refusal = q.admit(at(0), None, started).await.err();
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert_eq!(
        refusal,
        Some(Refusal::Timeout {
            retry_after: Duration::from_secs(1)
        })
    );
    assert_eq!((q.depth(), q.in_flight()), (0, 1));
}

#[tokio::test]
async fn dropped_waiter_leaves_and_loses_no_slot() {
    let q = queue(1, 10, LONG);
    let held = admitted(&q, 0).await;
    let waiter = tokio::spawn({
        let q = q.clone();
        async move { q.admit(at(0), None, Instant::now()).await.is_ok() }
    });
    until("queued", || q.depth() == 1).await;
    waiter.abort();
    assert!(waiter.await.is_err_and(|e| e.is_cancelled()));
    assert_eq!(q.depth(), 0);
    drop(held);
    assert_eq!(q.in_flight(), 0);
    let again = admitted(&q, 0).await;
    assert_eq!(again.waited(), Duration::ZERO);
}

#[tokio::test]
async fn slot_handed_to_a_departed_waiter_moves_on() {
    let q = queue(1, 10, LONG);
    let held = admitted(&q, 0).await;
    let mut first = Box::pin(q.admit(at(9), None, Instant::now()));
    tokio::select! {
        biased;
        _ = &mut first => panic!("no slot yet"),
        () = std::future::ready(()) => {}
    }
    assert_eq!(q.depth(), 1);
    let (tx, mut rx) = mpsc::unbounded_channel();
    spawn_waiter(&q, 0, 2, tx);
    until("second queued", || q.depth() == 2).await;
    drop(held); // the slot goes to `first`, which never looks at it again
    assert_eq!((q.depth(), q.in_flight()), (1, 1));
    drop(first);
    assert_eq!(rx.recv().await, Some(2));
    until("all free", || q.in_flight() == 0).await;
}

#[tokio::test]
async fn close_refuses_waiters_and_arrivals_with_draining() {
    let q = queue(1, 10, LONG);
    let held = admitted(&q, 0).await;
    let waiters: Vec<_> = (0..3)
        .map(|p| {
            let q = q.clone();
            tokio::spawn(async move { q.admit(at(p), None, Instant::now()).await.err() })
        })
        .collect();
    until("three queued", || q.depth() == 3).await;
    q.close();
    for w in waiters {
        assert!(matches!(
            w.await.ok().flatten(),
            Some(Refusal::Draining { .. })
        ));
    }
    let late = q.admit(at(0), None, Instant::now()).await.err();
    assert_eq!(late.map(|r| r.reason()), Some("draining"));
    drop(held);
    assert_eq!((q.depth(), q.in_flight()), (0, 0));
}

#[tokio::test]
async fn raising_capacity_admits_waiters() {
    let q = queue(1, 10, LONG);
    let _held = admitted(&q, 0).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    spawn_waiter(&q, 0, 1, tx);
    until("queued", || q.depth() == 1).await;
    q.set_capacity(2);
    assert_eq!(rx.recv().await, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flood_is_bounded_and_excess_refused_promptly() {
    const N: usize = 10_000;
    let q = queue(4, 100, LONG);
    let held: Vec<Permit> = hold(&q, 4).await;
    let (refused, served) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let started = Instant::now();
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let (q, refused, served) = (q.clone(), refused.clone(), served.clone());
            tokio::spawn(async move {
                match q.admit(at((i % 3) as u32), None, Instant::now()).await {
                    Ok(_permit) => served.fetch_add(1, Ordering::SeqCst),
                    Err(Refusal::QueueFull { retry_after, .. }) => {
                        assert!(retry_after >= Duration::from_secs(1));
                        refused.fetch_add(1, Ordering::SeqCst)
                    }
                    Err(other) => panic!("unexpected {other:?}"),
                }
            })
        })
        .collect();
    until("excess refused", || {
        refused.load(Ordering::SeqCst) + q.depth() == N
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        (q.depth(), q.in_flight(), served.load(Ordering::SeqCst)),
        (100, 4, 0)
    );
    drop(held);
    for t in tasks {
        assert!(t.await.is_ok());
    }
    let (refused, served) = (
        refused.load(Ordering::SeqCst),
        served.load(Ordering::SeqCst),
    );
    assert!(
        served >= 100 && refused + served == N,
        "served {served}, refused {refused}"
    );
    assert_eq!((q.depth(), q.in_flight()), (0, 0));
}

async fn hold(q: &AdmissionQueue, n: usize) -> Vec<Permit> {
    let mut permits = Vec::with_capacity(n);
    for _ in 0..n {
        permits.push(admitted(q, 0).await);
    }
    permits
}

/// On a paused clock: a waiter for a full pool is refused when its `max_wait` (30 s) runs out,
/// and one whose slot frees 10 s in is admitted then. Virtual seconds: no real waiting.
#[tokio::test(start_paused = true)]
async fn waits_end_at_the_deadline_or_the_freed_slot_on_a_paused_clock() {
    let real = Instant::now();
    let q = queue(1, 10, LONG);
    let held = admitted(&q, 0).await;
    let start = tokio::time::Instant::now();
    let refusal = q.admit(at(0), None, Instant::now()).await.err();
    assert!(
        matches!(refusal, Some(Refusal::Timeout { .. })),
        "{refusal:?}"
    );
    // `max_wait` counts from the arrival, on the real clock: the virtual wait is short by the
    // real time the call took (microseconds; timers round to the millisecond).
    let waited = start.elapsed();
    assert!(
        LONG.abs_diff(waited) < Duration::from_millis(500),
        "{waited:?}"
    );
    assert_eq!(q.depth(), 0);

    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(10)).await;
        drop(held);
    });
    let start = tokio::time::Instant::now();
    let permit = admitted(&q, 0).await;
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(11),
        "{waited:?}"
    );
    release.await.unwrap();
    drop(permit);
    assert_eq!(q.in_flight(), 0);
    // Forty virtual seconds passed; far less real time did.
    assert!(real.elapsed() < LONG, "{:?}", real.elapsed());
}

#[tokio::test(start_paused = true)]
async fn a_deadline_the_predicted_wait_passes_is_refused_at_once() {
    let q = queue(1, 10, LONG);
    let busy = q.admit(at(0), None, Instant::now()).await.unwrap();
    // One slot held; the prior is one second a request: the next waits about a second.
    let started = Instant::now();
    let refusal = q
        .admit(at(0), Some(Duration::from_millis(100)), started)
        .await
        .err();
    let Some(Refusal::Deadline {
        retry_after,
        predicted,
        deadline,
    }) = refusal
    else {
        panic!("{refusal:?}");
    };
    assert_eq!(predicted, Duration::from_secs(1));
    assert_eq!(deadline, Duration::from_millis(100));
    assert_eq!(
        retry_after,
        Duration::from_secs(1),
        "clamped to a whole second"
    );
    assert_eq!(q.depth(), 0, "refused without queueing");
    // A deadline the wait fits in queues, and waits no longer than the deadline.
    let waiter = {
        let q = q.clone();
        tokio::spawn(async move {
            q.admit(at(0), Some(Duration::from_secs(2)), Instant::now())
                .await
                .err()
        })
    };
    until("queued", || q.depth() == 1).await;
    tokio::time::advance(Duration::from_millis(2100)).await;
    assert!(matches!(
        waiter.await.unwrap(),
        Some(Refusal::Timeout { .. })
    ));
    drop(busy);
}

/// A fair queue of one slot whose router's view calls prefixes starting with `warm` warm.
fn fair_queue(window: f64, warm: u64) -> AdmissionQueue {
    let q = AdmissionQueue::new(QueueConfig {
        capacity: 1,
        max_queue: 16,
        max_wait: LONG,
        fair_share: Some(FairWeights {
            locality_window: window,
            ..FairWeights::default()
        }),
    });
    q.set_warmth(Arc::new(move |prefix: &[u64]| {
        prefix.first() == Some(&warm)
    }));
    q
}

/// With `q`'s one slot held by `a`: `b` (prefix 7) and then `a` (prefix 9) wait; `a`'s request
/// in flight turns out to have cost 40 weighted tokens; the slot is freed; returns who got it.
async fn who_goes_first(q: &AdmissionQueue) -> &'static str {
    let (done, mut got) = mpsc::unbounded_channel();
    let mut holder = {
        let ticket = Ticket {
            tenant: "a",
            ..at(0)
        };
        match q.admit(ticket, None, Instant::now()).await {
            Ok(p) => p,
            Err(e) => panic!("refused: {e:?}"),
        }
    };
    for (tenant, prefix) in [("b", 7u64), ("a", 9)] {
        let (qc, done) = (q.clone(), done.clone());
        tokio::spawn(async move {
            let prefix = [prefix];
            let ticket = Ticket {
                tenant,
                cost: 1.0,
                prefix: &prefix,
                ..at(0)
            };
            let permit = qc.admit(ticket, None, Instant::now()).await;
            let _ = done.send(tenant);
            drop(permit);
        });
        let depth = if tenant == "b" { 1 } else { 2 };
        until("queued", || q.depth() == depth).await;
    }
    // Settled once others wait: a is 40 ahead of b (a lone tenant's service lifts nobody).
    holder.settle(40, 0);
    drop(holder);
    got.recv().await.unwrap_or("none")
}

#[tokio::test]
async fn fair_share_lets_a_warm_waiter_within_the_window_go_first() {
    // b is the least served (0 against a's 40) but cold (7); a's waiter is warm (9).
    assert_eq!(
        who_goes_first(&fair_queue(100.0, 9)).await,
        "a",
        "warm, within 100"
    );
    assert_eq!(
        who_goes_first(&fair_queue(10.0, 9)).await,
        "b",
        "40 is past 10"
    );
    assert_eq!(
        who_goes_first(&fair_queue(100.0, 1)).await,
        "b",
        "nobody warm"
    );
}

#[tokio::test]
async fn with_fair_share_a_tenants_earliest_deadline_goes_first() {
    let q = fair_queue(0.0, 0);
    let holder = admitted(&q, 0).await;
    let (done, mut got) = mpsc::unbounded_channel();
    let now = Instant::now();
    for (label, deadline) in [(0u32, None), (1, Some(20_000)), (2, Some(10_000))] {
        let (qc, done) = (q.clone(), done.clone());
        tokio::spawn(async move {
            let ticket = Ticket {
                tenant: "a",
                cost: 1.0,
                ..at(0)
            };
            let deadline = deadline.map(Duration::from_millis);
            let permit = qc.admit(ticket, deadline, now).await;
            let _ = done.send(label);
            drop(permit);
        });
        until("queued", || q.depth() == label as usize + 1).await;
    }
    drop(holder);
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(got.recv().await.unwrap_or(9));
    }
    assert_eq!(order, [2, 1, 0], "earliest deadline, then the one without");
}

/// A fair queue of `capacity` slots lending `borrow` more to tenants under their share.
fn lending_queue(capacity: usize, borrow: usize) -> AdmissionQueue {
    AdmissionQueue::new(QueueConfig {
        capacity,
        max_queue: 16,
        max_wait: LONG,
        fair_share: Some(FairWeights {
            borrow_slots: borrow,
            ..FairWeights::default()
        }),
    })
}

async fn admitted_as(q: &AdmissionQueue, tenant: &'static str) -> Permit {
    let ticket = Ticket {
        tenant,
        cost: 1.0,
        ..at(0)
    };
    match q.admit(ticket, None, Instant::now()).await {
        Ok(p) => p,
        Err(e) => panic!("{tenant} refused: {e:?}"),
    }
}

#[tokio::test]
async fn a_tenant_under_its_share_borrows_a_slot_the_heavy_one_never_does() {
    let q = lending_queue(2, 1);
    // `a` holds both slots: alone, its share is all of them.
    let (a1, a2) = (admitted_as(&q, "a").await, admitted_as(&q, "a").await);
    let heavy = {
        let q = q.clone();
        tokio::spawn(async move { admitted_as(&q, "a").await })
    };
    until("a's third waits", || q.depth() == 1).await;
    // `b` holds nothing: it borrows the third slot at once, past the capacity.
    let b1 = admitted_as(&q, "b").await;
    assert_eq!((q.in_flight(), q.depth()), (3, 1));
    // Nothing more to lend: `b`'s second waits, with `a`'s third.
    let b2 = {
        let q = q.clone();
        tokio::spawn(async move { admitted_as(&q, "b").await })
    };
    until("b's second waits", || q.depth() == 2).await;
    // `b`'s slot comes back: back at the capacity's bound, `b` (still under its share of one)
    // borrows again; `a`, holding two of two, does not.
    drop(b1);
    let b2 = b2.await.expect("b's second");
    assert_eq!((q.in_flight(), q.depth()), (3, 1));
    assert!(!heavy.is_finished(), "a never borrows");
    // One of `a`'s slots frees: `a` and `b` now hold one each, the capacity: `a` waits.
    drop(a1);
    until("the release", || q.in_flight() == 2).await;
    assert!(!heavy.is_finished(), "a holds its share");
    // `b`'s borrowed slot comes back: within the capacity, the slot is `a`'s waiter's.
    drop(b2);
    let a3 = heavy.await.expect("a's third");
    assert_eq!((q.in_flight(), q.depth()), (2, 0));
    drop((a2, a3));
    assert_eq!(q.in_flight(), 0);
}

#[tokio::test]
async fn without_borrow_slots_the_capacity_is_a_hard_bound() {
    let q = lending_queue(1, 0);
    let a = admitted_as(&q, "a").await;
    let b = {
        let q = q.clone();
        tokio::spawn(async move { admitted_as(&q, "b").await })
    };
    until("b waits", || q.depth() == 1).await;
    assert_eq!(q.in_flight(), 1);
    drop(a);
    drop(b.await.expect("b"));
}
