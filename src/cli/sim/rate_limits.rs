//! The tiers' per-tenant rate limits on the virtual clock (`sim --rate-limits`): the gateway's
//! own limiter ([`InProcessLimiter`]: requests and tokens per minute, GCRA) reserves prompt plus
//! `max_tokens` on arrival, as the meter phase does, and is settled with the real usage when
//! the answer ends (refunded whole when none came). A refusal is the gateway's 429 (400 for a
//! request over the whole token burst). Concurrency caps are not modelled: they hold a slot the
//! body upload also holds, which the simulator has no notion of.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use infergate::limits::{InProcessLimiter, Limiter, Rejection, TierLimits};

/// The limiter, the reservations it holds and what it refused.
pub(super) struct SimLimits {
    limiter: InProcessLimiter,
    /// Virtual time 0 on the limiter's clock.
    epoch: Instant,
    /// Request id → (tenant, tokens reserved), until settled.
    held: HashMap<u64, (String, u64)>,
    /// Refusals: over a per-minute budget (429), over the whole burst (400).
    rate_limited: u64,
    never_fits: u64,
}

impl SimLimits {
    /// An empty limiter.
    pub(super) fn new() -> Self {
        Self {
            limiter: InProcessLimiter::new(),
            epoch: Instant::now(),
            held: HashMap::new(),
            rate_limited: 0,
            never_fits: 0,
        }
    }

    fn at(&self, t: f64) -> Instant {
        self.epoch + Duration::from_secs_f64(t.max(0.0))
    }

    /// Reserves `tokens` for request `id` of `tenant` at virtual time `t` under `limits`: `None`
    /// when it passes, else the status the gateway answers.
    pub(super) fn admit(
        &mut self,
        id: u64,
        tenant: &str,
        limits: &TierLimits,
        tokens: u64,
        t: f64,
    ) -> Option<u16> {
        if !limits.rated() {
            return None;
        }
        match self.limiter.acquire(tenant, limits, tokens, self.at(t)) {
            Ok(reservation) => {
                self.held
                    .insert(id, (tenant.to_owned(), reservation.tokens));
                None
            }
            Err(Rejection::TooLarge { .. }) => {
                self.never_fits += 1;
                Some(400)
            }
            Err(_) => {
                self.rate_limited += 1;
                Some(429)
            }
        }
    }

    /// Request `id` ended at `t` having used `actual` tokens (0: no answer, refunded whole).
    pub(super) fn settle(&mut self, id: u64, actual: u64, t: f64) {
        if let Some((tenant, reserved)) = self.held.remove(&id) {
            self.limiter
                .reconcile(&tenant, reserved, actual, self.at(t));
        }
    }

    /// Refusals for the report's `extra`.
    pub(super) fn extra(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("rate_limited", self.rate_limited as f64),
            ("rate_never_fits", self.never_fits as f64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tpm(n: u64) -> TierLimits {
        TierLimits {
            tokens_per_minute: Some(n),
            ..TierLimits::default()
        }
    }

    #[test]
    fn a_tenant_over_its_tokens_per_minute_gets_429_until_the_budget_refills() {
        let mut l = SimLimits::new();
        let limits = tpm(6_000);
        // The burst is a minute's budget: 6 requests of 1,000 tokens pass at once.
        for id in 0..6 {
            assert_eq!(l.admit(id, "a", &limits, 1_000, 0.0), None);
        }
        assert_eq!(l.admit(6, "a", &limits, 1_000, 0.0), Some(429));
        // Another tenant has its own budget.
        assert_eq!(l.admit(7, "b", &limits, 1_000, 0.0), None);
        // 100 tokens per second refill: 1,000 tokens 10 s later.
        assert_eq!(l.admit(8, "a", &limits, 1_000, 10.5), None);
        assert_eq!(l.extra()[0], ("rate_limited", 1.0));
        // Over the whole burst: never passes.
        assert_eq!(l.admit(9, "b", &limits, 7_000, 60.0), Some(400));
    }

    #[test]
    fn settling_refunds_what_the_answer_did_not_use() {
        let mut l = SimLimits::new();
        let limits = tpm(2_000);
        assert_eq!(l.admit(1, "a", &limits, 2_000, 0.0), None);
        assert_eq!(l.admit(2, "a", &limits, 1_000, 0.0), Some(429));
        l.settle(1, 500, 0.0);
        assert_eq!(l.admit(3, "a", &limits, 1_000, 0.0), None);
        // Unlimited tiers reserve nothing.
        assert_eq!(
            l.admit(4, "a", &TierLimits::default(), 1_000_000, 0.0),
            None
        );
    }
}
