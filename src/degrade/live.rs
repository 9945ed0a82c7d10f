//! A pool's degradation at run time: its sliding signal window, its level state machine, and
//! the policy in force; shared by the request path (actions, samples) and the ticker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Actions, DegradationPolicy, Degrader, SignalWindow, Signals, TierActions, Transition};

/// Degradation state of one pool; survives config reloads of the same pool.
#[derive(Debug)]
pub struct PoolDegradation {
    inner: Mutex<Inner>,
    /// Whether a policy is in force: without one the request path takes no lock and keeps no
    /// samples (nothing would read them).
    has_policy: AtomicBool,
}

#[derive(Debug)]
struct Inner {
    policy: Option<DegradationPolicy>,
    degrader: Degrader,
    window: SignalWindow,
    last_tick: Option<Instant>,
    last_signals: Signals,
}

/// What the admin API shows of a pool.
#[derive(Debug, Clone, PartialEq)]
pub struct DegradationStatus {
    /// Current level, 0 = normal.
    pub level: usize,
    /// The level's name.
    pub name: Option<String>,
    /// Level forced by an admin, if any.
    pub forced: Option<usize>,
    /// Levels in the policy (0 when the pool has none).
    pub levels: usize,
    /// Signals at the last tick.
    pub signals: Signals,
    /// Level changes since start.
    pub transitions: u64,
}

impl PoolDegradation {
    /// A pool at normal service under `policy`.
    pub fn new(policy: Option<DegradationPolicy>) -> Arc<Self> {
        let retain = policy
            .as_ref()
            .map_or(Duration::from_secs(10), |p| p.window);
        Arc::new(Self {
            has_policy: AtomicBool::new(policy.is_some()),
            inner: Mutex::new(Inner {
                policy,
                degrader: Degrader::new(Instant::now()),
                window: SignalWindow::new(retain),
                last_tick: None,
                last_signals: Signals::default(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Installs a (re)loaded policy; the level and samples are kept.
    pub fn set_policy(&self, policy: Option<DegradationPolicy>) {
        let mut inner = self.lock();
        if let Some(p) = &policy {
            inner.window.set_retain(p.window);
        }
        self.has_policy.store(policy.is_some(), Ordering::Relaxed);
        inner.policy = policy;
    }

    /// What applies to a request of `tier` now, and the level's name and a Retry-After for
    /// refusals (the rest of the level's dwell plus one tick, at least a second).
    pub fn for_tier(&self, tier: &str) -> (TierActions, Option<(usize, String, Duration)>) {
        if !self.has_policy.load(Ordering::Relaxed) {
            return (TierActions::default(), None);
        }
        let inner = self.lock();
        let Some(policy) = &inner.policy else {
            return (TierActions::default(), None);
        };
        let actions: Actions = inner.degrader.actions(policy);
        let level = actions.level();
        if level == 0 {
            return (TierActions::default(), None);
        }
        let dwell = policy.levels[level - 1].min_dwell;
        let left = dwell.saturating_sub(inner.degrader.entered_at().elapsed());
        let retry = (left + policy.tick).max(Duration::from_secs(1));
        let name = actions.level_name().unwrap_or_default().to_string();
        (actions.for_tier(tier), Some((level, name, retry)))
    }

    /// Records how long an admitted request waited in the queue.
    pub fn record_queue_wait(&self, wait: Duration) {
        if !self.has_policy.load(Ordering::Relaxed) {
            return;
        }
        self.lock().window.record_queue_wait(wait, Instant::now());
    }

    /// Records a time to first byte of a response.
    pub fn record_ttft(&self, ttft: Duration) {
        if !self.has_policy.load(Ordering::Relaxed) {
            return;
        }
        self.lock().window.record_ttft(ttft, Instant::now());
    }

    /// Samples queue depth and mean KV usage, and moves the level when the tick is due.
    pub fn tick(
        &self,
        queue_depth: u64,
        kv_usage_mean: Option<f64>,
        now: Instant,
    ) -> Option<Transition> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let Some(policy) = inner.policy.as_ref() else {
            // The policy was removed by a reload: back to normal service, logged as a change.
            if inner.degrader.level() > 0 || inner.degrader.forced().is_some() {
                let change = inner.degrader.force(Some(0), now);
                inner.degrader.force(None, now);
                return change;
            }
            return None;
        };
        inner.window.record_queue(queue_depth, now);
        if let Some(kv) = kv_usage_mean {
            inner.window.record_kv(kv, now);
        }
        if inner
            .last_tick
            .is_some_and(|t| now.duration_since(t) < policy.tick)
        {
            return None;
        }
        inner.last_tick = Some(now);
        inner.last_signals = inner.window.snapshot(now, policy.window);
        inner.degrader.tick(policy, &inner.last_signals, now)
    }

    /// Forces a level (admin), or releases the override with `None`. Errors past the last level.
    pub fn force(&self, level: Option<usize>) -> Result<Option<Transition>, String> {
        let mut inner = self.lock();
        let levels = inner.policy.as_ref().map_or(0, |p| p.levels.len());
        if let Some(l) = level
            && l > levels
        {
            return Err(format!(
                "level {l} does not exist: the policy has {levels} levels"
            ));
        }
        Ok(inner.degrader.force(level, Instant::now()))
    }

    /// The state for the admin API.
    pub fn status(&self) -> DegradationStatus {
        let inner = self.lock();
        let (levels, name) = match &inner.policy {
            Some(p) => {
                let level = inner.degrader.level().min(p.levels.len());
                (
                    p.levels.len(),
                    (level > 0).then(|| p.levels[level - 1].name.clone()),
                )
            }
            None => (0, None),
        };
        DegradationStatus {
            level: inner.degrader.level(),
            name,
            forced: inner.degrader.forced(),
            levels,
            signals: inner.last_signals,
            transitions: inner.degrader.transitions(),
        }
    }
}
