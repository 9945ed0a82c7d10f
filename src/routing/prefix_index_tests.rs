//! Tests of the per-worker prefix index.

use super::*;
use crate::routing::Residency;
use crate::routing::testkit::SplitMix64;

fn sorted(mut v: Vec<(u64, usize)>) -> Vec<(u64, usize)> {
    v.sort_unstable();
    v
}

/// A placement of `hashes` at 10 tokens a block, no extra KV, on a worker of `capacity` tokens.
fn at(hashes: &[u64], capacity: u64) -> Placement<'_> {
    Placement {
        hashes,
        block_tokens: 10.0,
        extra_tokens: 0,
        capacity: Some(capacity),
        protected: None,
    }
}

#[test]
fn longest_run_per_worker() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    idx.record(10, at(&[1, 2, 3, 4], 1_000));
    idx.record(20, at(&[1, 2, 7], 1_000));
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
fn each_worker_forgets_what_its_own_capacity_cannot_hold() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    // Worker 1 holds 3 blocks of 10 tokens, worker 2 holds 100.
    idx.record(1, at(&[1, 2], 30));
    idx.record(2, at(&[1, 2], 1_000));
    idx.record(1, at(&[5, 6], 30)); // evicts 2, the least recent
    idx.record(2, at(&[5, 6], 1_000));
    assert_eq!(sorted(idx.matches(&[1, 2])), vec![(1, 1), (2, 2)]);
    assert_eq!(sorted(idx.matches(&[5, 6])), vec![(1, 2), (2, 2)]);
    let sizes = idx.sizes();
    assert_eq!(sizes[0], (1, 3, 30, 30), "{sizes:?}");
    assert_eq!(sizes[1], (2, 4, 40, 1_000), "{sizes:?}");
}

#[test]
fn a_requests_answer_and_tail_push_older_prefixes_out() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    idx.record(1, at(&[1, 2], 100));
    // A request of 2 new blocks whose answer and tail take 80 tokens: 20 + 20 + 80 > 100.
    idx.record(
        1,
        Placement {
            extra_tokens: 80,
            ..at(&[8, 9], 100)
        },
    );
    assert_eq!(idx.matches(&[1, 2]), vec![], "the older prefix was evicted");
    // The anonymous KV is older than the request's blocks, so it goes before them.
    idx.record(1, at(&[3], 100));
    assert_eq!(idx.matches(&[8, 9]), vec![(1, 2)]);
}

#[test]
fn leading_blocks_outlive_deep_ones() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    idx.record(1, at(&[1, 2, 3], 40));
    idx.record(1, at(&[4], 40));
    idx.record(1, at(&[1], 40)); // refreshes 1
    idx.record(1, at(&[5], 40)); // evicts 3 (deepest of the oldest request)
    assert_eq!(idx.matches(&[1, 2, 3]), vec![(1, 2)]);
    idx.record(1, at(&[6], 40)); // evicts 2
    assert_eq!(idx.matches(&[1, 2]), vec![(1, 1)]);
    assert_eq!(idx.matches(&[4]), vec![(1, 1)]);
}

#[test]
fn bounded_under_many_random_inserts() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    let mut rng = SplitMix64(7);
    let mut hashes = Vec::with_capacity(10);
    for _ in 0..50_000 {
        hashes.clear();
        // A small hash space so blocks repeat and get refreshed as well as inserted.
        hashes.extend((0..10).map(|_| rng.below(5_000)));
        let worker = rng.below(8);
        idx.record(
            worker,
            Placement {
                extra_tokens: rng.below(30),
                ..at(&hashes, 500 + worker * 100)
            },
        );
    }
    let inner = idx.lock();
    for (key, cache) in &inner.workers {
        assert!(cache.used <= cache.capacity(), "worker {key}");
        assert_eq!(
            cache.used,
            cache.lru.values().map(|e| e.tokens).sum::<u64>()
        );
        assert_eq!(
            cache.ticks.len(),
            cache.lru.values().filter(|e| e.hash.is_some()).count()
        );
    }
    // The shared map holds exactly what the workers hold.
    let held: usize = inner.holders.values().map(Vec::len).sum();
    let per_worker: usize = inner.workers.values().map(|c| c.ticks.len()).sum();
    assert_eq!(held, per_worker);
}

#[test]
fn a_missed_prediction_shrinks_the_worker_and_a_surprise_grows_it_back() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    let hashes: Vec<u64> = (1..=10).collect();
    idx.record(1, at(&hashes, 100));
    assert_eq!(idx.sizes()[0].3, 100);
    // Predicted 100 cached tokens, the worker had 0: capacity × 0.8, tail blocks dropped.
    idx.correct(1, 100, 0, 10.0);
    assert_eq!(idx.sizes()[0].3, 80);
    assert_eq!(idx.matches(&hashes), vec![(1, 8)]);
    // Within two blocks of the prediction: nothing to learn.
    idx.correct(1, 80, 70, 10.0);
    assert_eq!(idx.sizes()[0].3, 80);
    // More cached than predicted: grows, but never past the capacity the worker reports.
    for _ in 0..20 {
        idx.correct(1, 0, 100, 10.0);
    }
    assert_eq!(idx.sizes()[0].3, 100);
    // A worker that reports no capacity may grow past the default.
    idx.record(
        2,
        Placement {
            capacity: None,
            ..at(&[1], 0)
        },
    );
    for _ in 0..5 {
        idx.correct(2, 0, 100, 10.0);
    }
    assert!(idx.sizes()[1].3 > DEFAULT_WORKER_TOKENS);
}

#[test]
fn forgetting_a_worker_removes_only_its_blocks() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    idx.record(1, at(&[1, 2], 100));
    idx.record(2, at(&[1, 2], 100));
    idx.forget(1);
    assert_eq!(idx.matches(&[1, 2]), vec![(2, 2)]);
    idx.forget(2);
    assert!(idx.is_empty());
    assert!(idx.sizes().is_empty());
}

#[test]
fn unknown_capacity_takes_the_default_and_oversize_blocks_do_not_stay() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    idx.record(1, at(&[1, 2], 0));
    // A zero capacity is "unknown": the default applies.
    assert_eq!(idx.matches(&[1]), vec![(1, 1)]);
    idx.record(
        1,
        Placement {
            block_tokens: 1e9,
            ..at(&[3], 5)
        },
    );
    assert!(
        idx.matches(&[3]).is_empty(),
        "a block larger than the cache"
    );
}

#[test]
fn a_snapshot_adds_to_guesses_and_events_keep_it_exact() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    // The gateway routed 1,2,3 to worker 10 before the stream opened; the snapshot has 1 and 5.
    idx.record(10, at(&[1, 2, 3], 1_000));
    idx.apply(10, Residency::Snapshot(&[1, 5]), 10.0);
    assert!(idx.is_precise(10));
    assert_eq!(
        idx.matches(&[1, 2, 3]),
        vec![(10, 3)],
        "a request still in prefill is not in the snapshot yet: the guess stays"
    );
    assert_eq!(idx.matches(&[5]), vec![(10, 1)]);
    // Its answer said only one block was cached: the unconfirmed guess goes, exactly.
    idx.refute(10, &[1, 2, 3], 1);
    assert_eq!(idx.matches(&[1, 2, 3]), vec![(10, 1)]);
    // Another gateway's request stored 2 and 3 there: this one learns it without routing it.
    idx.apply(10, Residency::Stored(&[2, 3]), 10.0);
    assert_eq!(idx.matches(&[1, 2, 3]), vec![(10, 3)]);
    // The engine evicted 2: the run stops at 1 at once, not when the LRU guesses so.
    idx.apply(10, Residency::Removed(&[2]), 10.0);
    assert_eq!(idx.matches(&[1, 2, 3]), vec![(10, 1)]);
    // Removing what it does not hold, or from a worker it does not know, is harmless.
    idx.apply(10, Residency::Removed(&[99]), 10.0);
    idx.apply(77, Residency::Removed(&[1]), 10.0);
    assert_eq!(idx.matches(&[1]), vec![(10, 1)]);
}

#[test]
fn a_precise_worker_takes_no_guessed_kv_and_no_feedback_scaling() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    idx.apply(10, Residency::Snapshot(&[]), 10.0);
    idx.record(
        10,
        Placement {
            hashes: &[1, 2],
            block_tokens: 10.0,
            extra_tokens: 500,
            capacity: Some(1_000),
            protected: None,
        },
    );
    let (_, blocks, used, cap) = idx.sizes()[0];
    assert_eq!(
        (blocks, used, cap),
        (2, 20, 1_000),
        "no anonymous answer KV"
    );
    // A predicted hit that the answer denies does not shrink a precise worker's capacity.
    idx.correct(10, 200, 0, 10.0);
    assert_eq!(idx.sizes()[0].3, 1_000);
}

#[test]
fn a_lost_stream_keeps_what_is_known_as_a_guess() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    idx.apply(10, Residency::Snapshot(&[1, 2]), 10.0);
    idx.apply(10, Residency::Lost, 10.0);
    assert!(!idx.is_precise(10));
    assert_eq!(idx.matches(&[1, 2]), vec![(10, 2)]);
    // A new snapshot makes it precise again; forgetting the worker drops everything.
    idx.apply(10, Residency::Snapshot(&[1]), 10.0);
    assert!(idx.is_precise(10));
    idx.forget(10);
    assert!(!idx.is_precise(10));
    assert!(idx.is_empty());
}

#[test]
fn segmented_worker_forgets_blocks_seen_once_first() {
    // 100 tokens of capacity (10 blocks), 50 of them protected. A prompt [1, 2] is seen twice,
    // then one-off prompts churn through: a segmented worker keeps [1, 2], a plain LRU one not.
    for (protected, kept) in [(None, false), (Some(50), true)] {
        let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
        let place = |hashes: &[u64]| {
            idx.record(
                7,
                Placement {
                    protected,
                    ..at(hashes, 100)
                },
            )
        };
        place(&[1, 2]);
        place(&[1, 2]);
        for i in 0..20u64 {
            place(&[100 + 2 * i, 101 + 2 * i]);
        }
        assert_eq!(idx.matches(&[1, 2]) == vec![(7, 2)], kept, "{protected:?}");
        let (_, blocks, used, cap) = idx.sizes()[0];
        assert!(used <= cap && blocks == 10, "{blocks} blocks, {used}/{cap}");
    }
}

#[test]
fn protected_segment_demotes_its_oldest_beyond_its_size() {
    // Protected holds 2 blocks: of two reused prompts, the older is demoted and goes first.
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    let place = |hashes: &[u64]| {
        idx.record(
            7,
            Placement {
                protected: Some(20),
                ..at(hashes, 60)
            },
        )
    };
    for p in [[1, 2], [1, 2], [3, 4], [3, 4]] {
        place(&p);
    }
    place(&[5, 6]);
    place(&[7, 8]);
    assert_eq!(idx.matches(&[1, 2]), vec![], "demoted, then evicted");
    assert_eq!(idx.matches(&[3, 4]), vec![(7, 2)]);
    // Removing a protected block keeps the books straight.
    idx.apply(7, Residency::Removed(&[3]), 10.0);
    assert_eq!(idx.sizes()[0].2, 50);
}

#[test]
fn the_entry_cap_bounds_each_worker_whatever_capacity_it_claims() {
    const CAP: usize = 1_000;
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS).with_max_blocks(CAP);
    let claimed = 16_000_000_000_000; // 1.6e13 tokens, as measured
    // Routed requests, each with its anonymous KV entry.
    for i in 0..2_000u64 {
        let hashes = [i * 3, i * 3 + 1, i * 3 + 2];
        idx.record(
            1,
            Placement {
                extra_tokens: 50,
                ..at(&hashes, claimed)
            },
        );
    }
    // Streamed keys of a precise worker (that claims the same), in one huge snapshot and then
    // batches.
    idx.record(2, at(&[u64::MAX], claimed));
    let keys: Vec<u64> = (0..50_000).collect();
    idx.apply(2, Residency::Snapshot(&keys), 64.0);
    for batch in keys.chunks(5_000) {
        let shifted: Vec<u64> = batch.iter().map(|k| k + 1_000_000).collect();
        idx.apply(2, Residency::Stored(&shifted), 64.0);
    }
    for (worker, blocks, _, _) in idx.sizes() {
        assert!(blocks <= CAP, "worker {worker} holds {blocks} blocks");
    }
    let inner = idx.lock();
    for (worker, cache) in &inner.workers {
        assert!(
            cache.entries() <= CAP,
            "worker {worker}: {}",
            cache.entries()
        );
    }
    // The newest survive: the last streamed key is still there, the first is gone.
    assert!(inner.workers[&2].ticks.contains_key(&1_049_999));
    assert!(!inner.workers[&2].ticks.contains_key(&0));
    assert!(inner.holders.len() <= 2 * CAP);
}

#[test]
fn the_default_cap_leaves_ordinary_workers_alone() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    let keys: Vec<u64> = (0..10_000).collect();
    idx.apply(1, Residency::Snapshot(&keys), 10.0);
    assert_eq!(idx.sizes()[0].1, 10_000);
}

#[test]
fn a_hot_prefix_is_not_moved_on_every_request_and_still_outlives_cold_ones() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    // Room for 400 blocks: a hot 4-block prefix, then one cold block per request.
    let hot = [1, 2, 3, 4];
    for i in 0..2_000u64 {
        let mut hashes = hot.to_vec();
        hashes.push(1_000 + i);
        idx.record(1, at(&hashes, 4_000));
    }
    // The hot prefix is held; the cold blocks beyond the last ~396 were evicted, oldest first.
    assert_eq!(idx.matches(&hot), vec![(1, 4)]);
    assert_eq!(idx.matches(&[1_000]), vec![]);
    assert_eq!(idx.matches(&[1_000 + 1_999]), vec![(1, 1)]);
    let guard = idx.lock();
    let cache = &guard.workers[&1];
    assert_eq!(cache.used, 4_000);
    // Its blocks were left in place most of the time: their ticks are older than the newest.
    let newest = *cache.lru.keys().next_back().unwrap_or(&0);
    let hot_tick = cache.ticks[&1].0;
    assert!(hot_tick < newest, "{hot_tick} {newest}");
    assert!(
        newest - hot_tick <= (cache.lru.len() / RECENT_SHARE) as u64 + 6,
        "the hot prefix stays among the newest eighth"
    );
}

#[test]
fn a_hot_prefix_moves_once_per_eighth_of_the_segment_inserted_whatever_its_length() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    // Room for 400 blocks (a window of 50 inserts): a hot 20-block prefix, then one cold block
    // per request. Touching the hot blocks inserts nothing, so it must not use the window up.
    let hot: Vec<u64> = (1..=20).collect();
    let mut moves = 0;
    let mut last = None;
    for i in 0..2_000u64 {
        let mut hashes = hot.clone();
        hashes.push(1_000 + i);
        idx.record(1, at(&hashes, 4_000));
        let tick = idx.lock().workers[&1].ticks[&1].0;
        // Counted once the segment is full (while it fills, its eighth is small).
        if i >= 1_000 && last.is_some_and(|t| t != tick) {
            moves += 1;
        }
        last = Some(tick);
    }
    // Each block moves once per 50 inserts: one cold block a request, and the hot blocks' own
    // moves (20 per 50 inserts), so about every 30 requests. Counting every touch against the
    // window instead moved it every 2-3 requests (~400 times here).
    assert!(
        (20..=50).contains(&moves),
        "{moves} moves in 1,000 requests"
    );
    assert_eq!(idx.matches(&hot), vec![(1, 20)]);
}

#[test]
fn a_prefix_is_homed_while_its_leading_block_is_held() {
    let idx = PrefixIndex::new(DEFAULT_WORKER_TOKENS);
    // Two prefixes of 3 and 2 blocks (10 tokens each) on worker 1, room for 6 blocks.
    idx.record(1, at(&[1, 2, 3], 60));
    idx.record(1, at(&[7, 8], 60));
    assert_eq!(idx.homed(), vec![(1, 50, 60)]);
    // Routed again longer, a prefix counts at its latest length, once.
    idx.record(1, at(&[1, 2, 3, 4], 60));
    assert_eq!(idx.homed(), vec![(1, 60, 60)]);
    // Blocks another router sent there evict the least recent, the second prefix's lead
    // among them; they start no prefix of ours.
    idx.apply(1, Residency::Stored(&[20, 21]), 10.0);
    assert!(idx.matches(&[7]).is_empty());
    assert_eq!(idx.homed(), vec![(1, 40, 60)]);
    // Removed by a KV event, or the worker forgotten: nothing is homed there any more.
    idx.apply(1, Residency::Removed(&[1]), 10.0);
    assert_eq!(idx.homed(), vec![(1, 0, 60)]);
    idx.forget(1);
    assert_eq!(idx.homed(), vec![]);
}
