//! A model of the routing bench's "four gateway replicas (KV room)" scenario on virtual time, to
//! measure the `prefix` policy's spread, copies and replica agreement over many draws of the
//! worker keys (the bench's workers get ephemeral ports, so each bench run is one such draw).
//!
//! Open-loop Poisson arrivals at 20 requests/s for 20 s, 16 groups with Zipf (1/k) popularity,
//! each with its own system prompt; requests alternate over the replicas. A request runs
//! [`SERVICE_S`] on its worker, its prefill the first [`PREFILL_S`]. Each replica polls every
//! worker's engine count every [`POLL_S`] at its own phase, and sees its own requests in flight
//! and pending prefill fresh. KV room: caches hold everything, so every (group, worker) pair used
//! costs one cold prefill of the system prompt, and nothing more (about 0.26 points of the bench's
//! hit rate each). The spreading rules tried for issue 46 and their figures in this model and
//! the bench are in BENCHMARKS.md (routing, four replicas).

use std::collections::{HashMap, HashSet};

use super::cold_home::load_bound;
use super::directory::Directory;
use super::features::{
    DEFAULT_BLOCK_BYTES, DEFAULT_MAX_BLOCKS, canonical_chat, prefix_hashes, session_hash,
};
use super::hash_ring;
use super::prefix::CacheAware;
use super::testkit::SplitMix64;
use super::{PrefixConfig, RequestFeatures, RoutingPolicy, WorkerView};

/// Seconds a request runs (prefill and 16 tokens of answer on a sim H100).
const SERVICE_S: f64 = 0.15;
/// Seconds of a request's prefill, while its prompt counts as pending.
const PREFILL_S: f64 = 0.02;
/// The gateways' poll interval.
const POLL_S: f64 = 0.25;

/// What one run of the model measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Requests each worker served.
    pub per_worker: Vec<usize>,
    /// Distinct (group, worker) pairs used beyond one per group: each cost a cold prefill.
    pub copies: usize,
    /// Workers each group used.
    pub spread_of: Vec<usize>,
    /// The bench's replica agreement: per placement, the share of the other replicas that sent
    /// the group anywhere and used that worker for it too.
    pub agreement: f64,
}

impl Outcome {
    /// Busiest worker's requests over the mean.
    pub fn max_over_mean(&self) -> f64 {
        let n = self.per_worker.len().max(1) as f64;
        let total: usize = self.per_worker.iter().sum();
        let max = self.per_worker.iter().copied().max().unwrap_or(0);
        max as f64 * n / (total.max(1) as f64)
    }
}

/// A group's 6,000-byte system prompt, distinct from its first block on.
fn system_prompt(rng: &mut SplitMix64, group: usize) -> String {
    let mut s = format!("You are the assistant of team {group}. Follow these notes.");
    while s.len() < 6_000 {
        s.push(' ');
        s.push(char::from(b'a' + rng.below(26) as u8));
        s.push(char::from(b'a' + rng.below(26) as u8));
    }
    s
}

/// The fleet's shared directory as the model keeps it (see `directory`): the state in Redis,
/// each replica's copy read back at its heartbeat, and the demand it counted since.
struct Shared {
    settings: DirectorySettings,
    redis: Directory,
    copies: Vec<Directory>,
    counted: Vec<HashMap<u64, f64>>,
    next_beat: Vec<f64>,
    last_move: f64,
}

/// How the modelled fleet shares its directory.
#[derive(Debug, Clone, Copy)]
pub struct DirectorySettings {
    /// Seconds between a replica's reports (and reads) of the directory.
    pub heartbeat: f64,
    /// Fewest seconds between two moves, fleet-wide.
    pub move_interval: f64,
    /// The busiest worker's homed demand over the mean that starts a move.
    pub tolerance: f64,
    /// Requests the fleet must have counted before any move.
    pub min_demand: f64,
}

impl DirectorySettings {
    /// What `workers::prefix_homes` does: a sync every 0.5 s, a move at most every 2 s.
    pub const LIVE: Self = Self {
        heartbeat: 0.5,
        move_interval: 2.0,
        tolerance: super::directory::MOVE_TOLERANCE,
        min_demand: super::directory::MIN_DEMAND,
    };
}

impl Shared {
    fn new(settings: DirectorySettings, replicas: usize) -> Self {
        Self {
            settings,
            redis: Directory::default(),
            copies: vec![Directory::default(); replicas],
            counted: vec![HashMap::new(); replicas],
            next_beat: (0..replicas)
                .map(|r| settings.heartbeat * r as f64 / replicas as f64)
                .collect(),
            last_move: f64::NEG_INFINITY,
        }
    }

    /// Every heartbeat due by `t`: a replica adds its counts, tries one move, reads the rest.
    fn beat(&mut self, t: f64, workers: &[u64]) {
        for r in 0..self.copies.len() {
            while self.next_beat[r] <= t {
                for (p, n) in self.counted[r].drain() {
                    *self.redis.demand.entry(p).or_insert(0.0) += n;
                }
                let s = self.settings;
                if self.next_beat[r] - self.last_move >= s.move_interval
                    && let Some(m) =
                        self.redis
                            .rebalance(workers, (s.tolerance, s.min_demand), |_, _| true)
                {
                    self.redis.homes.insert(m.prefix, m.to);
                    self.last_move = self.next_beat[r];
                }
                self.copies[r] = self.redis.clone();
                self.next_beat[r] += s.heartbeat;
            }
        }
    }

    /// The home replica `r` gives `prefix`: its copy's, else one it claims (placed on its copy,
    /// set in Redis unless another replica's claim got there first).
    fn home(&mut self, r: usize, prefix: u64, candidates: &[u64]) -> Option<u64> {
        *self.counted[r].entry(prefix).or_insert(0.0) += 1.0;
        if let Some(&h) = self.copies[r].homes.get(&prefix) {
            return Some(h);
        }
        let mine = self.copies[r].place(candidates)?;
        let home = *self.redis.homes.entry(prefix).or_insert(mine);
        self.copies[r].homes.insert(prefix, home);
        Some(home)
    }
}

/// One run: `replicas` gateways in front of `workers` workers whose keys come from `seed` (as
/// the bench's ephemeral ports do), the workload from `seed` too; with `shared`, the replicas
/// share a directory of homes.
pub fn run(
    seed: u64,
    replicas: usize,
    workers: usize,
    cfg: &PrefixConfig,
    shared: Option<DirectorySettings>,
) -> Outcome {
    let mut rng = SplitMix64(seed);
    let base: Vec<WorkerView> = (0..workers)
        .map(|i| {
            let port = 20_000 + rng.below(40_000);
            let mut w = super::testkit::worker(i);
            w.key = session_hash(&format!("http://127.0.0.1:{port}"));
            w
        })
        .collect();
    let groups = 16;
    let weights: Vec<f64> = (0..groups).map(|k| 1.0 / (k + 1) as f64).collect();
    let total_w: f64 = weights.iter().sum();
    let systems: Vec<String> = (0..groups).map(|g| system_prompt(&mut rng, g)).collect();
    let policies: Vec<CacheAware> = (0..replicas)
        .map(|_| CacheAware::new(cfg.clone()))
        .collect();
    // (start, replica, worker, prefill tokens) of every request so far.
    let mut sent: Vec<(f64, usize, usize, u64)> = Vec::new();
    // Per replica: the last poll's engine counts and its own in flight then.
    let mut polled: Vec<Vec<(f64, u32)>> = vec![vec![(0.0, 0); workers]; replicas];
    let mut next_poll: Vec<f64> = (0..replicas)
        .map(|r| POLL_S * r as f64 / replicas as f64)
        .collect();
    let live_at = |sent: &[(f64, usize, usize, u64)], t: f64, w: usize, r: Option<usize>| {
        sent.iter()
            .filter(|s| s.0 <= t && t < s.0 + SERVICE_S && s.2 == w)
            .filter(|s| r.is_none_or(|r| s.1 == r))
            .count()
    };
    let mut per_worker = vec![0usize; workers];
    let mut used: HashMap<(usize, usize), HashSet<usize>> = HashMap::new();
    let mut placements: Vec<(usize, usize, usize)> = Vec::new();
    let mut pairs: HashSet<(usize, usize)> = HashSet::new();
    let mut shared = shared.map(|s| Shared::new(s, replicas));
    let keys: Vec<u64> = base.iter().map(|w| w.key).collect();
    let mut t = 0.0;
    let mut n = 0usize;
    loop {
        t += -(1.0 - (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64).ln() / 20.0;
        if t >= 20.0 {
            break;
        }
        let mut pick = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total_w;
        let group = weights
            .iter()
            .position(|w| {
                pick -= w;
                pick < 0.0
            })
            .unwrap_or(groups - 1);
        let r = n % replicas;
        n += 1;
        for (rep, due) in next_poll.iter_mut().enumerate() {
            while *due <= t {
                for (w, p) in polled[rep].iter_mut().enumerate() {
                    *p = (
                        live_at(&sent, *due, w, None) as f64,
                        live_at(&sent, *due, w, Some(rep)) as u32,
                    );
                }
                *due += POLL_S;
            }
        }
        let mut ws = base.clone();
        for (w, v) in ws.iter_mut().enumerate() {
            v.running = polled[r][w].0;
            v.polled_in_flight = polled[r][w].1;
            v.in_flight = live_at(&sent, t, w, Some(r)) as u32;
            v.pending_prefill = sent
                .iter()
                .filter(|s| s.1 == r && s.2 == w && s.0 <= t && t < s.0 + PREFILL_S)
                .map(|s| s.3)
                .sum();
        }
        let bytes = canonical_chat(&[
            ("system", &systems[group]),
            (
                "user",
                &format!("Session {}, turn {n}: a question?", rng.below(32)),
            ),
        ]);
        let mut req = RequestFeatures {
            prefix_hashes: prefix_hashes(&bytes, DEFAULT_BLOCK_BYTES, DEFAULT_MAX_BLOCKS),
            session_key: None,
            prompt_bytes: bytes.len(),
            max_output_tokens: 16,
            home: None,
        };
        if let Some(sh) = shared.as_mut() {
            sh.beat(t, &keys);
            let key = req.prefix_hashes[0];
            let bound = load_bound(&ws, cfg.balance_tolerance);
            let order = hash_ring::candidates(key, &ws, ws.len());
            let candidates: Vec<u64> = order
                .iter()
                .filter(|&&i| ws[i].healthy && ws[i].polled_load() <= bound)
                .map(|&i| ws[i].key)
                .collect();
            req.home = sh.home(r, key, &candidates);
        }
        let Some(d) = policies[r].select(&req, &ws) else {
            continue;
        };
        policies[r].observe(&req, &ws[d.index]);
        per_worker[d.index] += 1;

        pairs.insert((group, d.index));
        used.entry((r, group)).or_default().insert(d.index);
        placements.push((r, group, d.index));
        sent.retain(|s| s.0 + SERVICE_S > t);
        sent.push((t, r, d.index, d.prefill));
    }
    let (mut agree, mut all) = (0.0, 0usize);
    for &(r, g, w) in &placements {
        let others: Vec<&HashSet<usize>> = (0..replicas)
            .filter(|&o| o != r)
            .filter_map(|o| used.get(&(o, g)))
            .collect();
        if others.is_empty() {
            continue;
        }
        all += 1;
        agree += others.iter().filter(|s| s.contains(&w)).count() as f64 / others.len() as f64;
    }
    let spread_of = (0..groups)
        .map(|g| pairs.iter().filter(|p| p.0 == g).count())
        .collect();
    Outcome {
        spread_of,
        per_worker,
        copies: pairs.len() - pairs.iter().map(|p| p.0).collect::<HashSet<_>>().len(),
        agreement: if all == 0 { 1.0 } else { agree / all as f64 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (median max/mean, mean copies, mean agreement) over `draws` draws of the worker keys.
    fn summary(draws: u64, shared: Option<DirectorySettings>) -> (f64, f64, f64, Vec<Outcome>) {
        let cfg = PrefixConfig::default();
        let runs: Vec<Outcome> = (0..draws)
            .map(|s| run(1_000 + s, 4, 4, &cfg, shared))
            .collect();
        let mut mm: Vec<f64> = runs.iter().map(Outcome::max_over_mean).collect();
        mm.sort_by(f64::total_cmp);
        let n = runs.len() as f64;
        let copies = runs.iter().map(|o| o.copies as f64).sum::<f64>() / n;
        let agree = runs.iter().map(|o| o.agreement).sum::<f64>() / n;
        (mm[mm.len() / 2], copies, agree, runs)
    }

    /// Four replicas in approximate mode home every group alike (rendezvous homes bounded by
    /// polled loads, see `cold_home`), so each group sits on one worker: 40 draws measured
    /// agreement 99.3% (min 92.0%), 0.3 extra (group, worker) pairs a run, and the hash's
    /// spread (median max/mean 1.93, p90 2.35; `report_four_replicas`).
    #[test]
    fn four_replicas_home_each_group_once_and_agree() {
        let (_, copies, agree, _) = summary(12, None);
        assert!(
            copies <= 1.0,
            "{copies:.2} extra (group, worker) pairs per run"
        );
        assert!(agree >= 0.97, "agreement {agree:.3}");
    }

    /// Sharing a directory of homes (see `directory`), new prefixes are placed by the fleet's
    /// demand and the busiest worker gives one up while it holds clearly more than its share:
    /// 40 draws measured median max/mean 1.25 (p90 1.37) against 1.93 computed alike, at 2.0
    /// extra (group, worker) pairs a run and 99.2% agreement (`report_four_replicas`).
    #[test]
    fn four_replicas_sharing_a_directory_spread_hot_prefixes_and_agree() {
        let (median, copies, agree, _) = summary(12, Some(DirectorySettings::LIVE));
        let (alike, _, _, _) = summary(12, None);
        assert!(median <= 1.35, "max/mean median {median:.2}");
        assert!(median < alike - 0.3, "{median:.2} against {alike:.2}");
        assert!(copies <= 3.0, "{copies:.2} extra pairs per run");
        assert!(agree >= 0.97, "agreement {agree:.3}");
    }

    #[test]
    #[ignore = "a report, not a check: cargo test --lib replica_model -- --ignored --nocapture"]
    fn report_four_replicas() {
        report(None);
        report(Some(DirectorySettings::LIVE));
    }

    fn report(shared: Option<DirectorySettings>) {
        eprintln!("{shared:?}");
        let (median, copies, agree, runs) = summary(40, shared);
        let mut mm: Vec<f64> = runs.iter().map(Outcome::max_over_mean).collect();
        mm.sort_by(f64::total_cmp);
        let min_agree = runs.iter().map(|o| o.agreement).fold(1.0, f64::min);
        eprintln!(
            "max/mean median {median:.2} p90 {:.2} max {:.2}; copies mean {copies:.2}; \
             agreement mean {:.1}% min {:.1}%",
            mm[mm.len() * 9 / 10],
            mm[mm.len() - 1],
            100.0 * agree,
            100.0 * min_agree
        );
        let by_group: Vec<usize> = (0..16)
            .map(|g| runs.iter().map(|o| o.spread_of[g].saturating_sub(1)).sum())
            .collect();
        eprintln!("copies by group over the runs: {by_group:?}");
        for o in runs.iter().take(8) {
            eprintln!(
                "{:?} copies {} agree {:.3}",
                o.per_worker, o.copies, o.agreement
            );
        }
    }
}
