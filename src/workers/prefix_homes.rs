//! Fleet mode's shared directory of prefix homes (`state.redis.prefix_homes: true`): the gateway
//! replicas of a fleet keep, in the Redis they share, which worker is each prefix's home and how
//! many requests each prefix had, so that in pools without KV events (approximate mode) they
//! place a new prefix once for the whole fleet, by popularity, and move one when a worker holds
//! clearly more than its share (the choices: `routing::directory`).
//!
//! Per request: the prefix's demand is counted in memory and its home read from this replica's
//! copy of the directory; only a prefix the copy lacks costs a round trip (one script that claims
//! it, first claim wins). Every [`SYNC`] one script per pool adds the counts, applies the move
//! this replica proposes (at most one a [`MOVE_INTERVAL`] fleet-wide, and only if the prefix is
//! still where the proposal saw it), halves the demand every [`HALF_LIFE`] (forgetting prefixes
//! no one asks for any more) and sends the directory back. Redis down or slow: no home is given
//! and routing falls back to the homes every replica computes alike (`routing::cold_home`).
//! Counts of a failed sync are dropped: demand is an estimate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::limits::SharedLimiter;
use crate::routing::directory::{Directory, MIN_DEMAND, MOVE_TOLERANCE, Move};
use crate::routing::{RequestFeatures, WorkerView};
use crate::workers::pool::PoolRuntime;

/// How often each replica sends its counts and reads the directory back.
pub const SYNC: Duration = Duration::from_millis(500);
/// Fewest time between two moves in a pool, fleet-wide: each costs a cold prefill per replica.
pub const MOVE_INTERVAL: Duration = Duration::from_secs(2);
/// Demand halves this often, so homes follow popularity as it changes.
pub const HALF_LIFE: Duration = Duration::from_secs(300);
/// Most prefixes a pool's directory holds; past it, new prefixes keep the computed homes.
pub const MAX_HOMES: usize = 2_048;
/// The directory's keys outlive the last replica's sync by this much.
const KEY_TTL: Duration = Duration::from_secs(3_600);

/// Claims a prefix's home. KEYS: homes. ARGV: prefix, proposed worker, the worker the replica
/// saw as its home but no longer healthy ('' for none), max homes, key TTL ms.
/// Returns the home (the existing one unless it is the stale one), or false when full.
const CLAIM: &str = r"
local h = redis.call('HGET', KEYS[1], ARGV[1])
if h and h ~= ARGV[3] then return h end
if not h and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then return false end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return ARGV[2]
";

/// A replica's sync. KEYS: homes, demand, meta. ARGV: key TTL ms, half-life ms, move interval
/// ms, move prefix ('' for none), move from, move to, then (prefix, count) pairs.
/// Returns {moved (0/1), homes as field, value…, demand as field, value…}.
const TEND: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl, half, gap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 7, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', KEYS[2], ARGV[i], ARGV[i + 1])
end
local decayed = tonumber(redis.call('HGET', KEYS[3], 'decayed') or '0')
if decayed == 0 then
  redis.call('HSET', KEYS[3], 'decayed', now)
elseif now - decayed >= half then
  local all = redis.call('HGETALL', KEYS[2])
  for j = 1, #all, 2 do
    local d = (tonumber(all[j + 1]) or 0) / 2
    if d < 0.25 then
      redis.call('HDEL', KEYS[2], all[j])
      redis.call('HDEL', KEYS[1], all[j])
    else
      redis.call('HSET', KEYS[2], all[j], string.format('%.3f', d))
    end
  end
  redis.call('HSET', KEYS[3], 'decayed', now)
end
local moved = 0
if ARGV[4] ~= '' then
  local last = tonumber(redis.call('HGET', KEYS[3], 'moved') or '0')
  if now - last >= gap and redis.call('HGET', KEYS[1], ARGV[4]) == ARGV[5] then
    redis.call('HSET', KEYS[1], ARGV[4], ARGV[6])
    redis.call('HSET', KEYS[3], 'moved', now)
    moved = 1
  end
end
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ttl) end
return {moved, redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2])}
";

/// One pool's copy of the directory, the demand counted since the last sync, and the prompt
/// size of each prefix this replica saw (what a move's target must have room for).
#[derive(Debug, Default)]
struct PoolCopy {
    copy: Directory,
    counted: HashMap<u64, f64>,
    prompt_bytes: HashMap<u64, usize>,
}

/// What the directory did, for `infergate_state_prefix_homes_total{event}`.
#[derive(Debug, Default)]
pub struct HomeCounters {
    /// Prefixes this replica claimed a home for (or learned one by claiming).
    pub claimed: AtomicU64,
    /// Moves this replica proposed that Redis applied.
    pub moved: AtomicU64,
    /// Syncs that Redis answered.
    pub synced: AtomicU64,
}

/// The shared directory of this replica: a copy per pool, synced through the fleet's Redis.
pub struct PrefixHomes {
    /// What it did.
    pub counters: HomeCounters,
    redis: Arc<SharedLimiter>,
    claim: redis::Script,
    tend: redis::Script,
    pools: Mutex<HashMap<String, PoolCopy>>,
}

/// A worker or prefix key as the directory writes it.
fn hex(key: u64) -> String {
    format!("{key:016x}")
}

/// A flat `field, value, …` answer as (key, value) pairs; entries that are not a 16-digit hex
/// key with a finite, non-negative value are skipped, and at most [`MAX_HOMES`] are kept, so a
/// corrupted directory cannot grow a replica's copy without bound.
fn pairs<T>(flat: &[String], value: impl Fn(&str) -> Option<T>) -> HashMap<u64, T> {
    flat.chunks_exact(2)
        .filter(|kv| kv[0].len() == 16)
        .filter_map(|kv| Some((u64::from_str_radix(&kv[0], 16).ok()?, value(&kv[1])?)))
        .take(MAX_HOMES)
        .collect()
}

/// A demand figure as Redis holds it, if it is one.
fn demand(v: &str) -> Option<f64> {
    v.parse::<f64>().ok().filter(|d| d.is_finite() && *d >= 0.0)
}

impl PrefixHomes {
    /// A directory on the fleet's Redis connection (`state.redis`).
    pub fn new(redis: Arc<SharedLimiter>) -> Arc<Self> {
        Arc::new(Self {
            counters: HomeCounters::default(),
            redis,
            claim: redis::Script::new(CLAIM),
            tend: redis::Script::new(TEND),
            pools: Mutex::new(HashMap::new()),
        })
    }

    fn key(&self, pool: &str, what: &str) -> String {
        format!(
            "{}:pool:{{{pool}}}:{what}",
            self.redis.settings().key_prefix
        )
    }

    /// The home of the prefix keyed `prefix` in `pool`, counting the request's demand; claims
    /// one for the fleet when this replica's copy has none (or only an unhealthy one). `None`
    /// when the pool does not home prefixes approximately, when the directory is full, or when
    /// Redis does not answer in time: routing then computes the home itself.
    pub async fn home(&self, pool: &PoolRuntime, features: &RequestFeatures) -> Option<u64> {
        let &prefix = features.prefix_hashes.first()?;
        let views = pool.approximate_views()?;
        let healthy = |key: &u64| views.iter().any(|w| w.healthy && w.key == *key);
        let stale = {
            let mut pools = self.pools.lock().ok()?;
            if !pools.contains_key(&pool.name) {
                pools.insert(pool.name.clone(), PoolCopy::default());
            }
            let entry = pools.get_mut(&pool.name)?;
            *entry.counted.entry(prefix).or_insert(0.0) += 1.0;
            if entry.prompt_bytes.len() < MAX_HOMES || entry.prompt_bytes.contains_key(&prefix) {
                entry.prompt_bytes.insert(prefix, features.prompt_bytes);
            }
            let known = entry.copy.homes.get(&prefix).copied();
            if let Some(home) = known.filter(healthy) {
                return Some(home);
            }
            known
        };
        // Only a claim needs the candidates (hash order, load bound, cache room).
        let policy = &pool.policy().policy;
        let candidates = policy.home_candidates(features, &views);
        let mine = {
            let pools = self.pools.lock().ok()?;
            pools.get(&pool.name)?.copy.place(&candidates)?
        };
        let mut conn = self.redis.healthy_connection()?;
        let mut call = self.claim.prepare_invoke();
        call.key(self.key(&pool.name, "homes"))
            .arg(hex(prefix))
            .arg(hex(mine))
            .arg(stale.map(hex).unwrap_or_default())
            .arg(MAX_HOMES)
            .arg(KEY_TTL.as_millis() as u64);
        let timeout = self.redis.settings().timeout;
        let home =
            match tokio::time::timeout(timeout, call.invoke_async::<Option<String>>(&mut conn))
                .await
            {
                Ok(Ok(Some(h))) => {
                    self.counters.claimed.fetch_add(1, Ordering::Relaxed);
                    u64::from_str_radix(&h, 16).ok()?
                }
                Ok(Ok(None)) => return None,
                Ok(Err(e)) => {
                    self.redis.call_failed("prefix home", &e.to_string());
                    return None;
                }
                Err(_) => {
                    self.redis.call_failed("prefix home", "timed out");
                    return None;
                }
            };
        if let Ok(mut pools) = self.pools.lock()
            && let Some(entry) = pools.get_mut(&pool.name)
        {
            entry.copy.homes.insert(prefix, home);
        }
        Some(home)
    }

    /// Syncs every [`SYNC`] the pools `pools` gives, until it gives none (the gateway is gone).
    pub fn start<F>(self: &Arc<Self>, pools: F)
    where
        F: Fn() -> Option<Vec<Arc<PoolRuntime>>> + Send + 'static,
    {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SYNC);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let (Some(me), Some(pools)) = (Weak::upgrade(&me), pools()) else {
                    return;
                };
                for pool in &pools {
                    me.sync(pool).await;
                }
            }
        });
    }

    /// One pool's sync: its counts up, a proposed move, the directory back.
    async fn sync(&self, pool: &PoolRuntime) {
        let (counted, proposal) = {
            let Ok(mut pools) = self.pools.lock() else {
                return;
            };
            let Some(entry) = pools.get_mut(&pool.name) else {
                return;
            };
            let views: Vec<WorkerView> = pool.workers().iter().map(|w| w.view()).collect();
            let healthy: Vec<u64> = views.iter().filter(|w| w.healthy).map(|w| w.key).collect();
            // A prefix this replica never saw has no known size: it does not move on its
            // proposal (another replica's may move it).
            let policy = &pool.policy().policy;
            let fits = |prefix: u64, worker: u64| {
                entry
                    .prompt_bytes
                    .get(&prefix)
                    .is_some_and(|&b| policy.room_for_prefix(&views, b).contains(&worker))
            };
            let proposal = entry
                .copy
                .rebalance(&healthy, (MOVE_TOLERANCE, MIN_DEMAND), fits);
            (std::mem::take(&mut entry.counted), proposal)
        };
        let Some(mut conn) = self.redis.healthy_connection() else {
            return;
        };
        let mut call = self.tend.prepare_invoke();
        call.key(self.key(&pool.name, "homes"))
            .key(self.key(&pool.name, "demand"))
            .key(self.key(&pool.name, "meta"))
            .arg(KEY_TTL.as_millis() as u64)
            .arg(HALF_LIFE.as_millis() as u64)
            .arg(MOVE_INTERVAL.as_millis() as u64);
        match proposal {
            Some(Move { prefix, from, to }) => call.arg(hex(prefix)).arg(hex(from)).arg(hex(to)),
            None => call.arg("").arg("").arg(""),
        };
        for (prefix, n) in &counted {
            call.arg(hex(*prefix)).arg(*n);
        }
        let timeout = self
            .redis
            .settings()
            .timeout
            .max(Duration::from_millis(200));
        let answer = tokio::time::timeout(
            timeout,
            call.invoke_async::<(i64, Vec<String>, Vec<String>)>(&mut conn),
        )
        .await;
        let (moved, homes, demands) = match answer {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return self.redis.call_failed("prefix homes", &e.to_string()),
            Err(_) => return self.redis.call_failed("prefix homes", "timed out"),
        };
        self.counters.synced.fetch_add(1, Ordering::Relaxed);
        if moved == 1
            && let Some(m) = proposal
        {
            self.counters.moved.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                pool = %pool.name,
                prefix = %hex(m.prefix),
                from = %hex(m.from),
                to = %hex(m.to),
                "prefix home moved to even the pool's load"
            );
        }
        let copy = Directory {
            homes: pairs(&homes, |v| u64::from_str_radix(v, 16).ok()),
            demand: pairs(&demands, demand),
        };
        if let Ok(mut pools) = self.pools.lock()
            && let Some(entry) = pools.get_mut(&pool.name)
        {
            // Sizes of prefixes the directory forgot go too, so the map stays bounded.
            entry
                .prompt_bytes
                .retain(|p, _| copy.homes.contains_key(p) || entry.counted.contains_key(p));
            entry.copy = copy;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corrupted_directory_is_read_as_far_as_it_makes_sense() {
        let flat: Vec<String> = [
            "00000000000000aa",
            "0000000000000001",
            "zz",
            "0000000000000002",
            "00000000000000bb",
            "not hex at all!!",
            "00000000000000cc",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let homes = pairs(&flat, |v| u64::from_str_radix(v, 16).ok());
        assert_eq!(homes, HashMap::from([(0xaa, 1)]));
        let d: Vec<String> = ["00000000000000aa", "12.5", "00000000000000bb", "NaN"]
            .iter()
            .chain(["00000000000000cc", "-3", "00000000000000dd", "inf"].iter())
            .map(|s| s.to_string())
            .collect();
        assert_eq!(pairs(&d, demand), HashMap::from([(0xaa, 12.5)]));
        assert_eq!(hex(0xaa), "00000000000000aa");
    }
}
