//! Quota leasing for fleet mode, the arithmetic alone (no Redis, no clock: time is passed in).
//!
//! Instead of one Redis round trip per admission, a replica takes a *block* of a tenant's
//! requests and tokens out of the shared GCRA cells at once and admits locally from what it
//! holds. Leased units are spent in Redis when they are leased, so the fleet as a whole never
//! admits more than the cells allow at the moment of leasing; the only excess is what a replica
//! carries into a later window: at most one block per replica and budget (tokens: two blocks,
//! refunds included). A replica that dies holding a lease loses its unused units; they come back
//! as the cell refills (within the window), so a crash costs admissions, never adds them.
//!
//! What the request path does with a tenant's [`TenantLease`]: [`TenantLease::admit`] takes from
//! the local lease, refuses at once while the fleet's cell is known to be dry, or asks for a
//! fetch (need plus a top-up to one block) and applies its answer with
//! [`TenantLease::fetched`]. Renewals ([`TenantLease::renewal`]) top the lease up in the
//! background once it falls below half a block, so steady traffic never waits on Redis.
//!
//! Concurrency slots are leased the same way, a few at a time: each leased slot is an entry of
//! the tenant's shared slot set, so the fleet never has more in flight than `max_concurrent`;
//! a replica holds at most a small block of them idle (fewer admissions elsewhere, never more),
//! and a request that finds no idle slot asks Redis, which counts exactly near the limit.

use std::time::{Duration, Instant};

use super::{LimitKind, RateHeaders, TierLimits};

/// `state.redis.lease`: block sizes and how long an unused lease is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Requests leased at once (capped at the tenant's requests per minute).
    pub requests: u64,
    /// Tokens leased at once (capped at the tenant's tokens per minute).
    pub tokens: u64,
    /// Concurrency slots leased at once (capped at the tenant's `max_concurrent`).
    pub slots: u32,
    /// An unused lease goes back to Redis this long after its last grant.
    pub hold: Duration,
}

impl LeaseSettings {
    /// The block of a budget of `per_minute` units (at least 1, at most the whole budget).
    fn block(self, kind: LimitKind, per_minute: u64) -> u64 {
        let size = match kind {
            LimitKind::Requests => self.requests,
            LimitKind::Tokens => self.tokens,
        };
        size.min(per_minute).max(1)
    }

    fn slot_block(self, max_concurrent: u32) -> u32 {
        self.slots.min(max_concurrent).max(1)
    }
}

/// The concurrency slots this replica holds in the tenant's shared slot set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Slots {
    /// Ids of the slot entries this replica owns in Redis.
    owned: Vec<u64>,
    /// How many of them requests are using.
    in_use: u32,
    /// The most in use at once since the last trim.
    peak: u32,
    /// Slots asked for and not answered yet.
    pending: u32,
    /// The fleet had fewer free slots than a block at the last answer: idle slots go back at
    /// once, so near the limit Redis counts exactly.
    near_limit: bool,
}

impl Slots {
    fn idle(&self) -> u32 {
        u32::try_from(self.owned.len())
            .unwrap_or(u32::MAX)
            .saturating_sub(self.in_use)
    }

    /// Takes up to `n` idle slot ids off the set (to give back to Redis).
    fn give(&mut self, n: u32) -> Vec<u64> {
        let n = n.min(self.idle()) as usize;
        let keep = self.owned.len() - n;
        self.owned.split_off(keep)
    }
}

/// One budget's (requests or tokens) lease on this replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Pool {
    /// Units leased and not spent; negative after charges past the reservation (a debt the next
    /// grant pays first).
    held: i64,
    /// Units asked for in fetches and renewals not answered yet.
    pending: u64,
    /// The fleet's cell had nothing left: refuse locally until then.
    dry_until: Option<Instant>,
    /// Units the fleet's cell had left at the last answer (for the headers).
    fleet_left: u64,
    /// When the fleet's cell is full again, as of the last answer.
    full_at: Option<Instant>,
}

impl Pool {
    fn short_of(&self, need: u64) -> bool {
        need > 0 && self.held < as_i64(need)
    }

    fn dry(&self, now: Instant) -> Option<Duration> {
        self.dry_until
            .filter(|t| *t > now)
            .map(|t| t.saturating_duration_since(now))
    }

    /// Units to ask for: what the request lacks plus a top-up to one block after it.
    fn ask(&self, need: u64, block: u64) -> (u64, u64) {
        let lack = u64::try_from(as_i64(need) - self.held).unwrap_or(0);
        let want = as_i64(need) + as_i64(block) - self.held - as_i64(self.pending);
        let want = u64::try_from(want).unwrap_or(0).max(lack);
        (lack, want - lack)
    }

    fn remaining(&self) -> u64 {
        self.fleet_left
            .saturating_add(u64::try_from(self.held).unwrap_or(0))
    }
}

fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// What one lease call asks Redis for: per budget, `need` units or nothing, plus up to `more`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ask {
    /// Requests the waiting request lacks (0 for a renewal).
    pub requests_need: u64,
    /// Requests wanted beyond the need (granted as far as the cell allows).
    pub requests_more: u64,
    /// Tokens the waiting request lacks (0 for a renewal).
    pub tokens_need: u64,
    /// Tokens wanted beyond the need.
    pub tokens_more: u64,
    /// Concurrency slots the waiting request lacks (0 or 1).
    pub slots_need: u32,
    /// Slots wanted beyond the need.
    pub slots_more: u32,
    /// Id of the first slot asked for (set by the caller: ids are unique per replica).
    pub slot_base: u64,
}

impl Ask {
    fn slots(&self) -> u32 {
        self.slots_need + self.slots_more
    }
}

/// Redis's answer to an [`Ask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Needs met: units granted, what the cells have left, and (when nothing is left) how long
    /// until the next unit.
    Granted {
        /// Requests and tokens granted.
        granted: (u64, u64),
        /// Units left in the requests and tokens cells.
        left: (u64, u64),
        /// Time until each cell is full again.
        reset: (Duration, Duration),
        /// Time until each dry cell has one unit again (0 when not dry).
        next: (Duration, Duration),
        /// Concurrency slots granted (ids `slot_base..`).
        slots: u32,
        /// Free slots the fleet had left after the grant.
        slots_left: u32,
    },
    /// No concurrency slot was free: nothing was granted.
    Full,
    /// A need did not fit: nothing was granted; the need fits after `retry_after`.
    Refused {
        /// The budget that refused.
        which: LimitKind,
        /// Exact wait for the need to fit.
        retry_after: Duration,
    },
}

/// What the request path does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Admitted from the local lease; the headers are the fleet's as last known plus the lease.
    Admitted(RateHeaders),
    /// Refused locally: the fleet's cell is dry until `retry_after` from now.
    Refused {
        /// The budget that refused.
        which: LimitKind,
        /// Time until it had a unit again, as Redis last said.
        retry_after: Duration,
        /// Headers as last known.
        headers: RateHeaders,
    },
    /// The lease lacks units and the fleet may have some: ask Redis (then [`TenantLease::fetched`]).
    Fetch(Ask),
    /// The tenant has `limit` requests in flight across the fleet.
    Concurrency {
        /// Its `max_concurrent`.
        limit: u32,
    },
    /// The request needs more tokens than the tier's whole burst: never passes.
    TooLarge {
        /// The tokens-per-minute burst.
        burst: u64,
    },
}

/// One tenant's leases on this replica.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantLease {
    requests: Pool,
    tokens: Pool,
    slots: Slots,
    renewing: bool,
    /// When the lease goes back to Redis unless granted again.
    expires: Option<Instant>,
}

/// The units one request takes from each budget its tier limits.
fn needs(limits: &TierLimits, tokens: u64) -> (u64, u64) {
    (
        u64::from(limits.requests_per_minute.is_some()),
        if limits.tokens_per_minute.is_some() {
            tokens
        } else {
            0
        },
    )
}

impl TenantLease {
    /// Admits one request costing `tokens` from the local lease, or says what to do instead.
    /// A step other than [`Step::Admitted`] takes nothing.
    pub fn admit(
        &mut self,
        cfg: LeaseSettings,
        limits: &TierLimits,
        tokens: u64,
        now: Instant,
    ) -> Step {
        if let Some(tpm) = limits.tokens_per_minute
            && tokens > tpm
        {
            return Step::TooLarge { burst: tpm };
        }
        let (need_r, need_t) = needs(limits, tokens);
        let (short_r, short_t) = (self.requests.short_of(need_r), self.tokens.short_of(need_t));
        let short_s = limits.max_concurrent.is_some() && self.slots.idle() == 0;
        if !short_r && !short_t && !short_s {
            self.take(limits, tokens);
            return Step::Admitted(self.headers(limits, now));
        }
        // A short budget whose fleet cell is dry refuses at once; the longer wait is the answer.
        let dry_r = short_r.then(|| self.requests.dry(now)).flatten();
        let dry_t = short_t.then(|| self.tokens.dry(now)).flatten();
        let refusal = match (dry_r, dry_t) {
            (Some(r), Some(t)) if t > r => Some((LimitKind::Tokens, t)),
            (Some(r), _) => Some((LimitKind::Requests, r)),
            (None, Some(t)) => Some((LimitKind::Tokens, t)),
            (None, None) => None,
        };
        if let Some((which, retry_after)) = refusal {
            return Step::Refused {
                which,
                retry_after,
                headers: self.headers(limits, now),
            };
        }
        let mut ask = Ask::default();
        if let Some(rpm) = limits.requests_per_minute {
            let block = cfg.block(LimitKind::Requests, rpm);
            (ask.requests_need, ask.requests_more) = self.requests.ask(need_r, block);
            self.requests.pending += ask.requests_need + ask.requests_more;
        }
        if let Some(tpm) = limits.tokens_per_minute {
            let block = cfg.block(LimitKind::Tokens, tpm);
            (ask.tokens_need, ask.tokens_more) = self.tokens.ask(need_t, block);
            self.tokens.pending += ask.tokens_need + ask.tokens_more;
        }
        if let Some(limit) = limits.max_concurrent {
            // Near the limit only the need is asked for: Redis counts exactly.
            let block = if self.slots.near_limit {
                0
            } else {
                cfg.slot_block(limit)
            };
            ask.slots_need = u32::from(short_s);
            // Top up to one idle block after this request.
            let after = self.slots.idle() + self.slots.pending;
            ask.slots_more = (block + u32::from(short_s)).saturating_sub(after + ask.slots_need);
            self.slots.pending += ask.slots();
        }
        Step::Fetch(ask)
    }

    /// The request's units out of the lease (its slot among them).
    fn take(&mut self, limits: &TierLimits, tokens: u64) {
        let (need_r, need_t) = needs(limits, tokens);
        self.requests.held -= as_i64(need_r);
        self.tokens.held -= as_i64(need_t);
        if limits.max_concurrent.is_some() {
            self.slots.in_use += 1;
            self.slots.peak = self.slots.peak.max(self.slots.in_use);
        }
    }

    /// Applies the answer to a [`Step::Fetch`] for a request costing `tokens`: admitted (the
    /// request takes its units) with its headers, or refused with the exact wait.
    pub fn fetched(
        &mut self,
        (cfg, limits): (LeaseSettings, &TierLimits),
        (ask, answer): (Ask, Answer),
        tokens: u64,
        now: Instant,
    ) -> Step {
        self.apply(cfg, ask, answer, now);
        match answer {
            Answer::Granted { .. } => {
                self.take(limits, tokens);
                Step::Admitted(self.headers(limits, now))
            }
            Answer::Full => Step::Concurrency {
                limit: limits.max_concurrent.unwrap_or(0),
            },
            Answer::Refused { which, retry_after } => Step::Refused {
                which,
                retry_after,
                headers: self.headers(limits, now),
            },
        }
    }

    /// A background top-up when a budget fell below half a block and its cell is not known to
    /// be dry; `None` while one is under way or none is needed.
    pub fn renewal(
        &mut self,
        cfg: LeaseSettings,
        limits: &TierLimits,
        now: Instant,
    ) -> Option<Ask> {
        if self.renewing {
            return None;
        }
        let top_up = |pool: &Pool, per_minute: Option<u64>, kind: LimitKind| -> u64 {
            let Some(per_minute) = per_minute else {
                return 0;
            };
            let block = as_i64(cfg.block(kind, per_minute));
            let have = pool.held + as_i64(pool.pending);
            if have * 2 >= block || pool.dry(now).is_some() {
                return 0;
            }
            u64::try_from(block - have).unwrap_or(0)
        };
        let slots_more = limits.max_concurrent.map_or(0, |limit| {
            if self.slots.near_limit {
                return 0;
            }
            let block = cfg.slot_block(limit);
            let have = self.slots.idle() + self.slots.pending;
            if have * 2 >= block { 0 } else { block - have }
        });
        let ask = Ask {
            requests_more: top_up(
                &self.requests,
                limits.requests_per_minute,
                LimitKind::Requests,
            ),
            tokens_more: top_up(&self.tokens, limits.tokens_per_minute, LimitKind::Tokens),
            slots_more,
            ..Ask::default()
        };
        if ask.requests_more == 0 && ask.tokens_more == 0 && ask.slots_more == 0 {
            return None;
        }
        self.renewing = true;
        self.requests.pending += ask.requests_more;
        self.tokens.pending += ask.tokens_more;
        self.slots.pending += ask.slots_more;
        Some(ask)
    }

    /// Applies the answer to a [`TenantLease::renewal`] (`None`: Redis did not answer).
    pub fn renewed(&mut self, cfg: LeaseSettings, ask: Ask, answer: Option<Answer>, now: Instant) {
        self.renewing = false;
        match answer {
            Some(answer) => self.apply(cfg, ask, answer, now),
            None => self.abandon(ask),
        }
    }

    /// Forgets an ask Redis never answered.
    pub fn abandon(&mut self, ask: Ask) {
        let asked = |need: u64, more: u64| need + more;
        self.requests.pending = self
            .requests
            .pending
            .saturating_sub(asked(ask.requests_need, ask.requests_more));
        self.tokens.pending = self
            .tokens
            .pending
            .saturating_sub(asked(ask.tokens_need, ask.tokens_more));
        self.slots.pending = self.slots.pending.saturating_sub(ask.slots());
    }

    fn apply(&mut self, cfg: LeaseSettings, ask: Ask, answer: Answer, now: Instant) {
        self.abandon(ask);
        match answer {
            Answer::Granted {
                granted,
                left,
                reset,
                next,
                slots,
                slots_left,
            } => {
                self.slots.near_limit = slots_left < cfg.slots;
                self.slots
                    .owned
                    .extend((0..u64::from(slots)).map(|i| ask.slot_base + i));
                for (pool, granted, left, reset, next) in [
                    (&mut self.requests, granted.0, left.0, reset.0, next.0),
                    (&mut self.tokens, granted.1, left.1, reset.1, next.1),
                ] {
                    pool.held += as_i64(granted);
                    pool.fleet_left = left;
                    pool.full_at = Some(now + reset);
                    pool.dry_until = (left == 0 && !next.is_zero()).then(|| now + next);
                }
                self.expires = Some(now + cfg.hold);
            }
            Answer::Refused { which, retry_after } => {
                let pool = match which {
                    LimitKind::Requests => &mut self.requests,
                    LimitKind::Tokens => &mut self.tokens,
                };
                pool.dry_until = Some(now + retry_after);
                pool.fleet_left = 0;
            }
            // Slots free at any moment: the next request short of one asks again.
            Answer::Full => self.slots.near_limit = true,
        }
    }

    /// Settles a leased request's tokens: the unused reservation comes back to the lease, an
    /// excess is owed by it. Returns the tokens to give back to Redis (the lease past two blocks
    /// is trimmed to one).
    pub fn settle(
        &mut self,
        cfg: LeaseSettings,
        tpm: Option<u64>,
        (reserved, actual): (u64, u64),
    ) -> u64 {
        let Some(tpm) = tpm else { return 0 };
        self.tokens.held += as_i64(reserved) - as_i64(actual);
        let block = as_i64(cfg.block(LimitKind::Tokens, tpm));
        if self.tokens.held <= 2 * block {
            return 0;
        }
        let excess = self.tokens.held - block;
        self.tokens.held = block;
        u64::try_from(excess).unwrap_or(0)
    }

    /// Frees a leased request's concurrency slot; returns the ids of idle slots to give back to
    /// Redis at once: all of them while the fleet is near its limit (or the tier lost its cap).
    /// Otherwise idle slots wait for [`TenantLease::trim_slots`], so a replica whose in-flight
    /// count wobbles does not give back and fetch again.
    pub fn release_slot(&mut self, max_concurrent: Option<u32>) -> Vec<u64> {
        self.slots.in_use = self.slots.in_use.saturating_sub(1);
        if self.slots.near_limit || max_concurrent.is_none() {
            return self.slots.give(self.slots.idle());
        }
        Vec::new()
    }

    /// Trims the leased slots to the most in use since the last trim plus one block (run every
    /// heartbeat); returns the ids to give back.
    pub fn trim_slots(&mut self, cfg: LeaseSettings, max_concurrent: Option<u32>) -> Vec<u64> {
        let block = max_concurrent.map_or(0, |limit| cfg.slot_block(limit));
        let keep = self.slots.peak.max(self.slots.in_use) + block;
        self.slots.peak = self.slots.in_use;
        let owned = u32::try_from(self.slots.owned.len()).unwrap_or(u32::MAX);
        self.slots.give(owned.saturating_sub(keep))
    }

    /// Ids of the slot entries this replica owns (their expiry is refreshed every heartbeat).
    pub fn slot_ids(&self) -> &[u64] {
        &self.slots.owned
    }

    /// When the lease is unused past its hold (nothing under way): the requests and tokens it
    /// held, now given up, to hand back to Redis.
    pub fn expire(&mut self, now: Instant) -> Option<((u64, u64), Vec<u64>)> {
        let idle = !self.renewing
            && self.requests.pending == 0
            && self.tokens.pending == 0
            && self.slots.pending == 0;
        if !idle || self.expires.is_none_or(|t| t > now) {
            return None;
        }
        self.expires = None;
        let give = |pool: &mut Pool| {
            let n = u64::try_from(pool.held).unwrap_or(0);
            pool.held = pool.held.min(0);
            n
        };
        let units = (give(&mut self.requests), give(&mut self.tokens));
        let slots = self.slots.give(self.slots.idle());
        (units != (0, 0) || !slots.is_empty()).then_some((units, slots))
    }

    /// Requests and tokens held (for the Redis record of this lease).
    pub fn held(&self) -> (i64, i64) {
        (self.requests.held, self.tokens.held)
    }

    /// The rate headers as this replica knows them: the fleet's cell at the last answer plus
    /// the local lease (approximate within a block).
    fn headers(&self, limits: &TierLimits, now: Instant) -> RateHeaders {
        let reset = |p: &Pool| {
            p.full_at
                .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
        };
        RateHeaders {
            limit_requests: limits.requests_per_minute,
            remaining_requests: limits
                .requests_per_minute
                .map(|_| self.requests.remaining()),
            reset_requests: limits.requests_per_minute.map(|_| reset(&self.requests)),
            limit_tokens: limits.tokens_per_minute,
            remaining_tokens: limits.tokens_per_minute.map(|_| self.tokens.remaining()),
            reset_tokens: limits.tokens_per_minute.map(|_| reset(&self.tokens)),
        }
    }
}

#[cfg(test)]
#[path = "lease_tests.rs"]
mod tests;
