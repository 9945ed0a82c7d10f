//! Paged KV-cache block manager: fixed-size blocks, per-sequence block tables, reference counts,
//! a content-hashed prefix cache and least-recently-used eviction of unreferenced cached blocks.

use std::collections::HashMap;

use crate::kv_events::{KvEventBatch, KvEventLog};

/// Index of one KV block in the cache.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Block {
    ref_count: u32,
    /// Content hash when this block is registered in the prefix cache.
    hash: Option<u64>,
    prev: u32,
    next: u32,
    in_free_list: bool,
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
/// Free blocks sit in one doubly linked list: allocation takes from the head, uncached blocks are
/// returned to the head (reused first), cached blocks to the tail (kept longest), so the head of
/// the cached part is always the least recently used.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    blocks: Vec<Block>,
    free_head: u32,
    free_tail: u32,
    num_free: usize,
    cached: HashMap<u64, BlockId>,
    prefix_caching: bool,
    stats: CacheStats,
    /// Router keys anchored on cached blocks, when KV events are on.
    events: Option<KvEventLog>,
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
                    in_free_list: false,
                };
                num_blocks
            ],
            free_head: NIL,
            free_tail: NIL,
            num_free: 0,
            cached: HashMap::new(),
            prefix_caching,
            stats: CacheStats::default(),
            events: None,
        };
        for id in 0..num_blocks as u32 {
            m.push_back(id);
        }
        m
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
        self.num_free
    }

    /// Fraction of blocks referenced by a sequence, 0..=1 (vLLM's `kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        1.0 - self.num_free as f64 / self.blocks.len() as f64
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
            self.blocks[id as usize].ref_count += 1;
            table.push(id);
        }
    }

    /// Grows `table` to hold `num_tokens` tokens. Returns false, changing nothing, when too few
    /// blocks are free.
    pub fn allocate_slots(&mut self, table: &mut Vec<BlockId>, num_tokens: usize) -> bool {
        let need = self.blocks_for(num_tokens).saturating_sub(table.len());
        if need > self.num_free {
            return false;
        }
        for _ in 0..need {
            let id = self.free_head;
            self.unlink(id);
            let block = &mut self.blocks[id as usize];
            if let Some(h) = block.hash.take() {
                if self.cached.get(&h) == Some(&id) {
                    self.cached.remove(&h);
                    if let Some(log) = &mut self.events {
                        log.evicted(h);
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
        if !self.prefix_caching {
            return;
        }
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
                if block.hash.is_some() {
                    self.push_back(id);
                } else {
                    self.push_front(id);
                }
            }
        }
        table.clear();
    }

    /// Reference count of one block (tests and invariants).
    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].ref_count
    }

    /// Content hash a block is cached under, if any.
    pub fn block_hash(&self, id: BlockId) -> Option<u64> {
        self.blocks[id as usize].hash
    }

    fn push_back(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        b.prev = self.free_tail;
        b.next = NIL;
        b.in_free_list = true;
        if self.free_tail == NIL {
            self.free_head = id;
        } else {
            self.blocks[self.free_tail as usize].next = id;
        }
        self.free_tail = id;
        self.num_free += 1;
    }

    fn push_front(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        b.next = self.free_head;
        b.prev = NIL;
        b.in_free_list = true;
        if self.free_head == NIL {
            self.free_tail = id;
        } else {
            self.blocks[self.free_head as usize].prev = id;
        }
        self.free_head = id;
        self.num_free += 1;
    }

    fn unlink(&mut self, id: u32) {
        let (prev, next) = {
            let b = &self.blocks[id as usize];
            debug_assert!(b.in_free_list);
            (b.prev, b.next)
        };
        if prev == NIL {
            self.free_head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.free_tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id as usize];
        b.prev = NIL;
        b.next = NIL;
        b.in_free_list = false;
        self.num_free -= 1;
    }
}

#[cfg(test)]
#[path = "block_manager_tests.rs"]
mod tests;
