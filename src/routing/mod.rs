//! Routing policies: pure functions of (request features, worker views) → worker index, shared by
//! the live gateway and the offline simulator. One file per policy; `build` makes one from config.
//!
//! Which to use when:
//! - `prefix`: requests share long prompt prefixes (system prompts, multi-turn chats, few-shot
//!   templates) and the engines cache prefixes. Picks the worker with the lowest expected cost in
//!   prompt tokens of work (see `prefix`), load counted relative to the pool; replicas agree
//!   through hashing.
//! - `session`: the cache that matters is per user/conversation and clients send `x-session-id`
//!   (or `user`); simpler than `prefix` and stable across restarts of the gateway.
//! - `least_load`: no reuse between requests (embeddings, one-off prompts) or very uneven request
//!   sizes; the fresh in-flight count reacts fastest to a slow worker.
//! - `round_robin`: identical workers and uniform small requests, or as a baseline to compare.
//!
//! Whatever a worker reports, routing stays finite: the view clamps polled counts and KV usage
//! ([`WorkerView::load`], [`WorkerView::kv_fill`]), so a lying worker looks busy instead of
//! making every cost NaN; the `prefix` index keeps at most `max_index_blocks_per_worker`
//! entries per worker, whatever KV capacity the worker claims.

use serde::Deserialize;

pub mod chat_keys;
pub mod cold_home;
pub mod demand;
pub mod directory;
pub mod features;
pub mod hash_ring;
pub mod least_load;
pub mod prefix;
pub mod prefix_index;
#[cfg(test)]
mod replica_model;
pub mod round_robin;
pub mod session;
pub mod shape_class;
#[cfg(test)]
mod testkit;
#[cfg(test)]
mod untrusted_tests;

/// What routing may know about a request, computed once in the validate phase.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFeatures {
    /// Chained xxh3 hashes of the canonical prompt in fixed-size blocks (see `features`).
    pub prefix_hashes: Vec<u64>,
    /// Hash of the session key (`x-session-id` header, else the body's `user`), if any.
    pub session_key: Option<u64>,
    /// Length of the canonical prompt in bytes (the policy turns it into tokens).
    pub prompt_bytes: usize,
    /// Most tokens the answer may take (`max_tokens`): KV the request will add.
    pub max_output_tokens: u32,
    /// The prefix's home in the fleet's shared directory (a worker key), when the pool shares
    /// one (see `directory`); set by the route phase, not by validation.
    pub home: Option<u64>,
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
    /// `in_flight` when `waiting` and `running` were polled: the engine's count beyond it was
    /// other gateways' traffic then.
    pub polled_in_flight: u32,
    /// Engine-reported KV-cache usage, 0..=1 (polled).
    pub kv_usage: f64,
    /// Prompt tokens this gateway routed here whose prefill has not produced a first token yet
    /// (always fresh, counted at pick time).
    pub pending_prefill: u64,
    /// The worker's KV capacity in tokens (`num_gpu_blocks × block_size`), when it reports one.
    pub kv_capacity: Option<u64>,
    /// Tokens of that capacity kept for reused blocks (our engine's segmented LRU); `None` for
    /// plain LRU engines.
    pub kv_protected: Option<u64>,
}

/// Most requests a polled count may stand for in routing. The poller already rejects larger
/// numbers; the view clamps again so that no input makes a cost infinite or NaN.
pub const MAX_POLLED_REQUESTS: f64 = 1e6;

/// A polled count as routing believes it: within `0..=MAX_POLLED_REQUESTS`; NaN counts as the
/// ceiling (a worker that reports nonsense looks busy, not idle).
fn polled_count(x: f64) -> f64 {
    if x.is_nan() {
        MAX_POLLED_REQUESTS
    } else {
        x.clamp(0.0, MAX_POLLED_REQUESTS)
    }
}

impl WorkerView {
    /// Load in requests: the fresh local count plus what the last poll showed beyond this
    /// gateway's own requests then (other replicas' traffic). A plain maximum of the two counts
    /// would keep requests that ended since the poll. Finite for any polled values (see
    /// [`MAX_POLLED_REQUESTS`]).
    pub fn load(&self) -> f64 {
        let others = (self.polled_load() - f64::from(self.polled_in_flight)).max(0.0);
        f64::from(self.in_flight) + others
    }

    /// The engine's own count of requests (waiting + running) at the last poll: the load every
    /// gateway replica sees alike, up to poll timing. Finite, as [`WorkerView::load`].
    pub fn polled_load(&self) -> f64 {
        polled_count(self.waiting) + polled_count(self.running)
    }

    /// KV-cache usage within `0..=1`; NaN counts as full.
    pub fn kv_fill(&self) -> f64 {
        if self.kv_usage.is_nan() {
            1.0
        } else {
            self.kv_usage.clamp(0.0, 1.0)
        }
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
    /// The cheapest worker holds the longest indexed prefix.
    PrefixHit,
    /// No worker holds the prefix; the first cheap worker in its hash order took it.
    PrefixHome,
    /// A worker holding a longer prefix lost on cost; see [`LossReason`].
    LoadSpill,
}

impl RouteReason {
    /// Every reason, each at the index of its discriminant (per-reason tables are this long).
    pub const ALL: [RouteReason; 6] = [
        RouteReason::RoundRobin,
        RouteReason::LeastLoad,
        RouteReason::Session,
        RouteReason::PrefixHit,
        RouteReason::PrefixHome,
        RouteReason::LoadSpill,
    ];

    /// Metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteReason::RoundRobin => "round_robin",
            RouteReason::LeastLoad => "least_load",
            RouteReason::Session => "session",
            RouteReason::PrefixHit => "prefix_hit",
            RouteReason::PrefixHome => "prefix_home",
            RouteReason::LoadSpill => "load_spill",
        }
    }
}

/// Why the worker holding the longest prefix was not chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LossReason {
    /// Its queue and load cost more than the cache saves.
    Queue,
    /// The request's new KV would not fit its free KV.
    Fit,
    /// It is ejected (or was already tried for this request).
    Health,
}

impl LossReason {
    /// Metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            LossReason::Queue => "queue",
            LossReason::Fit => "fit",
            LossReason::Health => "health",
        }
    }
}

/// A routing choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// Index into the worker slice given to `select`.
    pub index: usize,
    /// Why.
    pub reason: RouteReason,
    /// Prompt tokens the policy expects the chosen worker to have cached.
    pub predicted_cached: u64,
    /// Uncached prompt tokens the chosen worker must prefill (counted as its pending prefill).
    pub prefill: u64,
    /// Set when a worker holding a longer prefix lost, with why.
    pub lost: Option<LossReason>,
    /// Most prompt tokens the policy believed cached on any healthy worker (the best it could
    /// have predicted); at least `predicted_cached`.
    pub available_cached: u64,
}

/// Response header naming a pick's cached-token account (with `debug_headers`):
/// `predicted=P,available=A`, as [`Decision::route_cached_value`] writes it.
pub const ROUTE_CACHED_HEADER: &str = "x-infergate-route-cached";

impl Decision {
    /// The [`ROUTE_CACHED_HEADER`] value: cached prompt tokens routing expected on the chosen
    /// worker, and the most it knew of on any healthy worker.
    pub fn route_cached_value(&self) -> String {
        format!(
            "predicted={},available={}",
            self.predicted_cached, self.available_cached
        )
    }

    /// A choice that knows nothing of caches: the whole prompt is prefill.
    pub fn plain(index: usize, reason: RouteReason, req: &RequestFeatures) -> Self {
        Self {
            index,
            reason,
            predicted_cached: 0,
            prefill: features::estimate_tokens(req.prompt_bytes),
            lost: None,
            available_cached: 0,
        }
    }
}

/// What a worker's answer said about its cache, for [`RoutingPolicy::feedback`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feedback {
    /// Cached tokens the policy predicted at selection.
    pub predicted_cached: u64,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`; `None` when the worker does not report it.
    pub cached_tokens: Option<u64>,
}

/// What a worker's KV event stream said about the prefix keys it holds (precise mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency<'a> {
    /// Every key resident now (a new subscription); guesses it lacks stay until refuted.
    Snapshot(&'a [u64]),
    /// Keys that became resident.
    Stored(&'a [u64]),
    /// Keys that are no longer resident.
    Removed(&'a [u64]),
    /// The stream ended: what is known stays, but is a guess again from now on.
    Lost,
}

/// A routing policy. `select` has no effect beyond choosing (round-robin's turn counter aside);
/// what the policy learns it learns in `observe` (the choice) and `feedback` (the answer).
pub trait RoutingPolicy: Send + Sync {
    /// Picks a healthy worker, or `None` when none is healthy.
    fn select(&self, req: &RequestFeatures, workers: &[WorkerView]) -> Option<Decision>;
    /// Records that `req` was sent to `worker`.
    fn observe(&self, _req: &RequestFeatures, _worker: &WorkerView) {}
    /// Learns from the usage the worker with key `worker_key` reported for `req`.
    fn feedback(&self, _req: &RequestFeatures, _worker_key: u64, _fb: Feedback) {}
    /// Forgets what it learned about a worker (restarted, re-admitted or removed).
    fn forget(&self, _worker_key: u64) {}
    /// Applies a worker's KV events (precise mode). Cache-oblivious policies ignore them.
    fn residency(&self, _worker_key: u64, _update: Residency<'_>) {}
    /// True when, by what the policy learned, a healthy worker of `workers` already holds a
    /// usable prefix of a request with `prefix_hashes` (fair share's locality: such a request
    /// may go a little out of turn). Always false for cache-oblivious policies.
    fn holds_prefix(&self, _prefix_hashes: &[u64], _workers: &[WorkerView]) -> bool {
        false
    }
    /// Per worker: (key, prefix blocks indexed), for metrics. Empty for cache-oblivious policies.
    fn index_sizes(&self) -> Vec<(u64, usize)> {
        Vec::new()
    }
    /// True when the policy homes prefixes by what every replica sees alike instead of the
    /// workers' KV events (some healthy worker streams none): the pools a fleet's shared
    /// directory of homes serves (see `directory`). Always false for cache-oblivious policies.
    fn homes_prefixes_approximately(&self, _workers: &[WorkerView]) -> bool {
        false
    }
    /// Keys of the workers a shared directory may make the new home of a prefix of `req`: the
    /// healthy workers within the load bound, in its hash order (see `cold_home::candidates`),
    /// and of those the ones whose cache has room for it, when any has. Empty for
    /// cache-oblivious policies.
    fn home_candidates(&self, _req: &RequestFeatures, _workers: &[WorkerView]) -> Vec<u64> {
        Vec::new()
    }
    /// Keys of the healthy workers whose cache has room for one more homed prefix of
    /// `prompt_bytes` (graceful overflow: a directory moves a prefix only to one of these).
    /// Empty for cache-oblivious policies.
    fn room_for_prefix(&self, _workers: &[WorkerView], _prompt_bytes: usize) -> Vec<u64> {
        Vec::new()
    }
}

impl PolicyConfig {
    /// Every policy with its default settings, in the order the docs list them.
    pub fn defaults() -> [PolicyConfig; 4] {
        [
            PolicyConfig::Prefix(PrefixConfig::default()),
            PolicyConfig::RoundRobin,
            PolicyConfig::LeastLoad,
            PolicyConfig::Session,
        ]
    }

    /// The policy's name, as `policies/routing.yaml` and `infergate sim --policy` write it.
    pub fn name(&self) -> &'static str {
        match self {
            PolicyConfig::RoundRobin => "round_robin",
            PolicyConfig::LeastLoad => "least_load",
            PolicyConfig::Session => "session",
            PolicyConfig::Prefix(_) => "prefix",
        }
    }
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
    /// Cache-aware: lowest expected cost in prompt tokens of work.
    Prefix(PrefixConfig),
}

/// Settings of the `prefix` policy. The defaults need no tuning.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrefixConfig {
    /// How much busier than its least loaded peer a worker holding the whole prefix may be and
    /// still win, as a share of the pool's mean load (plus 2 requests), doubled by the uncached
    /// prompt's double weight, and doubled again for a prefix its holders serve within their
    /// share of the traffic (see `prefix`). Without KV events it also bounds a new prefix's
    /// home: a worker whose polled load is above `(1 + this) × the mean + 4` is skipped (see
    /// `cold_home`). Default 0.25.
    pub balance_tolerance: f64,
    /// Fewest matching blocks that count as a hit. Default 1.
    pub min_match_blocks: usize,
    /// KV capacity in tokens assumed for workers that do not export `vllm:cache_config_info`.
    /// Default 262,144; answers' cached-token counts correct it per worker.
    pub default_worker_kv_tokens: u64,
    /// Most index entries (prefix blocks and the anonymous KV entries of routed requests) kept
    /// per worker, whatever KV capacity the worker claims: bounds the index's memory (about
    /// 200 bytes an entry). Default 262,144 (≈ 16M tokens of prompt in 256-byte blocks).
    pub max_index_blocks_per_worker: usize,
    /// Removed in routing v2 (see `config::routing_file` for the message); rejected when set.
    pub load_factor: Option<serde::de::IgnoredAny>,
    /// Removed in routing v2; rejected when set.
    pub max_kv_usage: Option<serde::de::IgnoredAny>,
    /// Removed in routing v2; rejected when set.
    pub max_waiting: Option<serde::de::IgnoredAny>,
    /// Removed in routing v2; rejected when set.
    pub index_capacity: Option<serde::de::IgnoredAny>,
}

impl Default for PrefixConfig {
    fn default() -> Self {
        Self {
            balance_tolerance: 0.25,
            min_match_blocks: 1,
            default_worker_kv_tokens: prefix_index::DEFAULT_WORKER_TOKENS,
            max_index_blocks_per_worker: prefix_index::DEFAULT_MAX_BLOCKS_PER_WORKER,
            load_factor: None,
            max_kv_usage: None,
            max_waiting: None,
            index_capacity: None,
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
    fn every_route_reason_sits_at_its_own_index() {
        for (i, r) in RouteReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{}", r.as_str());
        }
    }

    #[test]
    fn load_is_fresh_local_count_plus_others_polled_share() {
        let mut w = testkit::worker(0);
        // Polled with 10 in the engine while this gateway had 8 there: 2 were another replica's.
        (w.running, w.waiting, w.polled_in_flight) = (7.0, 3.0, 8);
        // Since then 5 of ours ended: the stale engine count must not hide that.
        w.in_flight = 3;
        assert_eq!(w.load(), 5.0);
        // The engine lagging behind our own count is no one else's traffic.
        (w.running, w.waiting) = (2.0, 0.0);
        assert_eq!(w.load(), 3.0);
    }

    #[test]
    fn config_parses_and_builds_every_policy() {
        let cases = [
            (r#"{"policy":"round_robin"}"#, RouteReason::RoundRobin),
            (r#"{"policy":"least_load"}"#, RouteReason::LeastLoad),
            (r#"{"policy":"session"}"#, RouteReason::LeastLoad),
            (
                r#"{"policy":"prefix","balance_tolerance":0.5}"#,
                RouteReason::LeastLoad,
            ),
        ];
        let workers = testkit::workers(3);
        for (json, reason) in cases {
            let cfg: PolicyConfig = serde_json::from_str(json).expect(json);
            let d = build(&cfg).select(&RequestFeatures::default(), &workers);
            assert_eq!(d.map(|d| d.reason), Some(reason), "{json}");
        }
        let cfg: PolicyConfig =
            serde_json::from_str(r#"{"policy":"prefix","balance_tolerance":0.5}"#)
                .expect("valid prefix config");
        let expect = PrefixConfig {
            balance_tolerance: 0.5,
            ..PrefixConfig::default()
        };
        assert_eq!(cfg, PolicyConfig::Prefix(expect));
        assert!(serde_json::from_str::<PolicyConfig>(r#"{"policy":"prefix","x":1}"#).is_err());
        assert!(serde_json::from_str::<PolicyConfig>(r#"{"policy":"random"}"#).is_err());
    }
}
