//! Paged KV-cache block manager: fixed-size blocks, per-sequence block tables, reference counts,
//! a content-hashed prefix cache and segmented least-recently-used eviction of unreferenced cached
//! blocks (blocks reused at least once outlive blocks used once, up to a cap).

use std::collections::HashMap;

use crate::kv_events::{KvEventBatch, KvEventLog};
use crate::vllm_kv_events::{VllmEvent, VllmEventLog};

/// Index of one KV block in the cache.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// Default share of all blocks that free reused blocks may hold before they are demoted.
pub const DEFAULT_PROTECTED_FRACTION: f64 = 0.8;

/// Which free list a block sits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    /// Referenced by a sequence.
    None,
    /// Uncached blocks (head) and cached blocks used once (LRU towards the tail).
    Probation,
    /// Cached blocks reused at least once, LRU towards the tail.
    Protected,
}

/// Head, tail and length of one free list.
#[derive(Debug, Clone, Copy)]
struct FreeList {
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeList {
    const EMPTY: Self = Self {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

#[derive(Debug, Clone)]
struct Block {
    ref_count: u32,
    /// Content hash when this block is registered in the prefix cache.
    hash: Option<u64>,
    prev: u32,
    next: u32,
    list: List,
    /// Whether the cached content was found again (a hit, or two sequences sharing it).
    reused: bool,
}

/// Counters of the prefix cache since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Prompt tokens looked up in the prefix cache.
    pub queried_tokens: u64,
    /// Prompt tokens found in the prefix cache.
    pub hit_tokens: u64,
    /// Cached blocks whose content was dropped to make room.
    pub evictions: u64,
}

/// Owner of every KV block; sequences hold block tables (lists of `BlockId`) into it.
///
/// Free blocks sit in two doubly linked lists (a segmented LRU). *Probation*: uncached blocks at
/// the head (reused first), cached blocks used once at the tail. *Protected*: cached blocks that
/// were reused, least recently used at the head. Allocation drains probation before protected,
/// so a long shared system prompt is not pushed out by the churn of one-off questions and
/// answers. Protected holds at most `protected_cap` blocks; beyond that its oldest block is
/// demoted to the tail of probation and must be reused again to return.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    blocks: Vec<Block>,
    probation: FreeList,
    protected: FreeList,
    protected_cap: usize,
    cached: HashMap<u64, BlockId>,
    prefix_caching: bool,
    stats: CacheStats,
    /// Router keys anchored on cached blocks, when KV events are on.
    events: Option<KvEventLog>,
    /// Cached and evicted blocks in vLLM's terms, when `--kv-events-zmq` is on.
    vllm_events: Option<VllmEventLog>,
}

/// Chained content hashes of every full block of `tokens`: block i hashes block i-1's hash
/// followed by its token ids (xxh3), so equal hashes mean equal whole prefixes.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(tokens.len() / block_size.max(1));
    extend_block_hashes(&mut out, tokens, block_size);
    out
}

/// Appends the hashes of full blocks of `tokens` not yet covered by `hashes`.
pub fn extend_block_hashes(hashes: &mut Vec<u64>, tokens: &[u32], block_size: usize) {
    if block_size == 0 {
        return;
    }
    let full = tokens.len() / block_size;
    if hashes.len() >= full {
        return;
    }
    let mut buf = Vec::with_capacity(8 + 4 * block_size);
    while hashes.len() < full {
        let i = hashes.len();
        let parent = if i == 0 { 0 } else { hashes[i - 1] };
        buf.clear();
        buf.extend_from_slice(&parent.to_le_bytes());
        for t in &tokens[i * block_size..(i + 1) * block_size] {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        hashes.push(xxhash_rust::xxh3::xxh3_64(&buf));
    }
}

impl BlockManager {
    /// A manager of `num_blocks` blocks of `block_size` tokens each.
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        let mut m = Self {
            block_size: block_size.max(1),
            blocks: vec![
                Block {
                    ref_count: 0,
                    hash: None,
                    prev: NIL,
                    next: NIL,
                    list: List::None,
                    reused: false,
                };
                num_blocks
            ],
            probation: FreeList::EMPTY,
            protected: FreeList::EMPTY,
            protected_cap: protected_cap(num_blocks, DEFAULT_PROTECTED_FRACTION),
            cached: HashMap::new(),
            prefix_caching,
            stats: CacheStats::default(),
            events: None,
            vllm_events: None,
        };
        for id in 0..num_blocks as u32 {
            m.push_back(List::Probation, id);
        }
        m
    }

    /// Sets the share of all blocks (0..=1) that free reused blocks may hold; 0 is plain LRU.
    pub fn set_protected_fraction(&mut self, fraction: f64) {
        self.protected_cap = protected_cap(self.blocks.len(), fraction);
        self.demote_overflow();
    }

    /// Most free reused blocks kept ahead of blocks used once.
    pub fn protected_cap(&self) -> usize {
        self.protected_cap
    }

    /// Turns on KV events: router keys can be anchored on cached blocks and their residency read
    /// with [`take_events`](Self::take_events).
    pub fn enable_events(&mut self) {
        if self.prefix_caching {
            self.events = Some(KvEventLog::default());
        }
    }

    /// Whether KV events are on.
    pub fn events_enabled(&self) -> bool {
        self.events.is_some()
    }

    /// Anchors a router `key` on the block cached under `hash`; nothing when it is not cached.
    pub fn anchor_key(&mut self, hash: u64, key: u64) {
        if let Some(log) = &mut self.events
            && self.cached.contains_key(&hash)
        {
            log.attach(hash, key);
        }
    }

    /// Turns on vLLM-format events: cached and evicted blocks with their tokens, read with
    /// [`take_vllm_events`](Self::take_vllm_events).
    pub fn enable_vllm_events(&mut self) {
        if self.prefix_caching {
            self.vllm_events = Some(VllmEventLog::default());
        }
    }

    /// vLLM-format events since the last call (empty when they are off).
    pub fn take_vllm_events(&mut self) -> Vec<VllmEvent> {
        self.vllm_events
            .as_mut()
            .map(VllmEventLog::take)
            .unwrap_or_default()
    }

    /// Net change of resident router keys since the last call (empty when events are off).
    pub fn take_events(&mut self) -> KvEventBatch {
        self.events
            .as_mut()
            .map(KvEventLog::take)
            .unwrap_or_default()
    }

    /// The event log (tests and snapshots).
    pub fn events(&self) -> Option<&KvEventLog> {
        self.events.as_ref()
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// All blocks, free or not.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks no sequence references (including evictable cached ones).
    pub fn num_free_blocks(&self) -> usize {
        self.probation.len + self.protected.len
    }

    /// Fraction of blocks referenced by a sequence, 0..=1 (vLLM's `kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        1.0 - self.num_free_blocks() as f64 / self.blocks.len() as f64
    }

    /// Prefix cache counters.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Whether content-hashed reuse is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// Length in blocks of the longest run of `hashes` present in the cache (nothing is taken).
    pub fn find_cached_prefix(&self, hashes: &[u64]) -> usize {
        if !self.prefix_caching {
            return 0;
        }
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// Records one prefix-cache lookup of a new request for the hit-rate counters.
    pub fn record_lookup(&mut self, queried_tokens: usize, hit_tokens: usize) {
        self.stats.queried_tokens += queried_tokens as u64;
        self.stats.hit_tokens += hit_tokens as u64;
    }

    /// Takes a reference on the cached blocks of `hashes[..n]` and appends them to `table`.
    /// `n` must not exceed what [`find_cached_prefix`](Self::find_cached_prefix) returned.
    pub fn acquire_cached(&mut self, table: &mut Vec<BlockId>, hashes: &[u64], n: usize) {
        for h in &hashes[..n] {
            let Some(&id) = self.cached.get(h) else {
                return;
            };
            if self.blocks[id as usize].ref_count == 0 {
                self.unlink(id);
            }
            let block = &mut self.blocks[id as usize];
            block.ref_count += 1;
            block.reused = true;
            table.push(id);
        }
    }

    /// Grows `table` to hold `num_tokens` tokens. Returns false, changing nothing, when too few
    /// blocks are free.
    pub fn allocate_slots(&mut self, table: &mut Vec<BlockId>, num_tokens: usize) -> bool {
        let need = self.blocks_for(num_tokens).saturating_sub(table.len());
        if need > self.num_free_blocks() {
            return false;
        }
        for _ in 0..need {
            let id = if self.probation.head != NIL {
                self.probation.head
            } else {
                self.protected.head
            };
            self.unlink(id);
            let block = &mut self.blocks[id as usize];
            block.reused = false;
            if let Some(h) = block.hash.take() {
                if self.cached.get(&h) == Some(&id) {
                    self.cached.remove(&h);
                    if let Some(log) = &mut self.events {
                        log.evicted(h);
                    }
                    if let Some(log) = &mut self.vllm_events {
                        log.removed(h);
                    }
                }
                self.stats.evictions += 1;
            }
            block.ref_count = 1;
            table.push(id);
        }
        true
    }

    /// Registers the blocks `table[from..to]`, now full and computed, under `hashes[from..to]`.
    /// A hash already cached by another block leaves this block unregistered.
    pub fn cache_full_blocks(&mut self, table: &[BlockId], hashes: &[u64], from: usize, to: usize) {
        self.cache_full_blocks_of(table, hashes, &[], from, to);
    }

    /// [`cache_full_blocks`](Self::cache_full_blocks) for a sequence of `tokens`, which the
    /// vLLM-format events of the newly cached blocks carry.
    pub fn cache_full_blocks_of(
        &mut self,
        table: &[BlockId],
        hashes: &[u64],
        tokens: &[u32],
        from: usize,
        to: usize,
    ) {
        if !self.prefix_caching {
            return;
        }
        let bs = self.block_size;
        let to = to.min(table.len()).min(hashes.len());
        for i in from..to {
            let id = table[i];
            let block = &mut self.blocks[id as usize];
            if block.hash.is_some() {
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = self.cached.entry(hashes[i]) {
                e.insert(id);
                block.hash = Some(hashes[i]);
                if let Some(log) = &mut self.vllm_events
                    && let Some(block_tokens) = tokens.get(i * bs..(i + 1) * bs)
                {
                    let parent = i.checked_sub(1).map(|p| hashes[p]);
                    log.stored(hashes[i], parent, block_tokens);
                }
            }
        }
    }

    /// Drops one reference on each block of `table` and clears it. Tail blocks are released
    /// first so that, among equally old blocks, the end of a prompt is evicted before its start.
    pub fn free(&mut self, table: &mut Vec<BlockId>) {
        for &id in table.iter().rev() {
            let block = &mut self.blocks[id as usize];
            debug_assert!(block.ref_count > 0, "double free of block {id}");
            block.ref_count = block.ref_count.saturating_sub(1);
            if block.ref_count == 0 {
                match (block.hash.is_some(), block.reused) {
                    (true, true) => self.push_back(List::Protected, id),
                    (true, false) => self.push_back(List::Probation, id),
                    (false, _) => self.push_front(List::Probation, id),
                }
            }
        }
        table.clear();
        self.demote_overflow();
    }

    /// Moves the oldest protected blocks beyond the cap to the tail of probation.
    fn demote_overflow(&mut self) {
        while self.protected.len > self.protected_cap {
            let id = self.protected.head;
            self.unlink(id);
            self.blocks[id as usize].reused = false;
            self.push_back(List::Probation, id);
        }
    }

    /// Reference count of one block (tests and invariants).
    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].ref_count
    }

    /// Content hash a block is cached under, if any.
    pub fn block_hash(&self, id: BlockId) -> Option<u64> {
        self.blocks[id as usize].hash
    }

    fn list_mut(&mut self, list: List) -> &mut FreeList {
        match list {
            List::Protected => &mut self.protected,
            List::Probation | List::None => &mut self.probation,
        }
    }

    fn push_back(&mut self, list: List, id: u32) {
        let tail = self.list_mut(list).tail;
        let b = &mut self.blocks[id as usize];
        b.prev = tail;
        b.next = NIL;
        b.list = list;
        if tail == NIL {
            self.list_mut(list).head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        let l = self.list_mut(list);
        l.tail = id;
        l.len += 1;
    }

    fn push_front(&mut self, list: List, id: u32) {
        let head = self.list_mut(list).head;
        let b = &mut self.blocks[id as usize];
        b.next = head;
        b.prev = NIL;
        b.list = list;
        if head == NIL {
            self.list_mut(list).tail = id;
        } else {
            self.blocks[head as usize].prev = id;
        }
        let l = self.list_mut(list);
        l.head = id;
        l.len += 1;
    }

    fn unlink(&mut self, id: u32) {
        let (prev, next, list) = {
            let b = &self.blocks[id as usize];
            debug_assert!(b.list != List::None);
            (b.prev, b.next, b.list)
        };
        if prev == NIL {
            self.list_mut(list).head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.list_mut(list).tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id as usize];
        b.prev = NIL;
        b.next = NIL;
        b.list = List::None;
        self.list_mut(list).len -= 1;
    }
}

/// Blocks the protected list may hold for `fraction` of `num_blocks` (clamped to 0..=1).
fn protected_cap(num_blocks: usize, fraction: f64) -> usize {
    let f = if fraction.is_finite() {
        fraction.clamp(0.0, 1.0)
    } else {
        0.0
    };
    (num_blocks as f64 * f).floor() as usize
}

#[cfg(test)]
#[path = "block_manager_tests.rs"]
mod tests;
