//! `round_robin`: rotate over the healthy workers.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Decision, RequestFeatures, RouteReason, RoutingPolicy, WorkerView};

/// Rotates over healthy workers; the turn counter is the only state.
#[derive(Debug, Default)]
pub struct RoundRobin {
    turn: AtomicUsize,
}

impl RoundRobin {
    /// A policy starting at the first healthy worker.
    pub fn new() -> Self {
        Self::default()
    }
}

impl RoutingPolicy for RoundRobin {
    fn select(&self, req: &RequestFeatures, workers: &[WorkerView]) -> Option<Decision> {
        let healthy = workers.iter().filter(|w| w.healthy).count();
        if healthy == 0 {
            return None;
        }
        let nth = self.turn.fetch_add(1, Ordering::Relaxed) % healthy;
        let index = workers
            .iter()
            .enumerate()
            .filter(|(_, w)| w.healthy)
            .nth(nth)
            .map(|(i, _)| i)?;
        Some(Decision::plain(index, RouteReason::RoundRobin, req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(key: u64, healthy: bool) -> WorkerView {
        WorkerView {
            key,
            healthy,
            in_flight: 0,
            waiting: 0.0,
            running: 0.0,
            polled_in_flight: 0,
            kv_usage: 0.0,
            pending_prefill: 0,
            kv_capacity: None,
            kv_protected: None,
        }
    }

    #[test]
    fn rotates_over_healthy_only() {
        let rr = RoundRobin::new();
        let ws = [worker(1, true), worker(2, false), worker(3, true)];
        let req = RequestFeatures::default();
        let picks: Vec<usize> = (0..4)
            .filter_map(|_| rr.select(&req, &ws))
            .map(|d| d.index)
            .collect();
        assert_eq!(picks, vec![0, 2, 0, 2]);
        assert_eq!(
            rr.select(&req, &ws).map(|d| d.reason),
            Some(RouteReason::RoundRobin)
        );
    }

    #[test]
    fn none_when_all_unhealthy() {
        let rr = RoundRobin::new();
        let req = RequestFeatures::default();
        assert_eq!(rr.select(&req, &[]), None);
        assert_eq!(rr.select(&req, &[worker(1, false)]), None);
    }
}
