//! The in-process [`Limiter`]: one map of tenant → cells behind a mutex. Right for a single
//! gateway replica; entries are created on a tenant's first request (tenants are authenticated
//! first, so the map is bounded by the configured tenants).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Decision, Gcra, LimitKind, Limiter, RateHeaders, Rejection, Reservation, TierLimits};

/// One tenant's live state.
#[derive(Debug, Default)]
struct TenantState {
    rpm: Option<Gcra>,
    tpm: Option<Gcra>,
    in_flight: u32,
}

impl TenantState {
    /// Rebuilds a cell whose configured rate changed (a tier edit or a tenant moving tier).
    fn sync(&mut self, limits: &TierLimits) {
        sync_cell(&mut self.rpm, limits.requests_per_minute);
        sync_cell(&mut self.tpm, limits.tokens_per_minute);
    }
}

fn sync_cell(cell: &mut Option<Gcra>, per_minute: Option<u64>) {
    let current = cell.as_ref().map(|g| g.per_minute());
    if current != per_minute.map(|n| n.max(1)) {
        *cell = per_minute.map(|n| Gcra::new(n, n));
    }
}

/// Per-tenant limits kept in this process.
#[derive(Debug, Default)]
pub struct InProcessLimiter {
    tenants: Mutex<HashMap<String, TenantState>>,
}

impl InProcessLimiter {
    /// An empty limiter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tenants seen so far.
    pub fn tenant_count(&self) -> usize {
        self.lock().len()
    }

    /// Requests the tenant has in flight.
    pub fn in_flight(&self, tenant: &str) -> u32 {
        self.lock().get(tenant).map_or(0, |s| s.in_flight)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, TenantState>> {
        self.tenants.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Checks one cell on a copy: the updated copy if it passes, else the exact wait.
fn check_cell(cell: Option<Gcra>, n: u64, now: Instant) -> Result<Option<Gcra>, Duration> {
    let Some(mut g) = cell else { return Ok(None) };
    match g.check(n, now) {
        Decision::Allowed { .. } => Ok(Some(g)),
        Decision::Wait { retry_after, .. } => Err(retry_after),
        // Ruled out by the caller (TooLarge) before checking; were it reached, it never passes.
        Decision::Never { .. } => Err(Duration::MAX),
    }
}

/// Checks every budget on copies and commits them only if all pass.
fn acquire_in(
    state: &mut TenantState,
    limits: &TierLimits,
    tokens: u64,
    now: Instant,
) -> Result<Reservation, Rejection> {
    state.sync(limits);
    if let Some(g) = state.tpm
        && tokens > g.burst()
    {
        return Err(Rejection::TooLarge {
            tokens,
            burst: g.burst(),
        });
    }
    let (rpm, tpm) = match (
        check_cell(state.rpm, 1, now),
        check_cell(state.tpm, tokens, now),
    ) {
        (Ok(rpm), Ok(tpm)) => (rpm, tpm),
        (rpm, tpm) => {
            // Both must pass: the longer wait is the one that matters.
            let (rpm, tpm) = (rpm.err(), tpm.err());
            let (wait, which) = if rpm >= tpm {
                (rpm, LimitKind::Requests)
            } else {
                (tpm, LimitKind::Tokens)
            };
            let headers = headers(state, now);
            return Err(Rejection::RateLimited {
                retry_after: wait.unwrap_or_default(),
                which,
                headers,
            });
        }
    };
    state.rpm = rpm;
    state.tpm = tpm;
    Ok(Reservation {
        tokens,
        headers: headers(state, now),
    })
}

fn headers(state: &TenantState, now: Instant) -> RateHeaders {
    RateHeaders {
        limit_requests: state.rpm.map(|g| g.per_minute()),
        remaining_requests: state.rpm.map(|g| g.remaining(now)),
        reset_requests: state.rpm.map(|g| g.reset(now)),
        limit_tokens: state.tpm.map(|g| g.per_minute()),
        remaining_tokens: state.tpm.map(|g| g.remaining(now)),
        reset_tokens: state.tpm.map(|g| g.reset(now)),
    }
}

impl Limiter for InProcessLimiter {
    fn acquire_slot(&self, tenant: &str, limits: &TierLimits) -> Result<(), Rejection> {
        let mut tenants = self.lock();
        // One lookup for a tenant seen before (every request but its first).
        let state = match tenants.get_mut(tenant) {
            Some(state) => state,
            None => tenants.entry(tenant.to_owned()).or_default(),
        };
        if let Some(limit) = limits.max_concurrent
            && state.in_flight >= limit
        {
            return Err(Rejection::Concurrency { limit });
        }
        state.in_flight += 1;
        Ok(())
    }

    fn acquire(
        &self,
        tenant: &str,
        limits: &TierLimits,
        tokens: u64,
        now: Instant,
    ) -> Result<Reservation, Rejection> {
        if !limits.rated() {
            // Nothing to count against: no lock, no state (the account skips the reconcile).
            return Ok(Reservation {
                tokens,
                headers: RateHeaders::default(),
            });
        }
        let mut tenants = self.lock();
        if let Some(state) = tenants.get_mut(tenant) {
            return acquire_in(state, limits, tokens, now);
        }
        let mut state = TenantState::default();
        let result = acquire_in(&mut state, limits, tokens, now);
        tenants.insert(tenant.to_owned(), state);
        result
    }

    fn reconcile(&self, tenant: &str, reserved: u64, actual: u64, now: Instant) {
        let mut tenants = self.lock();
        let Some(tpm) = tenants.get_mut(tenant).and_then(|s| s.tpm.as_mut()) else {
            return;
        };
        if actual < reserved {
            tpm.refund(reserved - actual, now);
        } else if actual > reserved {
            tpm.charge(actual - reserved, now);
        }
    }

    fn release_concurrency(&self, tenant: &str) {
        if let Some(state) = self.lock().get_mut(tenant) {
            state.in_flight = state.in_flight.saturating_sub(1);
        }
    }
}

#[cfg(test)]
#[path = "in_process_tests.rs"]
mod tests;
