//! Tests of the KV block manager.

use super::*;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use std::collections::VecDeque;

const BS: usize = 4;

/// `n` tokens starting at `start`: distinct, recognisable content.
fn toks(start: u32, n: usize) -> Vec<u32> {
    (start..start + n as u32).collect()
}

/// What the scheduler does for a new prompt that runs to completion in one step: look up the
/// cached prefix (never the whole prompt), take it, allocate the rest, register every full block.
/// Returns the block table and the number of cached blocks hit.
fn run_prompt(bm: &mut BlockManager, tokens: &[u32]) -> (Vec<BlockId>, usize) {
    let bs = bm.block_size();
    let hashes = block_hashes(tokens, bs);
    let limit = (tokens.len() - 1) / bs;
    let n = bm.find_cached_prefix(&hashes[..limit]);
    let mut table = Vec::new();
    bm.acquire_cached(&mut table, &hashes, n);
    assert_eq!(table.len(), n);
    assert!(bm.allocate_slots(&mut table, tokens.len()));
    bm.cache_full_blocks(&table, &hashes, n, hashes.len());
    (table, n)
}

#[test]
fn new_manager_is_all_free() {
    let bm = BlockManager::new(8, BS, true);
    assert_eq!(bm.num_blocks(), 8);
    assert_eq!(bm.num_free_blocks(), 8);
    assert_eq!(bm.block_size(), BS);
    assert_eq!(bm.usage(), 0.0);
    assert!(bm.prefix_caching());
    assert_eq!(bm.stats(), CacheStats::default());
    assert_eq!(bm.blocks_for(0), 0);
    assert_eq!(bm.blocks_for(1), 1);
    assert_eq!(bm.blocks_for(4), 1);
    assert_eq!(bm.blocks_for(5), 2);
    for id in 0..8 {
        assert_eq!(bm.ref_count(id), 0);
        assert_eq!(bm.block_hash(id), None);
    }
}

#[test]
fn allocation_and_free_counts() {
    let mut bm = BlockManager::new(8, BS, true);
    let mut t = Vec::new();
    assert!(bm.allocate_slots(&mut t, 5));
    assert_eq!(t.len(), 2);
    assert_eq!(bm.num_free_blocks(), 6);
    // Growing within the last block takes nothing new.
    assert!(bm.allocate_slots(&mut t, 8));
    assert_eq!(t.len(), 2);
    assert_eq!(bm.num_free_blocks(), 6);
    // Asking for fewer tokens than the table holds never shrinks it.
    assert!(bm.allocate_slots(&mut t, 1));
    assert_eq!(t.len(), 2);
    assert!(bm.allocate_slots(&mut t, 9));
    assert_eq!(t.len(), 3);
    assert_eq!(bm.num_free_blocks(), 5);
    let mut distinct = t.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 3);
    for &id in &t {
        assert_eq!(bm.ref_count(id), 1);
    }

    let mut u = Vec::new();
    assert!(bm.allocate_slots(&mut u, 5 * BS));
    assert_eq!(bm.num_free_blocks(), 0);
    assert!(u.iter().all(|id| !t.contains(id)));

    bm.free(&mut t);
    assert!(t.is_empty());
    assert_eq!(bm.num_free_blocks(), 3);
    bm.free(&mut u);
    assert_eq!(bm.num_free_blocks(), 8);
    for id in 0..8 {
        assert_eq!(bm.ref_count(id), 0);
    }
}

#[test]
fn usage_is_referenced_fraction() {
    let mut bm = BlockManager::new(10, BS, true);
    let mut t = Vec::new();
    assert!(bm.allocate_slots(&mut t, 3 * BS));
    assert!((bm.usage() - 0.3).abs() < 1e-12);
    assert!(bm.allocate_slots(&mut t, 10 * BS));
    assert_eq!(bm.usage(), 1.0);
    bm.free(&mut t);
    assert_eq!(bm.usage(), 0.0);

    // Freed cached blocks are free: they do not count as used.
    let (mut t, _) = run_prompt(&mut bm, &toks(0, 4 * BS));
    assert!((bm.usage() - 0.4).abs() < 1e-12);
    bm.free(&mut t);
    assert_eq!(bm.usage(), 0.0);

    assert_eq!(BlockManager::new(0, BS, true).usage(), 0.0);
}

#[test]
fn shared_block_needs_every_reference_dropped() {
    let mut bm = BlockManager::new(4, BS, true);
    let prompt = toks(0, 2 * BS + 1);
    let (mut a, _) = run_prompt(&mut bm, &prompt);
    let (mut b, hit) = run_prompt(&mut bm, &prompt);
    assert_eq!(hit, 2);
    assert_eq!(a[..2], b[..2]);
    assert_eq!(bm.ref_count(a[0]), 2);
    assert_eq!(bm.ref_count(a[1]), 2);
    assert_eq!(bm.num_free_blocks(), 0);
    bm.free(&mut a);
    assert_eq!(bm.ref_count(b[0]), 1);
    assert_eq!(bm.ref_count(b[1]), 1);
    assert_eq!(bm.num_free_blocks(), 1);
    bm.free(&mut b);
    assert_eq!(bm.num_free_blocks(), 4);
}

#[test]
fn prefix_hit_counts_exactly_the_shared_full_blocks() {
    let base = toks(100, 4 * BS + 2);
    for k in 0..=4 {
        let mut bm = BlockManager::new(16, BS, true);
        let (mut t, hit) = run_prompt(&mut bm, &base);
        assert_eq!(hit, 0);
        bm.free(&mut t);

        // Same first k blocks, then something different in block k (if any).
        let mut other = base.clone();
        if k < 4 {
            other[k * BS + 1] = 9999;
        }
        let hashes = block_hashes(&other, BS);
        assert_eq!(bm.find_cached_prefix(&hashes), k, "k = {k}");
        let mut u = Vec::new();
        bm.acquire_cached(&mut u, &hashes, k);
        assert_eq!(u.len(), k);
        let orig = block_hashes(&base, BS);
        for (i, &id) in u.iter().enumerate() {
            assert_eq!(bm.block_hash(id), Some(orig[i]));
            assert_eq!(bm.ref_count(id), 1);
        }
        assert_eq!(bm.num_free_blocks(), 16 - k);
        bm.free(&mut u);
        assert_eq!(bm.num_free_blocks(), 16);
    }
}

#[test]
fn partial_blocks_are_never_cached() {
    let mut bm = BlockManager::new(8, BS, true);
    let prompt = toks(0, 2 * BS + 3);
    let (mut t, _) = run_prompt(&mut bm, &prompt);
    assert!(bm.block_hash(t[0]).is_some());
    assert!(bm.block_hash(t[1]).is_some());
    assert_eq!(bm.block_hash(t[2]), None);
    bm.free(&mut t);
    // The same prompt extended: the third block is new content, not a hit.
    let longer = toks(0, 3 * BS + 1);
    assert_eq!(bm.find_cached_prefix(&block_hashes(&longer, BS)), 2);
}

#[test]
fn hit_on_free_cached_block_takes_it_out_of_the_free_list() {
    let mut bm = BlockManager::new(4, BS, true);
    let prompt = toks(0, 2 * BS + 1);
    let (mut t, _) = run_prompt(&mut bm, &prompt);
    let cached0 = t[0];
    bm.free(&mut t);
    assert_eq!(bm.num_free_blocks(), 4);

    let hashes = block_hashes(&prompt, BS);
    let mut a = Vec::new();
    bm.acquire_cached(&mut a, &hashes, 1);
    assert_eq!(a, vec![cached0]);
    assert_eq!(bm.num_free_blocks(), 3);
    assert_eq!(bm.ref_count(cached0), 1);

    // Allocating every other block must not hand out (or evict) the referenced one.
    let mut b = Vec::new();
    assert!(bm.allocate_slots(&mut b, 3 * BS));
    assert!(!b.contains(&cached0));
    assert_eq!(bm.num_free_blocks(), 0);
    assert!(!bm.allocate_slots(&mut b, 4 * BS));
    assert_eq!(bm.ref_count(cached0), 1);
    assert_eq!(bm.block_hash(cached0), Some(hashes[0]));
    assert_eq!(bm.find_cached_prefix(&hashes), 1);

    bm.free(&mut b);
    bm.free(&mut a);
    assert_eq!(bm.num_free_blocks(), 4);
    assert_eq!(bm.find_cached_prefix(&hashes), 1);
}

#[test]
fn lru_evicts_older_prompt_before_newer() {
    let mut bm = BlockManager::new(4, BS, true);
    // Two full blocks each: both are registered, nothing partial is left over.
    let a = toks(0, 2 * BS);
    let b = toks(1000, 2 * BS);
    let ha = block_hashes(&a, BS);
    let hb = block_hashes(&b, BS);

    let (mut ta, _) = run_prompt(&mut bm, &a);
    let a_blocks = ta.clone();
    bm.free(&mut ta);
    let (mut tb, _) = run_prompt(&mut bm, &b);
    let b_blocks = tb.clone();
    bm.free(&mut tb);
    // Every block now holds cached content.
    for id in 0..4 {
        assert!(bm.block_hash(id).is_some(), "block {id} not cached");
    }
    assert_eq!(bm.find_cached_prefix(&ha), 2);
    assert_eq!(bm.find_cached_prefix(&hb), 2);

    let mut fresh = Vec::new();
    assert!(bm.allocate_slots(&mut fresh, 2 * BS));
    let mut got = fresh.clone();
    got.sort_unstable();
    let mut want = a_blocks.clone();
    want.sort_unstable();
    assert_eq!(got, want);
    assert_eq!(bm.find_cached_prefix(&ha), 0);
    assert_eq!(bm.find_cached_prefix(&hb), 2);
    assert_eq!(bm.stats().evictions, 2);

    assert!(bm.allocate_slots(&mut fresh, 3 * BS));
    assert!(b_blocks.contains(&fresh[2]));
    assert_eq!(bm.find_cached_prefix(&hb), 1);
}

#[test]
fn hit_refreshes_recency() {
    let mut bm = BlockManager::new(4, BS, true);
    let a = toks(0, 2 * BS);
    let b = toks(1000, 2 * BS);
    let ha = block_hashes(&a, BS);
    let (mut ta, _) = run_prompt(&mut bm, &a);
    bm.free(&mut ta);
    let (mut tb, _) = run_prompt(&mut bm, &b);
    bm.free(&mut tb);
    // A is older, but is used again after B was freed: B becomes the eviction candidate.
    let mut again = Vec::new();
    bm.acquire_cached(&mut again, &ha, 2);
    assert_eq!(bm.num_free_blocks(), 2);
    bm.free(&mut again);

    let mut fresh = Vec::new();
    assert!(bm.allocate_slots(&mut fresh, 2 * BS));
    assert_eq!(bm.find_cached_prefix(&ha), 2);
    assert_eq!(bm.find_cached_prefix(&block_hashes(&b, BS)), 0);
}

#[test]
fn tail_blocks_evicted_before_head_blocks() {
    let mut bm = BlockManager::new(3, BS, true);
    let prompt = toks(0, 3 * BS);
    let hashes = block_hashes(&prompt, BS);
    let mut t = Vec::new();
    assert!(bm.allocate_slots(&mut t, 3 * BS));
    bm.cache_full_blocks(&t, &hashes, 0, 3);
    let blocks = t.clone();
    bm.free(&mut t);
    assert_eq!(bm.find_cached_prefix(&hashes), 3);

    let mut fresh = Vec::new();
    assert!(bm.allocate_slots(&mut fresh, BS));
    assert_eq!(fresh, vec![blocks[2]]);
    assert_eq!(bm.find_cached_prefix(&hashes), 2);
    assert!(bm.allocate_slots(&mut fresh, 2 * BS));
    assert_eq!(fresh[1], blocks[1]);
    assert_eq!(bm.find_cached_prefix(&hashes), 1);
    assert!(bm.allocate_slots(&mut fresh, 3 * BS));
    assert_eq!(fresh[2], blocks[0]);
    assert_eq!(bm.find_cached_prefix(&hashes), 0);
    assert_eq!(bm.stats().evictions, 3);
}

#[test]
fn uncached_free_blocks_are_reused_before_cached_ones() {
    let mut bm = BlockManager::new(4, BS, true);
    let prompt = toks(0, 2 * BS + 1);
    let (mut t, _) = run_prompt(&mut bm, &prompt);
    let partial = t[2];
    bm.free(&mut t);
    let mut u = Vec::new();
    assert!(bm.allocate_slots(&mut u, 2 * BS));
    // The never-used block and the uncached partial block go first, no eviction.
    assert!(u.contains(&partial));
    assert_eq!(bm.stats().evictions, 0);
    assert_eq!(bm.find_cached_prefix(&block_hashes(&prompt, BS)), 2);
}

#[test]
fn failed_allocation_changes_nothing() {
    let mut bm = BlockManager::new(5, BS, true);
    let prompt = toks(0, 2 * BS + 1);
    let hashes = block_hashes(&prompt, BS);
    let (mut t, _) = run_prompt(&mut bm, &prompt);
    bm.free(&mut t);
    let mut held = Vec::new();
    assert!(bm.allocate_slots(&mut held, BS));

    let mut table = Vec::new();
    bm.acquire_cached(&mut table, &hashes, 1);
    let before_table = table.clone();
    let free_before = bm.num_free_blocks();
    let stats_before = bm.stats();
    let refs_before: Vec<u32> = (0..5).map(|id| bm.ref_count(id)).collect();
    let hashes_before: Vec<Option<u64>> = (0..5).map(|id| bm.block_hash(id)).collect();

    assert!(!bm.allocate_slots(&mut table, 10 * BS));
    assert_eq!(table, before_table);
    assert_eq!(bm.num_free_blocks(), free_before);
    assert_eq!(bm.stats(), stats_before);
    let refs_after: Vec<u32> = (0..5).map(|id| bm.ref_count(id)).collect();
    let hashes_after: Vec<Option<u64>> = (0..5).map(|id| bm.block_hash(id)).collect();
    assert_eq!(refs_after, refs_before);
    assert_eq!(hashes_after, hashes_before);
    assert_eq!(bm.find_cached_prefix(&hashes), 2);

    // Exactly what is free still fits afterwards.
    assert!(bm.allocate_slots(&mut table, (1 + free_before) * BS));
    assert_eq!(bm.num_free_blocks(), 0);
}

#[test]
fn prefix_caching_disabled_never_hits() {
    let mut bm = BlockManager::new(8, BS, false);
    assert!(!bm.prefix_caching());
    let prompt = toks(0, 3 * BS + 1);
    let hashes = block_hashes(&prompt, BS);
    for _ in 0..3 {
        let (mut t, hit) = run_prompt(&mut bm, &prompt);
        assert_eq!(hit, 0);
        assert!(t.iter().all(|&id| bm.block_hash(id).is_none()));
        bm.free(&mut t);
        assert_eq!(bm.find_cached_prefix(&hashes), 0);
    }
    let mut t = Vec::new();
    bm.acquire_cached(&mut t, &hashes, hashes.len());
    assert!(t.is_empty());
    assert_eq!(bm.num_free_blocks(), 8);
    assert_eq!(bm.stats().evictions, 0);
}

#[test]
fn chained_hashes() {
    let a: Vec<u32> = [toks(0, BS), toks(50, BS)].concat();
    let mut b = a.clone();
    b[BS + 2] = 7777;
    let ha = block_hashes(&a, BS);
    let hb = block_hashes(&b, BS);
    assert_eq!(ha.len(), 2);
    assert_eq!(ha[0], hb[0]);
    assert_ne!(ha[1], hb[1]);

    // Same content of block 1 after different block 0 hashes differently.
    let c: Vec<u32> = [toks(900, BS), toks(50, BS)].concat();
    let hc = block_hashes(&c, BS);
    assert_ne!(ha[0], hc[0]);
    assert_ne!(ha[1], hc[1]);

    // Only full blocks are hashed, and the hash does not depend on what follows.
    assert_eq!(block_hashes(&a[..2 * BS - 1], BS), ha[..1]);
    let mut longer = a.clone();
    longer.extend(toks(3000, BS + 1));
    assert_eq!(block_hashes(&longer, BS)[..2], ha[..]);
    assert!(block_hashes(&a, 0).is_empty());

    // Incremental extension equals hashing everything at once.
    let mut inc = Vec::new();
    for end in 0..=longer.len() {
        extend_block_hashes(&mut inc, &longer[..end], BS);
        assert_eq!(inc, block_hashes(&longer[..end], BS));
    }
}

#[test]
fn stats_count_evictions_and_lookups() {
    let mut bm = BlockManager::new(2, BS, true);
    let a = toks(0, 2 * BS);
    let (mut t, _) = run_prompt(&mut bm, &a);
    // Both blocks full; the last one is registered too (hashes.len() == 2).
    assert!(bm.block_hash(t[1]).is_some());
    bm.free(&mut t);
    assert_eq!(bm.stats().evictions, 0);

    let mut u = Vec::new();
    assert!(bm.allocate_slots(&mut u, BS));
    assert_eq!(bm.stats().evictions, 1);
    assert!(bm.allocate_slots(&mut u, 2 * BS));
    assert_eq!(bm.stats().evictions, 2);
    bm.free(&mut u);
    // Reusing uncached blocks is not an eviction.
    assert!(bm.allocate_slots(&mut u, 2 * BS));
    assert_eq!(bm.stats().evictions, 2);
    for &id in &u {
        assert_eq!(bm.block_hash(id), None);
    }

    bm.record_lookup(10, 4);
    bm.record_lookup(6, 0);
    let s = bm.stats();
    assert_eq!((s.queried_tokens, s.hit_tokens, s.evictions), (16, 4, 2));
}

#[test]
fn duplicate_content_is_registered_once() {
    let mut bm = BlockManager::new(4, BS, true);
    let prompt = toks(0, BS);
    let hashes = block_hashes(&prompt, BS);
    // Two sequences compute the same block concurrently.
    let mut a = Vec::new();
    let mut b = Vec::new();
    assert!(bm.allocate_slots(&mut a, BS));
    assert!(bm.allocate_slots(&mut b, BS));
    bm.cache_full_blocks(&a, &hashes, 0, 1);
    bm.cache_full_blocks(&b, &hashes, 0, 1);
    assert_eq!(bm.block_hash(a[0]), Some(hashes[0]));
    assert_eq!(bm.block_hash(b[0]), None);
    let mut got = Vec::new();
    bm.acquire_cached(&mut got, &hashes, 1);
    assert_eq!(got, a);
    bm.free(&mut a);
    bm.free(&mut b);
    bm.free(&mut got);
    assert_eq!(bm.num_free_blocks(), 4);
    // The unregistered duplicate is reused before the cached original.
    let mut c = Vec::new();
    assert!(bm.allocate_slots(&mut c, 3 * BS));
    assert_eq!(bm.stats().evictions, 0);
    assert_eq!(bm.find_cached_prefix(&hashes), 1);
}

// ---------------------------------------------------------------------------------------------
// Property tests: random scheduler-like workloads checked against a shadow model.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    /// A new request: shared prefix `prefix` (index into the pool) followed by `suffix`; its
    /// first chunk of `chunk` tokens is scheduled at once.
    Start {
        prefix: usize,
        suffix: Vec<u32>,
        chunk: usize,
    },
    /// Computes the next `chunk` pending tokens of a running sequence.
    Advance { seq: usize, chunk: usize },
    /// Appends generated tokens to a sequence that has computed all it has.
    Append { seq: usize, tokens: Vec<u32> },
    /// The sequence finishes or is aborted.
    Finish { seq: usize },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..8, prop::collection::vec(0u32..3, 0..10), 1usize..14)
            .prop_map(|(prefix, suffix, chunk)| Op::Start { prefix, suffix, chunk }),
        4 => (0usize..64, 1usize..14).prop_map(|(seq, chunk)| Op::Advance { seq, chunk }),
        2 => (0usize..64, prop::collection::vec(0u32..3, 1..4))
            .prop_map(|(seq, tokens)| Op::Append { seq, tokens }),
        1 => (0usize..64).prop_map(|seq| Op::Finish { seq }),
    ]
}

#[derive(Debug)]
struct Seq {
    tokens: Vec<u32>,
    hashes: Vec<u64>,
    table: Vec<BlockId>,
    /// Tokens whose KV has been written.
    computed: usize,
    /// Leading blocks already handed to `cache_full_blocks` (or taken from the cache).
    registered: usize,
}

/// The manager under test plus an independent model of what it should do.
struct Harness {
    bm: BlockManager,
    bs: usize,
    caching: bool,
    seqs: Vec<Seq>,
    /// What each block holds, slot by slot, as written by the sequence that computed it.
    written: Vec<Vec<Option<u32>>>,
    /// For a full computed block, the whole token prefix up to and including it.
    prefix_of: Vec<Option<Vec<u32>>>,
    /// Model of the probation free list: front is allocated first.
    free_order: VecDeque<BlockId>,
    /// Model of the protected free list (reused cached blocks): allocated once probation is empty.
    protected_order: VecDeque<BlockId>,
    /// Most blocks the protected list may hold.
    protected_cap: usize,
    /// Whether a block's cached content was taken from the cache since it was written.
    reused: Vec<bool>,
    refs: Vec<u32>,
    hash_of: Vec<Option<u64>>,
    cached: HashMap<u64, BlockId>,
    evictions: u64,
    hits: usize,
    preemptions: usize,
    /// Hits on blocks nobody else referenced (taken out of the free list).
    free_hits: usize,
    /// Allocations that had to take a protected block.
    protected_taken: usize,
}

impl Harness {
    fn new(num_blocks: usize, bs: usize, caching: bool, protected_fraction: f64) -> Self {
        let mut bm = BlockManager::new(num_blocks, bs, caching);
        bm.set_protected_fraction(protected_fraction);
        let protected_cap = (num_blocks as f64 * protected_fraction).floor() as usize;
        assert_eq!(bm.protected_cap(), protected_cap);
        Self {
            bm,
            bs,
            caching,
            seqs: Vec::new(),
            written: vec![vec![None; bs]; num_blocks],
            prefix_of: vec![None; num_blocks],
            free_order: (0..num_blocks as BlockId).collect(),
            protected_order: VecDeque::new(),
            protected_cap,
            reused: vec![false; num_blocks],
            refs: vec![0; num_blocks],
            hash_of: vec![None; num_blocks],
            cached: HashMap::new(),
            evictions: 0,
            hits: 0,
            preemptions: 0,
            free_hits: 0,
            protected_taken: 0,
        }
    }

    fn model_prefix(&self, hashes: &[u64]) -> usize {
        if !self.caching {
            return 0;
        }
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    fn allocate(&mut self, table: &mut Vec<BlockId>, num_tokens: usize) -> bool {
        let old_len = table.len();
        let need = num_tokens.div_ceil(self.bs).saturating_sub(old_len);
        let free_before = self.bm.num_free_blocks();
        let stats_before = self.bm.stats();
        let ok = self.bm.allocate_slots(table, num_tokens);
        let free = self.free_order.len() + self.protected_order.len();
        assert_eq!(ok, need <= free, "allocation outcome");
        if !ok {
            assert_eq!(table.len(), old_len, "failed allocation grew the table");
            assert_eq!(self.bm.num_free_blocks(), free_before);
            assert_eq!(self.bm.stats(), stats_before);
            return false;
        }
        assert_eq!(table.len(), old_len + need);
        for &id in &table[old_len..] {
            let want = match self.free_order.pop_front() {
                Some(id) => id,
                None => {
                    self.protected_taken += 1;
                    self.protected_order
                        .pop_front()
                        .expect("model free list empty")
                }
            };
            assert_eq!(id, want, "allocation did not take the segmented-LRU head");
            let i = id as usize;
            self.reused[i] = false;
            assert_eq!(self.refs[i], 0, "allocated a referenced block");
            self.refs[i] = 1;
            if let Some(h) = self.hash_of[i].take() {
                assert_eq!(self.cached.remove(&h), Some(id));
                self.evictions += 1;
            }
            self.written[i] = vec![None; self.bs];
            self.prefix_of[i] = None;
        }
        true
    }

    fn free(&mut self, mut table: Vec<BlockId>) {
        for &id in table.iter().rev() {
            let i = id as usize;
            assert!(self.refs[i] > 0, "model double free");
            self.refs[i] -= 1;
            if self.refs[i] == 0 {
                match (self.hash_of[i].is_some(), self.reused[i]) {
                    (true, true) => self.protected_order.push_back(id),
                    (true, false) => self.free_order.push_back(id),
                    (false, _) => self.free_order.push_front(id),
                }
            }
        }
        while self.protected_order.len() > self.protected_cap {
            let id = self
                .protected_order
                .pop_front()
                .expect("protected list empty");
            self.reused[id as usize] = false;
            self.free_order.push_back(id);
        }
        self.bm.free(&mut table);
        assert!(table.is_empty());
    }

    fn write(&mut self, seq: &Seq, from: usize, to: usize) {
        for p in from..to {
            let blk = p / self.bs;
            let id = seq.table[blk];
            let i = id as usize;
            assert_eq!(self.bm.ref_count(id), 1, "writing into a shared block");
            assert_eq!(self.bm.block_hash(id), None, "writing into a cached block");
            self.written[i][p % self.bs] = Some(seq.tokens[p]);
            if p % self.bs == self.bs - 1 {
                self.prefix_of[i] = Some(seq.tokens[..p + 1].to_vec());
            }
        }
    }

    fn register(&mut self, seq: &mut Seq) {
        let to = (seq.computed / self.bs)
            .min(seq.hashes.len())
            .min(seq.table.len());
        if self.caching {
            for i in seq.registered..to {
                let id = seq.table[i];
                let b = id as usize;
                if self.hash_of[b].is_none() && !self.cached.contains_key(&seq.hashes[i]) {
                    self.cached.insert(seq.hashes[i], id);
                    self.hash_of[b] = Some(seq.hashes[i]);
                }
            }
        }
        self.bm
            .cache_full_blocks(&seq.table, &seq.hashes, seq.registered, to);
        seq.registered = seq.registered.max(to);
    }

    /// Schedules `chunk` more tokens of `seq`. Returns false when it was preempted (freed).
    fn step(&mut self, mut seq: Seq, chunk: usize) -> Option<Seq> {
        let target = (seq.computed + chunk).min(seq.tokens.len());
        let mut table = std::mem::take(&mut seq.table);
        if !self.allocate(&mut table, target) {
            self.free(table);
            self.preemptions += 1;
            return None;
        }
        seq.table = table;
        self.write(&seq, seq.computed, target);
        seq.computed = target;
        self.register(&mut seq);
        Some(seq)
    }

    fn start(&mut self, prompt: Vec<u32>, chunk: usize) {
        let bs = self.bs;
        let hashes = block_hashes(&prompt, bs);
        let limit = (prompt.len() - 1) / bs;
        assert!(limit <= hashes.len());
        let n = self.bm.find_cached_prefix(&hashes[..limit]);
        assert_eq!(
            n,
            self.model_prefix(&hashes[..limit]),
            "cached prefix length"
        );
        self.bm.record_lookup(prompt.len(), n * bs);
        self.hits += n;

        let mut expected = Vec::new();
        for h in &hashes[..n] {
            let id = self.cached[h];
            if self.refs[id as usize] == 0 {
                self.free_hits += 1;
                if let Some(pos) = self.free_order.iter().position(|&b| b == id) {
                    self.free_order.remove(pos);
                } else {
                    let pos = self.protected_order.iter().position(|&b| b == id);
                    self.protected_order
                        .remove(pos.expect("unreferenced cached block not in a free list"));
                }
            }
            self.reused[id as usize] = true;
            self.refs[id as usize] += 1;
            expected.push(id);
        }
        let mut table = Vec::new();
        self.bm.acquire_cached(&mut table, &hashes, n);
        assert_eq!(table, expected, "acquired blocks");
        // Prefix reuse must hand back blocks holding exactly this prompt's tokens.
        for (i, &id) in table.iter().enumerate() {
            let want: Vec<Option<u32>> = prompt[i * bs..(i + 1) * bs]
                .iter()
                .map(|&t| Some(t))
                .collect();
            assert_eq!(self.written[id as usize], want, "reused block content");
            assert_eq!(
                self.prefix_of[id as usize].as_deref(),
                Some(&prompt[..(i + 1) * bs]),
                "reused block prefix"
            );
        }
        let seq = Seq {
            tokens: prompt,
            hashes,
            table,
            computed: n * bs,
            registered: n,
        };
        if let Some(seq) = self.step(seq, chunk) {
            self.seqs.push(seq);
        }
    }

    fn apply(&mut self, op: &Op, prefixes: &[Vec<u32>]) {
        match op {
            Op::Start {
                prefix,
                suffix,
                chunk,
            } => {
                let mut prompt = prefixes[prefix % prefixes.len()].clone();
                prompt.extend_from_slice(suffix);
                if prompt.is_empty() {
                    prompt.push(0);
                }
                self.start(prompt, *chunk);
            }
            Op::Advance { seq, chunk } => {
                if self.seqs.is_empty() {
                    return;
                }
                let i = seq % self.seqs.len();
                if self.seqs[i].computed == self.seqs[i].tokens.len() {
                    return;
                }
                let s = self.seqs.remove(i);
                if let Some(s) = self.step(s, *chunk) {
                    self.seqs.insert(i, s);
                }
            }
            Op::Append { seq, tokens } => {
                if self.seqs.is_empty() {
                    return;
                }
                let i = seq % self.seqs.len();
                let bs = self.bs;
                let s = &mut self.seqs[i];
                if s.computed < s.tokens.len() {
                    return;
                }
                s.tokens.extend_from_slice(tokens);
                extend_block_hashes(&mut s.hashes, &s.tokens, bs);
                assert_eq!(s.hashes, block_hashes(&s.tokens, bs));
            }
            Op::Finish { seq } => {
                if self.seqs.is_empty() {
                    return;
                }
                let s = self.seqs.remove(seq % self.seqs.len());
                self.free(s.table);
            }
        }
    }

    fn check(&self) {
        let nb = self.bm.num_blocks();
        let mut occ = vec![0u32; nb];
        let mut entries = 0usize;
        for s in &self.seqs {
            assert!(s.table.len() >= s.computed.div_ceil(self.bs));
            entries += s.table.len();
            for &id in &s.table {
                occ[id as usize] += 1;
            }
            // Nobody overwrote what this sequence computed.
            for p in 0..s.computed {
                assert_eq!(
                    self.written[s.table[p / self.bs] as usize][p % self.bs],
                    Some(s.tokens[p]),
                    "content of a referenced block changed"
                );
            }
            assert_eq!(
                self.bm.find_cached_prefix(&s.hashes),
                self.model_prefix(&s.hashes)
            );
        }
        let mut ref_sum = 0usize;
        let mut referenced = 0usize;
        for (id, &live) in occ.iter().enumerate() {
            let rc = self.bm.ref_count(id as BlockId);
            assert_eq!(rc, live, "ref count of block {id} vs live tables");
            assert_eq!(rc, self.refs[id]);
            ref_sum += rc as usize;
            referenced += usize::from(rc > 0);
            assert_eq!(self.bm.block_hash(id as BlockId), self.hash_of[id]);
            if let Some(h) = self.hash_of[id] {
                let p = self.prefix_of[id]
                    .as_ref()
                    .expect("cached block never fully computed");
                assert_eq!(p.len() % self.bs, 0);
                assert_eq!(block_hashes(p, self.bs).last(), Some(&h));
                assert_eq!(self.cached.get(&h), Some(&(id as BlockId)));
            }
        }
        assert_eq!(ref_sum, entries, "block leak");
        assert_eq!(nb - self.bm.num_free_blocks(), referenced, "block leak");
        assert_eq!(
            self.bm.num_free_blocks(),
            self.free_order.len() + self.protected_order.len()
        );
        assert!(self.protected_order.len() <= self.protected_cap);
        let u = self.bm.usage();
        assert!((0.0..=1.0).contains(&u), "usage {u}");
        if nb > 0 {
            assert!((u - referenced as f64 / nb as f64).abs() < 1e-9);
        }
        assert_eq!(self.bm.stats().evictions, self.evictions);
        if !self.caching {
            assert!(self.cached.is_empty());
        }
    }

    fn finish_all(&mut self) {
        while let Some(s) = self.seqs.pop() {
            self.free(s.table);
            self.check();
        }
        let nb = self.bm.num_blocks();
        assert_eq!(self.bm.num_free_blocks(), nb);
        assert_eq!(self.bm.usage(), 0.0);
        for id in 0..nb {
            assert_eq!(self.bm.ref_count(id as BlockId), 0);
        }
    }
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(0x5eed_b10c),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

type Workload = (usize, usize, bool, f64, Vec<Vec<u32>>, Vec<Op>);

fn workload_strategy() -> impl Strategy<Value = Workload> {
    (
        1usize..=4,
        3usize..=24,
        prop::bool::weighted(0.85),
        prop::sample::select(vec![0.0, 0.25, 0.5, 1.0]),
        prop::collection::vec(prop::collection::vec(0u32..3, 0..13), 3..=5),
        prop::collection::vec(op_strategy(), 1..100),
    )
}

/// Runs one workload, checking every invariant after every op; returns the final harness.
fn run_workload((bs, num_blocks, caching, protected, prefixes, ops): &Workload) -> Harness {
    let mut h = Harness::new(*num_blocks, *bs, *caching, *protected);
    h.check();
    for op in ops {
        h.apply(op, prefixes);
        h.check();
    }
    if !caching {
        assert_eq!(h.hits, 0);
    }
    h.finish_all();
    h
}

/// Guards the property test against a generator that never reaches the interesting paths.
#[test]
fn workload_generator_reaches_hits_evictions_and_preemptions() {
    let totals = std::cell::Cell::new((0usize, 0usize, 0u64, 0usize));
    let protected_taken = std::cell::Cell::new(0usize);
    let mut runner = proptest::test_runner::TestRunner::new(config(256));
    runner
        .run(&workload_strategy(), |w| {
            let h = run_workload(&w);
            protected_taken.set(protected_taken.get() + h.protected_taken);
            let (hits, free_hits, ev, pre) = totals.get();
            totals.set((
                hits + h.hits,
                free_hits + h.free_hits,
                ev + h.evictions,
                pre + h.preemptions,
            ));
            Ok(())
        })
        .unwrap();
    let (hits, free_hits, evictions, preemptions) = totals.get();
    assert!(hits > 1000, "hits {hits}");
    assert!(free_hits > 200, "free hits {free_hits}");
    assert!(evictions > 500, "evictions {evictions}");
    assert!(preemptions > 200, "preemptions {preemptions}");
    let taken = protected_taken.get();
    assert!(taken > 50, "allocations from the protected list {taken}");
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn random_workload_keeps_invariants(w in workload_strategy()) {
        run_workload(&w);
    }

    #[test]
    fn hashes_equal_iff_prefixes_equal(
        bs in 1usize..=4,
        a in prop::collection::vec(0u32..2, 0..20),
        b in prop::collection::vec(0u32..2, 0..20),
        split in 0usize..20,
    ) {
        let ha = block_hashes(&a, bs);
        let hb = block_hashes(&b, bs);
        prop_assert_eq!(ha.len(), a.len() / bs);
        for i in 0..ha.len().min(hb.len()) {
            let same = a[..(i + 1) * bs] == b[..(i + 1) * bs];
            prop_assert_eq!(ha[i] == hb[i], same, "block {}", i);
        }
        let mut inc = block_hashes(&a[..split.min(a.len())], bs);
        extend_block_hashes(&mut inc, &a, bs);
        prop_assert_eq!(inc, ha);
    }
}

/// A system prompt of 2 blocks followed by a one-off question of 2 blocks; returns its hashes.
fn prompt_with_question(bm: &mut BlockManager, question: u32) -> (Vec<BlockId>, usize) {
    let mut p = toks(0, 2 * BS);
    p.extend(toks(10_000 + question * 100, 2 * BS));
    run_prompt(bm, &p)
}

#[test]
fn reused_prompt_outlives_one_off_churn() {
    // 8 blocks: a shared 2-block prompt reused by every request, each with its own 2-block
    // question. Under plain LRU the prompt is evicted once the questions fill the cache; with a
    // protected segment it stays.
    for (fraction, survives) in [(0.0, false), (0.5, true)] {
        let mut bm = BlockManager::new(8, BS, true);
        bm.set_protected_fraction(fraction);
        let shared = block_hashes(&toks(0, 2 * BS), BS);
        let (mut t, hit) = prompt_with_question(&mut bm, 0);
        assert_eq!(hit, 0);
        bm.free(&mut t);
        let (mut t, hit) = prompt_with_question(&mut bm, 1);
        assert_eq!(hit, 2, "second use hits the shared prompt");
        bm.free(&mut t);
        // One-off prompts of 4 fresh blocks each, three times the room left.
        for q in 0..6u32 {
            let (mut t, _) = run_prompt(&mut bm, &toks(50_000 + q * 1_000, 4 * BS));
            bm.free(&mut t);
        }
        assert_eq!(
            bm.find_cached_prefix(&shared) == 2,
            survives,
            "protected fraction {fraction}"
        );
    }
}

#[test]
fn protected_blocks_are_evicted_when_nothing_else_is_free() {
    let mut bm = BlockManager::new(4, BS, true);
    bm.set_protected_fraction(1.0);
    let p = toks(0, 2 * BS + 1);
    let hashes = block_hashes(&p, BS);
    let (mut t, _) = run_prompt(&mut bm, &p);
    bm.free(&mut t);
    let (mut t, hit) = run_prompt(&mut bm, &p);
    assert_eq!(hit, 2);
    bm.free(&mut t);
    // All 4 blocks are needed: the protected prompt goes too, least recently used first.
    let mut all = Vec::new();
    assert!(bm.allocate_slots(&mut all, 4 * BS));
    assert_eq!(bm.num_free_blocks(), 0);
    assert_eq!(bm.find_cached_prefix(&hashes), 0);
    assert_eq!(bm.stats().evictions, 2);
    bm.free(&mut all);
    assert_eq!(bm.num_free_blocks(), 4);
}

#[test]
fn protected_segment_is_capped_and_demotes_its_oldest() {
    // Cap of 2 blocks: two reused 2-block prompts cannot both stay protected; the older is
    // demoted to probation, where it is evicted before the newer one.
    let mut bm = BlockManager::new(6, BS, true);
    bm.set_protected_fraction(2.0 / 6.0);
    assert_eq!(bm.protected_cap(), 2);
    let a = toks(0, 2 * BS);
    let b = toks(1_000, 2 * BS);
    let (ha, hb) = (block_hashes(&a, BS), block_hashes(&b, BS));
    for p in [&a, &a, &b, &b] {
        let mut t = Vec::new();
        let n = bm.find_cached_prefix(&block_hashes(p, BS));
        bm.acquire_cached(&mut t, &block_hashes(p, BS), n);
        assert!(bm.allocate_slots(&mut t, p.len()));
        bm.cache_full_blocks(&t, &block_hashes(p, BS), n, 2);
        bm.free(&mut t);
    }
    assert_eq!(bm.num_free_blocks(), 6);
    let mut fresh = Vec::new();
    // 2 never-used blocks, then A's demoted blocks, before B's protected ones.
    assert!(bm.allocate_slots(&mut fresh, 4 * BS));
    assert_eq!(bm.find_cached_prefix(&ha), 0);
    assert_eq!(bm.find_cached_prefix(&hb), 2);
}

#[test]
fn protected_fraction_is_clamped() {
    let mut bm = BlockManager::new(10, BS, true);
    bm.set_protected_fraction(-1.0);
    assert_eq!(bm.protected_cap(), 0);
    bm.set_protected_fraction(7.0);
    assert_eq!(bm.protected_cap(), 10);
    bm.set_protected_fraction(f64::NAN);
    assert_eq!(bm.protected_cap(), 0);
}
