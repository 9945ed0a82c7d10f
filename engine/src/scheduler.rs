//! Iteration-level continuous batching: picks, every step, which sequences compute how many tokens
//! under a sequence cap and a token budget. Decodes first, then unfinished prefills, then waiting
//! requests (chunked when their prompt exceeds the remaining budget). Preempts the newest running
//! sequence by recompute when KV blocks run out. Pure logic: no clock, no I/O.

use std::collections::VecDeque;

use crate::block_manager::BlockManager;
use crate::roofline::BatchShape;
use crate::sequence::Sequence;

/// Limits of the scheduler.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulerConfig {
    /// Most sequences running at once (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Most tokens computed in one step (`--max-num-batched-tokens`).
    pub max_num_batched_tokens: usize,
    /// Split prompts longer than the remaining budget across steps.
    pub chunked_prefill: bool,
}

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// Index into [`Scheduler::running`].
    pub index: usize,
    /// Tokens computed for it this step.
    pub num_tokens: usize,
}

/// The work of one step.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    /// Scheduled sequences, each at most once.
    pub seqs: Vec<ScheduledSeq>,
    /// Totals for the cost model.
    pub shape: BatchShape,
    /// Sequences preempted while building this batch.
    pub preempted: usize,
}

/// Owner of the waiting queue, the running set and the KV block manager.
pub struct Scheduler {
    cfg: SchedulerConfig,
    /// The KV cache.
    pub kv: BlockManager,
    /// Requests not yet (or no longer) holding KV blocks, oldest first; preempted ones go first.
    pub waiting: VecDeque<Sequence>,
    /// Sequences holding KV blocks, in admission order (the last is the newest).
    pub running: Vec<Sequence>,
    batch: Batch,
}

impl Scheduler {
    /// A scheduler over `kv`. Without chunked prefill the token budget is raised by the caller
    /// to at least the model's context so every prompt can be admitted whole.
    pub fn new(cfg: SchedulerConfig, kv: BlockManager) -> Self {
        Self {
            cfg,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
            batch: Batch::default(),
        }
    }

    /// The limits in force.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Queues a new sequence behind the others.
    pub fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// True when nothing waits and nothing runs.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Removes every sequence matching `gone` (a client that went away), freeing its blocks.
    pub fn remove_where(&mut self, mut gone: impl FnMut(&Sequence) -> bool) -> Vec<Sequence> {
        let mut removed = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            if gone(&self.running[i]) {
                let mut seq = self.running.remove(i);
                self.kv.free(&mut seq.block_table);
                removed.push(seq);
            } else {
                i += 1;
            }
        }
        if !self.waiting.iter().any(&mut gone) {
            return removed;
        }
        let mut kept = VecDeque::with_capacity(self.waiting.len());
        for seq in self.waiting.drain(..) {
            if gone(&seq) {
                removed.push(seq);
            } else {
                kept.push_back(seq);
            }
        }
        self.waiting = kept;
        removed
    }

    /// Builds the next step's batch. `now` stamps first scheduling.
    pub fn schedule(&mut self, now: f64) -> &Batch {
        self.batch.seqs.clear();
        self.batch.preempted = 0;
        let mut budget = self.cfg.max_num_batched_tokens;

        // Decodes first: each needs one token and room for it.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            if self.running[i].remaining() != 1 {
                i += 1;
                continue;
            }
            let need = self.running[i].num_computed + 1;
            let mut fits = true;
            loop {
                let (kv, seq) = (&mut self.kv, &mut self.running[i]);
                if kv.allocate_slots(&mut seq.block_table, need) {
                    break;
                }
                let victim = self.running.len() - 1;
                self.preempt_last();
                if victim == i {
                    fits = false;
                    break;
                }
            }
            if !fits {
                break;
            }
            self.batch.seqs.push(ScheduledSeq {
                index: i,
                num_tokens: 1,
            });
            budget -= 1;
            i += 1;
        }

        // Then prefills already under way (chunked), oldest first.
        for i in 0..self.running.len() {
            if budget == 0 {
                break;
            }
            let remaining = self.running[i].remaining();
            if remaining <= 1 {
                continue;
            }
            let chunk = remaining.min(budget);
            let (kv, seq) = (&mut self.kv, &mut self.running[i]);
            if !kv.allocate_slots(&mut seq.block_table, seq.num_computed + chunk) {
                break;
            }
            self.batch.seqs.push(ScheduledSeq {
                index: i,
                num_tokens: chunk,
            });
            budget -= chunk;
        }

        // Then new (or preempted) requests, in order, while sequences and budget remain.
        while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            if let Some(leader) = self.waiting.front().and_then(|s| s.share_prefix_of) {
                // A sibling waits (keeping its place) until its leader's prompt blocks are in
                // the cache, then reads them from there instead of computing them again.
                if self.prefix_in_progress(leader) {
                    break;
                }
            }
            let Some(seq) = self.waiting.front_mut() else {
                break;
            };
            seq.share_prefix_of = None;
            let bs = self.kv.block_size();
            let max_hit = ((seq.tokens.len() - 1) / bs).min(seq.block_hashes.len());
            // Prompt logprobs need the logits of every prompt position: compute them all.
            let max_hit = if seq.needs_prompt_logprobs() {
                0
            } else {
                max_hit
            };
            let hit = self.kv.find_cached_prefix(&seq.block_hashes[..max_hit]);
            let computed = hit * bs;
            let remaining = seq.tokens.len() - computed;
            let chunk = if self.cfg.chunked_prefill {
                remaining.min(budget)
            } else if remaining <= budget {
                remaining
            } else {
                break;
            };
            self.kv
                .acquire_cached(&mut seq.block_table, &seq.block_hashes, hit);
            if !self
                .kv
                .allocate_slots(&mut seq.block_table, computed + chunk)
            {
                self.kv.free(&mut seq.block_table);
                break;
            }
            if seq.cached_tokens.is_none() {
                let cached = computed.min(seq.prompt_len);
                // A prompt that skipped the cache was not looked up (as in vLLM).
                if !seq.needs_prompt_logprobs() {
                    self.kv.record_lookup(seq.prompt_len, cached);
                }
                seq.cached_tokens = Some(cached);
                seq.first_scheduled = Some(now);
            }
            seq.num_computed = computed;
            seq.num_registered_blocks = hit;
            anchor_keys(&mut self.kv, seq, hit);
            let Some(seq) = self.waiting.pop_front() else {
                break;
            };
            self.running.push(seq);
            self.batch.seqs.push(ScheduledSeq {
                index: self.running.len() - 1,
                num_tokens: chunk,
            });
            budget -= chunk;
        }

        let mut shape = BatchShape::default();
        for s in &self.batch.seqs {
            let ctx = self.running[s.index].num_computed + s.num_tokens;
            shape.num_seqs += 1;
            if s.num_tokens == 1 {
                shape.num_decode_seqs += 1;
            }
            shape.new_tokens += s.num_tokens;
            shape.kv_tokens_read += ctx;
            shape.attn_token_pairs += (s.num_tokens * ctx) as u64;
        }
        self.batch.shape = shape;
        &self.batch
    }

    /// The batch built by the last [`schedule`](Self::schedule).
    pub fn batch(&self) -> &Batch {
        &self.batch
    }

    /// Marks the last batch computed: advances each sequence and registers its newly full blocks
    /// in the prefix cache. Returns nothing; callers then sample for sequences with `remaining() == 0`.
    pub fn commit_step(&mut self) {
        let bs = self.kv.block_size();
        for s in &self.batch.seqs {
            let seq = &mut self.running[s.index];
            seq.num_computed += s.num_tokens;
            let full = seq.num_computed / bs;
            if full > seq.num_registered_blocks {
                self.kv.cache_full_blocks_of(
                    &seq.block_table,
                    &seq.block_hashes,
                    &seq.tokens,
                    seq.num_registered_blocks,
                    full,
                );
                seq.num_registered_blocks = full;
                anchor_keys(&mut self.kv, seq, full);
            }
        }
    }

    /// Removes finished sequences from the running set, freeing their blocks, and returns them.
    pub fn take_finished(&mut self) -> Vec<Sequence> {
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].finish.is_some() {
                let mut seq = self.running.remove(i);
                self.kv.free(&mut seq.block_table);
                done.push(seq);
            } else {
                i += 1;
            }
        }
        done
    }

    /// True while sequence `leader` still has to compute prompt blocks a sibling could share:
    /// it waits, or runs with fewer than its prompt's full blocks (all but the last token)
    /// computed. A leader that finished or went away holds nothing up.
    fn prefix_in_progress(&self, leader: u64) -> bool {
        if self.waiting.iter().any(|s| s.id == leader) {
            return true;
        }
        let bs = self.kv.block_size();
        self.running.iter().any(|s| {
            let shareable = (s.prompt_len.saturating_sub(1) / bs) * bs;
            s.id == leader && s.num_computed < shareable
        })
    }

    fn preempt_last(&mut self) {
        if let Some(mut seq) = self.running.pop() {
            self.kv.free(&mut seq.block_table);
            seq.recompute_until = seq.recompute_until.max(seq.num_computed);
            seq.num_computed = 0;
            seq.num_registered_blocks = 0;
            seq.anchors_attached = 0;
            seq.preemptions += 1;
            self.batch.preempted += 1;
            self.waiting.push_front(seq);
        }
    }
}

/// Anchors the router keys of `seq` whose blocks lie within its first `registered` blocks, now
/// cached (KV events).
fn anchor_keys(kv: &mut BlockManager, seq: &mut Sequence, registered: usize) {
    if !kv.events_enabled() {
        return;
    }
    while let Some(&(block, key)) = seq.key_anchors.get(seq.anchors_attached) {
        if block >= registered {
            break;
        }
        if let Some(&hash) = seq.block_hashes.get(block) {
            kv.anchor_key(hash, key);
        }
        seq.anchors_attached += 1;
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
