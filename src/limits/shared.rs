//! Fleet mode: tenant limits shared by every gateway replica through Redis (`state: {redis}`).
//!
//! One atomic Lua script per admission takes the tenant's shared concurrency slot and its
//! request and token GCRA cells together, on Redis's clock, so `Retry-After` is exact across
//! replicas; one more per request settles it (refund or charge the token difference, free the
//! slot), off the request path. A slot carries an expiry (the request's total timeout), so a
//! replica that dies cannot hold its slots forever.
//!
//! When Redis does not answer within `timeout`, the replica falls back to a local share of each
//! limit (the limit divided by the live replicas it last counted through Redis heartbeats, or
//! the configured `replicas`), never to unlimited; it logs the switch, shows it in
//! `infergate_state_fallback` and recovers on its own once Redis answers again.
//!
//! With `lease:` set, rates are admitted from quota leased in blocks instead (see [`leased`]):
//! no round trip per request, at most one block per replica over the limit; concurrency slots
//! are leased a few at a time and never exceed the limit.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

mod leased;

pub use leased::LeaseCalls;
use leased::Leases;

use super::lease::LeaseSettings;
use super::{
    InProcessLimiter, LimitKind, Limiter, RateHeaders, Rejection, Reservation, TierLimits,
};

/// `state.redis` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// `redis://host:port/db`.
    pub url: String,
    /// Prefix of every key, so fleets can share a Redis.
    pub key_prefix: String,
    /// Longest wait for one Redis call before the local share takes over.
    pub timeout: Duration,
    /// Replicas to divide limits by when Redis is down and no heartbeat count is known.
    pub replicas: Option<u32>,
    /// Fail readiness while Redis is unreachable.
    pub fail_closed: bool,
    /// Quota leasing (`lease:`); `None` keeps one script per admission (exact).
    pub lease: Option<LeaseSettings>,
    /// Share a directory of prefix homes (`prefix_homes:`, see `workers::prefix_homes`).
    pub prefix_homes: bool,
}

/// Admission: concurrency slot, then both GCRA cells, all or nothing. Times in microseconds of
/// Redis's clock; a cell refills `per_minute` units evenly over a minute, burst = per_minute.
/// KEYS: rpm, tpm, slots. ARGV: rpm (0 = none), tpm (0 = none), tokens, max_concurrent
/// (0 = none), slot id, slot lifetime µs.
/// Returns {0, rem_req, reset_req_us, rem_tok, reset_tok_us} admitted;
/// {1, which (1 requests, 2 tokens), retry_us, rem_req, reset_req_us, rem_tok, reset_tok_us};
/// {2, limit} concurrency; {3, burst} never fits.
const ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rpm, tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local conc, slot, life = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
if tpm > 0 and tokens > tpm then return {3, tpm} end
local function cell(key, per_min, n)
  if per_min <= 0 then return true, 0, 0, 0, 0 end
  local T = 60000000 / per_min
  local tat = tonumber(redis.call('GET', key) or '0')
  local base = math.max(tat, now)
  local new = base + n * T
  local allow_at = new - 60000000
  if allow_at <= now then
    return true, new, math.floor((60000000 - (new - now)) / T + 1e-6), math.ceil(new - now), 0
  end
  local used = math.max(tat - now, 0)
  return false, 0, math.floor((60000000 - used) / T + 1e-6), math.ceil(base - now), math.ceil(allow_at - now)
end
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= conc then return {2, conc} end
end
local ok_r, new_r, rem_r, reset_r, wait_r = cell(KEYS[1], rpm, 1)
local ok_t, new_t, rem_t, reset_t, wait_t = cell(KEYS[2], tpm, tokens)
if not (ok_r and ok_t) then
  local which, wait = 1, wait_r
  if wait_t > wait_r then which, wait = 2, wait_t end
  return {1, which, wait, rem_r, reset_r, rem_t, reset_t}
end
if rpm > 0 then redis.call('SET', KEYS[1], string.format('%.3f', new_r), 'PX', math.ceil((new_r - now) / 1000) + 1000) end
if tpm > 0 then redis.call('SET', KEYS[2], string.format('%.3f', new_t), 'PX', math.ceil((new_t - now) / 1000) + 1000) end
if conc > 0 then
  redis.call('ZADD', KEYS[3], now + life, slot)
  redis.call('PEXPIRE', KEYS[3], math.ceil(life / 1000) + 1000)
end
return {0, rem_r, reset_r, rem_t, reset_t}
";

/// Settlement: the token cell gets the difference between reserved and used, the slot is freed.
/// KEYS: tpm, slots. ARGV: tpm (0 = none), reserved, actual, slot id.
const SETTLE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tpm, reserved, actual = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if tpm > 0 and reserved ~= actual then
  local T = 60000000 / tpm
  local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
  if actual < reserved then
    tat = math.max(tat - (reserved - actual) * T, now)
  else
    tat = math.max(tat, now) + (actual - reserved) * T
  end
  redis.call('SET', KEYS[1], string.format('%.3f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
end
redis.call('ZREM', KEYS[2], ARGV[4])
return 1
";

/// How often a replica announces itself and counts the others.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A replica not heard from for this long no longer counts.
const REPLICA_TTL_MS: u64 = 5_000;

/// Where an admitted request's limits are held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// In Redis, under this slot id.
    Shared(String),
    /// In this replica's local share (Redis was down at admission).
    Local,
    /// In this replica's lease of the shared cells and slots.
    Leased,
}

/// The tenant limits of a fleet.
pub struct SharedLimiter {
    settings: RedisSettings,
    client: redis::Client,
    conn: Mutex<Option<MultiplexedConnection>>,
    acquire: redis::Script,
    settle: redis::Script,
    healthy: AtomicBool,
    /// Live replicas last counted through Redis (≥ 1).
    replicas: AtomicU32,
    /// This replica's id in the heartbeat set.
    replica_id: String,
    /// The local share used while Redis is down.
    local: InProcessLimiter,
    /// Redis calls that failed or timed out.
    pub errors: AtomicU64,
    slot_seq: AtomicU64,
    /// Longest a slot may be held (the request's total timeout).
    slot_life: Duration,
    /// Quota leases, when `lease:` is set.
    leases: Option<Leases>,
}

impl SharedLimiter {
    /// A limiter on `settings`; no connection is made until [`start`](Self::start).
    pub fn new(settings: RedisSettings, slot_life: Duration) -> Result<Arc<Self>, String> {
        let client = redis::Client::open(settings.url.as_str())
            .map_err(|e| format!("state.redis.url: {e}"))?;
        let replica_id = format!(
            "{}-{}-{:x}",
            std::process::id(),
            crate::utc::now_ms(),
            xxhash_rust::xxh3::xxh3_64(settings.url.as_bytes())
        );
        let replicas = settings.replicas.unwrap_or(1).max(1);
        let leases = settings.lease.map(Leases::new);
        Ok(Arc::new(Self {
            settings,
            client,
            conn: Mutex::new(None),
            acquire: redis::Script::new(ACQUIRE),
            settle: redis::Script::new(SETTLE),
            healthy: AtomicBool::new(false),
            replicas: AtomicU32::new(replicas),
            replica_id,
            local: InProcessLimiter::new(),
            errors: AtomicU64::new(0),
            slot_seq: AtomicU64::new(0),
            slot_life,
            leases,
        }))
    }

    /// Connects (within the timeout) and starts the heartbeat that counts replicas, reconnects
    /// after a failure and exchanges `budgets`' spend with the fleet. A Redis that is down at
    /// start only means starting on the local share.
    pub async fn start(self: &Arc<Self>, budgets: Arc<crate::budgets::BudgetBook>) {
        self.heartbeat().await;
        self.share_budgets(&budgets).await;
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(HEARTBEAT);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(me) = me.upgrade() else { return };
                me.heartbeat().await;
                me.share_budgets(&budgets).await;
                me.expire_leases().await;
                me.refresh_slots().await;
            }
        });
    }

    /// Adds the spend settled here since the last exchange to each tenant's fleet total in
    /// Redis and takes the totals back (one pipelined round trip). A replica's own ledger seed
    /// starts a total that Redis does not have yet. Spend is shared within a heartbeat (1 s);
    /// estimates in flight stay per replica.
    async fn share_budgets(&self, book: &crate::budgets::BudgetBook) {
        if !self.is_healthy() {
            return;
        }
        let Some(mut conn) = self.connection() else {
            return;
        };
        let now = crate::utc::now_ms();
        let items = book.take_unshared(now);
        if items.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        for s in &items {
            let key = format!(
                "{}:budget:{{{}}}:{}:{}",
                self.settings.key_prefix,
                s.tenant,
                s.period.as_str(),
                s.period_start
            );
            // Kept a day past the period's end.
            let ttl = (s.period.end(now) - now) / 1000 + 86_400;
            if let Some(seed) = s.seed {
                pipe.cmd("SET").arg(&key).arg(seed).arg("NX").ignore();
            }
            pipe.cmd("INCRBY").arg(&key).arg(s.delta);
            pipe.cmd("EXPIRE").arg(&key).arg(ttl).ignore();
        }
        match tokio::time::timeout(
            self.settings.timeout,
            pipe.query_async::<Vec<i64>>(&mut conn),
        )
        .await
        {
            Ok(Ok(totals)) if totals.len() == items.len() => {
                for (s, total) in items.iter().zip(totals) {
                    book.apply_shared(s, u64::try_from(total).unwrap_or(0), now);
                }
            }
            other => {
                for s in &items {
                    book.restore_unshared(s, now);
                }
                let why = match other {
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(_)) => "unexpected answer".into(),
                    Err(_) => "timed out".into(),
                };
                self.failed("budgets", &why);
            }
        }
    }

    /// Redis calls made for leases, when leasing is on.
    pub fn lease_calls(&self) -> Option<&LeaseCalls> {
        self.leases.as_ref().map(|l| &l.calls)
    }

    /// True while Redis answers.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// Whether readiness should fail now (`fail_closed` and Redis unreachable).
    pub fn blocks_readiness(&self) -> bool {
        self.settings.fail_closed && !self.is_healthy()
    }

    /// Replicas the local share divides by.
    pub fn replicas(&self) -> u32 {
        self.replicas.load(Ordering::Relaxed).max(1)
    }

    fn key(&self, tenant: &str, what: &str) -> String {
        format!("{}:tenant:{{{tenant}}}:{what}", self.settings.key_prefix)
    }

    /// The fleet's Redis connection while Redis answers, for other fleet state (the shared
    /// prefix directory, `workers::prefix_homes`).
    pub fn healthy_connection(&self) -> Option<MultiplexedConnection> {
        self.connection().filter(|_| self.is_healthy())
    }

    /// Key prefix and call timeout of `state.redis`.
    pub fn settings(&self) -> &RedisSettings {
        &self.settings
    }

    /// Counts a failed call made on [`Self::healthy_connection`] and marks Redis down.
    pub fn call_failed(&self, what: &str, error: &str) {
        self.failed(what, error);
    }

    fn connection(&self) -> Option<MultiplexedConnection> {
        self.conn.lock().ok().and_then(|c| c.clone())
    }

    /// Marks Redis down after a failed call: the next heartbeat reconnects.
    fn failed(&self, what: &str, error: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut c) = self.conn.lock() {
            *c = None;
        }
        if self.healthy.swap(false, Ordering::AcqRel) {
            tracing::error!(
                error,
                what,
                replicas = self.replicas(),
                "Redis is unreachable: tenant limits fall back to this replica's share"
            );
        }
    }

    /// Announces this replica, counts the live ones, and reconnects when needed.
    async fn heartbeat(&self) {
        let timeout = self.settings.timeout;
        let mut conn = match self.connection() {
            Some(c) => c,
            None => {
                let connect = self.client.get_multiplexed_async_connection();
                match tokio::time::timeout(timeout.max(Duration::from_millis(500)), connect).await {
                    Ok(Ok(c)) => {
                        if let Ok(mut slot) = self.conn.lock() {
                            *slot = Some(c.clone());
                        }
                        c
                    }
                    Ok(Err(e)) => return self.failed("connect", &e.to_string()),
                    Err(_) => return self.failed("connect", "timed out"),
                }
            }
        };
        let key = format!("{}:replicas", self.settings.key_prefix);
        let now = crate::utc::now_ms();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("ZADD")
            .arg(&key)
            .arg(now)
            .arg(&self.replica_id)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg("-inf")
            .arg(now - REPLICA_TTL_MS as i64)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(REPLICA_TTL_MS * 2)
            .ignore()
            .cmd("ZCARD")
            .arg(&key);
        match tokio::time::timeout(timeout, pipe.query_async::<(u32,)>(&mut conn)).await {
            Ok(Ok((count,))) => {
                if self.settings.replicas.is_none() {
                    self.replicas.store(count.max(1), Ordering::Relaxed);
                }
                if !self.healthy.swap(true, Ordering::AcqRel) {
                    tracing::info!(
                        replicas = count,
                        "Redis reachable: tenant limits are shared"
                    );
                }
            }
            Ok(Err(e)) => self.failed("heartbeat", &e.to_string()),
            Err(_) => self.failed("heartbeat", "timed out"),
        }
    }

    /// This replica's share of `limits` (each limit ÷ live replicas, at least 1).
    pub fn local_share(&self, limits: &TierLimits) -> TierLimits {
        let n = u64::from(self.replicas());
        let share = |v: u64| (v / n).max(1);
        TierLimits {
            requests_per_minute: limits.requests_per_minute.map(share),
            tokens_per_minute: limits.tokens_per_minute.map(share),
            max_concurrent: limits.max_concurrent.map(|c| (c / self.replicas()).max(1)),
        }
    }

    /// Admits one request of `tenant` costing `tokens`: from its lease (leasing on, no
    /// concurrency cap), else in Redis (one round trip), or from the local share when Redis does
    /// not answer in time.
    pub async fn acquire(
        self: &Arc<Self>,
        tenant: &str,
        limits: &TierLimits,
        tokens: u64,
    ) -> Result<(Reservation, Held), Rejection> {
        if let Some(leases) = self.leases.as_ref()
            && self.is_healthy()
            && let Some(r) = self.acquire_leased(leases, tenant, limits, tokens).await
        {
            return r.map(|r| (r, Held::Leased));
        }
        if self.is_healthy()
            && let Some(mut conn) = self.connection()
        {
            let slot = format!(
                "{}:{}",
                self.replica_id,
                self.slot_seq.fetch_add(1, Ordering::Relaxed)
            );
            let mut call = self.acquire.prepare_invoke();
            call.key(self.key(tenant, "rpm"))
                .key(self.key(tenant, "tpm"))
                .key(self.key(tenant, "slots"))
                .arg(limits.requests_per_minute.unwrap_or(0))
                .arg(limits.tokens_per_minute.unwrap_or(0))
                .arg(tokens)
                .arg(limits.max_concurrent.unwrap_or(0))
                .arg(&slot)
                .arg(self.slot_life.as_micros() as u64);
            let answer = tokio::time::timeout(
                self.settings.timeout,
                call.invoke_async::<Vec<i64>>(&mut conn),
            )
            .await;
            match answer {
                Ok(Ok(v)) => return decode(&v, limits, tokens).map(|r| (r, Held::Shared(slot))),
                Ok(Err(e)) => self.failed("acquire", &e.to_string()),
                Err(_) => self.failed("acquire", "timed out"),
            }
        }
        let share = self.local_share(limits);
        self.local.acquire_slot(tenant, &share)?;
        match self.local.acquire(tenant, &share, tokens, Instant::now()) {
            Ok(r) => Ok((r, Held::Local)),
            Err(e) => {
                self.local.release_concurrency(tenant);
                Err(e)
            }
        }
    }

    /// Settles an admitted request: refunds or charges the token difference and frees its slot
    /// (in Redis, in the background; locally at once).
    pub fn settle(
        self: &Arc<Self>,
        tenant: &str,
        limits: &TierLimits,
        held: Held,
        (reserved, actual): (u64, u64),
    ) {
        let slot = match held {
            Held::Local => {
                self.local
                    .reconcile(tenant, reserved, actual, Instant::now());
                self.local.release_concurrency(tenant);
                return;
            }
            Held::Leased => {
                self.settle_leased(tenant, limits, (reserved, actual));
                return;
            }
            Held::Shared(slot) => slot,
        };
        let me = self.clone();
        let (tpm_key, slots_key) = (self.key(tenant, "tpm"), self.key(tenant, "slots"));
        let tpm = limits.tokens_per_minute.unwrap_or(0);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            let Some(mut conn) = me.connection() else {
                // The slot expires by itself; the token difference is lost with Redis.
                return;
            };
            let mut call = me.settle.prepare_invoke();
            call.key(tpm_key)
                .key(slots_key)
                .arg(tpm)
                .arg(reserved)
                .arg(actual)
                .arg(&slot);
            match tokio::time::timeout(me.settings.timeout, call.invoke_async::<i64>(&mut conn))
                .await
            {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => me.failed("settle", &e.to_string()),
                Err(_) => me.failed("settle", "timed out"),
            }
        });
    }
}

/// The script's answer as a reservation or a refusal.
fn decode(v: &[i64], limits: &TierLimits, tokens: u64) -> Result<Reservation, Rejection> {
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    let us = |x: i64| Duration::from_micros(u64::try_from(x).unwrap_or(0));
    let count = |x: i64| u64::try_from(x).unwrap_or(0);
    let headers = |base: usize| RateHeaders {
        limit_requests: limits.requests_per_minute,
        remaining_requests: limits.requests_per_minute.map(|_| count(at(base))),
        reset_requests: limits.requests_per_minute.map(|_| us(at(base + 1))),
        limit_tokens: limits.tokens_per_minute,
        remaining_tokens: limits.tokens_per_minute.map(|_| count(at(base + 2))),
        reset_tokens: limits.tokens_per_minute.map(|_| us(at(base + 3))),
    };
    match at(0) {
        0 => Ok(Reservation {
            tokens,
            headers: headers(1),
        }),
        1 => Err(Rejection::RateLimited {
            retry_after: us(at(2)),
            which: if at(1) == 2 {
                LimitKind::Tokens
            } else {
                LimitKind::Requests
            },
            headers: headers(3),
        }),
        2 => Err(Rejection::Concurrency {
            limit: u32::try_from(at(1)).unwrap_or(u32::MAX),
        }),
        _ => Err(Rejection::TooLarge {
            tokens,
            burst: count(at(1)),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_share_divides_every_limit_and_never_reaches_zero() {
        let settings = RedisSettings {
            url: "redis://127.0.0.1:1/".into(),
            key_prefix: "t".into(),
            timeout: Duration::from_millis(50),
            replicas: Some(3),
            fail_closed: false,
            lease: None,
            prefix_homes: false,
        };
        let l = SharedLimiter::new(settings, Duration::from_secs(60)).expect("limiter");
        let share = l.local_share(&TierLimits {
            requests_per_minute: Some(30),
            tokens_per_minute: Some(1_000),
            max_concurrent: Some(2),
        });
        assert_eq!(share.requests_per_minute, Some(10));
        assert_eq!(share.tokens_per_minute, Some(333));
        assert_eq!(share.max_concurrent, Some(1));
        assert_eq!(l.local_share(&TierLimits::default()), TierLimits::default());
    }

    #[test]
    fn script_answers_decode_to_reservations_and_refusals() {
        let limits = TierLimits {
            requests_per_minute: Some(30),
            tokens_per_minute: Some(1_000),
            max_concurrent: Some(4),
        };
        let ok = decode(&[0, 29, 2_000_000, 900, 6_000_000], &limits, 100).expect("admitted");
        assert_eq!(ok.headers.remaining_requests, Some(29));
        assert_eq!(ok.headers.reset_tokens, Some(Duration::from_secs(6)));
        match decode(&[1, 2, 1_500_000, 0, 0, 0, 0], &limits, 100) {
            Err(Rejection::RateLimited {
                retry_after, which, ..
            }) => {
                assert_eq!(retry_after, Duration::from_micros(1_500_000));
                assert_eq!(which, LimitKind::Tokens);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            decode(&[2, 4], &limits, 1),
            Err(Rejection::Concurrency { limit: 4 })
        );
        assert_eq!(
            decode(&[3, 1_000], &limits, 5_000),
            Err(Rejection::TooLarge {
                tokens: 5_000,
                burst: 1_000
            })
        );
    }
}
