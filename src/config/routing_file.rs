//! `pools:` of `policies/routing.yaml`: one routing policy per pool, with its parameters checked
//! for range. The section comes parsed (`routing_doc`); cross-checks against the pools of the
//! main config happen in `compile`.

use std::collections::HashMap;

use serde_saphyr::Location;

use super::pool_policy::RawPoolPolicy;
use super::raw::Text;
use crate::diagnostics::Sink;
use crate::routing::{PolicyConfig, PrefixConfig};

/// One pool's entry in routing.yaml.
pub(super) struct RoutingEntry {
    /// The pool name, where it was written.
    pub pool: Text,
    /// Its policy, parameters in range.
    pub policy: PolicyConfig,
}

/// Checks the parsed `pools:` section (in file order): entries with bad parameters are reported
/// and dropped; the rest come back in file order.
pub(super) fn check(pools: Vec<(Text, RawPoolPolicy)>, sink: &mut Sink<'_>) -> Vec<RoutingEntry> {
    pools
        .into_iter()
        .filter_map(|(pool, raw)| {
            let entry = RoutingEntry {
                pool,
                policy: raw.policy,
            };
            check_entry(&entry, &raw.places, sink).then_some(entry)
        })
        .collect()
}

/// Reports parameters out of range, or given to a policy that takes none; true when clean.
fn check_entry(
    entry: &RoutingEntry,
    places: &HashMap<String, Location>,
    sink: &mut Sink<'_>,
) -> bool {
    let pool = &entry.pool.value;
    let place = |key: &str| places.get(key).copied().unwrap_or(entry.pool.referenced);
    let mut clean = true;
    let mut fail = |key: &str, message: String| {
        sink.at(&place(key), format!("pool `{pool}`: {message}"));
        clean = false;
    };
    match &entry.policy {
        PolicyConfig::Prefix(config) => {
            for (key, problem) in prefix_problems(config) {
                fail(key, problem);
            }
        }
        other => {
            let mut extra: Vec<&String> = places.keys().filter(|k| *k != "policy").collect();
            extra.sort();
            for key in extra {
                fail(
                    key,
                    format!("`{key}` does not apply to policy {}", other.name()),
                );
            }
        }
    }
    clean
}

/// A removed `prefix` knob: its name, whether a config sets it, and where routing v2 moved it.
type Removed = (&'static str, fn(&PrefixConfig) -> bool, &'static str);

/// Every removed `prefix` knob.
const REMOVED: [Removed; 4] = [
    (
        "load_factor",
        |c| c.load_factor.is_some(),
        "`load_factor` was removed in routing v2: load now counts relative to the pool inside one \
         cost; use `balance_tolerance` (default 0.25) for how much busier than its peers a \
         prefix holder may be",
    ),
    (
        "max_kv_usage",
        |c| c.max_kv_usage.is_some(),
        "`max_kv_usage` was removed in routing v2: KV is weighed against the request's new KV \
         relative to peers, never as a veto; bound a saturated pool with the admission stage \
         (`admission.max_in_flight_per_worker`, `max_queue` in infergate.yaml)",
    ),
    (
        "max_waiting",
        |c| c.max_waiting.is_some(),
        "`max_waiting` was removed in routing v2: queues count relative to peers inside one \
         cost; bound a saturated pool with the admission stage (`admission.max_queue`, \
         `max_wait` in infergate.yaml)",
    ),
    (
        "index_capacity",
        |c| c.index_capacity.is_some(),
        "`index_capacity` was removed in routing v2: the index is sized per worker from its KV \
         capacity (`vllm:cache_config_info`); `default_worker_kv_tokens` sizes it for workers \
         that do not export one",
    ),
];

/// Every parameter of a prefix policy that is out of range or removed, with the rule it breaks.
fn prefix_problems(config: &PrefixConfig) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    for (key, is_set, message) in REMOVED {
        if is_set(config) {
            problems.push((key, message.to_string()));
        }
    }
    let tol = config.balance_tolerance;
    if !tol.is_finite() || !(0.0..=10.0).contains(&tol) {
        problems.push((
            "balance_tolerance",
            format!("balance_tolerance must be a number in [0, 10], got {tol}"),
        ));
    }
    if config.min_match_blocks < 1 {
        problems.push((
            "min_match_blocks",
            "min_match_blocks must be ≥ 1, got 0".into(),
        ));
    }
    if config.default_worker_kv_tokens < 1 {
        problems.push((
            "default_worker_kv_tokens",
            "default_worker_kv_tokens must be ≥ 1, got 0".into(),
        ));
    }
    if config.max_index_blocks_per_worker < 1 {
        problems.push((
            "max_index_blocks_per_worker",
            "max_index_blocks_per_worker must be ≥ 1, got 0".into(),
        ));
    }
    problems
}
