//! `prefix`: cache-aware routing by one expected cost, in prompt tokens of work.
//!
//! For each healthy worker *i*, with `P` the prompt's tokens and `H_i` the prefix the index says
//! *i* holds:
//!
//! ```text
//! cost_i = Q_i + 2·(P − H_i) + λ·(L_i − L_min) + deficit_i
//! λ      = P / ((balance_tolerance · L_mean + 2) · keep)
//! keep   = 2 − min(1, demand / holders)
//! ```
//!
//! - `Q_i`: prompt tokens this gateway routed to *i* whose prefill has not started producing
//!   tokens (counted at pick time, so a burst inside one poll interval sees its own picks).
//! - `P − H_i`: the prefill this request costs there, counted twice: once as its own wait, once
//!   as the work it adds to a worker whose other requests wait behind it (a hit adds none).
//! - `L_i − L_min`: its load in requests above the least loaded peer (this gateway's in-flight
//!   count plus other replicas' share of the last poll). Load only counts *relative* to the pool,
//!   so when every worker is equally saturated the prefix holder still wins; absolute saturation
//!   is the admission stage's business.
//! - `keep`: `demand` is the prefix's recent share of the requests (see `demand`) times the
//!   healthy workers, i.e. how many workers' worth of traffic it has; `holders` is how many
//!   healthy workers hold its longest indexed run. A prefix its holders serve within their share
//!   (`keep` up to 2) rides out load swings that a closed loop of clients makes on any worker; one
//!   that needs more workers than hold it (`keep` 1) spills at the tolerance: a whole-prefix hit is
//!   then worth `2 × (balance_tolerance × mean load + 2)` requests of imbalance.
//! - `deficit_i`: how many tokens of this request's new KV (uncached prompt and answer) would not
//!   fit the worker's free KV, so would be preempted or evicted and recomputed.
//!
//! Costs within one request of load (λ) of the cheapest count as equal, and among those the
//! request's rendezvous-hash order decides (keyed by its first block, else its session, else a
//! per-request counter, so keyless requests spread at random). So a cold prefix goes to its hash
//! home among the cheap workers and every gateway replica makes the same choice; a hot prefix
//! whose holders get too busy spills to the next cheap worker in its hash order, which then holds
//! it too (a stable replica set that grows with demand), and when demand falls the home wins
//! every tie again and the set shrinks. A holder only keeps a request its hash order would give
//! elsewhere while it is clearly (more than λ) cheaper, so two replicas whose indexes diverged
//! (one spilled where the other did not) drift back to the same hash-ordered set.
//!
//! A cold prefix's home, when every healthy worker streams its KV events (precise mode), is the
//! first worker in its hash order among the cheap ones that, holding this prompt too, would not
//! be clearly fuller than the pool's mean (bounded-load consistent hashing, in tokens of cache as
//! the index sees it, the same in every replica): new prefixes start spread, instead of piling
//! onto one worker by chance and needing spills to even out. Otherwise (approximate mode) each
//! replica's index, in-flight counts and pending prefill are its own, so the home is built from
//! what every replica sees alike instead: the first worker in the hash order whose *polled* load
//! is within the tolerance of the pool's (see `cold_home`), so replicas agree by construction.
//!
//! Behind several replicas that share a directory of homes (`state.redis.prefix_homes`, see
//! `directory`), approximate mode takes the directory's home for the request's prefix
//! (`RequestFeatures::home`) while that worker is healthy and within the load bound of a new
//! prefix's home: the fleet places prefixes by their summed demand, and every replica follows a
//! move at once.
//!
//! Graceful overflow, in both modes: a new prefix's home must also have room for it, i.e. the
//! prefixes already homed there (the index counts each while its leading block is held) plus
//! this one fit in [`WARM_SHARE`] of the worker's cache. While every cache has room this changes
//! nothing. When the prefixes in play outgrow a hash home, the next worker in the order with room
//! takes the new one instead of the home evicting a warm prefix for it, so each worker's set
//! stays stable. When no cache has room, the hash order alone decides, which keeps each worker's
//! set of prefixes fixed (its cache then keeps the most popular of them).

use std::sync::atomic::{AtomicU64, Ordering};

use super::cold_home;
use super::demand::Demand;
use super::features::{DEFAULT_BLOCK_BYTES, DEFAULT_BYTES_PER_TOKEN};
use super::hash_ring;
use super::prefix_index::{Placement, PrefixIndex};
use super::{
    Decision, Feedback, LossReason, PrefixConfig, RequestFeatures, Residency, RouteReason,
    RoutingPolicy, WorkerView,
};

/// Requests of load a whole-prefix hit outweighs on an idle pool.
const MIN_SLACK: f64 = 2.0;
/// Costs within this many requests of load (× λ) of the cheapest are near-equal.
const BAND_REQUESTS: f64 = 1.0;
/// How far above the pool's mean cache fill a worker may be and still be a new prefix's home.
const COLD_FILL_SLACK: f64 = 0.25;
/// Share of a worker's KV that the prefixes homed there may claim and still take a new one: the
/// rest holds the requests' own KV (their user turns and answers) and what is running.
const WARM_SHARE: f64 = 0.8;
/// Weight of a new answer in the learned bytes-per-token average.
const BPT_ALPHA: f64 = 0.05;

/// The cache-aware policy: a per-worker prefix index plus the learned bytes per token.
#[derive(Debug)]
pub struct CacheAware {
    cfg: PrefixConfig,
    index: PrefixIndex,
    /// Each prefix's recent share of the requests, keyed by its first block.
    demand: Demand,
    /// f64 bits: bytes of canonical prompt per prompt token, learned from answers' usage.
    bytes_per_token: AtomicU64,
    /// Tie-break keys for requests with neither prefix blocks nor a session.
    turn: AtomicU64,
}

/// One worker's terms of the cost.
#[derive(Debug, Clone, Copy)]
struct Scored {
    index: usize,
    run: usize,
    hit: f64,
    queue: f64,
    fit: f64,
    cost: f64,
}

/// The request-side quantities shared by every worker's cost.
struct Sizes {
    prompt: f64,
    block_tokens: f64,
}

impl CacheAware {
    /// A policy with an empty index.
    pub fn new(cfg: PrefixConfig) -> Self {
        let index = PrefixIndex::new(cfg.default_worker_kv_tokens)
            .with_max_blocks(cfg.max_index_blocks_per_worker);
        Self {
            cfg,
            index,
            demand: Demand::default(),
            bytes_per_token: AtomicU64::new(DEFAULT_BYTES_PER_TOKEN.to_bits()),
            turn: AtomicU64::new(0),
        }
    }

    /// The prefix index (read-only use: sizes, matches).
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    /// Bytes of canonical prompt per token, as learned so far.
    pub fn bytes_per_token(&self) -> f64 {
        f64::from_bits(self.bytes_per_token.load(Ordering::Relaxed))
    }

    fn sizes(&self, req: &RequestFeatures) -> Sizes {
        let bpt = self.bytes_per_token();
        Sizes {
            prompt: (req.prompt_bytes as f64 / bpt).max(1.0),
            block_tokens: DEFAULT_BLOCK_BYTES as f64 / bpt,
        }
    }

    /// True when every healthy worker streams its KV events, so every replica's index agrees.
    fn all_precise(&self, workers: &[WorkerView]) -> bool {
        workers
            .iter()
            .filter(|w| w.healthy)
            .all(|w| self.index.is_precise(w.key))
    }

    /// Indices of the healthy workers that may become a new prefix's home in precise mode: those
    /// that, holding `prompt` more tokens, would be within [`COLD_FILL_SLACK`] of the pool's mean
    /// fill (tokens held over capacity, as the index sees it), and those within half this prompt
    /// of the least filled, so someone always qualifies (bounded-load consistent hashing, in
    /// tokens).
    fn roomy_workers(&self, workers: &[WorkerView], prompt: f64) -> Vec<usize> {
        let sizes = self.index.sizes();
        // (index, fill, this prompt's share of the capacity) of each healthy worker.
        let healthy: Vec<(usize, f64, f64)> = workers
            .iter()
            .enumerate()
            .filter(|(_, w)| w.healthy)
            .map(|(i, w)| {
                let (used, cap) = sizes
                    .iter()
                    .find(|s| s.0 == w.key)
                    .map_or((0, self.cfg.default_worker_kv_tokens), |s| (s.2, s.3));
                let cap = cap.max(1) as f64;
                (i, used as f64 / cap, prompt / cap)
            })
            .collect();
        let n = healthy.len() as f64;
        let mean = healthy.iter().map(|h| h.1).sum::<f64>() / n;
        let least = healthy.iter().map(|h| h.1).fold(f64::INFINITY, f64::min);
        // Fed by every worker's KV events, all replicas see the same fills and may balance
        // tightly.
        healthy
            .iter()
            .filter(|&&(_, fill, share)| {
                fill <= least + share / 2.0
                    || fill + share <= (1.0 + COLD_FILL_SLACK) * (mean + share / n)
            })
            .map(|h| h.0)
            .collect()
    }

    /// Keys of the healthy workers that may take a new prefix of `prompt` tokens without evicting
    /// a prefix homed there (graceful overflow): those whose homed prefixes plus this one fit in
    /// [`WARM_SHARE`] of their cache. Empty when none has that room: the pool is then
    /// overflowing everywhere, and the hash order keeps each worker's set of prefixes stable
    /// (moving cold prefixes to whichever cache claims the least mixes every prefix into every
    /// cache, and measured 4 points fewer hits at ~2.7 prompts per cache).
    fn room_for(&self, workers: &[WorkerView], prompt: f64) -> Vec<u64> {
        let homed = self.index.homed();
        workers
            .iter()
            .filter(|w| w.healthy)
            .filter(|w| {
                let (tokens, cap) = homed
                    .iter()
                    .find(|h| h.0 == w.key)
                    .map_or((0, self.cfg.default_worker_kv_tokens), |h| (h.1, h.2));
                tokens as f64 + prompt <= WARM_SHARE * cap as f64
            })
            .map(|w| w.key)
            .collect()
    }

    /// The key whose rendezvous order breaks ties, and the reason a cold choice gets.
    fn tie_key(&self, req: &RequestFeatures) -> (u64, RouteReason) {
        match (req.prefix_hashes.first(), req.session_key) {
            (Some(&first), _) => (first, RouteReason::PrefixHome),
            (None, Some(session)) => (session, RouteReason::Session),
            (None, None) => {
                let n = self.turn.fetch_add(1, Ordering::Relaxed);
                (hash_ring::mix(n), RouteReason::LeastLoad)
            }
        }
    }
}

impl RoutingPolicy for CacheAware {
    fn homes_prefixes_approximately(&self, workers: &[WorkerView]) -> bool {
        !self.all_precise(workers)
    }

    fn home_candidates(&self, req: &RequestFeatures, workers: &[WorkerView]) -> Vec<u64> {
        let Some(&key) = req.prefix_hashes.first() else {
            return Vec::new();
        };
        let light = cold_home::candidates(key, workers, self.cfg.balance_tolerance);
        let room = self.room_for(workers, self.sizes(req).prompt);
        let roomy: Vec<u64> = light.iter().filter(|k| room.contains(k)).copied().collect();
        if roomy.is_empty() { light } else { roomy }
    }

    fn room_for_prefix(&self, workers: &[WorkerView], prompt_bytes: usize) -> Vec<u64> {
        let req = RequestFeatures {
            prompt_bytes,
            ..RequestFeatures::default()
        };
        self.room_for(workers, self.sizes(&req).prompt)
    }

    fn holds_prefix(&self, prefix_hashes: &[u64], workers: &[WorkerView]) -> bool {
        let min_run = self.cfg.min_match_blocks.max(1);
        self.index
            .matches(prefix_hashes)
            .iter()
            .any(|&(key, run)| run >= min_run && workers.iter().any(|w| w.healthy && w.key == key))
    }

    fn select(&self, req: &RequestFeatures, workers: &[WorkerView]) -> Option<Decision> {
        let (healthy, total, min_load) = workers
            .iter()
            .filter(|w| w.healthy)
            .fold((0usize, 0.0, f64::INFINITY), |(n, sum, min), w| {
                (n + 1, sum + w.load(), min.min(w.load()))
            });
        if healthy == 0 {
            return None;
        }
        let sizes = self.sizes(req);
        let min_run = self.cfg.min_match_blocks.max(1);
        let matches = self.index.matches(&req.prefix_hashes);
        // A run shorter than the minimum is no hit.
        let run_of = |key: u64| match matches.iter().find(|&&(k, _)| k == key) {
            Some(&(_, run)) if run >= min_run => run,
            _ => 0,
        };
        // The longest hit anywhere (an ejected holder counts, for the loss reason), and how
        // many healthy workers hold it.
        let best_run = matches
            .iter()
            .map(|&(_, run)| run)
            .filter(|&run| run >= min_run)
            .max()
            .unwrap_or(0);
        let holders = workers
            .iter()
            .filter(|w| w.healthy && best_run > 0 && run_of(w.key) == best_run)
            .count();
        let slack = self.cfg.balance_tolerance * total / healthy as f64 + MIN_SLACK;
        // A prefix whose recent demand its holders serve within their share keeps them through
        // load swings up to twice the tolerance; one that needs more workers than hold it spills
        // at the tolerance itself.
        let needed = req
            .prefix_hashes
            .first()
            .map_or(0.0, |&k| self.demand.share(k))
            * healthy as f64;
        let keep = if holders > 0 {
            2.0 - (needed / holders as f64).min(1.0)
        } else {
            1.0
        };
        let lambda = sizes.prompt / (slack * keep);
        let output = f64::from(req.max_output_tokens);
        let scored: Vec<Scored> = workers
            .iter()
            .enumerate()
            .filter(|(_, w)| w.healthy)
            .map(|(index, w)| {
                let run = run_of(w.key);
                let hit = (run as f64 * sizes.block_tokens).min(sizes.prompt);
                let miss = sizes.prompt - hit;
                let queue = w.pending_prefill as f64 + lambda * (w.load() - min_load);
                let fit = w.kv_capacity.map_or(0.0, |cap| {
                    let free = (1.0 - w.kv_fill()) * cap as f64;
                    (miss + output - free).max(0.0)
                });
                Scored {
                    index,
                    run,
                    hit,
                    queue,
                    fit,
                    cost: queue + 2.0 * miss + fit,
                }
            })
            .collect();
        // Every term is finite whatever a worker reported (the view clamps polled values), so
        // the band below always holds the cheapest worker.
        debug_assert!(scored.iter().all(|s| s.cost.is_finite()), "{scored:?}");
        let best_cost = scored.iter().map(|s| s.cost).fold(f64::INFINITY, f64::min);
        // Where no healthy worker holds the prefix, the prompt costs the same everywhere and only
        // load differs: the hash home keeps it within the whole tolerance, so every replica seeds
        // it on the same worker.
        let cold = scored.iter().all(|s| s.run == 0);
        let band = best_cost + lambda * if cold { slack } else { BAND_REQUESTS };
        let (key, cold_reason) = self.tie_key(req);
        let new_prefix = cold && !req.prefix_hashes.is_empty();
        // Where the new prefix fits without evicting one homed elsewhere (graceful overflow).
        let room = if new_prefix {
            self.room_for(workers, sizes.prompt)
        } else {
            Vec::new()
        };
        let approximate = !req.prefix_hashes.is_empty() && !self.all_precise(workers);
        // The fleet's shared directory names this prefix's home (approximate mode behind
        // several replicas, see `directory`): it wins while healthy and within the load bound
        // of a new prefix's home, so every replica follows a claim or a move alike.
        let directed = req.home.filter(|_| approximate).and_then(|home| {
            let bound = cold_home::load_bound(workers, self.cfg.balance_tolerance);
            scored
                .iter()
                .find(|s| workers[s.index].key == home && workers[s.index].polled_load() <= bound)
                .copied()
        });
        let chosen = if let Some(directed) = directed {
            directed
        } else if new_prefix && approximate {
            // Approximate mode: a home every replica computes alike while the caches have room
            // (see `cold_home`); only an overflowing pool makes it follow this index's claims.
            let ask = cold_home::Ask {
                key,
                new_kv: sizes.prompt + output,
                tolerance: self.cfg.balance_tolerance,
            };
            let home = cold_home::home(ask, workers, |w| room.contains(&w.key))?;
            scored.iter().find(|s| s.index == home).copied()?
        } else {
            // A new prefix also skips workers whose cache already holds clearly more than their
            // share (bounded-load consistent hashing), so prefixes start spread and do not need
            // load spills, and the copies they make, to even out later.
            let roomy = if new_prefix {
                self.roomy_workers(workers, sizes.prompt)
            } else {
                Vec::new()
            };
            let in_band = |s: &&Scored| s.cost <= band;
            let rank = |s: &&Scored| hash_ring::score(key, workers[s.index].key);
            let has_room = |s: &&Scored| room.contains(&workers[s.index].key);
            let spread = |s: &&Scored| roomy.is_empty() || roomy.contains(&s.index);
            scored
                .iter()
                .filter(in_band)
                .filter(spread)
                .filter(has_room)
                .max_by_key(rank)
                .or_else(|| {
                    scored
                        .iter()
                        .filter(in_band)
                        .filter(spread)
                        .max_by_key(rank)
                })
                .or_else(|| scored.iter().filter(in_band).max_by_key(rank))
                .copied()?
        };
        let (reason, lost) = if best_run == 0 {
            (cold_reason, None)
        } else if chosen.run >= best_run {
            (RouteReason::PrefixHit, None)
        } else if directed.is_some() {
            // Moved by the directory, not lost to load.
            (RouteReason::PrefixHome, None)
        } else {
            let holder = scored
                .iter()
                .filter(|s| s.run == best_run)
                .min_by(|a, b| a.cost.total_cmp(&b.cost));
            let why = match holder {
                None => LossReason::Health,
                Some(h) if h.fit > h.queue => LossReason::Fit,
                Some(_) => LossReason::Queue,
            };
            (RouteReason::LoadSpill, Some(why))
        };
        Some(Decision {
            index: chosen.index,
            reason,
            predicted_cached: chosen.hit.round() as u64,
            prefill: (sizes.prompt - chosen.hit).round() as u64,
            lost,
            available_cached: scored.iter().map(|s| s.hit).fold(0.0, f64::max).round() as u64,
        })
    }

    fn observe(&self, req: &RequestFeatures, worker: &WorkerView) {
        self.demand.record(req.prefix_hashes.first().copied());
        let sizes = self.sizes(req);
        let blocks = req.prefix_hashes.len() as f64 * sizes.block_tokens;
        let tail = (sizes.prompt - blocks).max(0.0);
        self.index.record(
            worker.key,
            Placement {
                hashes: &req.prefix_hashes,
                block_tokens: sizes.block_tokens,
                extra_tokens: (tail + f64::from(req.max_output_tokens)).round() as u64,
                capacity: worker.kv_capacity,
                protected: worker.kv_protected,
            },
        );
    }

    fn feedback(&self, req: &RequestFeatures, worker_key: u64, fb: Feedback) {
        if fb.prompt_tokens > 0 && req.prompt_bytes > 0 {
            let sample = (req.prompt_bytes as f64 / fb.prompt_tokens as f64).clamp(1.0, 16.0);
            let old = self.bytes_per_token();
            let new = old + BPT_ALPHA * (sample - old);
            self.bytes_per_token.store(new.to_bits(), Ordering::Relaxed);
        }
        if let Some(actual) = fb.cached_tokens {
            let block_tokens = self.sizes(req).block_tokens;
            self.index
                .correct(worker_key, fb.predicted_cached, actual, block_tokens);
            // Exact correction for a precise worker (`refute` is a no-op for the others).
            if actual.saturating_add(2 * block_tokens as u64) <= fb.predicted_cached {
                let blocks = (actual as f64 / block_tokens.max(1.0)) as usize;
                self.index.refute(worker_key, &req.prefix_hashes, blocks);
            }
        }
    }

    fn forget(&self, worker_key: u64) {
        self.index.forget(worker_key);
    }

    fn residency(&self, worker_key: u64, update: Residency<'_>) {
        let block_tokens = DEFAULT_BLOCK_BYTES as f64 / self.bytes_per_token();
        self.index.apply(worker_key, update, block_tokens);
    }

    fn index_sizes(&self) -> Vec<(u64, usize)> {
        self.index
            .sizes()
            .into_iter()
            .map(|(key, blocks, _, _)| (key, blocks))
            .collect()
    }
}

#[cfg(test)]
#[path = "prefix_tests.rs"]
mod tests;
