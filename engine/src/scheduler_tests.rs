//! Tests of the scheduler: budgets, ordering, chunked prefill, prefix reuse, preemption and the
//! batch shape, driven step by step without a backend or a clock.

use super::*;
use crate::block_manager::BlockId;
use crate::request::SamplingParams;
use crate::sequence::{EventSink, FinishReason, NewRequest, SendError, SeqEvent};

/// Tokens per KV block in these tests.
const BS: usize = 4;

/// A sink that accepts and drops everything: the scheduler never sends events.
struct NullSink;

impl EventSink for NullSink {
    fn try_send(&mut self, _event: SeqEvent) -> Result<(), SendError> {
        Ok(())
    }

    fn is_closed(&self) -> bool {
        false
    }
}

/// `n` distinct, recognisable prompt tokens starting at `start`.
fn toks(start: u32, n: usize) -> Vec<u32> {
    (start..start + n as u32).collect()
}

/// A waiting sequence that generates exactly `max_tokens` tokens.
fn seq(id: u64, prompt: Vec<u32>, max_tokens: usize) -> Sequence {
    let req = NewRequest {
        id,
        prompt,
        params: SamplingParams {
            max_tokens,
            ignore_eos: true,
            ..SamplingParams::default()
        },
        sink: Box::new(NullSink),
        prefix_keys: None,
    };
    Sequence::new(req, BS, 0.0)
}

fn scheduler(
    num_blocks: usize,
    max_num_seqs: usize,
    budget: usize,
    chunked_prefill: bool,
) -> Scheduler {
    Scheduler::new(
        SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: budget,
            chunked_prefill,
        },
        BlockManager::new(num_blocks, BS, true),
    )
}

/// The token a sequence samples next: depends only on its id and position, so recompute after
/// preemption cannot change it.
fn next_token(seq: &Sequence) -> u32 {
    50_000 + seq.id as u32 * 1_000 + seq.num_output() as u32
}

/// What the engine does after a step: commit, sample for sequences whose tokens are all computed,
/// finish at `max_tokens`, take the finished ones out.
fn finish_step(s: &mut Scheduler) -> Vec<Sequence> {
    s.commit_step();
    let entries = s.batch().seqs.clone();
    for e in entries {
        let seq = &mut s.running[e.index];
        if seq.remaining() == 0 {
            let t = next_token(seq);
            seq.push_token(t, BS);
            if seq.num_output() >= seq.params.max_tokens {
                seq.finish = Some(FinishReason::Length);
            }
        }
    }
    s.take_finished()
}

/// What one whole step did.
struct Stepped {
    batch: Batch,
    /// `(id, tokens)` of each scheduled sequence.
    ids: Vec<(u64, usize)>,
    /// Sequences that finished.
    done: Vec<Sequence>,
}

/// One whole step.
fn step(s: &mut Scheduler) -> Stepped {
    let batch = s.schedule(0.0).clone();
    check_batch(s, &batch);
    let ids = entries(s, &batch);
    let done = finish_step(s);
    check_blocks(s);
    Stepped { batch, ids, done }
}

/// `(id, tokens)` of each scheduled sequence.
fn entries(s: &Scheduler, batch: &Batch) -> Vec<(u64, usize)> {
    batch
        .seqs
        .iter()
        .map(|e| (s.running[e.index].id, e.num_tokens))
        .collect()
}

/// Invariants of a freshly built batch.
fn check_batch(s: &Scheduler, batch: &Batch) {
    let cfg = *s.config();
    let total: usize = batch.seqs.iter().map(|e| e.num_tokens).sum();
    assert!(total <= cfg.max_num_batched_tokens, "budget exceeded");
    assert!(batch.seqs.len() <= cfg.max_num_seqs);
    assert!(s.running.len() <= cfg.max_num_seqs, "too many running");
    let mut seen = vec![false; s.running.len()];
    for e in &batch.seqs {
        assert!(!seen[e.index], "sequence scheduled twice");
        seen[e.index] = true;
        let seq = &s.running[e.index];
        assert!(e.num_tokens >= 1 && e.num_tokens <= seq.remaining());
        assert!(seq.block_table.len() * BS >= seq.num_computed + e.num_tokens);
    }
    assert_eq!(batch.shape.num_seqs, batch.seqs.len());
    assert_eq!(batch.shape.new_tokens, total);
}

/// Every block referenced by a running sequence is counted exactly once per reference; waiting
/// sequences hold nothing.
fn check_blocks(s: &Scheduler) {
    let n = s.kv.num_blocks();
    let mut refs = vec![0u32; n];
    for seq in &s.running {
        assert!(seq.block_table.len() * BS >= seq.num_computed);
        for &b in &seq.block_table {
            refs[b as usize] += 1;
        }
    }
    for seq in &s.waiting {
        assert!(
            seq.block_table.is_empty(),
            "waiting seq {} holds blocks",
            seq.id
        );
        assert_eq!(seq.num_computed, 0);
    }
    let mut free = 0;
    for (id, &r) in refs.iter().enumerate() {
        assert_eq!(s.kv.ref_count(id as BlockId), r, "ref count of block {id}");
        if r == 0 {
            free += 1;
        }
    }
    assert_eq!(s.kv.num_free_blocks(), free);
}

/// Runs until idle; returns finished sequences in finishing order. Fails on a step that schedules
/// nothing while work remains (nothing outside the scheduler could unblock it).
fn run_to_idle(s: &mut Scheduler, max_steps: usize) -> Vec<Sequence> {
    let mut done = Vec::new();
    for _ in 0..max_steps {
        if s.is_idle() {
            return done;
        }
        let Stepped {
            batch,
            done: finished,
            ..
        } = step(s);
        assert!(
            !batch.seqs.is_empty(),
            "no progress: {} running, {} waiting, {} free blocks",
            s.running.len(),
            s.waiting.len(),
            s.kv.num_free_blocks()
        );
        done.extend(finished);
    }
    panic!("not idle after {max_steps} steps");
}

/// Puts a sequence straight into the running set as if its prompt had been computed and one token
/// sampled: its next step is a decode.
fn make_decoding(s: &mut Scheduler, mut seq: Sequence) {
    let len = seq.tokens.len();
    assert!(s.kv.allocate_slots(&mut seq.block_table, len + 1));
    seq.num_computed = len;
    let t = next_token(&seq);
    seq.push_token(t, BS);
    s.running.push(seq);
}

#[test]
fn new_scheduler_is_idle_and_schedules_nothing() {
    let mut s = scheduler(8, 4, 16, true);
    assert!(s.is_idle());
    let batch = s.schedule(0.0);
    assert!(batch.seqs.is_empty());
    assert_eq!(batch.shape, BatchShape::default());
    assert_eq!(batch.preempted, 0);
}

#[test]
fn decodes_go_before_an_older_prefill() {
    let mut s = scheduler(64, 8, 8, true);
    s.add(seq(1, toks(100, 40), 4));
    assert_eq!(step(&mut s).ids, vec![(1, 8)]);
    // A younger sequence already decoding.
    make_decoding(&mut s, seq(2, toks(200, 5), 4));

    let batch = s.schedule(1.0).clone();
    check_batch(&s, &batch);
    assert_eq!(entries(&s, &batch), vec![(2, 1), (1, 7)]);
    finish_step(&mut s);

    // With a budget of one token only the decode runs.
    s.cfg.max_num_batched_tokens = 1;
    let batch = s.schedule(2.0).clone();
    assert_eq!(entries(&s, &batch), vec![(2, 1)]);
}

#[test]
fn decodes_take_budget_first_and_prefill_gets_the_rest() {
    let mut s = scheduler(64, 8, 5, true);
    for id in 0..3 {
        s.add(seq(id, toks(100 * id as u32, 1), 10));
    }
    assert_eq!(step(&mut s).ids, vec![(0, 1), (1, 1), (2, 1)]);
    s.add(seq(9, toks(900, 12), 2));
    assert_eq!(step(&mut s).ids, vec![(0, 1), (1, 1), (2, 1), (9, 2)]);
    assert_eq!(s.running[3].num_computed, 2);
}

#[test]
fn token_budget_and_sequence_cap_hold_under_load() {
    let mut s = scheduler(64, 3, 10, true);
    for id in 0..12u64 {
        let len = 1 + (id as usize * 7) % 13;
        s.add(seq(id, toks(1_000 * id as u32, len), 1 + id as usize % 5));
    }
    let mut saw_cap = false;
    let mut saw_full_budget = false;
    let mut done = Vec::new();
    for _ in 0..500 {
        if s.is_idle() {
            break;
        }
        let Stepped {
            batch,
            done: finished,
            ..
        } = step(&mut s);
        saw_cap |= batch.seqs.len() == 3;
        saw_full_budget |= batch.shape.new_tokens == 10;
        assert!(batch.seqs.len() <= 3);
        assert!(batch.shape.new_tokens <= 10);
        done.extend(finished);
    }
    assert!(s.is_idle());
    assert!(saw_cap, "the sequence cap was never reached");
    assert!(saw_full_budget, "the token budget was never filled");
    assert_eq!(done.len(), 12);
    for d in &done {
        assert_eq!(d.num_output(), d.params.max_tokens);
    }
    assert_eq!(s.kv.num_free_blocks(), s.kv.num_blocks());
}

#[test]
fn chunked_prefill_splits_a_long_prompt_over_steps() {
    let mut s = scheduler(64, 4, 8, true);
    s.add(seq(1, toks(0, 20), 2));
    let chunks: Vec<usize> = (0..3)
        .map(|_| {
            let ids = step(&mut s).ids;
            assert_eq!(ids.len(), 1);
            ids[0].1
        })
        .collect();
    assert_eq!(chunks, vec![8, 8, 4]);
    // The first token is sampled only once the whole prompt is computed.
    assert_eq!(s.running[0].num_output(), 1);
    assert_eq!(s.running[0].num_computed, 20);
    let Stepped { ids, done, .. } = step(&mut s);
    assert_eq!(ids, vec![(1, 1)]);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].tokens.len(), 22);
    assert_eq!(s.kv.num_free_blocks(), 64);
}

#[test]
fn without_chunked_prefill_a_prompt_waits_until_it_fits_whole() {
    let mut s = scheduler(64, 4, 8, false);
    s.add(seq(1, toks(0, 3), 3));
    step(&mut s);
    s.add(seq(2, toks(100, 8), 1));
    // Seq 1 decodes for two more steps, leaving 7 tokens: seq 2 does not fit whole.
    for _ in 0..2 {
        assert_eq!(step(&mut s).ids, vec![(1, 1)]);
        assert_eq!(s.waiting.len(), 1);
        assert!(s.waiting[0].block_table.is_empty());
    }
    assert!(s.running.is_empty());
    let Stepped { ids, done, .. } = step(&mut s);
    assert_eq!(ids, vec![(2, 8)]);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].id, 2);
}

#[test]
fn without_chunked_prefill_a_prompt_over_the_budget_never_starts() {
    // The caller raises the budget to the context length; if it does not, nothing is split.
    let mut s = scheduler(64, 4, 8, false);
    s.add(seq(1, toks(0, 9), 1));
    for _ in 0..3 {
        assert!(s.schedule(0.0).seqs.is_empty());
    }
    assert_eq!(s.waiting.len(), 1);
    assert_eq!(s.kv.num_free_blocks(), 64);
}

#[test]
fn a_shared_prefix_is_reused_and_recorded() {
    let mut s = scheduler(64, 4, 64, true);
    let first = toks(0, 10);
    s.add(seq(1, first.clone(), 1));
    run_to_idle(&mut s, 10);
    assert_eq!(s.kv.stats().queried_tokens, 10);
    assert_eq!(s.kv.stats().hit_tokens, 0);

    // Same two full blocks, different tail.
    let mut second = first[..8].to_vec();
    second.extend(toks(500, 5));
    s.add(seq(2, second, 1));
    let batch = s.schedule(3.0).clone();
    check_batch(&s, &batch);
    assert_eq!(entries(&s, &batch), vec![(2, 5)]);
    let r = &s.running[0];
    assert_eq!(r.num_computed, 2 * BS);
    assert_eq!(r.cached_tokens, Some(2 * BS));
    assert_eq!(r.num_registered_blocks, 2);
    assert_eq!(r.first_scheduled, Some(3.0));
    assert_eq!(batch.shape.kv_tokens_read, 13);
    assert_eq!(s.kv.stats().queried_tokens, 10 + 13);
    assert_eq!(s.kv.stats().hit_tokens, 8);
    finish_step(&mut s);
    check_blocks(&s);

    // Only the first block in common.
    let mut third = first[..BS].to_vec();
    third.extend(toks(700, 6));
    s.add(seq(3, third, 1));
    let batch = s.schedule(4.0).clone();
    assert_eq!(entries(&s, &batch), vec![(3, 6)]);
    assert_eq!(s.running[0].cached_tokens, Some(BS));
    finish_step(&mut s);
    assert!(s.is_idle());
    assert_eq!(s.kv.num_free_blocks(), 64);
}

#[test]
fn a_block_aligned_prompt_still_computes_its_last_token() {
    let mut s = scheduler(64, 4, 64, true);
    s.add(seq(1, toks(0, 2 * BS), 1));
    run_to_idle(&mut s, 10);
    s.add(seq(2, toks(0, 2 * BS), 1));
    let batch = s.schedule(0.0).clone();
    // Both blocks are cached, but the last one is recomputed so a token can be sampled.
    assert_eq!(entries(&s, &batch), vec![(2, BS)]);
    assert_eq!(s.running[0].num_computed, BS);
    assert_eq!(s.running[0].cached_tokens, Some(BS));
    let done = finish_step(&mut s);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].num_output(), 1);

    // A one-block prompt gets no hit at all.
    s.add(seq(3, toks(0, BS), 1));
    s.add(seq(4, toks(0, BS), 1));
    let batch = s.schedule(0.0).clone();
    assert_eq!(entries(&s, &batch), vec![(3, BS), (4, BS)]);
    assert_eq!(s.running[1].cached_tokens, Some(0));
}

#[test]
fn prefix_hits_need_prefix_caching() {
    let mut s = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: 64,
            chunked_prefill: true,
        },
        BlockManager::new(64, BS, false),
    );
    s.add(seq(1, toks(0, 10), 1));
    run_to_idle(&mut s, 10);
    s.add(seq(2, toks(0, 10), 1));
    let batch = s.schedule(0.0).clone();
    assert_eq!(entries(&s, &batch), vec![(2, 10)]);
    assert_eq!(s.running[0].cached_tokens, Some(0));
}

#[test]
fn the_newest_running_sequence_is_preempted_first() {
    // Three one-block prompts decoding into a second block, with room for only one more block.
    let mut s = scheduler(4, 8, 64, true);
    for id in 1..=3 {
        s.add(seq(id, toks(100 * id as u32, BS), 6));
    }
    assert_eq!(step(&mut s).ids.len(), 3);
    assert_eq!(s.kv.num_free_blocks(), 1);

    // Seq 1 takes the last block; seq 2 needs one, so seq 3 (the newest) is preempted.
    let batch = s.schedule(0.0).clone();
    check_batch(&s, &batch);
    assert_eq!(batch.preempted, 1);
    assert_eq!(entries(&s, &batch), vec![(1, 1), (2, 1)]);
    let ids: Vec<u64> = s.running.iter().map(|q| q.id).collect();
    assert_eq!(ids, vec![1, 2]);
    assert_eq!(s.waiting.len(), 1);
    let victim = &s.waiting[0];
    assert_eq!(victim.id, 3);
    assert!(victim.block_table.is_empty());
    assert_eq!(victim.num_computed, 0);
    assert_eq!(victim.num_registered_blocks, 0);
    assert_eq!(victim.preemptions, 1);
    assert_eq!(
        victim.num_output(),
        1,
        "its sampled token is kept for recompute"
    );
    assert_eq!(s.kv.num_free_blocks(), 0);
    finish_step(&mut s);
    check_blocks(&s);

    let done = run_to_idle(&mut s, 100);
    assert_eq!(done.len(), 3);
    for d in &done {
        assert_eq!(d.num_output(), 6);
        let expected: Vec<u32> = (0..6).map(|i| 50_000 + d.id as u32 * 1_000 + i).collect();
        assert_eq!(&d.tokens[BS..], &expected[..]);
    }
    let victim = done.iter().find(|d| d.id == 3).unwrap();
    assert!(victim.preemptions >= 1);
    assert_eq!(
        victim.cached_tokens,
        Some(0),
        "first admission's lookup is kept"
    );
    assert_eq!(s.kv.num_free_blocks(), s.kv.num_blocks());
}

#[test]
fn a_decode_that_cannot_grow_preempts_itself_when_it_is_the_newest() {
    let mut s = scheduler(3, 8, 64, true);
    for id in 1..=3 {
        s.add(seq(id, toks(100 * id as u32, BS), 2));
    }
    step(&mut s);
    assert_eq!(s.kv.num_free_blocks(), 0);
    // Seq 1 needs a block: seq 3 goes, seq 1 grows; seq 2 needs one: it is now the newest.
    let batch = s.schedule(0.0).clone();
    check_batch(&s, &batch);
    assert_eq!(batch.preempted, 2);
    assert_eq!(entries(&s, &batch), vec![(1, 1)]);
    let waiting: Vec<u64> = s.waiting.iter().map(|q| q.id).collect();
    assert_eq!(waiting, vec![2, 3], "older preempted sequences stay ahead");
    finish_step(&mut s);
    let done = run_to_idle(&mut s, 100);
    assert_eq!(done.len(), 2);
    assert_eq!(s.kv.num_free_blocks(), 3);
}

#[test]
fn many_sequences_in_a_small_cache_all_finish_without_leaking_blocks() {
    let mut s = scheduler(10, 16, 24, true);
    for id in 0..20u64 {
        let len = 2 + (id as usize * 5) % 11;
        s.add(seq(id, toks(1_000 * id as u32, len), 3 + id as usize % 9));
    }
    let mut preempted = 0;
    let mut done = Vec::new();
    for _ in 0..2_000 {
        if s.is_idle() {
            break;
        }
        let Stepped {
            batch,
            done: finished,
            ..
        } = step(&mut s);
        assert!(!batch.seqs.is_empty(), "no progress");
        preempted += batch.preempted;
        done.extend(finished);
    }
    assert!(s.is_idle());
    assert!(preempted > 0, "the cache was meant to be too small");
    assert_eq!(done.len(), 20);
    let total: u32 = done.iter().map(|d| d.preemptions).sum();
    assert_eq!(total as usize, preempted);
    for d in &done {
        let expected: Vec<u32> = (0..d.params.max_tokens as u32)
            .map(|i| 50_000 + d.id as u32 * 1_000 + i)
            .collect();
        assert_eq!(&d.tokens[d.prompt_len..], &expected[..]);
    }
    assert_eq!(s.kv.num_free_blocks(), s.kv.num_blocks());
}

#[test]
fn remove_where_frees_running_and_drops_waiting() {
    let mut s = scheduler(16, 2, 64, true);
    for id in 1..=4 {
        s.add(seq(id, toks(100 * id as u32, 6), 5));
    }
    step(&mut s);
    assert_eq!(s.running.len(), 2);
    assert_eq!(s.waiting.len(), 2);
    let removed = s.remove_where(|q| q.id == 1 || q.id == 3);
    let mut ids: Vec<u64> = removed.iter().map(|q| q.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 3]);
    assert!(removed.iter().all(|q| q.block_table.is_empty()));
    assert_eq!(s.running.len(), 1);
    assert_eq!(s.running[0].id, 2);
    let waiting: Vec<u64> = s.waiting.iter().map(|q| q.id).collect();
    assert_eq!(waiting, vec![4]);
    check_blocks(&s);
    assert_eq!(s.kv.num_free_blocks(), 16 - s.running[0].block_table.len());

    let removed = s.remove_where(|_| true);
    assert_eq!(removed.len(), 2);
    assert!(s.is_idle());
    assert_eq!(s.kv.num_free_blocks(), 16);
}

#[test]
fn batch_shape_of_a_mixed_batch_is_hand_computable() {
    let mut s = scheduler(64, 8, 9, true);
    s.add(seq(1, toks(0, 5), 10));
    step(&mut s);
    // Seq 1 now decodes its 6th token; seq 2 shares seq 1's first (cached) block.
    let mut prompt = toks(0, BS);
    prompt.extend(toks(300, 8));
    s.add(seq(2, prompt, 10));
    s.add(seq(3, toks(600, 5), 10));
    let batch = s.schedule(0.0).clone();
    check_batch(&s, &batch);
    // Seq 1: 1 new token, context 6. Seq 2: 4 cached + 8 new, context 12. Budget spent.
    assert_eq!(entries(&s, &batch), vec![(1, 1), (2, 8)]);
    assert_eq!(
        batch.shape,
        BatchShape {
            num_seqs: 2,
            num_decode_seqs: 1,
            new_tokens: 9,
            kv_tokens_read: 6 + 12,
            attn_token_pairs: 6 + 8 * 12,
        }
    );
    assert_eq!(s.batch().shape, batch.shape);
}

/// A tiny deterministic generator for workload mixes.
fn lcg(state: &mut u64) -> usize {
    *state = state
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    (*state >> 33) as usize
}

#[test]
fn random_workloads_always_progress_and_finish() {
    for case in 0..2_000u64 {
        let mut rng = case * 7_919 + 3;
        let num_blocks = 2 + lcg(&mut rng) % 12;
        let max_seqs = 1 + lcg(&mut rng) % 6;
        let chunked = case % 2 == 0;
        let budget = 1 + lcg(&mut rng) % 24;
        let mut s = scheduler(num_blocks, max_seqs, budget, chunked);
        let mut arrivals = Vec::new();
        for id in 0..(1 + lcg(&mut rng) % 8) as u64 {
            // Few distinct starts, so prompts share prefixes.
            let start = 10_000 * (lcg(&mut rng) % 3) as u32;
            let len = 1 + lcg(&mut rng) % 24;
            let max_tokens = 1 + lcg(&mut rng) % 12;
            let at = lcg(&mut rng) % 10;
            // What the engine core admits at all.
            let fits = s.kv.blocks_for(len + max_tokens) <= num_blocks;
            if fits && (chunked || len <= budget) {
                arrivals.push((at, seq(id, toks(start, len), max_tokens)));
            }
        }
        let total = arrivals.len();
        let mut done = Vec::new();
        for t in 0..5_000 {
            let (now, later) = arrivals.into_iter().partition(|(at, _)| *at <= t);
            arrivals = later;
            for (_, q) in now {
                s.add(q);
            }
            if s.is_idle() && arrivals.is_empty() {
                break;
            }
            let st = step(&mut s);
            let stuck = st.batch.seqs.is_empty() && !s.is_idle();
            assert!(
                !stuck,
                "case {case}: no progress with {num_blocks} blocks, {max_seqs} seqs, \
                 budget {budget}, chunked {chunked}"
            );
            done.extend(st.done);
        }
        assert_eq!(done.len(), total, "case {case}");
        for d in &done {
            assert_eq!(d.num_output(), d.params.max_tokens, "case {case}");
        }
        assert_eq!(s.kv.num_free_blocks(), num_blocks, "case {case}");
    }
}

/// A waiting sequence carrying router keys over a canonical prompt of 4 bytes per token, one key
/// per 8 bytes (2 tokens): key j ends at token 2(j+1).
fn keyed_seq(id: u64, prompt: Vec<u32>, keys: Vec<u64>) -> Sequence {
    let canonical_bytes = prompt.len() * 4;
    let mut s = seq(id, prompt, 1);
    s.key_anchors = crate::kv_events::PrefixKeys {
        block_bytes: 8,
        canonical_bytes,
        keys,
    }
    .anchors(s.prompt_len, BS);
    s
}

fn run_to_end(s: &mut Scheduler) {
    for _ in 0..100 {
        if s.is_idle() {
            return;
        }
        step(s);
    }
    panic!("did not finish");
}

#[test]
fn kv_events_follow_the_prefix_cache_and_its_evictions() {
    let mut s = scheduler(6, 4, 64, true);
    s.kv.enable_events();
    // 12 tokens = 3 full blocks; keys of 2 tokens end at tokens 2, 4, ..., 12. Key 1 ends before
    // the first full block, so nothing can anchor it; keys 2..6 anchor on blocks 0,0,1,1,2.
    s.add(keyed_seq(1, toks(0, 12), vec![1, 2, 3, 4, 5, 6]));
    run_to_end(&mut s);
    let mut stored = s.kv.take_events().stored;
    stored.sort_unstable();
    assert_eq!(stored, vec![2, 3, 4, 5, 6]);
    // A second request with the same 8-token prefix hits blocks 0 and 1 and anchors nothing new.
    s.add(keyed_seq(2, toks(0, 8), vec![1, 2, 3, 4]));
    run_to_end(&mut s);
    assert!(s.kv.take_events().is_empty());
    // A 6-block prompt needs every block: the cached ones are evicted.
    s.add(seq(3, toks(1000, 24), 1));
    run_to_end(&mut s);
    let mut removed = s.kv.take_events().removed;
    removed.sort_unstable();
    assert_eq!(removed, vec![2, 3, 4, 5, 6]);
    assert_eq!(s.kv.events().map(|l| l.resident().count()), Some(0));
}

#[test]
fn kv_events_are_off_unless_enabled() {
    let mut s = scheduler(6, 4, 64, true);
    s.add(keyed_seq(1, toks(0, 12), vec![1, 2, 3]));
    run_to_end(&mut s);
    assert!(s.kv.take_events().is_empty());
    assert!(s.kv.events().is_none());
}
