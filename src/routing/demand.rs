//! Each prefix's recent share of the traffic, decayed per routed request (no clock, so the live
//! gateway and the simulator count alike and replicas seeing the same traffic agree).
//!
//! The `prefix` policy asks how many workers' worth of demand a prefix has: a prefix that one
//! worker serves well keeps its holder through short load swings, and only one that needs more
//! than its holders grows its replica set at the normal tolerance.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Per-request decay: a request's weight halves after about `ln 2 / DECAY` ≈ 177 more requests.
const DECAY: f64 = 1.0 / 256.0;
/// Entries kept before the ones that decayed to almost nothing are dropped.
const MAX_ENTRIES: usize = 4_096;
/// Decayed weight below which an entry is dropped when the map is pruned.
const FORGOTTEN: f64 = 0.01;

/// One prefix's decayed count, as of `tick`.
#[derive(Debug, Clone, Copy)]
struct Count {
    weight: f64,
    tick: u64,
}

#[derive(Debug, Default)]
struct Inner {
    /// Requests counted so far.
    tick: u64,
    /// Decayed count of every request, as of `tick`.
    total: f64,
    counts: HashMap<u64, Count>,
}

/// Decayed per-key request counts.
#[derive(Debug, Default)]
pub struct Demand {
    inner: Mutex<Inner>,
}

fn decayed(weight: f64, from: u64, to: u64) -> f64 {
    let steps = to.saturating_sub(from).min(i32::MAX as u64) as i32;
    weight * (1.0 - DECAY).powi(steps)
}

impl Demand {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere leaves plain numbers behind; they are still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one request, of `key` when it has one.
    pub fn record(&self, key: Option<u64>) {
        let mut inner = self.lock();
        inner.tick += 1;
        inner.total = inner.total * (1.0 - DECAY) + 1.0;
        let Some(key) = key else {
            return;
        };
        let tick = inner.tick;
        let entry = inner
            .counts
            .entry(key)
            .or_insert(Count { weight: 0.0, tick });
        entry.weight = decayed(entry.weight, entry.tick, tick) + 1.0;
        entry.tick = tick;
        if inner.counts.len() > MAX_ENTRIES {
            inner
                .counts
                .retain(|_, c| decayed(c.weight, c.tick, tick) >= FORGOTTEN);
        }
    }

    /// `key`'s share of the recent requests, 0..=1 (0 before any request).
    pub fn share(&self, key: u64) -> f64 {
        let inner = self.lock();
        if inner.total <= 0.0 {
            return 0.0;
        }
        inner.counts.get(&key).map_or(0.0, |c| {
            (decayed(c.weight, c.tick, inner.tick) / inner.total).min(1.0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_mix_of_recent_requests() {
        let d = Demand::default();
        assert_eq!(d.share(1), 0.0);
        // 60% key 1, the rest spread over 8 others.
        for i in 0..2_000u64 {
            d.record(Some(if i % 5 < 3 { 1 } else { 100 + i % 8 }));
        }
        assert!((d.share(1) - 0.6).abs() < 0.02, "{}", d.share(1));
        assert!((d.share(100) - 0.05).abs() < 0.02, "{}", d.share(100));
        // The mix changes: key 1 stops; within a few windows it is forgotten.
        for i in 0..2_000u64 {
            d.record(if i % 5 == 0 { None } else { Some(200 + i % 4) });
        }
        assert!(d.share(1) < 0.001, "{}", d.share(1));
        assert!((d.share(201) - 0.2).abs() < 0.02, "{}", d.share(201));
    }

    #[test]
    fn many_one_off_keys_stay_bounded() {
        let d = Demand::default();
        for k in 0..50_000u64 {
            d.record(Some(k));
        }
        assert!(d.lock().counts.len() <= MAX_ENTRIES + 1);
        let total: f64 = (49_000..50_000u64).map(|k| d.share(k)).sum();
        assert!(total > 0.95, "{total}");
    }
}
