//! `least_load`: the healthy worker with the smallest load; also the fallback of other policies.

use std::cmp::Ordering;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

use super::{Decision, RequestFeatures, RouteReason, RoutingPolicy, WorkerView};

/// Orders workers by load, then KV-cache usage; callers break remaining ties by lower index.
pub fn by_load(a: &WorkerView, b: &WorkerView) -> Ordering {
    a.load()
        .total_cmp(&b.load())
        .then(a.kv_fill().total_cmp(&b.kv_fill()))
}

/// Index of the least loaded worker accepted by `accept` (ties: lower KV usage, then lower index).
pub fn least_loaded(workers: &[WorkerView], accept: impl Fn(&WorkerView) -> bool) -> Option<usize> {
    least_loaded_from(workers, 0, accept)
}

/// Like [`least_loaded`], but full ties go to the first worker at or after `start` (wrapping),
/// so that an idle pool is not filled in list order.
pub fn least_loaded_from(
    workers: &[WorkerView],
    start: usize,
    accept: impl Fn(&WorkerView) -> bool,
) -> Option<usize> {
    let n = workers.len();
    let mut best: Option<usize> = None;
    for i in (0..n).map(|k| (start + k) % n.max(1)) {
        let w = &workers[i];
        if !accept(w) {
            continue;
        }
        match best {
            Some(b) if by_load(w, &workers[b]) != Ordering::Less => {}
            _ => best = Some(i),
        }
    }
    best
}

/// Sends each request to the least loaded healthy worker; equally loaded workers take turns.
#[derive(Debug, Default)]
pub struct LeastLoad {
    turn: AtomicUsize,
}

impl RoutingPolicy for LeastLoad {
    fn select(&self, req: &RequestFeatures, workers: &[WorkerView]) -> Option<Decision> {
        let start = self.turn.fetch_add(1, AtomicOrdering::Relaxed);
        least_loaded_from(workers, start % workers.len().max(1), |w| w.healthy)
            .map(|index| Decision::plain(index, RouteReason::LeastLoad, req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(healthy: bool, in_flight: u32, waiting: f64, kv_usage: f64) -> WorkerView {
        WorkerView {
            key: 0,
            healthy,
            in_flight,
            waiting,
            running: 0.0,
            polled_in_flight: 0,
            kv_usage,
            ..crate::routing::testkit::worker(0)
        }
    }

    fn pick(ws: &[WorkerView]) -> Option<usize> {
        LeastLoad::default()
            .select(&RequestFeatures::default(), ws)
            .map(|d| d.index)
    }

    #[test]
    fn smallest_load_wins() {
        let ws = [worker(true, 3, 0.0, 0.0), worker(true, 1, 0.0, 0.0)];
        assert_eq!(pick(&ws), Some(1));
        // Polled engine load counts when it exceeds the local count.
        let ws = [worker(true, 1, 5.0, 0.0), worker(true, 2, 0.0, 0.0)];
        assert_eq!(pick(&ws), Some(1));
    }

    #[test]
    fn ties_break_on_kv_then_index() {
        let ws = [worker(true, 1, 0.0, 0.5), worker(true, 1, 0.0, 0.2)];
        assert_eq!(pick(&ws), Some(1));
        let ws = [worker(true, 1, 0.0, 0.2), worker(true, 1, 0.0, 0.2)];
        assert_eq!(pick(&ws), Some(0));
        assert_eq!(least_loaded(&ws, |_| true), Some(0));
    }

    #[test]
    fn full_ties_take_turns() {
        let policy = LeastLoad::default();
        let ws = [
            worker(true, 0, 0.0, 0.0),
            worker(true, 0, 0.0, 0.0),
            worker(true, 0, 0.0, 0.0),
        ];
        let picks: Vec<usize> = (0..6)
            .filter_map(|_| {
                policy
                    .select(&RequestFeatures::default(), &ws)
                    .map(|d| d.index)
            })
            .collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
        // A strictly less loaded worker still wins whatever the turn.
        let ws = [worker(true, 1, 0.0, 0.0), worker(true, 0, 0.0, 0.0)];
        for _ in 0..4 {
            assert_eq!(
                policy
                    .select(&RequestFeatures::default(), &ws)
                    .map(|d| d.index),
                Some(1)
            );
        }
    }

    #[test]
    fn skips_unhealthy_and_none_when_all_down() {
        let ws = [worker(false, 0, 0.0, 0.0), worker(true, 9, 0.0, 0.0)];
        assert_eq!(pick(&ws), Some(1));
        assert_eq!(pick(&[worker(false, 0, 0.0, 0.0)]), None);
        assert_eq!(pick(&[]), None);
    }
}
