//! A fleet's shared directory of prefix homes, for pools without KV events (approximate mode)
//! behind several gateway replicas (`state.redis.prefix_homes`): the home of each prefix and its
//! recent demand, as every replica reads them from Redis.
//!
//! Homes computed alike from polled loads ([`super::cold_home`]) agree, but they are a hash's
//! spread, blind to popularity: with Zipf-popular prefixes one worker can get the two hottest.
//! Each replica sees only its share of the traffic, too little to size hot prefixes in time, but
//! the fleet's demand summed in one place is enough. So a new prefix's home is claimed once for
//! the whole fleet, on the candidate worker whose homed demand is least (longest processing time
//! first, online), and while one worker's homed demand stays clearly above the mean, one prefix
//! at a time moves from it to the least loaded worker: a move costs one cold prefill per replica,
//! so moves are few and only for a real gain.
//!
//! Pure: the choice of a home and of a move from a [`Directory`] snapshot. The I/O (claims and
//! moves applied atomically in Redis, the snapshot read back every heartbeat) is in
//! `workers::prefix_homes`; the replica model (`replica_model`) drives the same functions.

use std::collections::HashMap;

/// Fewest requests of demand a home counts for, so that homes whose demand is not known yet (a
/// fleet just started, a prefix just claimed) spread by number.
pub const PRIOR_DEMAND: f64 = 1.0;
/// Homed demand over the mean, on the busiest worker, that starts a move.
pub const MOVE_TOLERANCE: f64 = 0.15;
/// Requests the fleet must have counted in a pool before any move: fewer are noise.
pub const MIN_DEMAND: f64 = 40.0;
/// Share of the mean homed demand a move must take off the busiest worker: less is not worth the
/// cold prefills it costs.
const MIN_GAIN: f64 = 0.05;

/// The fleet's homes and demand, keyed by prefix key (a prompt's first block hash) and worker
/// key (xxh3 of its URL, equal in every replica).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Directory {
    /// Each prefix's home worker.
    pub homes: HashMap<u64, u64>,
    /// Each prefix's recent requests, summed over the replicas (decayed over time).
    pub demand: HashMap<u64, f64>,
}

/// One prefix moved from its home to a less loaded worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The prefix key.
    pub prefix: u64,
    /// Its home until now.
    pub from: u64,
    /// Its new home.
    pub to: u64,
}

impl Directory {
    /// A prefix's demand as placement counts it: at least [`PRIOR_DEMAND`]; non-finite or
    /// negative figures (nothing a replica should write) count as the prior.
    fn weight(&self, prefix: u64) -> f64 {
        match self.demand.get(&prefix) {
            Some(&d) if d.is_finite() && d > PRIOR_DEMAND => d,
            _ => PRIOR_DEMAND,
        }
    }

    /// Homed demand of each of `workers`, in their order.
    pub fn loads(&self, workers: &[u64]) -> Vec<f64> {
        let mut loads = vec![0.0; workers.len()];
        for (&prefix, home) in &self.homes {
            if let Some(i) = workers.iter().position(|w| w == home) {
                loads[i] += self.weight(prefix);
            }
        }
        loads
    }

    /// The home for a new prefix among `candidates` (worker keys, most preferred first: the
    /// prefix's rendezvous order over the workers that may take it): the least homed demand,
    /// ties to the earlier candidate. `None` without candidates.
    pub fn place(&self, candidates: &[u64]) -> Option<u64> {
        let loads = self.loads(candidates);
        let mut best: Option<(usize, f64)> = None;
        for (i, &load) in loads.iter().enumerate() {
            if best.is_none_or(|(_, b)| load < b) {
                best = Some((i, load));
            }
        }
        best.map(|(i, _)| candidates[i])
    }

    /// The one move that best evens the homed demand over `workers` (the healthy ones), when the
    /// busiest carries more than `(1 + tolerance) ×` the mean and the fleet has seen at least
    /// `min_demand` requests: the prefix on the busiest whose move to the least loaded leaves
    /// the lowest maximum, if that takes at least [`MIN_GAIN`] of the mean off it and
    /// `fits(prefix, worker)` (the target's cache has room for it: a move must not evict a
    /// prefix homed there). A worker's only prefix never moves (that moves the load, not evens
    /// it).
    pub fn rebalance(
        &self,
        workers: &[u64],
        (tolerance, min_demand): (f64, f64),
        fits: impl Fn(u64, u64) -> bool,
    ) -> Option<Move> {
        if workers.len() < 2 {
            return None;
        }
        let loads = self.loads(workers);
        let total: f64 = loads.iter().sum();
        let seen: f64 = self
            .homes
            .keys()
            .filter_map(|p| self.demand.get(p))
            .filter(|d| d.is_finite() && **d > 0.0)
            .sum();
        if seen < min_demand || total <= 0.0 {
            return None;
        }
        let mean = total / workers.len() as f64;
        let by_load = |a: &(usize, &f64), b: &(usize, &f64)| a.1.total_cmp(b.1);
        let (hi, &max) = loads.iter().enumerate().max_by(by_load)?;
        let (lo, &min) = loads.iter().enumerate().min_by(by_load)?;
        if max <= (1.0 + tolerance.max(0.0)) * mean {
            return None;
        }
        let others = loads
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != hi && i != lo)
            .map(|(_, &l)| l)
            .fold(0.0, f64::max);
        let on_hi: Vec<u64> = self
            .homes
            .iter()
            .filter(|&(_, &w)| w == workers[hi])
            .map(|(&p, _)| p)
            .collect();
        if on_hi.len() < 2 {
            return None;
        }
        // Lowest resulting maximum; equal ones by prefix key, so every replica picks alike.
        let (prefix, after) = on_hi
            .iter()
            .filter(|&&p| fits(p, workers[lo]))
            .map(|&p| {
                let d = self.weight(p);
                (p, (max - d).max(min + d).max(others))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))?;
        (after <= max - MIN_GAIN * mean).then_some(Move {
            prefix,
            from: workers[hi],
            to: workers[lo],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(entries: &[(u64, u64, f64)]) -> Directory {
        Directory {
            homes: entries.iter().map(|&(p, w, _)| (p, w)).collect(),
            demand: entries.iter().map(|&(p, _, d)| (p, d)).collect(),
        }
    }

    #[test]
    fn a_new_prefix_goes_where_the_least_demand_is_homed_ties_to_the_preferred() {
        let d = dir(&[(1, 10, 30.0), (2, 20, 5.0), (3, 20, 5.0), (4, 30, 12.0)]);
        assert_eq!(d.place(&[10, 20, 30]), Some(20));
        assert_eq!(d.place(&[10, 30]), Some(30));
        // Nothing homed yet: the first candidate (the prefix's own hash order).
        assert_eq!(Directory::default().place(&[30, 10, 20]), Some(30));
        // Demand not known yet: spread by number.
        let young = dir(&[(1, 10, 0.0), (2, 20, 0.0)]);
        assert_eq!(young.place(&[10, 20, 30]), Some(30));
        assert_eq!(young.place(&[]), None);
    }

    #[test]
    fn the_busiest_worker_gives_up_the_prefix_that_evens_the_pool_best() {
        // Worker 10 holds the two hottest (30 + 15), 20 and 30 hold 10 each, 40 holds 8.
        let d = dir(&[
            (1, 10, 30.0),
            (2, 10, 15.0),
            (3, 20, 10.0),
            (4, 30, 10.0),
            (5, 40, 8.0),
        ]);
        let m = d.rebalance(&[10, 20, 30, 40], (0.15, 20.0), |_, _| true);
        assert_eq!(
            m,
            Some(Move {
                prefix: 2,
                from: 10,
                to: 40
            })
        );
    }

    #[test]
    fn a_move_goes_only_where_the_prefix_fits() {
        let d = dir(&[(1, 10, 30.0), (2, 10, 15.0), (3, 20, 10.0), (4, 40, 8.0)]);
        let ws = [10, 20, 40];
        assert_eq!(
            d.rebalance(&ws, (0.15, 20.0), |_, _| true)
                .map(|m| m.prefix),
            Some(2)
        );
        // The least loaded cache has no room for prefix 2: prefix 1 may still go, if it fits.
        let m = d.rebalance(&ws, (0.15, 20.0), |p, w| !(p == 2 && w == 40));
        assert!(m.is_none_or(|m| m.prefix == 1 && m.to == 40), "{m:?}");
        assert_eq!(d.rebalance(&ws, (0.15, 20.0), |_, _| false), None);
    }

    #[test]
    fn no_move_within_the_tolerance_before_enough_demand_or_for_a_lone_prefix() {
        let even = dir(&[(1, 10, 11.0), (2, 20, 10.0), (3, 30, 9.0)]);
        assert_eq!(
            even.rebalance(&[10, 20, 30], (0.15, 5.0), |_, _| true),
            None
        );
        let early = dir(&[(1, 10, 6.0), (2, 10, 5.0), (3, 20, 1.0)]);
        assert_eq!(early.rebalance(&[10, 20], (0.15, 20.0), |_, _| true), None);
        assert!(
            early
                .rebalance(&[10, 20], (0.15, 5.0), |_, _| true)
                .is_some()
        );
        // One hot prefix alone on its worker stays: moving it only moves the load.
        let lone = dir(&[(1, 10, 60.0), (2, 20, 10.0), (3, 30, 10.0)]);
        assert_eq!(
            lone.rebalance(&[10, 20, 30], (0.15, 5.0), |_, _| true),
            None
        );
        assert_eq!(lone.rebalance(&[10], (0.15, 5.0), |_, _| true), None);
    }

    #[test]
    fn homes_on_workers_not_listed_and_nonsense_demand_count_for_nothing_worse_than_the_prior() {
        let d = dir(&[
            (1, 99, 500.0),
            (2, 10, f64::NAN),
            (3, 20, -4.0),
            (4, 20, 1e300),
        ]);
        assert_eq!(d.loads(&[10, 20]), vec![1.0, 1.0 + 1e300]);
        assert_eq!(d.place(&[20, 10]), Some(10));
        // The huge figure makes worker 20 the busiest, but its move cannot even anything out.
        let m = d.rebalance(&[10, 20], (0.15, 1.0), |_, _| true);
        assert!(m.is_none_or(|m| m.from == 20 && m.to == 10), "{m:?}");
    }
}
