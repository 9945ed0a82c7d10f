//! An approximate index of which prefix blocks each worker still holds in its KV cache.
//!
//! Each worker gets its own LRU, weighed in tokens and sized from that worker's KV capacity
//! (`vllm:cache_config_info`: `num_gpu_blocks × block_size`), so the index forgets what the
//! worker must have evicted: every routed request pushes its prompt blocks *and* the KV it will
//! add beyond them (the uncached tail and the answer) into the worker's LRU, as the engine's own
//! block pool fills. A worker that evicts by segmented LRU (our engine: `kv_protected_blocks` in
//! the same metric) gets the same two segments here: a block seen again moves to a protected
//! segment of that size, and blocks seen once (and the anonymous KV) are forgotten first, as the
//! engine evicts them first. A shared map from block hash to the workers holding it answers
//! lookups in O(blocks × holders), whatever the pool size.
//!
//! Feedback corrects it: when a worker's answer reports fewer cached tokens than the index
//! predicted, that worker's effective capacity shrinks (other gateway replicas, or work the
//! gateway cannot see, share the cache); when it reports more, it grows back. A restarted or
//! re-admitted worker is forgotten whole.
//!
//! A worker that streams KV events (`GET /kv/events`, our engine) is *precise*: its snapshot and
//! `stored` keys are added even when another gateway routed them, and `removed` keys go at once.
//! Routed requests still add their blocks before the engine confirms them, so a burst within one
//! prefill keeps to the worker it chose; a snapshot therefore adds to what is known instead of
//! replacing it (requests sent before the stream opened, or still in prefill, are not in it yet).
//! A guess the engine never confirms is corrected by feedback, exactly: the blocks an answer
//! says were not cached are dropped from that worker. The capacity bound stays as a backstop,
//! without the guessed answer KV and without feedback scaling.
//!
//! Whatever capacity a worker claims, its LRU holds at most `max_index_blocks_per_worker`
//! entries (the `prefix` policy's setting): past it the oldest go, as past the capacity, so
//! the index's memory is bounded by configuration, not by what a worker says.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use crate::fast_maps::HashKeyMap;
use crate::routing::Residency;

/// Capacity assumed for a worker that does not export its KV size, in tokens.
pub const DEFAULT_WORKER_TOKENS: u64 = 262_144;
/// Entries kept per worker by default, whatever its claimed capacity (≈ 50 MiB at most).
pub const DEFAULT_MAX_BLOCKS_PER_WORKER: usize = 262_144;

/// Bounds of the feedback-learned capacity scale. A worker with a known capacity never goes past
/// 1 (its cache cannot be larger than it says); an unknown one may grow to 8× the default.
const MIN_SCALE: f64 = 0.05;
const MAX_SCALE_KNOWN: f64 = 1.0;
const MAX_SCALE_UNKNOWN: f64 = 8.0;
/// Scale change on a predicted hit that was not there, and on an unpredicted one.
const SHRINK: f64 = 0.8;
const GROW: f64 = 1.05;

/// A block touched within the newest `1 / RECENT_SHARE` of its segment's entries is not moved.
const RECENT_SHARE: usize = 8;

/// One LRU entry: a prompt block (`hash`), or the anonymous KV a request added beyond it.
#[derive(Debug, Clone, Copy)]
struct Entry {
    hash: Option<u64>,
    tokens: u64,
    /// For a prompt's leading block: the tokens of the prefix it starts, as last routed (0 for
    /// every other entry). The sum over a worker's held leads is how much of its cache the
    /// prefixes homed there claim.
    lead: u64,
}

/// What one worker holds, least recently used first.
#[derive(Debug)]
struct WorkerCache {
    /// Capacity the worker reports (or the default), tokens.
    base: u64,
    /// Whether `base` came from the worker.
    known: bool,
    /// Protected-segment size the worker reports, tokens (0: plain LRU).
    protected_base: u64,
    /// Learned correction of `base` (and of `protected_base`).
    scale: f64,
    /// Tokens of all entries.
    used: u64,
    /// Tokens of the protected entries.
    protected_used: u64,
    /// Sum of the held entries' `lead`: the prefixes this worker is home to, in tokens.
    lead_used: u64,
    /// Entries seen once and anonymous KV, by tick.
    lru: BTreeMap<u64, Entry>,
    /// Entries seen again, by tick (empty for plain LRU workers).
    protected: BTreeMap<u64, Entry>,
    /// Block hash → (tick, whether protected).
    ticks: HashKeyMap<(u64, bool)>,
    /// Fed by the worker's KV events.
    precise: bool,
}

impl WorkerCache {
    fn new(default: u64) -> Self {
        Self {
            base: default,
            known: false,
            protected_base: 0,
            scale: 1.0,
            used: 0,
            protected_used: 0,
            lead_used: 0,
            lru: BTreeMap::new(),
            protected: BTreeMap::new(),
            ticks: HashKeyMap::default(),
            precise: false,
        }
    }

    fn capacity(&self) -> u64 {
        (self.base as f64 * self.scale) as u64
    }

    fn protected_capacity(&self) -> u64 {
        ((self.protected_base as f64 * self.scale) as u64).min(self.capacity())
    }

    fn set_base(&mut self, capacity: Option<u64>, protected: Option<u64>, default: u64) {
        match capacity {
            Some(c) if c > 0 => {
                self.base = c;
                self.known = true;
                self.protected_base = protected.unwrap_or(0).min(c);
                self.scale = self.scale.min(MAX_SCALE_KNOWN);
            }
            _ => {
                self.base = default;
                self.known = false;
                self.protected_base = 0;
            }
        }
    }

    /// Entries held (prompt blocks and anonymous KV).
    fn entries(&self) -> usize {
        self.lru.len() + self.protected.len()
    }

    fn max_scale(&self) -> f64 {
        if self.known {
            MAX_SCALE_KNOWN
        } else {
            MAX_SCALE_UNKNOWN
        }
    }
}

#[derive(Debug)]
struct Inner {
    /// Block hash → keys of the workers holding it.
    holders: HashKeyMap<Vec<u64>>,
    workers: HashKeyMap<WorkerCache>,
    tick: u64,
    /// Most entries per worker.
    max_entries: usize,
}

impl Inner {
    /// Makes `hash` the most recent block of `worker`, adding it (weighing `tokens`) if new.
    fn touch(&mut self, worker: u64, hash: u64, tokens: u64) {
        let Inner {
            holders,
            workers,
            tick,
            ..
        } = self;
        if let Some(cache) = workers.get_mut(&worker) {
            touch_in(cache, holders, tick, (worker, hash, tokens));
        } else {
            *tick += 1;
        }
    }

    /// Marks `hash`, held by `worker`, as the leading block of a prefix of `tokens`.
    fn set_lead(&mut self, worker: u64, hash: u64, tokens: u64) {
        let Some(cache) = self.workers.get_mut(&worker) else {
            return;
        };
        let Some(&(tick, protected)) = cache.ticks.get(&hash) else {
            return;
        };
        let segment = if protected {
            &mut cache.protected
        } else {
            &mut cache.lru
        };
        if let Some(entry) = segment.get_mut(&tick) {
            cache.lead_used = cache
                .lead_used
                .saturating_sub(entry.lead)
                .saturating_add(tokens);
            entry.lead = tokens;
        }
    }

    /// Removes `hash` from `worker`.
    fn remove(&mut self, worker: u64, hash: u64) {
        let Some(cache) = self.workers.get_mut(&worker) else {
            return;
        };
        if let Some((tick, protected)) = cache.ticks.remove(&hash) {
            let entry = if protected {
                cache.protected.remove(&tick)
            } else {
                cache.lru.remove(&tick)
            };
            if let Some(entry) = entry {
                cache.used = cache.used.saturating_sub(entry.tokens);
                cache.lead_used = cache.lead_used.saturating_sub(entry.lead);
                if protected {
                    cache.protected_used = cache.protected_used.saturating_sub(entry.tokens);
                }
            }
            unhold(&mut self.holders, hash, worker);
        }
    }

    /// The cache of `worker`, created empty if new.
    fn cache(&mut self, worker: u64, default: u64) -> &mut WorkerCache {
        self.workers
            .entry(worker)
            .or_insert_with(|| WorkerCache::new(default))
    }

    /// Demotes `worker`'s oldest protected entries beyond the protected size to the newest end
    /// of the other segment (as the engine does), then drops least recently used entries, seen
    /// once before seen again, until it fits its capacity and the entry cap.
    fn evict(&mut self, worker: u64) {
        let max_entries = self.max_entries.max(1);
        let Some(cache) = self.workers.get_mut(&worker) else {
            return;
        };
        let protected_cap = cache.protected_capacity();
        while cache.protected_used > protected_cap {
            let Some((_, entry)) = cache.protected.pop_first() else {
                cache.protected_used = 0;
                break;
            };
            cache.protected_used = cache.protected_used.saturating_sub(entry.tokens);
            self.tick += 1;
            if let Some(hash) = entry.hash {
                cache.ticks.insert(hash, (self.tick, false));
            }
            cache.lru.insert(self.tick, entry);
        }
        let cap = cache.capacity();
        while cache.used > cap || cache.entries() > max_entries {
            let (entry, protected) = match cache.lru.pop_first() {
                Some((_, e)) => (e, false),
                None => match cache.protected.pop_first() {
                    Some((_, e)) => (e, true),
                    None => {
                        cache.used = 0;
                        cache.protected_used = 0;
                        cache.lead_used = 0;
                        break;
                    }
                },
            };
            cache.used = cache.used.saturating_sub(entry.tokens);
            cache.lead_used = cache.lead_used.saturating_sub(entry.lead);
            if protected {
                cache.protected_used = cache.protected_used.saturating_sub(entry.tokens);
            }
            if let Some(hash) = entry.hash {
                cache.ticks.remove(&hash);
                unhold(&mut self.holders, hash, worker);
            }
        }
    }
}

/// [`Inner::touch`] on the worker's cache, found once for all of a request's blocks.
fn touch_in(
    cache: &mut WorkerCache,
    holders: &mut HashKeyMap<Vec<u64>>,
    tick: &mut u64,
    (worker, hash, tokens): (u64, u64, u64),
) {
    let protect = cache.protected_base > 0;
    // A block already among the newest eighth of its segment stays where it is: the order
    // among the newest entries decides nothing until seven eighths of the segment are
    // evicted, and moving it costs two B-tree updates per block of every request (most of
    // the routing phase's CPU with a hot system prompt). Ticks advance only when an entry is
    // inserted, so the ticks taken since a block's own bound the entries newer than it (had
    // every touch taken one, a hot 23-block prompt would move ~5 blocks a request).
    if let Some(&(old, was_protected)) = cache.ticks.get(&hash) {
        let segment = if was_protected {
            cache.protected.len()
        } else {
            cache.lru.len()
        };
        if was_protected == protect && tick.saturating_sub(old) <= (segment / RECENT_SHARE) as u64 {
            return;
        }
    }
    *tick += 1;
    let tick = *tick;
    match cache.ticks.insert(hash, (tick, protect)) {
        Some((old, was_protected)) => {
            let entry = if was_protected {
                cache.protected.remove(&old)
            } else {
                cache.lru.remove(&old)
            };
            if let Some(entry) = entry {
                if protect {
                    if !was_protected {
                        cache.protected_used = cache.protected_used.saturating_add(entry.tokens);
                    }
                    cache.protected.insert(tick, entry);
                } else {
                    if was_protected {
                        cache.protected_used = cache.protected_used.saturating_sub(entry.tokens);
                    }
                    cache.lru.insert(tick, entry);
                }
            }
        }
        None => {
            cache.ticks.insert(hash, (tick, false));
            cache.lru.insert(
                tick,
                Entry {
                    hash: Some(hash),
                    tokens,
                    lead: 0,
                },
            );
            cache.used = cache.used.saturating_add(tokens);
            holders.entry(hash).or_default().push(worker);
        }
    }
}

fn forget_in(inner: &mut Inner, worker: u64) {
    if let Some(cache) = inner.workers.remove(&worker) {
        for hash in cache.ticks.into_keys() {
            unhold(&mut inner.holders, hash, worker);
        }
    }
}

fn unhold(holders: &mut HashKeyMap<Vec<u64>>, hash: u64, worker: u64) {
    if let Some(list) = holders.get_mut(&hash) {
        list.retain(|&w| w != worker);
        if list.is_empty() {
            holders.remove(&hash);
        }
    }
}

/// What was recorded for one routed request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placement<'a> {
    /// The request's chained block hashes, leading block first.
    pub hashes: &'a [u64],
    /// Tokens one block stands for.
    pub block_tokens: f64,
    /// KV the request adds beyond its blocks (partial tail block and answer), tokens.
    pub extra_tokens: u64,
    /// The worker's KV capacity in tokens, when it reports one.
    pub capacity: Option<u64>,
    /// Tokens of that capacity its segmented LRU keeps for reused blocks, when it has one.
    pub protected: Option<u64>,
}

/// Per-worker bounded LRUs of prefix blocks, with a shared block → holders map.
#[derive(Debug)]
pub struct PrefixIndex {
    /// Capacity of a worker that reports none, tokens.
    default_capacity: u64,
    inner: Mutex<Inner>,
}

impl PrefixIndex {
    /// An empty index; workers that report no KV capacity get `default_capacity` tokens.
    pub fn new(default_capacity: u64) -> Self {
        Self {
            default_capacity,
            inner: Mutex::new(Inner {
                holders: HashKeyMap::default(),
                workers: HashKeyMap::default(),
                tick: 0,
                max_entries: DEFAULT_MAX_BLOCKS_PER_WORKER,
            }),
        }
    }

    /// The same index holding at most `max_blocks` entries per worker (at least 1).
    pub fn with_max_blocks(self, max_blocks: usize) -> Self {
        let mut inner = self.inner.into_inner().unwrap_or_else(|p| p.into_inner());
        inner.max_entries = max_blocks.max(1);
        Self {
            default_capacity: self.default_capacity,
            inner: Mutex::new(inner),
        }
    }

    /// The index's state; a panic elsewhere cannot leave it inconsistent, so poison is ignored.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records that `worker` was sent a request, then evicts that worker down to its capacity.
    ///
    /// The anonymous KV goes in first and the blocks from last to first, so a prompt's leading
    /// blocks are the most recent and its tail goes first, as an engine frees a finished
    /// sequence's blocks: a surviving block is always useful to a prefix walk.
    pub fn record(&self, worker: u64, placement: Placement<'_>) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let default = self.default_capacity;
        let block_tokens = placement.block_tokens.max(1.0).round() as u64;
        let Inner {
            holders,
            workers,
            tick,
            ..
        } = inner;
        let cache = workers
            .entry(worker)
            .or_insert_with(|| WorkerCache::new(default));
        cache.set_base(placement.capacity, placement.protected, default);
        // A precise worker's events account for what it really holds; only guesses add KV.
        if placement.extra_tokens > 0 && !cache.precise {
            *tick += 1;
            cache.lru.insert(
                *tick,
                Entry {
                    hash: None,
                    tokens: placement.extra_tokens,
                    lead: 0,
                },
            );
            cache.used = cache.used.saturating_add(placement.extra_tokens);
        }
        for &hash in placement.hashes.iter().rev() {
            touch_in(cache, holders, tick, (worker, hash, block_tokens));
        }
        if let Some(&first) = placement.hashes.first() {
            let prefix = (placement.hashes.len() as u64).saturating_mul(block_tokens);
            inner.set_lead(worker, first, prefix);
        }
        inner.evict(worker);
    }

    /// For each worker that holds the first block, the number of leading blocks it holds in a row.
    ///
    /// Walks the hashes in order keeping the workers that matched every block so far and stops
    /// when none is left: O(blocks × holders), whatever the number of workers.
    pub fn matches(&self, hashes: &[u64]) -> Vec<(u64, usize)> {
        let inner = self.lock();
        let Some(first) = hashes.first().and_then(|h| inner.holders.get(h)) else {
            return Vec::new();
        };
        let mut alive: Vec<u64> = first.clone();
        let mut out = Vec::with_capacity(alive.len());
        for (depth, hash) in hashes.iter().enumerate().skip(1) {
            let held = inner.holders.get(hash).map_or(&[][..], |b| &b[..]);
            alive.retain(|w| {
                let keep = held.contains(w);
                if !keep {
                    out.push((*w, depth));
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

    /// Learns from a worker's answer: `predicted` cached tokens against the `actual` ones it
    /// reported, with `block_tokens` as the granularity below which they count as equal.
    pub fn correct(&self, worker: u64, predicted: u64, actual: u64, block_tokens: f64) {
        let slack = (2.0 * block_tokens.max(1.0)) as u64;
        let mut guard = self.lock();
        let Some(cache) = guard.workers.get_mut(&worker) else {
            return;
        };
        if cache.precise {
            return;
        }
        if predicted > slack && actual < predicted / 2 {
            cache.scale = (cache.scale * SHRINK).max(MIN_SCALE);
        } else if actual > predicted + slack {
            cache.scale = (cache.scale * GROW).min(cache.max_scale());
        } else {
            return;
        }
        guard.evict(worker);
    }

    /// Applies a worker's KV events; its entries are exact from its first snapshot on.
    pub fn apply(&self, worker: u64, update: Residency<'_>, block_tokens: f64) {
        let tokens = block_tokens.max(1.0).round() as u64;
        let default = self.default_capacity;
        let mut guard = self.lock();
        let inner = &mut *guard;
        match update {
            Residency::Snapshot(keys) => {
                let cache = inner.cache(worker, default);
                cache.precise = true;
                // Evicting as keys come keeps a huge snapshot from growing the index first.
                for &k in keys {
                    inner.touch(worker, k, tokens);
                    inner.evict(worker);
                }
            }
            Residency::Stored(keys) => {
                inner.cache(worker, default);
                for &k in keys {
                    inner.touch(worker, k, tokens);
                    inner.evict(worker);
                }
            }
            Residency::Removed(keys) => {
                for &k in keys {
                    inner.remove(worker, k);
                }
            }
            Residency::Lost => {
                if let Some(cache) = inner.workers.get_mut(&worker) {
                    cache.precise = false;
                }
                return;
            }
        }
        inner.evict(worker);
    }

    /// A precise worker's answer said only `cached_blocks` of `hashes` were cached: the rest is
    /// not there, whatever was guessed.
    pub fn refute(&self, worker: u64, hashes: &[u64], cached_blocks: usize) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner.workers.get(&worker).is_some_and(|c| c.precise) {
            return;
        }
        for &h in hashes.iter().skip(cached_blocks) {
            inner.remove(worker, h);
        }
    }

    /// Whether `worker`'s entries come from its KV events.
    pub fn is_precise(&self, worker: u64) -> bool {
        self.lock().workers.get(&worker).is_some_and(|c| c.precise)
    }

    /// Forgets everything about `worker` (restarted, re-admitted or removed).
    pub fn forget(&self, worker: u64) {
        forget_in(&mut self.lock(), worker);
    }

    /// Per worker: (key, blocks held, tokens accounted, effective capacity in tokens).
    pub fn sizes(&self) -> Vec<(u64, usize, u64, u64)> {
        let inner = self.lock();
        let mut out: Vec<_> = inner
            .workers
            .iter()
            .map(|(&k, c)| (k, c.ticks.len(), c.used, c.capacity()))
            .collect();
        out.sort_unstable();
        out
    }

    /// Per worker: (key, tokens of the prefixes homed there, effective capacity in tokens). A
    /// prefix counts while its leading block is held, with its length as last routed.
    pub fn homed(&self) -> Vec<(u64, u64, u64)> {
        let inner = self.lock();
        let mut out: Vec<_> = inner
            .workers
            .iter()
            .map(|(&k, c)| (k, c.lead_used, c.capacity()))
            .collect();
        out.sort_unstable();
        out
    }

    /// Block hashes held over all workers.
    pub fn len(&self) -> usize {
        self.lock().holders.len()
    }

    /// True when no block is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
#[path = "prefix_index_tests.rs"]
mod tests;
