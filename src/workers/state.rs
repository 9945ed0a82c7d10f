//! Live state of one upstream worker: the gateway's own in-flight count (always fresh), the load
//! last polled from its `/metrics`, and its health ([`outlier`]): ejection after failed polls or
//! failed requests in a row, each counted on its own, and re-admission through a probe request.

mod outlier;

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

pub use outlier::{HealthChange, OutlierSettings, Phase, ejection_time};

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
    /// In service at full share with no failed request pending: the hot path's lock-free
    /// answer; anything else asks [`Self::health`].
    clean: AtomicBool,
    health: Mutex<outlier::Outlier>,
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
    /// Whether its engine finished warm-up (see [`Warmth`]); routing skips it until `Warm`.
    warmth: AtomicU8,
}

/// Where a worker stands with warm-up, as its `/ready` last answered. Workers of dialects
/// without a ready endpoint start `Warm`; ours start `Unknown` until the first poll, so a
/// worker that joins (spawned, discovered, added by a reload) gets nothing before it is warm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Warmth {
    /// Not polled yet.
    Unknown = 0,
    /// `/ready` answered 503 (warming up), or the first poll failed.
    Warming = 1,
    /// Ready: routable (health permitting).
    Warm = 2,
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

impl WorkerState {
    /// A worker at `url`, healthy until proven otherwise.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_string(),
            key: xxhash_rust::xxh3::xxh3_64(url.as_bytes()),
            conns: Conns::new(url),
            in_flight: AtomicU32::new(0),
            clean: AtomicBool::new(true),
            health: Mutex::new(outlier::Outlier::default()),
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
            warmth: AtomicU8::new(Warmth::Warm as u8),
        }
    }

    /// This worker held out of routing until a poll finds it warm (engines with `/ready`).
    pub fn gated(self, gated: bool) -> Self {
        if gated {
            self.warmth.store(Warmth::Unknown as u8, Ordering::Release);
        }
        self
    }

    /// Where the worker stands with warm-up.
    pub fn warmth(&self) -> Warmth {
        match self.warmth.load(Ordering::Acquire) {
            0 => Warmth::Unknown,
            1 => Warmth::Warming,
            _ => Warmth::Warm,
        }
    }

    /// Records what its `/ready` said; true when that changed it.
    pub fn set_warmth(&self, w: Warmth) -> bool {
        self.warmth.swap(w as u8, Ordering::AcqRel) != w as u8
    }

    /// A failed poll of a worker never polled before: it is known now, and not warm.
    pub fn poll_failed_unpolled(&self) {
        let _ = self.warmth.compare_exchange(
            Warmth::Unknown as u8,
            Warmth::Warming as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Whether its last `/ready` said warm (always, for dialects without one).
    pub fn is_warm(&self) -> bool {
        self.warmth.load(Ordering::Acquire) == Warmth::Warm as u8
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
            healthy: self.routable(),
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

    /// True unless ejected (in service, or on probation); warm-up is apart ([`Self::is_warm`]).
    pub fn is_healthy(&self) -> bool {
        self.clean.load(Ordering::Acquire) || self.health().phase(Instant::now()) != Phase::Ejected
    }

    /// Where the worker stands now.
    pub fn phase(&self) -> Phase {
        if self.clean.load(Ordering::Acquire) {
            return Phase::InService;
        }
        self.health().phase(Instant::now())
    }

    /// Whether routing may pick it now: in service, or on probation with no probe in flight.
    fn routable(&self) -> bool {
        self.is_warm()
            && (self.clean.load(Ordering::Acquire) || self.health().routable(Instant::now()))
    }

    /// The health machine, locked (a panic elsewhere leaves it usable: it holds plain counts).
    fn health(&self) -> MutexGuard<'_, outlier::Outlier> {
        self.health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `event` on the health machine, then publishes what it changed: the lock-free flag,
    /// and an ejection's count and wake-up.
    fn on_health(&self, event: impl FnOnce(&mut outlier::Outlier) -> HealthChange) -> HealthChange {
        let mut health = self.health();
        let change = event(&mut health);
        self.clean.store(health.clean(), Ordering::Release);
        drop(health);
        if change == HealthChange::Ejected {
            self.ejections.fetch_add(1, Ordering::Relaxed);
            self.ejected.notify_waiters();
        }
        change
    }

    /// A request may go here now: its [`Attempt`] reports how it went. `None` when the worker
    /// is ejected, or on probation with its probe in flight.
    pub fn admit(self: &Arc<Self>, settings: OutlierSettings) -> Option<Attempt> {
        if !self.is_warm() {
            return None;
        }
        let probe = if self.clean.load(Ordering::Acquire) {
            false
        } else {
            self.health().admit(Instant::now())?
        };
        Some(Attempt {
            worker: self.clone(),
            probe,
            settings,
            judged: false,
        })
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

    /// A successful poll: after `readmit_after` in a row, polls no longer hold the worker out
    /// (`Readmitted`: it is on probation, and its first request is a probe). Requests report
    /// through their [`Attempt`]: a good poll does not clear their failures.
    pub fn record_success(&self, readmit_after: u32) -> HealthChange {
        self.on_health(|h| h.poll_succeeded(readmit_after, Instant::now()))
    }

    /// A failed poll: ejects after `eject_after` in a row, counted apart from failed requests.
    pub fn record_failure(&self, eject_after: u32) -> HealthChange {
        self.on_health(|h| h.poll_failed(eject_after, Instant::now()))
    }
}

/// One request's turn on a worker (possibly its probe), judged once: [`Attempt::succeeded`]
/// or [`Attempt::failed`]; dropped unjudged (the client left), it frees the probe slot.
#[derive(Debug)]
pub struct Attempt {
    worker: Arc<WorkerState>,
    probe: bool,
    settings: OutlierSettings,
    judged: bool,
}

impl Attempt {
    /// Whether this request is the worker's probe after an ejection.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// The worker this turn is on.
    pub fn worker(&self) -> &Arc<WorkerState> {
        &self.worker
    }

    /// The worker answered this request well: its failed requests in a row are forgotten, and
    /// a probe gives it back its full share (`Readmitted`).
    pub fn succeeded(mut self) -> HealthChange {
        self.judged = true;
        let probe = self.probe;
        if !probe && self.worker.clean.load(Ordering::Acquire) {
            return HealthChange::None;
        }
        self.worker
            .on_health(|h| h.request_succeeded(probe, Instant::now()))
    }

    /// The worker failed this request (no answer in time, a refused or reset connection, a 5xx,
    /// a broken stream): `Ejected` after too many in a row, or at once for a probe.
    pub fn failed(mut self) -> HealthChange {
        self.judged = true;
        let (probe, settings) = (self.probe, self.settings);
        self.worker
            .on_health(|h| h.request_failed(probe, Instant::now(), &settings))
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.judged && self.probe {
            self.worker.on_health(|h| {
                h.probe_abandoned();
                HealthChange::None
            });
        }
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
    fn a_gated_worker_is_not_routed_until_warm_and_a_503_takes_it_out_again() {
        let settings = OutlierSettings::default();
        let w = Arc::new(WorkerState::new("http://a").gated(true));
        assert_eq!(w.warmth(), Warmth::Unknown);
        assert!(!w.view().healthy && !w.is_warm() && w.is_healthy());
        assert!(w.admit(settings).is_none());
        w.poll_failed_unpolled();
        assert_eq!(w.warmth(), Warmth::Warming);
        assert!(w.set_warmth(Warmth::Warm));
        assert!(w.view().healthy);
        assert!(w.admit(settings).is_some());
        assert!(w.set_warmth(Warmth::Warming));
        assert!(!w.view().healthy);
        // Ungated workers (dialects without /ready) are warm from the start.
        assert!(WorkerState::new("http://b").view().healthy);
    }

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
    fn ejects_after_failed_polls_and_readmits_through_a_probe() {
        let w = Arc::new(WorkerState::new("http://a"));
        assert_eq!(w.record_failure(3), HealthChange::None);
        assert_eq!(w.record_success(2), HealthChange::None);
        assert_eq!(w.record_failure(3), HealthChange::None);
        assert_eq!(w.record_failure(3), HealthChange::None);
        assert_eq!(w.record_failure(3), HealthChange::Ejected);
        assert!(!w.view().healthy);
        assert!(w.admit(OutlierSettings::default()).is_none());
        assert_eq!(w.record_failure(3), HealthChange::None);
        assert_eq!(w.record_success(2), HealthChange::None);
        assert_eq!(w.record_success(2), HealthChange::Readmitted);
        assert!(w.is_healthy());
        assert_eq!(w.phase(), Phase::Probation);
        let probe = w.admit(OutlierSettings::default()).expect("the probe");
        assert!(probe.is_probe());
        assert!(!w.view().healthy, "one probe at a time");
        assert!(w.admit(OutlierSettings::default()).is_none());
        assert_eq!(probe.succeeded(), HealthChange::Readmitted);
        assert_eq!(w.phase(), Phase::InService);
        assert!(w.view().healthy);
        assert_eq!(w.ejections(), 1);
    }

    #[test]
    fn failed_requests_eject_whatever_the_polls_say() {
        let w = Arc::new(WorkerState::new("http://a"));
        let s = OutlierSettings {
            eject_after: 2,
            ..OutlierSettings::default()
        };
        let attempt = || w.admit(s).expect("in service");
        assert_eq!(attempt().failed(), HealthChange::None);
        assert_eq!(w.record_success(1), HealthChange::None);
        assert_eq!(attempt().failed(), HealthChange::Ejected);
        assert!(!w.is_healthy());
        assert_eq!(w.ejections(), 1);
        // Good polls do not bring it back before its ejection time is up.
        assert_eq!(w.record_success(1), HealthChange::None);
        assert!(!w.view().healthy);
    }

    #[test]
    fn an_unjudged_probe_frees_the_slot() {
        let w = Arc::new(WorkerState::new("http://a"));
        w.record_failure(1);
        w.record_success(1);
        let probe = w.admit(OutlierSettings::default()).expect("the probe");
        assert!(w.admit(OutlierSettings::default()).is_none());
        drop(probe);
        assert!(
            w.admit(OutlierSettings::default())
                .is_some_and(|a| a.is_probe())
        );
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
