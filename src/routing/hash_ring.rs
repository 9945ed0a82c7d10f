//! Rendezvous (highest random weight) hashing shared by the `session` and `prefix` policies.
//!
//! A key's order over workers is by `score(key, worker.key)`, highest first. It depends only on the
//! worker keys, so every gateway replica computes the same order whatever the slice order, and
//! removing a worker moves only the keys whose home it was. Finding the first accepted worker is
//! one O(workers) pass; the first few candidates take a partial selection, never a full sort.

use std::cmp::Ordering;

use xxhash_rust::xxh3::xxh3_64;

use super::WorkerView;

/// Weight of `worker_key` for `key`: xxh3 of both keys, little-endian.
pub fn score(key: u64, worker_key: u64) -> u64 {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&key.to_le_bytes());
    buf[8..].copy_from_slice(&worker_key.to_le_bytes());
    xxh3_64(&buf)
}

/// splitmix64's step: spreads a counter into a well-mixed 64-bit key.
pub fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Rank of a worker for a key: higher is preferred. The worker key breaks score ties.
fn rank(key: u64, w: &WorkerView) -> (u64, u64) {
    (score(key, w.key), w.key)
}

/// Orders (rank, index) pairs best first; equal ranks (duplicate keys) fall back to lower index.
fn best_first(a: &((u64, u64), usize), b: &((u64, u64), usize)) -> Ordering {
    b.0.cmp(&a.0).then(a.1.cmp(&b.1))
}

/// Index of the first worker in `key`'s order that `accept` takes, in one pass over `workers`.
pub fn first(
    key: u64,
    workers: &[WorkerView],
    accept: impl Fn(&WorkerView) -> bool,
) -> Option<usize> {
    let mut best: Option<((u64, u64), usize)> = None;
    for (i, w) in workers.iter().enumerate() {
        if !accept(w) {
            continue;
        }
        let cand = (rank(key, w), i);
        match best {
            Some(b) if best_first(&cand, &b) != Ordering::Less => {}
            _ => best = Some(cand),
        }
    }
    best.map(|(_, i)| i)
}

/// The first `max` distinct worker indices in `key`'s order: its home first, then its fallbacks.
pub fn candidates(key: u64, workers: &[WorkerView], max: usize) -> Vec<usize> {
    if max == 0 {
        return Vec::new();
    }
    let mut ranked: Vec<((u64, u64), usize)> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| (rank(key, w), i))
        .collect();
    if max < ranked.len() {
        ranked.select_nth_unstable_by(max - 1, best_first);
        ranked.truncate(max);
    }
    ranked.sort_unstable_by(best_first);
    ranked.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::testkit::{SplitMix64, workers};

    fn full_order(key: u64, ws: &[WorkerView]) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..ws.len()).collect();
        idx.sort_by_key(|&i| std::cmp::Reverse(rank(key, &ws[i])));
        idx
    }

    #[test]
    fn candidates_are_the_head_of_the_full_order() {
        let ws = workers(16);
        let mut rng = SplitMix64(1);
        for _ in 0..200 {
            let key = rng.next_u64();
            let full = full_order(key, &ws);
            for max in [0, 1, 3, 16, 40] {
                assert_eq!(candidates(key, &ws, max), full[..max.min(16)]);
            }
            assert_eq!(first(key, &ws, |_| true), Some(full[0]));
            // The first accepted worker is the first accepted one in the order.
            let odd = |w: &WorkerView| w.key % 2 == 1;
            let expect = full.iter().copied().find(|&i| odd(&ws[i]));
            assert_eq!(first(key, &ws, odd), expect);
        }
    }

    #[test]
    fn order_depends_on_worker_keys_not_slice_order() {
        let ws = workers(10);
        let mut reversed = ws.clone();
        reversed.reverse();
        let mut rng = SplitMix64(2);
        for _ in 0..500 {
            let key = rng.next_u64();
            let a: Vec<u64> = candidates(key, &ws, 4).iter().map(|&i| ws[i].key).collect();
            let b: Vec<u64> = candidates(key, &reversed, 4)
                .iter()
                .map(|&i| reversed[i].key)
                .collect();
            assert_eq!(a, b);
        }
    }

    #[test]
    fn removing_a_worker_moves_only_its_keys() {
        let ws = workers(10);
        let removed = ws[3].key;
        let rest: Vec<WorkerView> = ws.iter().filter(|w| w.key != removed).cloned().collect();
        let mut rng = SplitMix64(3);
        let mut moved = 0;
        for _ in 0..10_000 {
            let key = rng.next_u64();
            let before = first(key, &ws, |_| true).map(|i| ws[i].key);
            let after = first(key, &rest, |_| true).map(|i| rest[i].key);
            if before == Some(removed) {
                moved += 1;
                assert_ne!(after, Some(removed));
            } else {
                assert_eq!(before, after, "a key not homed on the removed worker moved");
            }
        }
        assert!((700..=1300).contains(&moved), "moved {moved} of 10000");
    }

    #[test]
    fn empty_slice_has_no_candidates() {
        assert_eq!(first(7, &[], |_| true), None);
        assert!(candidates(7, &[], 3).is_empty());
    }
}
