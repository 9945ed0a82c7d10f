//! Hot prefixes over several workers when the workers do not stream KV events, so that a few
//! popular prefixes hashed onto one worker do not make it the pool's bottleneck at low load.
//!
//! In approximate mode a new prefix's home is its rendezvous hash (see `cold_home`), and at a
//! low request rate no polled load ever passes the bound, so which worker carries the most
//! popular prefixes is chance (16 Zipf groups over 4 workers: the busiest worker serves 1.5–2×
//! the mean). Instantaneous loads cannot see it (a worker runs one or two requests at a time);
//! the request *rate* can. So:
//!
//! - A prefix's *worth* is how many workers' share of the traffic it has, from this replica's
//!   decayed demand (see `demand`), taken at a lower confidence bound (`count − Z·√count`) so a
//!   few early requests do not make a prefix look hot. A prefix worth `w` may use the first
//!   `1 + ⌊w / STEP⌋` workers of its rendezvous order (its *set*).
//! - Each request of a prefix whose set has more than one worker goes to the member this replica
//!   sent the fewest of its recent requests to (its own picks, decayed per request), ties by the
//!   order, while the pool is at low load ([`LOW_LOAD`]); busier pools show a worker's excess in
//!   its load, which the `prefix` cost already weighs.
//!
//! Replicas agree by construction on *where* (the set is the head of the prefix's rendezvous
//! order, the same in every replica); only the split between set members comes from each
//! replica's own counts, and each replica balancing its own share of the traffic balances the
//! sum. Every extra set member costs one cold prefill of the prefix there, so sets grow only with
//! evidence. Measured in `replica_model` and `cargo bench --bench routing -- four`.

/// Mean requests per worker (running, waiting, in flight) at or below which request rates are
/// balanced: above it the loads themselves show a busy worker, and the `prefix` cost weighs them.
pub const LOW_LOAD: f64 = 4.0;
/// Lower-confidence-bound width, in standard deviations of a Poisson count.
pub const Z: f64 = 1.5;
/// Workers' worth of traffic per extra set member.
pub const STEP: f64 = 0.4;
/// Requests the worth's denominator counts at least, so the first requests do not look hot.
pub const MIN_TOTAL: f64 = 16.0;

/// How many workers of its rendezvous order a prefix may use: `1 + ⌊worth / STEP⌋`, at most
/// `healthy`, where worth is `(count − Z·√count) / max(total, MIN_TOTAL) × healthy`. `count` is
/// the prefix's decayed request count and `total` every request's; nonsense counts give 1.
pub fn set_size(count: f64, total: f64, healthy: usize) -> usize {
    if healthy <= 1 || !count.is_finite() || !total.is_finite() || count <= 0.0 {
        return 1;
    }
    let sure = (count - Z * count.sqrt()).max(0.0);
    let worth = sure / total.max(MIN_TOTAL).max(count) * healthy as f64;
    let extra = (worth / STEP).floor();
    if extra.is_finite() && extra >= 1.0 {
        (1 + extra as usize).min(healthy)
    } else {
        1
    }
}

/// The set member (an index into `set`, which is in rendezvous order) with the fewest recent
/// picks; the first in order among equals. `None` for an empty set.
pub fn least_picked(set: &[usize], picks: impl Fn(usize) -> f64) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for &i in set {
        let p = picks(i);
        let p = if p.is_nan() { f64::INFINITY } else { p };
        match best {
            Some((_, b)) if b <= p => {}
            _ => best = Some((i, p)),
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_needs_evidence_before_it_spreads() {
        // Half the traffic over 4 workers: after 100 requests, (50 − 10.6) / 100 × 4 = 1.58
        // workers' worth for sure → all four.
        assert_eq!(set_size(50.0, 100.0, 4), 4);
        // A 30% prefix after 100 requests: (30 − 8.2) / 100 × 4 = 0.87 → three.
        assert_eq!(set_size(30.0, 100.0, 4), 3);
        // The same share over its first 6 requests is no evidence yet.
        assert_eq!(set_size(3.0, 6.0, 4), 1);
        // A tenth of the traffic stays on one worker; a sixth of 200 requests gets a second.
        assert_eq!(set_size(10.0, 100.0, 4), 1);
        assert_eq!(set_size(33.0, 200.0, 4), 2);
        // Never more workers than are healthy, and one worker alone is the set.
        assert_eq!(set_size(1_000.0, 1_000.0, 3), 3);
        assert_eq!(set_size(1_000.0, 1_000.0, 1), 1);
    }

    #[test]
    fn nonsense_counts_keep_a_prefix_on_one_worker() {
        for (c, t) in [
            (f64::NAN, 10.0),
            (10.0, f64::NAN),
            (f64::INFINITY, 10.0),
            (-5.0, 10.0),
            (0.0, 0.0),
        ] {
            assert_eq!(set_size(c, t, 4), 1, "{c} {t}");
        }
        // A count above the total (it cannot be) reads as all of the traffic, not more.
        assert_eq!(set_size(400.0, 100.0, 4), set_size(400.0, 400.0, 4));
    }

    #[test]
    fn the_least_picked_member_wins_and_ties_keep_the_order() {
        let picks = [5.0, 2.0, 2.0, f64::NAN];
        assert_eq!(least_picked(&[0, 1, 2], |i| picks[i]), Some(1));
        assert_eq!(least_picked(&[2, 1, 0], |i| picks[i]), Some(2));
        assert_eq!(least_picked(&[3, 0], |i| picks[i]), Some(0));
        assert_eq!(least_picked(&[3], |i| picks[i]), Some(3));
        assert_eq!(least_picked(&[], |i| picks[i]), None);
    }
}
