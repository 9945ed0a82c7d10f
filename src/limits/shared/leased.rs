//! Fleet mode with quota leases (`state.redis.lease`): the Redis side of [`crate::limits::lease`].
//!
//! A lease is taken out of the tenant's shared GCRA cells and slot set (the same `…:rpm`, `…:tpm`
//! and `…:slots` keys the exact mode uses), so leased and exact replicas can share a fleet.
//! A leased slot is the entry `{replica}:L{n}` of the slot set; its expiry is a few seconds
//! ahead and every heartbeat pushes it on, so a replica that dies frees its slots within
//! [`LEASED_SLOT_LIFE`]. Each replica also writes
//! what it holds to `{prefix}:tenant:{T}:lease:{replica}` (a hash of `requests` and `tokens`,
//! expiring with the lease's hold) so an operator can read who holds what; nothing depends on
//! it. Only a request that finds its lease empty waits on Redis; renewals, the return of
//! unused units and of refunds past two blocks run in background tasks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::SharedLimiter;
use crate::limits::lease::{Answer, Ask, LeaseSettings, Step, TenantLease};
use crate::limits::{LimitKind, Rejection, Reservation, TierLimits};

/// How long a leased slot entry lives without a heartbeat pushing it on.
const LEASED_SLOT_LIFE: Duration = Duration::from_secs(5);

/// Takes a lease out of both cells and the slot set: each need whole or nothing, then up to
/// `more` beyond it. Times in microseconds of Redis's clock; a cell refills `per_minute` evenly,
/// burst = a minute. KEYS: rpm, tpm, lease record, slots. ARGV: rpm (0 = none), tpm (0 = none),
/// requests need, requests more, tokens need, tokens more, hold ms, requests held, tokens held,
/// max_concurrent (0 = none), slots need, slots more, slot id prefix, first slot id, slot life
/// µs. Returns {0, granted_r, left_r, reset_r_us, next_r_us, granted_t, left_t, reset_t_us,
/// next_t_us, granted_slots, free_slots_left}, {1, which (1 requests, 2 tokens), retry_us} or {2} (no slot).
const LEASE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local conc, need_s, more_s = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local free_s = 0
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  free_s = math.max(conc - redis.call('ZCARD', KEYS[4]), 0)
  if need_s > free_s then return {2} end
end
local function look(key, per_min)
  if per_min <= 0 then return 1, now, 0 end
  local T = 60000000 / per_min
  local tat = math.max(tonumber(redis.call('GET', key) or '0'), now)
  return T, tat, math.max(math.floor((60000000 - (tat - now)) / T + 1e-6), 0)
end
local function wait(T, tat, n) return math.max(math.ceil(tat + n * T - 60000000 - now), 0) end
local Tr, tat_r, free_r = look(KEYS[1], rpm)
local Tt, tat_t, free_t = look(KEYS[2], tpm)
local need_r, need_t = tonumber(ARGV[3]), tonumber(ARGV[5])
local short_r, short_t = rpm > 0 and need_r > free_r, tpm > 0 and need_t > free_t
if short_r or short_t then
  local wr, wt = 0, 0
  if short_r then wr = wait(Tr, tat_r, need_r) end
  if short_t then wt = wait(Tt, tat_t, need_t) end
  if wt > wr then return {1, 2, wt} end
  return {1, 1, wr}
end
local function take(key, per_min, T, tat, free, n)
  if per_min <= 0 then return 0, 0, 0, 0 end
  local g = math.min(n, free)
  local new = tat + g * T
  if g > 0 then
    redis.call('SET', key, string.format('%.3f', new), 'PX', math.ceil((new - now) / 1000) + 1000)
  end
  local next = 0
  if free - g == 0 then next = wait(T, new, 1) end
  return g, free - g, math.ceil(new - now), next
end
local gr, lr, rr, nr = take(KEYS[1], rpm, Tr, tat_r, free_r, need_r + tonumber(ARGV[4]))
local gt, lt, rt, nt = take(KEYS[2], tpm, Tt, tat_t, free_t, need_t + tonumber(ARGV[6]))
local gs = 0
if conc > 0 then
  gs = math.min(need_s + more_s, free_s)
  local base, life = tonumber(ARGV[14]), tonumber(ARGV[15])
  for i = 0, gs - 1 do
    redis.call('ZADD', KEYS[4], now + life, ARGV[13] .. ':L' .. (base + i))
  end
  if redis.call('PTTL', KEYS[4]) < life / 1000 + 1000 then
    redis.call('PEXPIRE', KEYS[4], math.ceil(life / 1000) + 1000)
  end
end
redis.call('HSET', KEYS[3], 'requests', tonumber(ARGV[8]) + gr, 'tokens', tonumber(ARGV[9]) + gt)
redis.call('PEXPIRE', KEYS[3], ARGV[7])
return {0, gr, lr, rr, nr, gt, lt, rt, nt, gs, free_s - gs}
";

/// Pushes the expiry of this replica's leased slots on (they are alive while it is); a slot
/// that expired while Redis was unreachable, or that an empty restart lost, is added back, as
/// its request still runs. KEYS: slots. ARGV: slot life µs, slot ids (members).
const REFRESH: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local life = tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], now + life, ARGV[i]) end
if redis.call('PTTL', KEYS[1]) < life / 1000 + 1000 then
  redis.call('PEXPIRE', KEYS[1], math.ceil(life / 1000) + 1000)
end
return 1
";

/// Gives unused units back to the cells (never past a full cell) and idle slots back to the
/// set, and records what is held. KEYS: rpm, tpm, lease record, slots. ARGV: rpm, tpm,
/// requests, tokens, requests held, tokens held, slot ids (members) to free.
const GIVE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function give(key, per_min, n)
  if per_min <= 0 or n <= 0 then return end
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat <= now then return end
  tat = math.max(tat - n * 60000000 / per_min, now)
  redis.call('SET', key, string.format('%.3f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
end
give(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[3]))
give(KEYS[2], tonumber(ARGV[2]), tonumber(ARGV[4]))
for i = 7, #ARGV do redis.call('ZREM', KEYS[4], ARGV[i]) end
if tonumber(ARGV[5]) <= 0 and tonumber(ARGV[6]) <= 0 then
  redis.call('DEL', KEYS[3])
else
  redis.call('HSET', KEYS[3], 'requests', ARGV[5], 'tokens', ARGV[6])
end
return 1
";

/// Redis calls made for leases, by kind (`infergate_state_lease_calls_total{call}`).
#[derive(Debug, Default)]
pub struct LeaseCalls {
    /// Fetches a request waited for (its lease was empty).
    pub fetch: AtomicU64,
    /// Background renewals ahead of need.
    pub renew: AtomicU64,
    /// Background returns of unused units.
    pub give: AtomicU64,
    /// Heartbeat refreshes of leased slots.
    pub refresh: AtomicU64,
}

/// A tenant's lease and the limits it was last taken under.
struct Entry {
    lease: TenantLease,
    limits: TierLimits,
}

/// This replica's leases, one per tenant.
pub(super) struct Leases {
    pub(super) settings: LeaseSettings,
    tenants: Mutex<HashMap<String, Entry>>,
    lease: redis::Script,
    give: redis::Script,
    refresh: redis::Script,
    pub(super) calls: LeaseCalls,
}

impl Leases {
    pub(super) fn new(settings: LeaseSettings) -> Self {
        Self {
            settings,
            tenants: Mutex::new(HashMap::new()),
            lease: redis::Script::new(LEASE),
            give: redis::Script::new(GIVE),
            refresh: redis::Script::new(REFRESH),
            calls: LeaseCalls::default(),
        }
    }

    /// Runs `f` on `tenant`'s lease (created on first use) under the table's lock.
    fn with<R>(
        &self,
        tenant: &str,
        limits: &TierLimits,
        f: impl FnOnce(&mut TenantLease) -> R,
    ) -> R {
        let mut tenants = self.lock();
        let entry = match tenants.get_mut(tenant) {
            Some(e) => e,
            None => tenants.entry(tenant.to_owned()).or_insert(Entry {
                lease: TenantLease::default(),
                limits: *limits,
            }),
        };
        entry.limits = *limits;
        f(&mut entry.lease)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.tenants.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The lease script's answer.
fn decode(v: &[i64]) -> Answer {
    let at = |i: usize| u64::try_from(v.get(i).copied().unwrap_or(0)).unwrap_or(0);
    let us = |i: usize| Duration::from_micros(at(i));
    match v.first() {
        Some(0) => Answer::Granted {
            granted: (at(1), at(5)),
            left: (at(2), at(6)),
            reset: (us(3), us(7)),
            next: (us(4), us(8)),
            slots: u32::try_from(at(9)).unwrap_or(0),
            slots_left: u32::try_from(at(10)).unwrap_or(0),
        },
        Some(2) => Answer::Full,
        _ => Answer::Refused {
            which: if at(1) == 2 {
                LimitKind::Tokens
            } else {
                LimitKind::Requests
            },
            retry_after: us(2),
        },
    }
}

impl SharedLimiter {
    /// Admits from `tenant`'s lease, fetching one when it is empty; `None` when Redis failed
    /// (the caller falls back to the local share).
    pub(super) async fn acquire_leased(
        self: &Arc<Self>,
        leases: &Leases,
        tenant: &str,
        limits: &TierLimits,
        tokens: u64,
    ) -> Option<Result<Reservation, Rejection>> {
        let cfg = leases.settings;
        // One lock for the common case: admitted locally, and maybe a renewal to start.
        let (step, renewal) = leases.with(tenant, limits, |l| {
            let now = Instant::now();
            let step = l.admit(cfg, limits, tokens, now);
            let renewal = matches!(step, Step::Admitted(_))
                .then(|| l.renewal(cfg, limits, now).map(|a| (a, l.held())))
                .flatten();
            (step, renewal)
        });
        if let Some(renewal) = renewal {
            self.renew(leases, tenant, limits, renewal);
        }
        let step = match step {
            Step::Fetch(mut ask) => {
                leases.calls.fetch.fetch_add(1, Ordering::Relaxed);
                ask.slot_base = self.slot_ids(ask.slots_need + ask.slots_more);
                let held = leases.with(tenant, limits, |l| l.held());
                let answer = self.lease_call(leases, tenant, limits, ask, held).await;
                let now = Instant::now();
                match answer {
                    Some(a) => {
                        let (step, renewal) = leases.with(tenant, limits, |l| {
                            let step = l.fetched((cfg, limits), (ask, a), tokens, now);
                            (step, l.renewal(cfg, limits, now).map(|a| (a, l.held())))
                        });
                        if let Some(renewal) = renewal {
                            self.renew(leases, tenant, limits, renewal);
                        }
                        step
                    }
                    None => {
                        leases.with(tenant, limits, |l| l.abandon(ask));
                        return None;
                    }
                }
            }
            other => other,
        };
        Some(match step {
            Step::Admitted(headers) => Ok(Reservation { tokens, headers }),
            Step::Refused {
                which,
                retry_after,
                headers,
            } => Err(Rejection::RateLimited {
                retry_after,
                which,
                headers,
            }),
            Step::TooLarge { burst } => Err(Rejection::TooLarge { tokens, burst }),
            Step::Concurrency { limit } => Err(Rejection::Concurrency { limit }),
            Step::Fetch(_) => return None,
        })
    }

    /// Runs a top-up of `tenant`'s lease (from [`TenantLease::renewal`], with what it held) in
    /// a background task.
    fn renew(
        self: &Arc<Self>,
        leases: &Leases,
        tenant: &str,
        limits: &TierLimits,
        (mut ask, held): (Ask, (i64, i64)),
    ) {
        let cfg = leases.settings;
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            leases.with(tenant, limits, |l| {
                l.renewed(cfg, ask, None, Instant::now())
            });
            return;
        };
        leases.calls.renew.fetch_add(1, Ordering::Relaxed);
        ask.slot_base = self.slot_ids(ask.slots_more);
        let (me, tenant, limits) = (self.clone(), tenant.to_owned(), *limits);
        rt.spawn(async move {
            let Some(leases) = me.leases.as_ref() else {
                return;
            };
            let answer = me.lease_call(leases, &tenant, &limits, ask, held).await;
            leases.with(&tenant, &limits, |l| {
                l.renewed(cfg, ask, answer, Instant::now());
            });
        });
    }

    /// One lease script call; `None` when Redis failed or timed out (marked down).
    async fn lease_call(
        &self,
        leases: &Leases,
        tenant: &str,
        limits: &TierLimits,
        ask: Ask,
        held: (i64, i64),
    ) -> Option<Answer> {
        let mut conn = self.connection()?;
        let mut call = leases.lease.prepare_invoke();
        call.key(self.key(tenant, "rpm"))
            .key(self.key(tenant, "tpm"))
            .key(self.lease_key(tenant))
            .key(self.key(tenant, "slots"))
            .arg(limits.requests_per_minute.unwrap_or(0))
            .arg(limits.tokens_per_minute.unwrap_or(0))
            .arg(ask.requests_need)
            .arg(ask.requests_more)
            .arg(ask.tokens_need)
            .arg(ask.tokens_more)
            .arg(u64::try_from(leases.settings.hold.as_millis()).unwrap_or(u64::MAX))
            .arg(held.0)
            .arg(held.1)
            .arg(limits.max_concurrent.unwrap_or(0))
            .arg(ask.slots_need)
            .arg(ask.slots_more)
            .arg(&self.replica_id)
            .arg(ask.slot_base)
            .arg(micros(LEASED_SLOT_LIFE));
        match tokio::time::timeout(
            self.settings.timeout,
            call.invoke_async::<Vec<i64>>(&mut conn),
        )
        .await
        {
            Ok(Ok(v)) => Some(decode(&v)),
            Ok(Err(e)) => {
                self.failed("lease", &e.to_string());
                None
            }
            Err(_) => {
                self.failed("lease", "timed out");
                None
            }
        }
    }

    /// Settles a leased request's tokens into the lease; refunds past two blocks go back to
    /// Redis in the background.
    pub(super) fn settle_leased(
        self: &Arc<Self>,
        tenant: &str,
        limits: &TierLimits,
        settled: (u64, u64),
    ) {
        let Some(leases) = self.leases.as_ref() else {
            return;
        };
        let cfg = leases.settings;
        let (excess, slots, held) = leases.with(tenant, limits, |l| {
            let excess = l.settle(cfg, limits.tokens_per_minute, settled);
            (excess, l.release_slot(limits.max_concurrent), l.held())
        });
        if excess == 0 && slots.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (me, tenant, limits) = (self.clone(), tenant.to_owned(), *limits);
        rt.spawn(async move {
            me.give_back(&tenant, &limits, ((0, excess), slots), held)
                .await;
        });
    }

    /// Hands back to Redis the units of every lease unused past its hold, and leased slots past
    /// the last second's peak plus a block (from the heartbeat).
    pub(super) async fn expire_leases(&self) {
        let Some(leases) = self.leases.as_ref() else {
            return;
        };
        let now = Instant::now();
        let expired: Vec<_> = leases
            .lock()
            .iter_mut()
            .filter_map(|(tenant, e)| {
                let trimmed = e.lease.trim_slots(leases.settings, e.limits.max_concurrent);
                let (units, mut slots) = e.lease.expire(now).unwrap_or_default();
                slots.extend(trimmed);
                let nothing = units == (0, 0) && slots.is_empty();
                (!nothing).then(|| (tenant.clone(), e.limits, (units, slots), e.lease.held()))
            })
            .collect();
        for (tenant, limits, units, held) in expired {
            self.give_back(&tenant, &limits, units, held).await;
        }
    }

    /// One give-back script call (errors mark Redis down; the units are then lost, which only
    /// costs admissions until the cells refill).
    async fn give_back(
        &self,
        tenant: &str,
        limits: &TierLimits,
        (units, slots): ((u64, u64), Vec<u64>),
        held: (i64, i64),
    ) {
        let (Some(leases), Some(mut conn)) = (self.leases.as_ref(), self.connection()) else {
            return;
        };
        leases.calls.give.fetch_add(1, Ordering::Relaxed);
        let mut call = leases.give.prepare_invoke();
        call.key(self.key(tenant, "rpm"))
            .key(self.key(tenant, "tpm"))
            .key(self.lease_key(tenant))
            .key(self.key(tenant, "slots"))
            .arg(limits.requests_per_minute.unwrap_or(0))
            .arg(limits.tokens_per_minute.unwrap_or(0))
            .arg(units.0)
            .arg(units.1)
            .arg(held.0)
            .arg(held.1);
        for id in slots {
            call.arg(self.slot_member(id));
        }
        match tokio::time::timeout(self.settings.timeout, call.invoke_async::<i64>(&mut conn)).await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => self.failed("lease return", &e.to_string()),
            Err(_) => self.failed("lease return", "timed out"),
        }
    }

    /// Pushes on the expiry of every leased slot this replica owns (from the heartbeat): one
    /// call per tenant holding slots.
    pub(super) async fn refresh_slots(&self) {
        let Some(leases) = self.leases.as_ref() else {
            return;
        };
        let owned: Vec<(String, Vec<u64>)> = leases
            .lock()
            .iter()
            .filter(|(_, e)| !e.lease.slot_ids().is_empty())
            .map(|(tenant, e)| (tenant.clone(), e.lease.slot_ids().to_vec()))
            .collect();
        for (tenant, ids) in owned {
            let Some(mut conn) = self.connection() else {
                return;
            };
            leases.calls.refresh.fetch_add(1, Ordering::Relaxed);
            let mut call = leases.refresh.prepare_invoke();
            call.key(self.key(&tenant, "slots"))
                .arg(micros(LEASED_SLOT_LIFE));
            for id in ids {
                call.arg(self.slot_member(id));
            }
            match tokio::time::timeout(self.settings.timeout, call.invoke_async::<i64>(&mut conn))
                .await
            {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => self.failed("slot refresh", &e.to_string()),
                Err(_) => self.failed("slot refresh", "timed out"),
            }
        }
    }

    /// `n` fresh slot ids of this replica (the first one).
    fn slot_ids(&self, n: u32) -> u64 {
        self.slot_seq.fetch_add(u64::from(n), Ordering::Relaxed)
    }

    /// A leased slot's member in the slot set.
    fn slot_member(&self, id: u64) -> String {
        format!("{}:L{id}", self.replica_id)
    }

    /// `{prefix}:tenant:{T}:lease:{replica}`: what this replica holds of the tenant's limits.
    fn lease_key(&self, tenant: &str) -> String {
        format!(
            "{}:tenant:{{{tenant}}}:lease:{}",
            self.settings.key_prefix, self.replica_id
        )
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_answers_decode_to_grants_and_refusals() {
        assert_eq!(
            decode(&[0, 6, 54, 6_000_000, 0, 1_000, 0, 60_000_000, 60_000, 2, 7]),
            Answer::Granted {
                granted: (6, 1_000),
                left: (54, 0),
                reset: (Duration::from_secs(6), Duration::from_secs(60)),
                next: (Duration::ZERO, Duration::from_millis(60)),
                slots: 2,
                slots_left: 7,
            }
        );
        assert_eq!(decode(&[2]), Answer::Full);
        assert_eq!(
            decode(&[1, 2, 1_500_000]),
            Answer::Refused {
                which: LimitKind::Tokens,
                retry_after: Duration::from_micros(1_500_000),
            }
        );
    }
}
