//! A pure GCRA (generic cell rate algorithm) cell with refunds and after-the-fact charges.
//!
//! `governor` implements the same algorithm, but it can only *check* a cost up front: it cannot
//! refund part of a reservation nor charge extra after the response, and token reconciliation
//! needs both (a request reserves its prompt plus `max_tokens`, then the worker reports what it
//! really used). So the cell is kept here: no clock, no locking, time is always passed in.
//!
//! State is one theoretical arrival time (TAT). Time is counted in exact integer *ticks*: one
//! nanosecond is `per_minute` ticks and one unit of cost is 60·10⁹ ticks, so the emission interval
//! (60 s / per_minute) never rounds and a waited `retry_after` is always enough.

use std::time::{Duration, Instant};

/// Ticks per unit of cost: one minute in nanoseconds (a nanosecond is `per_minute` ticks).
const TICKS_PER_UNIT: u128 = 60_000_000_000;

/// The answer of [`Gcra::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The cost was taken; `remaining` units are left and `reset` is the time until the cell is
    /// fully replenished.
    Allowed { remaining: u64, reset: Duration },
    /// Nothing was taken; the same cost passes after exactly `retry_after`.
    Wait {
        retry_after: Duration,
        remaining: u64,
        reset: Duration,
    },
    /// The cost exceeds the whole burst: it can never pass, however long the caller waits.
    Never { burst: u64 },
}

/// One rate-limit cell: `per_minute` units replenish evenly over a minute, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    per_minute: u64,
    burst: u64,
    /// Set on first use; ticks are counted from here.
    epoch: Option<Instant>,
    /// Theoretical arrival time, in ticks since `epoch`.
    tat: u128,
}

impl Gcra {
    /// A cell refilling `per_minute` units per minute holding at most `burst` (0 means
    /// `per_minute`: a full minute's budget available at once). `per_minute` of 0 is treated as 1.
    pub fn new(per_minute: u64, burst: u64) -> Self {
        let per_minute = per_minute.max(1);
        let burst = if burst == 0 { per_minute } else { burst };
        Self {
            per_minute,
            burst,
            epoch: None,
            tat: 0,
        }
    }

    /// Units replenished per minute.
    pub fn per_minute(&self) -> u64 {
        self.per_minute
    }

    /// Largest cost that can ever pass at once.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Time for one unit to replenish (60 s / per_minute, rounded up to a nanosecond).
    pub fn emission_interval(&self) -> Duration {
        self.ticks_to_duration(TICKS_PER_UNIT)
    }

    /// Takes `n` units if they are available now; otherwise says exactly how long to wait.
    pub fn check(&mut self, n: u64, now: Instant) -> Decision {
        if n > self.burst {
            return Decision::Never { burst: self.burst };
        }
        let now_t = self.anchor(now);
        let base = self.tat.max(now_t);
        let new_tat = base + cost(n);
        let allow_at = new_tat.saturating_sub(cost(self.burst));
        if allow_at <= now_t {
            self.tat = new_tat;
            Decision::Allowed {
                remaining: self.remaining_at(now_t),
                reset: self.ticks_to_duration(new_tat - now_t),
            }
        } else {
            Decision::Wait {
                retry_after: self.ticks_to_duration(allow_at - now_t),
                remaining: self.remaining_at(now_t),
                reset: self.ticks_to_duration(base - now_t),
            }
        }
    }

    /// Adds `n` units of cost unconditionally; the cell may go into debt (used when real usage
    /// exceeds what was reserved).
    pub fn charge(&mut self, n: u64, now: Instant) {
        let now_t = self.anchor(now);
        self.tat = self.tat.max(now_t).saturating_add(cost(n));
    }

    /// Gives `n` units back, never crediting past a full cell (TAT never goes below `now`).
    pub fn refund(&mut self, n: u64, now: Instant) {
        let now_t = self.anchor(now);
        self.tat = self.tat.saturating_sub(cost(n)).max(now_t);
    }

    /// Units that would pass at `now`.
    pub fn remaining(&self, now: Instant) -> u64 {
        match self.epoch {
            Some(epoch) => self.remaining_at(self.ticks_since(epoch, now)),
            None => self.burst,
        }
    }

    /// Time from `now` until the cell is full again.
    pub fn reset(&self, now: Instant) -> Duration {
        match self.epoch {
            Some(epoch) => {
                self.ticks_to_duration(self.tat.saturating_sub(self.ticks_since(epoch, now)))
            }
            None => Duration::ZERO,
        }
    }

    fn anchor(&mut self, now: Instant) -> u128 {
        let epoch = *self.epoch.get_or_insert(now);
        self.ticks_since(epoch, now)
    }

    fn ticks_since(&self, epoch: Instant, now: Instant) -> u128 {
        now.saturating_duration_since(epoch).as_nanos() * u128::from(self.per_minute)
    }

    fn remaining_at(&self, now_t: u128) -> u64 {
        let used = self.tat.saturating_sub(now_t);
        let left = cost(self.burst).saturating_sub(used) / TICKS_PER_UNIT;
        u64::try_from(left).unwrap_or(u64::MAX)
    }

    /// Ticks to a duration, rounded up to the next nanosecond.
    fn ticks_to_duration(&self, ticks: u128) -> Duration {
        let nanos = ticks.div_ceil(u128::from(self.per_minute));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

fn cost(n: u64) -> u128 {
    u128::from(n).saturating_mul(TICKS_PER_UNIT)
}

#[cfg(test)]
#[path = "gcra_tests.rs"]
mod tests;
