//! Routing policies: pure functions of (request features, worker views) → worker index, shared by
//! the live gateway and the offline simulator. One file per policy; `build` makes one from config.
//!
//! Which to use when:
//! - `prefix`: requests share long prompt prefixes (system
//!   prompts, multi-turn chats, few-shot templates) and the engines cache prefixes. Sends a prefix
//!   where its KV blocks already are, within a load bound; replicas agree through hashing.
//! - `session`: the cache that matters is per user/conversation and clients send `x-session-id`
//!   (or `user`); simpler than `prefix` and stable across restarts of the gateway.
//! - `least_load`: no reuse between requests (embeddings, one-off prompts) or very uneven request
//!   sizes; the fresh in-flight count reacts fastest to a slow worker.
//! - `round_robin`: identical workers and uniform small requests, or as a baseline to compare.

use serde::Deserialize;

pub mod features;
pub mod hash_ring;
pub mod least_load;
pub mod prefix;
pub mod prefix_index;
pub mod round_robin;
pub mod session;
#[cfg(test)]
mod testkit;

/// What routing may know about a request, computed once in the validate phase.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFeatures {
    /// Chained xxh3 hashes of the canonical prompt in fixed-size blocks (see `features`).
    pub prefix_hashes: Vec<u64>,
    /// Hash of the session key (`x-session-id` header, else the body's `user`), if any.
    pub session_key: Option<u64>,
}

/// One worker as routing sees it: identity, health and load.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerView {
    /// Stable identity (xxh3 of the worker's URL), equal in every gateway replica.
    pub key: u64,
    /// False while ejected.
    pub healthy: bool,
    /// Requests this gateway has in flight on the worker (always fresh).
    pub in_flight: u32,
    /// Engine-reported requests waiting (polled; includes other gateways' traffic).
    pub waiting: f64,
    /// Engine-reported requests running (polled).
    pub running: f64,
    /// Engine-reported KV-cache usage, 0..=1 (polled).
    pub kv_usage: f64,
}

impl WorkerView {
    /// Load in requests: the larger of the fresh local count and the polled engine count.
    pub fn load(&self) -> f64 {
        f64::from(self.in_flight).max(self.waiting + self.running)
    }
}

/// Why a worker was chosen; counted in metrics by its `as_str` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteReason {
    /// Next in turn.
    RoundRobin,
    /// Least loaded healthy worker.
    LeastLoad,
    /// Consistent-hash home of the session key.
    Session,
    /// Worker already holding the longest matching prefix.
    PrefixHit,
    /// Unseen prefix sent to its consistent-hash home.
    PrefixHome,
    /// The preferred worker was over its load bound; the next candidate in hash order took it.
    LoadSpill,
    /// Every candidate was over its bound; the least loaded healthy worker took it.
    Overloaded,
}

impl RouteReason {
    /// Metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteReason::RoundRobin => "round_robin",
            RouteReason::LeastLoad => "least_load",
            RouteReason::Session => "session",
            RouteReason::PrefixHit => "prefix_hit",
            RouteReason::PrefixHome => "prefix_home",
            RouteReason::LoadSpill => "load_spill",
            RouteReason::Overloaded => "overloaded",
        }
    }
}

/// A routing choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Index into the worker slice given to `select`.
    pub index: usize,
    /// Why.
    pub reason: RouteReason,
}

/// A routing policy. `select` has no effect beyond choosing (round-robin's turn counter aside);
/// what the policy learns from a routed request it learns in `observe`.
pub trait RoutingPolicy: Send + Sync {
    /// Picks a healthy worker, or `None` when none is healthy.
    fn select(&self, req: &RequestFeatures, workers: &[WorkerView]) -> Option<Decision>;
    /// Records that `req` was sent to the worker with key `worker_key`.
    fn observe(&self, _req: &RequestFeatures, _worker_key: u64) {}
}

/// Per-pool policy settings from `policies/routing.yaml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case", deny_unknown_fields)]
pub enum PolicyConfig {
    /// Rotate over healthy workers.
    RoundRobin,
    /// Fewest requests in flight (fresh) or queued (polled).
    LeastLoad,
    /// Consistent hash of the session key; requests without one go least-loaded.
    Session,
    /// Cache-aware with bounded load.
    Prefix(PrefixConfig),
}

/// Settings of the `prefix` policy.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrefixConfig {
    /// A worker whose load exceeds the pool mean × this factor (+1 request) is skipped. Default 1.5.
    pub load_factor: f64,
    /// A worker at or above this KV-cache usage (0..1) is skipped. Default 0.95.
    pub max_kv_usage: f64,
    /// A worker with at least this many engine-queued requests is skipped. Default 16.
    pub max_waiting: f64,
    /// Block hashes remembered over all workers (LRU beyond). Default 200,000.
    pub index_capacity: usize,
    /// Fewest matching blocks that count as a hit. Default 1.
    pub min_match_blocks: usize,
}

impl Default for PrefixConfig {
    fn default() -> Self {
        Self {
            load_factor: 1.5,
            max_kv_usage: 0.95,
            max_waiting: 16.0,
            index_capacity: 200_000,
            min_match_blocks: 1,
        }
    }
}

/// Builds the policy a pool's config names.
pub fn build(cfg: &PolicyConfig) -> Box<dyn RoutingPolicy> {
    match cfg {
        PolicyConfig::RoundRobin => Box::new(round_robin::RoundRobin::new()),
        PolicyConfig::LeastLoad => Box::new(least_load::LeastLoad::default()),
        PolicyConfig::Session => Box::new(session::SessionAffinity),
        PolicyConfig::Prefix(prefix) => Box::new(prefix::CacheAware::new(prefix.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_and_builds_every_policy() {
        let cases = [
            (r#"{"policy":"round_robin"}"#, RouteReason::RoundRobin),
            (r#"{"policy":"least_load"}"#, RouteReason::LeastLoad),
            (r#"{"policy":"session"}"#, RouteReason::LeastLoad),
            (
                r#"{"policy":"prefix","load_factor":2.0}"#,
                RouteReason::LeastLoad,
            ),
        ];
        let workers = testkit::workers(3);
        for (json, reason) in cases {
            let cfg: PolicyConfig = serde_json::from_str(json).expect(json);
            let d = build(&cfg).select(&RequestFeatures::default(), &workers);
            assert_eq!(d.map(|d| d.reason), Some(reason), "{json}");
        }
        let cfg: PolicyConfig = serde_json::from_str(r#"{"policy":"prefix","load_factor":2.0}"#)
            .expect("valid prefix config");
        let expect = PrefixConfig {
            load_factor: 2.0,
            ..PrefixConfig::default()
        };
        assert_eq!(cfg, PolicyConfig::Prefix(expect));
        assert!(serde_json::from_str::<PolicyConfig>(r#"{"policy":"prefix","x":1}"#).is_err());
        assert!(serde_json::from_str::<PolicyConfig>(r#"{"policy":"random"}"#).is_err());
    }
}
