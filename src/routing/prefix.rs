//! `prefix`: cache-aware routing with bounded load.
//!
//! Selection, over the workers that are *eligible* (healthy, load within the pool mean × factor
//! + 1, KV usage and engine queue under their thresholds):
//! 1. the longest indexed prefix match of at least `min_match_blocks` blocks → `PrefixHit`
//!    (ties: lower load);
//! 2. else the prefix's consistent-hash order, keyed by its first block (the system prompt): the
//!    home if eligible → `PrefixHome`, else the next eligible worker in that order → `LoadSpill`.
//!    A hot prefix thus spreads over a few workers in a stable order instead of scattering, and a
//!    longest-match worker that is over its bound falls here too, never to an arbitrary worker.
//!    A request too short for one block is keyed by its session (`Session`) or goes least loaded;
//! 3. no eligible worker → least loaded healthy worker → `Overloaded`.

use super::hash_ring;
use super::least_load::{by_load, least_loaded};
use super::prefix_index::PrefixIndex;
use super::{Decision, PrefixConfig, RequestFeatures, RouteReason, RoutingPolicy, WorkerView};

/// The cache-aware policy: a bounded prefix index plus the thresholds of its config.
#[derive(Debug)]
pub struct CacheAware {
    cfg: PrefixConfig,
    index: PrefixIndex,
}

/// Which workers may take a request right now (computed once per decision).
struct Bounds<'a> {
    cfg: &'a PrefixConfig,
    max_load: f64,
}

impl Bounds<'_> {
    fn eligible(&self, w: &WorkerView) -> bool {
        w.healthy
            && w.load() <= self.max_load
            && w.kv_usage < self.cfg.max_kv_usage
            && w.waiting < self.cfg.max_waiting
    }
}

fn decision(index: usize, reason: RouteReason) -> Decision {
    Decision { index, reason }
}

impl CacheAware {
    /// A policy with an empty index of `cfg.index_capacity` block hashes.
    pub fn new(cfg: PrefixConfig) -> Self {
        let index = PrefixIndex::new(cfg.index_capacity);
        Self { cfg, index }
    }

    /// The prefix index (read-only use: size, matches).
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// Step 1: the eligible worker holding the longest run of the request's leading blocks.
    ///
    /// The index answers for at most a few workers per block, so its part costs
    /// O(blocks × workers per block); one pass over `workers` then maps keys to eligible indices.
    fn longest_hit(
        &self,
        req: &RequestFeatures,
        workers: &[WorkerView],
        bounds: &Bounds,
    ) -> Option<Decision> {
        let min_run = self.cfg.min_match_blocks.max(1);
        let mut matches = self.index.matches(&req.prefix_hashes);
        matches.retain(|&(_, run)| run >= min_run);
        if matches.is_empty() {
            return None;
        }
        let mut best: Option<(usize, usize)> = None;
        for (i, w) in workers.iter().enumerate() {
            let Some(&(_, run)) = matches.iter().find(|&&(k, _)| k == w.key) else {
                continue;
            };
            if !bounds.eligible(w) {
                continue;
            }
            let better = match best {
                None => true,
                Some((b, best_run)) => {
                    run > best_run || (run == best_run && by_load(w, &workers[b]).is_lt())
                }
            };
            if better {
                best = Some((i, run));
            }
        }
        best.map(|(i, _)| decision(i, RouteReason::PrefixHit))
    }

    /// Step 2: the first eligible worker in the prefix's (or session's) hash order.
    fn hash_order(
        &self,
        req: &RequestFeatures,
        workers: &[WorkerView],
        bounds: &Bounds,
    ) -> Option<Decision> {
        let (key, home_reason) = match (req.prefix_hashes.first(), req.session_key) {
            (Some(&first), _) => (first, RouteReason::PrefixHome),
            (None, Some(session)) => (session, RouteReason::Session),
            (None, None) => {
                return least_loaded(workers, |w| bounds.eligible(w))
                    .map(|i| decision(i, RouteReason::LeastLoad));
            }
        };
        let home = hash_ring::first(key, workers, |w| w.healthy)?;
        if bounds.eligible(&workers[home]) {
            return Some(decision(home, home_reason));
        }
        hash_ring::first(key, workers, |w| bounds.eligible(w))
            .map(|i| decision(i, RouteReason::LoadSpill))
    }
}

impl RoutingPolicy for CacheAware {
    fn select(&self, req: &RequestFeatures, workers: &[WorkerView]) -> Option<Decision> {
        let (healthy, total_load) = workers
            .iter()
            .filter(|w| w.healthy)
            .fold((0usize, 0.0), |(n, sum), w| (n + 1, sum + w.load()));
        if healthy == 0 {
            return None;
        }
        let mean = total_load / healthy as f64;
        let bounds = Bounds {
            cfg: &self.cfg,
            max_load: mean * self.cfg.load_factor + 1.0,
        };
        self.longest_hit(req, workers, &bounds)
            .or_else(|| self.hash_order(req, workers, &bounds))
            .or_else(|| {
                least_loaded(workers, |w| w.healthy).map(|i| decision(i, RouteReason::Overloaded))
            })
    }

    fn observe(&self, req: &RequestFeatures, worker_key: u64) {
        self.index.record(&req.prefix_hashes, worker_key);
    }
}

#[cfg(test)]
#[path = "prefix_tests.rs"]
mod tests;
