//! Live state of one upstream worker: the gateway's own in-flight count (always fresh), the load
//! last polled from its `/metrics`, and its health with ejection after consecutive failures.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};

use crate::routing::WorkerView;
use crate::workers::conns::Conns;
use crate::workers::load_metrics::EngineLoad;

/// One worker, shared by the router, the forwarder and the poller.
#[derive(Debug)]
pub struct WorkerState {
    /// Base URL, e.g. `http://10.0.0.5:8000`.
    pub url: String,
    /// Stable identity: xxh3 of the URL.
    pub key: u64,
    /// Its keep-alive connections.
    pub conns: Conns,
    in_flight: AtomicU32,
    healthy: AtomicBool,
    failures: AtomicU32,
    successes: AtomicU32,
    waiting: AtomicU64,
    running: AtomicU64,
    /// `in_flight` when `waiting` and `running` were stored.
    polled_in_flight: AtomicU32,
    kv_usage: AtomicU64,
    ejections: AtomicU64,
    /// Prompt tokens routed here whose first token has not arrived (see [`PrefillGuard`]).
    pending_prefill: Arc<AtomicU64>,
    /// KV capacity in tokens as last polled; 0 = not reported.
    kv_capacity: AtomicU64,
    /// Protected (segmented-LRU) share of that capacity in tokens; 0 = plain LRU.
    kv_protected: AtomicU64,
    /// f64 bits of the polled `process_start_time_seconds`; 0 = not reported yet.
    started_at: AtomicU64,
    /// Subscription to the worker's `/kv/events` (see [`KvEventsState`]).
    kv_events: AtomicU8,
    /// Polls left before a worker without KV events is asked again.
    kv_events_backoff: AtomicU32,
    /// Wakes the requests waiting on this worker's first byte when it is ejected.
    ejected: tokio::sync::Notify,
}

/// Where the gateway stands with a worker's KV event stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum KvEventsState {
    /// Not subscribed; the next poll tries.
    Idle = 0,
    /// A subscription is being opened.
    Connecting = 1,
    /// Events flow: routing uses the worker's real residency.
    Live = 2,
    /// The worker has no `/kv/events`; asked again after a while (it may be upgraded).
    Unsupported = 3,
}

/// Polls between two asks of a worker that had no KV events.
const KV_EVENTS_RETRY_POLLS: u32 = 30;

/// What a health event did to a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    /// Nothing changed.
    None,
    /// The worker was ejected just now.
    Ejected,
    /// The worker was re-admitted just now.
    Readmitted,
}

impl WorkerState {
    /// A worker at `url`, healthy until proven otherwise.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_string(),
            key: xxhash_rust::xxh3::xxh3_64(url.as_bytes()),
            conns: Conns::new(url),
            in_flight: AtomicU32::new(0),
            healthy: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            successes: AtomicU32::new(0),
            waiting: AtomicU64::new(0f64.to_bits()),
            running: AtomicU64::new(0f64.to_bits()),
            polled_in_flight: AtomicU32::new(0),
            kv_usage: AtomicU64::new(0f64.to_bits()),
            ejections: AtomicU64::new(0),
            pending_prefill: Arc::new(AtomicU64::new(0)),
            kv_capacity: AtomicU64::new(0),
            kv_protected: AtomicU64::new(0),
            started_at: AtomicU64::new(0),
            kv_events: AtomicU8::new(KvEventsState::Idle as u8),
            kv_events_backoff: AtomicU32::new(0),
            ejected: tokio::sync::Notify::new(),
        }
    }

    /// The state of the worker's KV event subscription.
    pub fn kv_events(&self) -> KvEventsState {
        match self.kv_events.load(Ordering::Acquire) {
            1 => KvEventsState::Connecting,
            2 => KvEventsState::Live,
            3 => KvEventsState::Unsupported,
            _ => KvEventsState::Idle,
        }
    }

    /// Sets the subscription state; `Unsupported` starts the wait before the next ask.
    pub fn set_kv_events(&self, state: KvEventsState) {
        if state == KvEventsState::Unsupported {
            self.kv_events_backoff
                .store(KV_EVENTS_RETRY_POLLS, Ordering::Relaxed);
        }
        self.kv_events.store(state as u8, Ordering::Release);
    }

    /// Called once a poll: true when the caller should open a subscription now (it is then
    /// `Connecting`, so only one caller wins).
    pub fn should_subscribe_kv_events(&self) -> bool {
        let state = self.kv_events();
        if state == KvEventsState::Unsupported {
            let left = self.kv_events_backoff.load(Ordering::Relaxed);
            if left > 0 {
                self.kv_events_backoff.store(left - 1, Ordering::Relaxed);
                return false;
            }
        } else if state != KvEventsState::Idle {
            return false;
        }
        self.kv_events
            .compare_exchange(
                state as u8,
                KvEventsState::Connecting as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// The routing view of this worker now.
    pub fn view(&self) -> WorkerView {
        WorkerView {
            key: self.key,
            healthy: self.healthy.load(Ordering::Acquire),
            in_flight: self.in_flight.load(Ordering::Acquire),
            waiting: f64::from_bits(self.waiting.load(Ordering::Relaxed)),
            running: f64::from_bits(self.running.load(Ordering::Relaxed)),
            polled_in_flight: self.polled_in_flight.load(Ordering::Relaxed),
            kv_usage: f64::from_bits(self.kv_usage.load(Ordering::Relaxed)),
            pending_prefill: self.pending_prefill.load(Ordering::Acquire),
            kv_capacity: Some(self.kv_capacity.load(Ordering::Relaxed)).filter(|&c| c > 0),
            kv_protected: Some(self.kv_protected.load(Ordering::Relaxed)).filter(|&c| c > 0),
        }
    }

    /// True unless ejected.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// Requests this gateway has in flight here.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Resolves at this worker's next ejection (create it before sending, so none is missed).
    pub fn next_ejection(&self) -> tokio::sync::futures::Notified<'_> {
        self.ejected.notified()
    }

    /// Times this worker was ejected.
    pub fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Counts a request in flight until the guard drops (end of body, error, or client gone).
    pub fn start_request(self: &Arc<Self>) -> InFlightGuard {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(self.clone())
    }

    /// Counts `tokens` of prefill pending here until the guard drops (first token, or the end).
    pub fn start_prefill(&self, tokens: u64) -> PrefillGuard {
        self.pending_prefill.fetch_add(tokens, Ordering::AcqRel);
        PrefillGuard {
            counter: self.pending_prefill.clone(),
            tokens,
        }
    }

    /// Stores a successful poll; true when it shows the engine restarted (a new start time or
    /// a new KV capacity), so whatever was learned about its cache is void.
    pub fn record_load(&self, load: EngineLoad) -> bool {
        self.waiting
            .store(load.waiting.to_bits(), Ordering::Relaxed);
        self.running
            .store(load.running.to_bits(), Ordering::Relaxed);
        self.polled_in_flight
            .store(self.in_flight(), Ordering::Relaxed);
        self.kv_usage
            .store(load.kv_usage.to_bits(), Ordering::Relaxed);
        let capacity = load.kv_capacity.unwrap_or(0);
        let old_capacity = self.kv_capacity.swap(capacity, Ordering::Relaxed);
        self.kv_protected
            .store(load.kv_protected.unwrap_or(0), Ordering::Relaxed);
        let started = load.started_at.map_or(0, f64::to_bits);
        let old_started = self.started_at.swap(started, Ordering::Relaxed);
        (old_capacity != 0 && old_capacity != capacity)
            || (old_started != 0 && old_started != started)
    }

    /// A successful poll or request: re-admits after `readmit_after` in a row.
    pub fn record_success(&self, readmit_after: u32) -> HealthChange {
        self.failures.store(0, Ordering::Relaxed);
        let n = self.successes.fetch_add(1, Ordering::AcqRel) + 1;
        if !self.is_healthy() && n >= readmit_after.max(1) {
            self.healthy.store(true, Ordering::Release);
            return HealthChange::Readmitted;
        }
        HealthChange::None
    }

    /// A failed poll, connect error or 5xx: ejects after `eject_after` in a row.
    pub fn record_failure(&self, eject_after: u32) -> HealthChange {
        self.successes.store(0, Ordering::Relaxed);
        let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if self.is_healthy() && n >= eject_after.max(1) {
            self.healthy.store(false, Ordering::Release);
            self.ejections.fetch_add(1, Ordering::Relaxed);
            self.ejected.notify_waiters();
            return HealthChange::Ejected;
        }
        HealthChange::None
    }
}

/// Takes a request's prefill tokens off its worker's pending count when dropped.
#[derive(Debug)]
pub struct PrefillGuard {
    counter: Arc<AtomicU64>,
    tokens: u64,
}

impl Drop for PrefillGuard {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.tokens, Ordering::AcqRel);
    }
}

/// Decrements a worker's in-flight count when dropped.
#[derive(Debug)]
pub struct InFlightGuard(Arc<WorkerState>);

impl InFlightGuard {
    /// The worker this request runs on.
    pub fn worker(&self) -> &Arc<WorkerState> {
        &self.0
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_follows_guards() {
        let w = Arc::new(WorkerState::new("http://a"));
        let g1 = w.start_request();
        let g2 = w.start_request();
        assert_eq!(w.view().in_flight, 2);
        drop(g1);
        assert_eq!(w.in_flight(), 1);
        drop(g2);
        assert_eq!(w.in_flight(), 0);
    }

    #[test]
    fn ejects_after_consecutive_failures_and_readmits_after_successes() {
        let w = WorkerState::new("http://a");
        assert_eq!(w.record_failure(3), HealthChange::None);
        assert_eq!(w.record_success(2), HealthChange::None);
        assert_eq!(w.record_failure(3), HealthChange::None);
        assert_eq!(w.record_failure(3), HealthChange::None);
        assert_eq!(w.record_failure(3), HealthChange::Ejected);
        assert!(!w.view().healthy);
        assert_eq!(w.record_failure(3), HealthChange::None);
        assert_eq!(w.record_success(2), HealthChange::None);
        assert_eq!(w.record_success(2), HealthChange::Readmitted);
        assert!(w.is_healthy());
        assert_eq!(w.ejections(), 1);
    }

    #[test]
    fn polled_load_reaches_the_view() {
        let w = WorkerState::new("http://a");
        let load = EngineLoad {
            waiting: 2.0,
            running: 5.0,
            kv_usage: 0.4,
            kv_capacity: Some(1_000),
            kv_protected: Some(500),
            started_at: Some(1.0),
        };
        assert!(!w.record_load(load), "the first poll is no restart");
        assert!(!w.record_load(load));
        let v = w.view();
        assert_eq!(v.kv_capacity, Some(1_000));
        assert_eq!(v.kv_protected, Some(500));
        assert_eq!((v.waiting, v.running, v.kv_usage), (2.0, 5.0, 0.4));
        assert_eq!(v.load(), 7.0);
        let restarted = EngineLoad {
            started_at: Some(2.0),
            ..load
        };
        assert!(w.record_load(restarted), "a new start time is a restart");
        let resized = EngineLoad {
            kv_capacity: Some(2_000),
            ..restarted
        };
        assert!(w.record_load(resized), "a new KV size is a restart");
    }

    #[test]
    fn pending_prefill_follows_guards() {
        let w = WorkerState::new("http://a");
        let a = w.start_prefill(100);
        let b = w.start_prefill(50);
        assert_eq!(w.view().pending_prefill, 150);
        drop(a);
        assert_eq!(w.view().pending_prefill, 50);
        drop(b);
        assert_eq!(w.view().pending_prefill, 0);
    }
}
