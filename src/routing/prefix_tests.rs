//! Tests of the `prefix` policy on hand-built worker views.

use super::*;
use crate::routing::features::{
    DEFAULT_BLOCK_BYTES, DEFAULT_MAX_BLOCKS, canonical_chat, prefix_hashes, session_hash,
};
use crate::routing::prefix_index::MAX_WORKERS_PER_BLOCK;
use crate::routing::testkit::{SplitMix64, workers};

fn policy() -> CacheAware {
    CacheAware::new(PrefixConfig::default())
}

fn chat(system: &str, user: &str) -> RequestFeatures {
    let bytes = canonical_chat(&[("system", system), ("user", user)]);
    RequestFeatures {
        prefix_hashes: prefix_hashes(&bytes, DEFAULT_BLOCK_BYTES, DEFAULT_MAX_BLOCKS),
        session_key: None,
    }
}

fn system_prompt(seed: u64) -> String {
    let mut rng = SplitMix64(seed);
    (0..1200)
        .map(|_| char::from(b'a' + rng.below(26) as u8))
        .collect()
}

/// Selects, then records the choice as the gateway would.
fn route(p: &CacheAware, req: &RequestFeatures, ws: &[WorkerView]) -> Option<Decision> {
    let d = p.select(req, ws)?;
    p.observe(req, ws[d.index].key);
    Some(d)
}

/// The prefix's consistent-hash order over `ws`.
fn order(req: &RequestFeatures, ws: &[WorkerView]) -> Vec<usize> {
    hash_ring::candidates(req.prefix_hashes[0], ws, ws.len())
}

#[test]
fn shared_system_prompt_concentrates_while_load_allows() {
    let p = policy();
    let mut ws = workers(8);
    for w in &mut ws {
        w.in_flight = 2;
    }
    let system = system_prompt(1);
    let first = route(&p, &chat(&system, "q0"), &ws).map(|d| (d.index, d.reason));
    assert_eq!(first.map(|f| f.1), Some(RouteReason::PrefixHome));
    for i in 1..50 {
        let d = route(&p, &chat(&system, &format!("question {i}")), &ws);
        assert_eq!(d.map(|d| d.index), first.map(|f| f.0));
        assert_eq!(d.map(|d| d.reason), Some(RouteReason::PrefixHit));
    }
}

#[test]
fn distinct_unseen_prefixes_spread() {
    let p = policy();
    let ws = workers(8);
    let mut counts = [0usize; 8];
    for seed in 0..1_000 {
        let d = route(&p, &chat(&system_prompt(seed + 100), "hi"), &ws);
        assert_eq!(d.map(|d| d.reason), Some(RouteReason::PrefixHome));
        if let Some(d) = d {
            counts[d.index] += 1;
        }
    }
    assert!(
        counts.iter().all(|&c| (50..=250).contains(&c)),
        "{counts:?}"
    );
}

#[test]
fn saturated_home_spills_to_a_stable_next_candidate() {
    let p = policy();
    let mut ws = workers(6);
    for w in &mut ws {
        w.in_flight = 1;
    }
    let system = system_prompt(2);
    let hot = order(&chat(&system, ""), &ws);
    ws[hot[0]].in_flight = 50;
    for i in 0..20 {
        let req = chat(&system, &format!("user {i}"));
        // Without learning: every request spills to the same second worker.
        let d = p.select(&req, &ws);
        assert_eq!(d, Some(decision(hot[1], RouteReason::LoadSpill)));
    }
    for i in 0..20 {
        // With learning: the spill worker becomes the hit; still the same worker.
        let d = route(&p, &chat(&system, &format!("user {i}")), &ws);
        assert_eq!(d.map(|d| d.index), Some(hot[1]));
    }
}

#[test]
fn hit_over_its_bound_falls_to_hash_order() {
    let p = policy();
    let mut ws = workers(6);
    let req = chat(&system_prompt(3), "hello");
    let hot = order(&req, &ws);
    p.observe(&req, ws[hot[3]].key);
    assert_eq!(
        p.select(&req, &ws),
        Some(decision(hot[3], RouteReason::PrefixHit))
    );
    ws[hot[3]].in_flight = 40;
    assert_eq!(
        p.select(&req, &ws),
        Some(decision(hot[0], RouteReason::PrefixHome))
    );
    ws[hot[0]].in_flight = 40;
    assert_eq!(
        p.select(&req, &ws),
        Some(decision(hot[1], RouteReason::LoadSpill))
    );
}

#[test]
fn cache_miss_is_not_sent_to_a_busy_worker() {
    let p = policy();
    let mut ws = workers(4);
    let req = chat(&system_prompt(4), "new");
    let hot = order(&req, &ws);
    ws[hot[0]].waiting = 6.0;
    ws[hot[0]].running = 4.0;
    let d = p.select(&req, &ws);
    assert_eq!(d, Some(decision(hot[1], RouteReason::LoadSpill)));
}

#[test]
fn longest_match_wins_and_ties_go_to_lower_load() {
    let p = policy();
    let mut ws = workers(4);
    let system = system_prompt(5);
    let long = chat(&system, &"x".repeat(600));
    p.observe(&chat(&system, "short"), ws[0].key);
    p.observe(&long, ws[1].key);
    assert_eq!(
        p.select(&long, &ws),
        Some(decision(1, RouteReason::PrefixHit))
    );
    p.observe(&long, ws[2].key);
    ws[1].in_flight = 1;
    assert_eq!(
        p.select(&long, &ws),
        Some(decision(2, RouteReason::PrefixHit))
    );
}

#[test]
fn short_matches_below_the_minimum_are_not_hits() {
    let p = CacheAware::new(PrefixConfig {
        min_match_blocks: 3,
        ..PrefixConfig::default()
    });
    let ws = workers(4);
    let system = "s".repeat(600); // two full blocks of shared system prompt
    let req = chat(&system, "a");
    let hot = order(&req, &ws);
    p.observe(&req, ws[hot[2]].key);
    let d = p.select(&chat(&system, "b"), &ws);
    assert_eq!(d, Some(decision(hot[0], RouteReason::PrefixHome)));
}

#[test]
fn kv_usage_and_waiting_thresholds_are_respected() {
    let p = policy();
    let mut ws = workers(4);
    for w in &mut ws {
        w.running = 20.0;
    }
    let req = chat(&system_prompt(6), "q");
    let hot = order(&req, &ws);
    ws[hot[0]].kv_usage = 0.95;
    assert_eq!(
        p.select(&req, &ws),
        Some(decision(hot[1], RouteReason::LoadSpill))
    );
    ws[hot[0]].kv_usage = 0.5;
    ws[hot[0]].waiting = 16.0; // within the load bound, but the queue is at its threshold
    assert_eq!(
        p.select(&req, &ws),
        Some(decision(hot[1], RouteReason::LoadSpill))
    );
    for w in &mut ws {
        w.kv_usage = 0.99;
    }
    ws[hot[2]].running = 5.0;
    assert_eq!(
        p.select(&req, &ws),
        Some(decision(hot[2], RouteReason::Overloaded))
    );
}

#[test]
fn unhealthy_workers_are_never_chosen() {
    let p = policy();
    let mut rng = SplitMix64(9);
    let mut ws = workers(8);
    for i in 0..2_000 {
        for w in &mut ws {
            w.healthy = rng.below(3) != 0;
            w.in_flight = rng.below(10) as u32;
        }
        let req = chat(&system_prompt(rng.below(20)), &format!("{i}"));
        match route(&p, &req, &ws) {
            Some(d) => assert!(ws[d.index].healthy),
            None => assert!(ws.iter().all(|w| !w.healthy)),
        }
    }
    for w in &mut ws {
        w.healthy = false;
    }
    assert_eq!(p.select(&chat(&system_prompt(1), "x"), &ws), None);
    assert_eq!(p.select(&RequestFeatures::default(), &ws), None);
}

#[test]
fn requests_without_blocks_use_session_or_least_load() {
    let p = policy();
    let mut ws = workers(4);
    ws[0].in_flight = 1;
    let req = RequestFeatures {
        prefix_hashes: Vec::new(),
        session_key: Some(session_hash("s1")),
    };
    let home = hash_ring::first(session_hash("s1"), &ws, |_| true);
    assert_eq!(
        p.select(&req, &ws).map(|d| (Some(d.index), d.reason)),
        Some((home, RouteReason::Session))
    );
    let d = p.select(&RequestFeatures::default(), &ws);
    assert_eq!(d, Some(decision(1, RouteReason::LeastLoad)));
}

#[test]
fn index_stays_bounded() {
    let p = CacheAware::new(PrefixConfig {
        index_capacity: 100,
        ..PrefixConfig::default()
    });
    let ws = workers(4);
    for seed in 0..500 {
        route(&p, &chat(&system_prompt(seed), "q"), &ws);
        assert!(p.index().len() <= 100);
    }
}

#[test]
fn index_answers_for_a_few_workers_whatever_the_pool_size() {
    let p = policy();
    let ws = workers(200);
    let req = chat(&system_prompt(7), "q");
    for w in &ws {
        p.observe(&req, w.key);
    }
    // The index's answer is bounded by the per-block list, not by the 200 workers.
    assert_eq!(
        p.index().matches(&req.prefix_hashes).len(),
        MAX_WORKERS_PER_BLOCK
    );
    let d = p.select(&req, &ws);
    assert_eq!(d.map(|d| d.reason), Some(RouteReason::PrefixHit));
    assert!(d.is_some_and(|d| d.index >= 200 - MAX_WORKERS_PER_BLOCK));
}
