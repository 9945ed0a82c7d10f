//! `least_load`: the healthy worker with the smallest load; also the fallback of other policies.

use std::cmp::Ordering;

use super::{Decision, RequestFeatures, RouteReason, RoutingPolicy, WorkerView};

/// Orders workers by load, then KV-cache usage; callers break remaining ties by lower index.
pub fn by_load(a: &WorkerView, b: &WorkerView) -> Ordering {
    a.load()
        .total_cmp(&b.load())
        .then(a.kv_usage.total_cmp(&b.kv_usage))
}

/// Index of the least loaded worker accepted by `accept` (ties: lower KV usage, then lower index).
pub fn least_loaded(workers: &[WorkerView], accept: impl Fn(&WorkerView) -> bool) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, w) in workers.iter().enumerate() {
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

/// Sends each request to the least loaded healthy worker.
#[derive(Debug, Default)]
pub struct LeastLoad;

impl RoutingPolicy for LeastLoad {
    fn select(&self, _req: &RequestFeatures, workers: &[WorkerView]) -> Option<Decision> {
        least_loaded(workers, |w| w.healthy).map(|index| Decision {
            index,
            reason: RouteReason::LeastLoad,
        })
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
            kv_usage,
        }
    }

    fn pick(ws: &[WorkerView]) -> Option<usize> {
        LeastLoad
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
    }

    #[test]
    fn skips_unhealthy_and_none_when_all_down() {
        let ws = [worker(false, 0, 0.0, 0.0), worker(true, 9, 0.0, 0.0)];
        assert_eq!(pick(&ws), Some(1));
        assert_eq!(pick(&[worker(false, 0, 0.0, 0.0)]), None);
        assert_eq!(pick(&[]), None);
    }
}
