//! The home of a new prefix when the workers do not stream KV events: a function of inputs every
//! gateway replica sees alike, so replicas place new prefixes on the same worker without talking.
//!
//! The prefix's rendezvous order over the healthy workers decides; a worker is skipped only when
//! its *polled* load (the engine's waiting + running, as the poller last read it) is more than
//! `(1 + tolerance) × mean + MIN_SLACK` of the healthy workers' polled loads, or when its polled
//! free KV cannot hold the request (bounded-load rendezvous hashing). Both inputs come from the
//! workers' `/metrics`, the same in every replica up to poll timing. A replica's own in-flight
//! count, pending prefill and approximate cache index are left out on purpose: each replica has
//! its own, and homing by them is what made replicas place the same prefix apart. A burst of new
//! prefixes inside one poll interval is spread by the hash itself.
//!
//! Deviations stay bounded and rare: the least loaded worker is always within the bound, so a
//! skip moves a prefix at most to the next worker in its order that is, and with even loads
//! nothing is skipped at all.

use super::{WorkerView, hash_ring};

/// Requests of polled load a worker may carry above `(1 + tolerance) × mean` and still be a home,
/// so that an idle pool's one-request differences never move a prefix.
pub const MIN_SLACK: f64 = 4.0;

/// What a new prefix's request asks of its home.
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    /// The prefix's rendezvous key (its first block hash).
    pub key: u64,
    /// KV tokens the request adds where nothing is cached: its prompt and its answer.
    pub new_kv: f64,
    /// Share of the mean polled load a home may carry beyond it (`balance_tolerance`).
    pub tolerance: f64,
}

/// The most polled load a worker may carry and still be a new prefix's home.
pub fn load_bound(workers: &[WorkerView], tolerance: f64) -> f64 {
    let (n, sum) = workers
        .iter()
        .filter(|w| w.healthy)
        .fold((0usize, 0.0), |(n, sum), w| (n + 1, sum + w.polled_load()));
    let mean = if n == 0 { 0.0 } else { sum / n as f64 };
    (1.0 + tolerance.max(0.0)) * mean + MIN_SLACK
}

/// Whether the worker's polled free KV holds `new_kv` tokens (always, when it reports no size).
fn fits(w: &WorkerView, new_kv: f64) -> bool {
    w.kv_capacity
        .is_none_or(|cap| (1.0 - w.kv_fill()) * cap as f64 >= new_kv)
}

/// Index of the new prefix's home among `workers`, or `None` when none is healthy: the first
/// healthy worker in the key's order within the load bound whose free KV fits the request and
/// that is `roomy` (its cache can take the prefix without evicting another, the caller's
/// judgement), else the same without `roomy`, else the first within the load bound (the least
/// loaded always is).
pub fn home(
    ask: Ask,
    workers: &[WorkerView],
    roomy: impl Fn(&WorkerView) -> bool,
) -> Option<usize> {
    let bound = load_bound(workers, ask.tolerance);
    let light = |w: &WorkerView| w.healthy && w.polled_load() <= bound;
    hash_ring::first(ask.key, workers, |w| {
        light(w) && fits(w, ask.new_kv) && roomy(w)
    })
    .or_else(|| hash_ring::first(ask.key, workers, |w| light(w) && fits(w, ask.new_kv)))
    .or_else(|| hash_ring::first(ask.key, workers, light))
    .or_else(|| hash_ring::first(ask.key, workers, |w| w.healthy))
}

/// Keys of the healthy workers within the load bound, in `key`'s rendezvous order: the workers
/// a fleet's shared directory may make the prefix's home (see `directory`).
pub fn candidates(key: u64, workers: &[WorkerView], tolerance: f64) -> Vec<u64> {
    let bound = load_bound(workers, tolerance);
    hash_ring::candidates(key, workers, workers.len())
        .into_iter()
        .map(|i| &workers[i])
        .filter(|w| w.healthy && w.polled_load() <= bound)
        .map(|w| w.key)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::testkit::{SplitMix64, workers};

    fn ask(key: u64) -> Ask {
        Ask {
            key,
            new_kv: 1_000.0,
            tolerance: 0.25,
        }
    }

    #[test]
    fn an_even_pool_homes_every_key_at_the_head_of_its_order() {
        let mut ws = workers(6);
        for w in &mut ws {
            w.running = 10.0;
        }
        let mut rng = SplitMix64(11);
        for _ in 0..500 {
            let key = rng.next_u64();
            assert_eq!(
                home(ask(key), &ws, |_| true),
                hash_ring::first(key, &ws, |_| true)
            );
        }
    }

    #[test]
    fn own_in_flight_and_pending_prefill_never_move_a_home() {
        let base = workers(4);
        let mut rng = SplitMix64(12);
        for _ in 0..500 {
            let key = rng.next_u64();
            let mut mine = base.clone();
            for w in &mut mine {
                w.in_flight = rng.below(30) as u32;
                w.pending_prefill = rng.below(50_000);
            }
            assert_eq!(
                home(ask(key), &mine, |_| true),
                home(ask(key), &base, |_| true)
            );
        }
    }

    #[test]
    fn a_worker_polled_well_above_the_mean_is_skipped_for_the_next_in_order() {
        let mut ws = workers(4);
        let mut rng = SplitMix64(13);
        for _ in 0..200 {
            let key = rng.next_u64();
            let order = hash_ring::candidates(key, &ws, 4);
            for w in &mut ws {
                (w.waiting, w.running) = (0.0, 8.0);
            }
            // 20: mean 11, bound 17.75, over it. 13: mean 9.25, bound 15.56, within.
            ws[order[0]].running = 20.0;
            assert_eq!(home(ask(key), &ws, |_| true), Some(order[1]));
            ws[order[0]].running = 13.0;
            assert_eq!(home(ask(key), &ws, |_| true), Some(order[0]));
        }
    }

    #[test]
    fn a_full_kv_is_skipped_unless_every_light_worker_is_full() {
        let mut ws = workers(3);
        for w in &mut ws {
            w.kv_capacity = Some(10_000);
        }
        let key = 77;
        let order = hash_ring::candidates(key, &ws, 3);
        ws[order[0]].kv_usage = 0.95;
        assert_eq!(home(ask(key), &ws, |_| true), Some(order[1]));
        for w in &mut ws {
            w.kv_usage = 0.99;
        }
        assert_eq!(home(ask(key), &ws, |_| true), Some(order[0]));
    }

    #[test]
    fn directory_candidates_are_the_light_healthy_workers_in_hash_order() {
        let mut ws = workers(4);
        let key = 42;
        let order: Vec<u64> = hash_ring::candidates(key, &ws, 4)
            .into_iter()
            .map(|i| ws[i].key)
            .collect();
        assert_eq!(candidates(key, &ws, 0.25), order);
        let (hot, sick) = (order[0], order[2]);
        for w in &mut ws {
            w.running = if w.key == hot { 40.0 } else { 2.0 };
            w.healthy = w.key != sick;
        }
        assert_eq!(candidates(key, &ws, 0.25), vec![order[1], order[3]]);
    }

    #[test]
    fn only_healthy_workers_are_homes_and_nonsense_loads_stay_finite() {
        let mut ws = workers(3);
        let key = 5;
        let order = hash_ring::candidates(key, &ws, 3);
        ws[order[0]].healthy = false;
        ws[order[1]].running = f64::NAN;
        assert_eq!(home(ask(key), &ws, |_| true), Some(order[2]));
        for w in &mut ws {
            w.healthy = false;
        }
        assert_eq!(home(ask(key), &ws, |_| true), None);
        assert_eq!(home(ask(key), &[], |_| true), None);
    }
}
