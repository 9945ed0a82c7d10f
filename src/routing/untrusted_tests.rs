//! Routing stays sane whatever workers report: for arbitrary polled values (NaN, infinities,
//! negatives, huge numbers) every policy picks a healthy worker whenever one exists, and the
//! load and KV fill it computes from them are finite and in range. The `prefix` policy also
//! checks in debug builds that every cost it computes is finite.

use proptest::prelude::*;

use super::prefix::CacheAware;
use super::{
    MAX_POLLED_REQUESTS, PolicyConfig, PrefixConfig, RequestFeatures, RoutingPolicy, WorkerView,
    build, testkit,
};

/// Any f64, with the special values much more likely than by chance.
fn any_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(1e308),
        Just(-1e308),
        Just(f64::MAX),
        Just(f64::MIN_POSITIVE),
        Just(-0.0),
        -10.0..10.0f64,
        any::<f64>(),
    ]
}

fn any_u64() -> impl Strategy<Value = u64> {
    prop_oneof![Just(u64::MAX), Just(0u64), 0..1_000_000u64, any::<u64>()]
}

prop_compose! {
    fn any_worker(i: usize)(
        healthy in prop::bool::weighted(0.7),
        in_flight in prop_oneof![Just(u32::MAX), 0..64u32],
        waiting in any_f64(),
        running in any_f64(),
        polled_in_flight in prop_oneof![Just(u32::MAX), 0..64u32],
        kv_usage in any_f64(),
        pending_prefill in any_u64(),
        kv_capacity in prop::option::of(any_u64()),
        kv_protected in prop::option::of(any_u64()),
    ) -> WorkerView {
        WorkerView {
            healthy,
            in_flight,
            waiting,
            running,
            polled_in_flight,
            kv_usage,
            pending_prefill,
            kv_capacity,
            kv_protected,
            ..testkit::worker(i)
        }
    }
}

fn any_workers() -> impl Strategy<Value = Vec<WorkerView>> {
    (1..6usize).prop_flat_map(|n| (0..n).map(any_worker).collect::<Vec<_>>())
}

fn any_request() -> impl Strategy<Value = RequestFeatures> {
    (
        prop::collection::vec(0..4u64, 0..6),
        prop::option::of(any::<u64>()),
        prop_oneof![Just(0usize), Just(usize::MAX), 0..100_000usize],
        any::<u32>(),
    )
        .prop_map(
            |(prefix_hashes, session_key, prompt_bytes, max_output_tokens)| RequestFeatures {
                prefix_hashes,
                session_key,
                prompt_bytes,
                max_output_tokens,
                home: None,
            },
        )
}

fn policies() -> Vec<(&'static str, Box<dyn RoutingPolicy>)> {
    vec![
        ("round_robin", build(&PolicyConfig::RoundRobin)),
        ("least_load", build(&PolicyConfig::LeastLoad)),
        ("session", build(&PolicyConfig::Session)),
        (
            "prefix",
            build(&PolicyConfig::Prefix(PrefixConfig::default())),
        ),
    ]
}

proptest! {
    #[test]
    fn load_and_fill_are_finite_and_in_range(w in any_worker(0)) {
        let load = w.load();
        prop_assert!(load.is_finite() && load >= 0.0, "load {load} of {w:?}");
        prop_assert!(load <= f64::from(w.in_flight) + 2.0 * MAX_POLLED_REQUESTS);
        let fill = w.kv_fill();
        prop_assert!((0.0..=1.0).contains(&fill), "fill {fill} of {w:?}");
    }

    #[test]
    fn every_policy_picks_a_healthy_worker_whenever_one_exists(
        workers in any_workers(),
        reqs in prop::collection::vec(any_request(), 1..4),
    ) {
        let any_healthy = workers.iter().any(|w| w.healthy);
        for (name, policy) in policies() {
            for req in &reqs {
                let d = policy.select(req, &workers);
                match d {
                    Some(d) => {
                        prop_assert!(workers[d.index].healthy, "{name} chose an ejected worker");
                        // Learn from the pick, so later requests meet a non-empty index.
                        policy.observe(req, &workers[d.index]);
                    }
                    None => prop_assert!(!any_healthy, "{name} chose none of {workers:?}"),
                }
            }
        }
    }

    #[test]
    fn prefix_holders_with_nonsense_load_do_not_block_the_pool(
        workers in any_workers(),
        req in any_request(),
    ) {
        // The index says every worker holds the prompt, so every cost term is in play.
        let policy = CacheAware::new(PrefixConfig::default());
        for w in &workers {
            policy.observe(&req, w);
        }
        let d = policy.select(&req, &workers);
        prop_assert_eq!(d.is_some(), workers.iter().any(|w| w.healthy));
        if let Some(d) = d {
            prop_assert!(workers[d.index].healthy);
        }
    }
}

/// The measured case: one worker reporting `1e308` / NaN / -Inf waiting beside an idle one; the
/// idle one takes the requests (before the fix the band was NaN and no worker was chosen).
#[test]
fn a_worker_reporting_nonsense_load_loses_to_an_idle_one() {
    for bad in [1e308, f64::NAN, f64::INFINITY] {
        let mut ws = testkit::workers(2);
        ws[0].waiting = bad;
        ws[0].running = bad;
        let policy = CacheAware::new(PrefixConfig::default());
        for i in 0..20u64 {
            let req = RequestFeatures {
                prefix_hashes: vec![i, i + 1],
                prompt_bytes: 2_000,
                max_output_tokens: 16,
                home: None,
                ..RequestFeatures::default()
            };
            let d = policy.select(&req, &ws).map(|d| d.index);
            assert_eq!(d, Some(1), "waiting {bad}");
        }
    }
    // Negative or -Inf counts are no load at all, not less than none.
    let mut ws = testkit::workers(2);
    ws[0].waiting = f64::NEG_INFINITY;
    assert_eq!(ws[0].load(), 0.0);
}
