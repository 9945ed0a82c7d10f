//! Per-tenant limits: requests per minute, tokens per minute (GCRA cells that can refund and
//! charge after the response) and a concurrency cap, behind the small [`Limiter`] trait so a
//! shared store (Redis) can replace the in-process one when several gateway replicas run.
//!
//! Right after authentication the request takes a concurrency slot ([`ConcurrencySlot`], before
//! its body is read); the meter phase calls [`Limiter::acquire`] with the request's estimated
//! tokens (prompt plus reserved completion); the account phase calls [`Limiter::reconcile`] with
//! the real usage and drops the slot once the response body ends or the client goes away.

use std::fmt;
use std::time::{Duration, Instant};

pub mod gcra;
pub mod headers;
pub mod in_process;
pub mod lease;
pub mod shared;

pub use gcra::{Decision, Gcra};
pub use headers::{RateHeaders, format_reset, retry_after_secs};
pub use in_process::InProcessLimiter;
pub use lease::LeaseSettings;
pub use shared::{Held, LeaseCalls, RedisSettings, SharedLimiter};

/// A tier's limits; `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierLimits {
    /// Requests per minute (also the burst). Default: unlimited.
    pub requests_per_minute: Option<u64>,
    /// Tokens (prompt + reserved completion) per minute, also the burst. Default: unlimited.
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight at once. Default: unlimited.
    pub max_concurrent: Option<u32>,
}

impl TierLimits {
    /// Whether requests or tokens per minute are limited (else nothing is reserved or settled).
    pub fn rated(&self) -> bool {
        self.requests_per_minute.is_some() || self.tokens_per_minute.is_some()
    }
}

/// What an admitted request holds: the tokens reserved, to reconcile later, and the headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Tokens reserved by this request (pass back to [`Limiter::reconcile`]).
    pub tokens: u64,
    /// Rate-limit headers to send with the response.
    pub headers: RateHeaders,
}

/// Which budget refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// The requests-per-minute budget.
    Requests,
    /// The tokens-per-minute budget.
    Tokens,
}

impl LimitKind {
    /// "requests" or "tokens", as used in headers and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::Tokens => "tokens",
        }
    }
}

/// Why a request was not admitted; nothing was consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Over a per-minute budget: the request passes after exactly `retry_after` (429; the caller
    /// rounds it up to whole seconds for `Retry-After`).
    RateLimited {
        retry_after: Duration,
        which: LimitKind,
        headers: RateHeaders,
    },
    /// The request needs more tokens than the whole token burst: it can never pass (not a 429).
    TooLarge { tokens: u64, burst: u64 },
    /// The tenant already has `limit` requests in flight.
    Concurrency { limit: u32 },
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RateLimited {
                retry_after, which, ..
            } => write!(
                f,
                "rate limit reached for {}; retry after {}",
                which.as_str(),
                format_reset(*retry_after)
            ),
            Self::TooLarge { tokens, burst } => write!(
                f,
                "request needs {tokens} tokens but the tier allows at most {burst} tokens per \
                 minute: it can never pass; reduce the prompt or max_tokens"
            ),
            Self::Concurrency { limit } => {
                write!(f, "too many concurrent requests (limit {limit})")
            }
        }
    }
}

impl std::error::Error for Rejection {}

/// A per-tenant limiter. Small on purpose, so a shared store can implement it.
pub trait Limiter: Send + Sync {
    /// Takes one of the tenant's concurrency slots, or refuses with [`Rejection::Concurrency`].
    /// Taken right after authentication, before the body is read, so a tenant's unfinished
    /// uploads count against its own concurrency. Freed by [`Limiter::release_concurrency`].
    fn acquire_slot(&self, tenant: &str, limits: &TierLimits) -> Result<(), Rejection>;

    /// Admits one request costing `tokens` if its request and token budgets both allow it, and
    /// consumes both together; a refused request consumes nothing.
    fn acquire(
        &self,
        tenant: &str,
        limits: &TierLimits,
        tokens: u64,
        now: Instant,
    ) -> Result<Reservation, Rejection>;

    /// Settles a reservation with real usage: refunds unused tokens or charges the excess.
    fn reconcile(&self, tenant: &str, reserved: u64, actual: u64, now: Instant);

    /// Frees the concurrency slot taken by a successful [`Limiter::acquire_slot`].
    fn release_concurrency(&self, tenant: &str);
}

/// A tenant's concurrency slot, given back when dropped. Under a tier without a concurrency limit
/// nothing is counted (a reload that adds one counts the requests that start after it).
pub struct ConcurrencySlot {
    held: Option<(std::sync::Arc<dyn Limiter>, String)>,
}

impl ConcurrencySlot {
    /// Takes a slot of `tenant` (see [`Limiter::acquire_slot`]).
    pub fn take(
        limiter: std::sync::Arc<dyn Limiter>,
        tenant: &str,
        limits: &TierLimits,
    ) -> Result<Self, Rejection> {
        if limits.max_concurrent.is_none() {
            return Ok(Self { held: None });
        }
        limiter.acquire_slot(tenant, limits)?;
        Ok(Self {
            held: Some((limiter, tenant.to_owned())),
        })
    }
}

impl Drop for ConcurrencySlot {
    fn drop(&mut self) {
        if let Some((limiter, tenant)) = &self.held {
            limiter.release_concurrency(tenant);
        }
    }
}
