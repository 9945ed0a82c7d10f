//! An approximate, bounded index of which prefix blocks were sent to which worker.
//!
//! Each block hash keeps a short list of workers (at most [`MAX_WORKERS_PER_BLOCK`]), and the
//! index keeps at most `capacity` block hashes, evicting the least recently used by a monotonic
//! tick (HashMap for lookup, BTreeMap ordered by tick for eviction: O(log n) per block). Entries of
//! a removed worker are not purged; they simply never match a live worker and age out.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

/// Most workers remembered per block; the least recently used one is replaced beyond it.
pub const MAX_WORKERS_PER_BLOCK: usize = 4;

/// One block hash: when it was last used and by which workers.
#[derive(Debug)]
struct Block {
    tick: u64,
    workers: Vec<(u64, u64)>,
}

#[derive(Debug, Default)]
struct Inner {
    blocks: HashMap<u64, Block>,
    lru: BTreeMap<u64, u64>,
    tick: u64,
}

/// Block hash → workers that were sent it, bounded to `capacity` block hashes.
#[derive(Debug)]
pub struct PrefixIndex {
    capacity: usize,
    inner: Mutex<Inner>,
}

impl PrefixIndex {
    /// An empty index holding at most `capacity` block hashes.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The index's state; a panic elsewhere cannot leave it inconsistent, so poison is ignored.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records that the blocks `hashes` were sent to `worker_key`, then evicts down to capacity.
    ///
    /// Blocks are touched from last to first, so a prompt's leading blocks are the most recent and
    /// its deepest ones go first: a surviving block is always useful to a prefix walk.
    pub fn record(&self, hashes: &[u64], worker_key: u64) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        for &hash in hashes.iter().rev() {
            inner.tick += 1;
            let tick = inner.tick;
            let block = inner.blocks.entry(hash).or_insert(Block {
                tick,
                workers: Vec::new(),
            });
            inner.lru.remove(&block.tick);
            block.tick = tick;
            inner.lru.insert(tick, hash);
            touch_worker(&mut block.workers, worker_key, tick);
        }
        while inner.blocks.len() > self.capacity {
            let Some((_, hash)) = inner.lru.pop_first() else {
                break;
            };
            inner.blocks.remove(&hash);
        }
    }

    /// For each worker that holds the first block, the number of leading blocks it holds in a row.
    ///
    /// Walks the hashes in order keeping the workers that matched every block so far and stops
    /// when none is left: O(blocks × workers per block), whatever the number of workers.
    pub fn matches(&self, hashes: &[u64]) -> Vec<(u64, usize)> {
        let inner = self.lock();
        let Some(first) = hashes.first().and_then(|h| inner.blocks.get(h)) else {
            return Vec::new();
        };
        let mut alive: Vec<u64> = first.workers.iter().map(|&(w, _)| w).collect();
        let mut out = Vec::with_capacity(alive.len());
        for (depth, hash) in hashes.iter().enumerate().skip(1) {
            let held = inner.blocks.get(hash).map_or(&[][..], |b| &b.workers[..]);
            alive.retain(|&w| {
                let keep = held.iter().any(|&(k, _)| k == w);
                if !keep {
                    out.push((w, depth));
                }
                keep
            });
            if alive.is_empty() {
                return out;
            }
        }
        out.extend(alive.into_iter().map(|w| (w, hashes.len())));
        out
    }

    /// Number of block hashes held.
    pub fn len(&self) -> usize {
        self.lock().blocks.len()
    }

    /// True when no block is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most block hashes held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// Marks `worker` as using a block at `tick`, replacing the stalest worker when the list is full.
fn touch_worker(workers: &mut Vec<(u64, u64)>, worker: u64, tick: u64) {
    if let Some(entry) = workers.iter_mut().find(|(k, _)| *k == worker) {
        entry.1 = tick;
    } else if workers.len() < MAX_WORKERS_PER_BLOCK {
        workers.push((worker, tick));
    } else if let Some(stalest) = workers.iter_mut().min_by_key(|(_, t)| *t) {
        *stalest = (worker, tick);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::testkit::SplitMix64;

    fn sorted(mut v: Vec<(u64, usize)>) -> Vec<(u64, usize)> {
        v.sort_unstable();
        v
    }

    #[test]
    fn longest_run_per_worker() {
        let idx = PrefixIndex::new(100);
        idx.record(&[1, 2, 3, 4], 10);
        idx.record(&[1, 2, 7], 20);
        assert_eq!(sorted(idx.matches(&[1, 2, 3, 9])), vec![(10, 3), (20, 2)]);
        assert_eq!(
            sorted(idx.matches(&[1, 2, 3, 4, 5])),
            vec![(10, 4), (20, 2)]
        );
        assert_eq!(
            idx.matches(&[9, 2]),
            vec![],
            "runs start at the first block"
        );
        assert_eq!(idx.matches(&[]), vec![]);
    }

    #[test]
    fn never_exceeds_capacity_under_a_million_inserts() {
        let idx = PrefixIndex::new(1_000);
        let mut rng = SplitMix64(7);
        let mut hashes = Vec::with_capacity(10);
        for _ in 0..100_000 {
            hashes.clear();
            // A small hash space so blocks repeat and get refreshed as well as inserted.
            hashes.extend((0..10).map(|_| rng.below(5_000)));
            idx.record(&hashes, rng.below(16));
            assert!(idx.len() <= idx.capacity());
        }
        assert_eq!(idx.len(), 1_000);
        let inner = idx.lock();
        assert_eq!(inner.lru.len(), inner.blocks.len());
        assert!(
            inner
                .blocks
                .values()
                .all(|b| b.workers.len() <= MAX_WORKERS_PER_BLOCK)
        );
    }

    #[test]
    fn least_recently_used_goes_first_deep_blocks_before_leading_ones() {
        let idx = PrefixIndex::new(4);
        idx.record(&[1, 2, 3], 10);
        idx.record(&[4], 10);
        idx.record(&[1], 10); // refreshes 1
        idx.record(&[5], 10); // evicts 3 (deepest of the oldest request)
        assert_eq!(idx.matches(&[1, 2, 3]), vec![(10, 2)]);
        idx.record(&[6], 10); // evicts 2
        assert_eq!(idx.matches(&[1, 2]), vec![(10, 1)]);
        assert_eq!(idx.matches(&[4]), vec![(10, 1)]);
    }

    #[test]
    fn workers_per_block_are_bounded() {
        let idx = PrefixIndex::new(10);
        for worker in 0..1_000 {
            idx.record(&[1, 2], worker);
        }
        let m = idx.matches(&[1, 2]);
        assert_eq!(m.len(), MAX_WORKERS_PER_BLOCK);
        // The most recent workers are the ones kept.
        assert!(m.iter().all(|&(w, run)| w >= 996 && run == 2));
    }

    #[test]
    fn zero_capacity_holds_nothing() {
        let idx = PrefixIndex::new(0);
        idx.record(&[1, 2], 1);
        assert!(idx.is_empty());
        assert!(idx.matches(&[1]).is_empty());
    }
}
