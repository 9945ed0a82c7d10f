//! Meter: what the request may cost is reserved before it runs: the tenant's cost budgets (the
//! spend so far plus what its requests in flight may cost), then its requests- and
//! tokens-per-minute (prompt plus `max_tokens`; in fleet mode one Redis round trip). The
//! reservation lives in an [`Account`], which reconciles it with the real usage when the answer
//! ends, or refunds it whole if none starts.

use std::time::Instant;

use super::ctx::RequestCtx;
use super::reservation::{Account, Usage};
use crate::config::{Snapshot, TenantSpec, TierSpec};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::limits::{ConcurrencySlot, Rejection, Reservation};
use crate::pipeline::validate::request::{PromptSize, ValidRequest};
use crate::request_body::BodyHold;
use crate::usage_check::UsageBounds;

/// What metering hands on: the account that settles the request, and the limiter's answer
/// (its `x-ratelimit-*` headers go on the response).
pub(super) struct Metered {
    /// Settles the reservation once. Boxed: it is large, and it moves from here through forward
    /// into the body's end hook (each move of the value a copy of it).
    pub account: Box<Account>,
    /// The limiter's reservation.
    pub reservation: Reservation,
}

/// Reserves `valid`'s cost for `tenant`: budgets first, then the rate limits (a refusal there
/// releases the budget reservation). `holds` are the tenant's concurrency slot and the body's
/// budget share, kept until the request ends. Degradation and the canary split run later, so the
/// reservation is an upper bound: the client's `max_tokens` (before any cap) at the dearest of the
/// model's versions; the account settles it against what the request really cost. A degradation
/// cap therefore never lets a request pass that its tier's tokens per minute would refuse.
pub(super) async fn meter(
    gw: &Gateway,
    snapshot: &Snapshot,
    (tenant, tier): (&TenantSpec, &TierSpec),
    valid: &ValidRequest,
    prompt_tokens: u64,
    holds: (ConcurrencySlot, BodyHold),
    ctx: &RequestCtx,
) -> Result<Metered, GatewayError> {
    let budgets = snapshot.budgets_of(&tenant.name, tier);
    // The worker may produce `max_tokens` for each of the `n` choices.
    let completion_max = valid.max_tokens.saturating_mul(u64::from(valid.n));
    let budget_estimate = if budgets.is_empty() {
        0
    } else {
        let reserved = crate::pricing::TokenCounts {
            prompt: prompt_tokens,
            cached: 0,
            completion: completion_max,
        };
        let cost = |served: &str| {
            snapshot
                .prices
                .cost(served, &valid.model, &tier.name, reserved)
                .nano_usd
        };
        match snapshot.canaries.get(&valid.model) {
            Some(spec) => spec
                .versions
                .iter()
                .map(|v| cost(&v.model))
                .fold(cost(&valid.model), u64::max),
            None => cost(&valid.model),
        }
    };
    let check = gw
        .budgets
        .admit(&tenant.name, budgets, budget_estimate, crate::utc::now_ms())
        .map_err(|refusal| GatewayError::BudgetExceeded {
            message: refusal.message(&tenant.name),
            retry_after_secs: u64::try_from(refusal.retry_after_ms)
                .unwrap_or(0)
                .div_ceil(1000)
                .max(1),
        })?;
    for (over, spent) in &check.soft_first {
        tracing::warn!(
            request_id = ctx.request_id,
            tenant = %tenant.name,
            period = over.period.as_str(),
            limit = %crate::pricing::format_usd_cents(over.limit_nano),
            spent = %crate::pricing::format_usd_cents(*spent),
            "tenant is over its soft budget (requests still pass)"
        );
    }
    for over in &check.soft_over {
        gw.metrics
            .budget_soft_exceeded
            .with_label_values(&[&tenant.name, over.period.as_str()])
            .inc();
    }
    let budget_periods = crate::budgets::periods(budgets);
    let usage = Usage {
        prices: snapshot.prices.clone(),
        tier: tier.name.clone(),
        budgets: gw.budgets.clone(),
        budget_periods: budget_periods.clone(),
        budget_estimate,
        bounds: UsageBounds {
            prompt_estimate: prompt_tokens,
            prompt_exact: matches!(valid.prompt, PromptSize::Tokens(_)),
            media_parts: valid.media_parts,
            completion_max,
        },
        check: snapshot.usage_check,
    };
    let limits = tier.limits();
    let reserve = prompt_tokens.saturating_add(completion_max);
    // Fleet mode: one round trip to Redis for the tenant's shared rate and concurrency.
    let acquired = match &gw.shared {
        // Boxed: its future is large, and without Redis this one's stays small.
        Some(shared) => {
            infergate_engine::edge::boxed(|| shared.acquire(&tenant.name, &limits, reserve))
                .await
                .map(|(r, held)| (r, Some(held)))
        }
        None => gw
            .limiter
            .acquire(&tenant.name, &limits, reserve, Instant::now())
            .map(|r| (r, None)),
    };
    let (reservation, held) = match acquired {
        Ok(r) => r,
        Err(r) => {
            // Refused after the budget reserved: release it.
            gw.budgets.settle(
                &tenant.name,
                &budget_periods,
                budget_estimate,
                0,
                crate::utc::now_ms(),
            );
            return Err(rejection_error(r, reserve));
        }
    };
    let mut account = Box::new(Account::new(
        gw.limiter.clone(),
        gw.metrics.clone(),
        &tenant.name,
        (reserve, prompt_tokens),
        holds,
        usage,
    ));
    if let (Some(shared), Some(held)) = (&gw.shared, held) {
        account.shared_by(shared.clone(), limits, held);
    } else if gw.shared.is_none() && !limits.rated() {
        account.unrated();
    }
    Ok(Metered {
        account,
        reservation,
    })
}

/// A limiter refusal as the answer the client gets.
pub(super) fn rejection_error(r: Rejection, reserve: u64) -> GatewayError {
    match r {
        Rejection::RateLimited {
            retry_after,
            which,
            headers,
        } => GatewayError::TooManyRequests {
            message: format!(
                "Rate limit reached for {} (this request needs {reserve} tokens). Try again in {}.",
                which.as_str(),
                crate::limits::format_reset(retry_after)
            ),
            retry_after_secs: crate::limits::retry_after_secs(retry_after),
            headers: headers.header_pairs(),
            reason: "rate",
        },
        Rejection::TooLarge { tokens, burst } => GatewayError::NeverFits(format!(
            "this request needs {tokens} tokens (prompt plus max_tokens) but your tier allows at most {burst} tokens per minute: it can never pass; lower max_tokens or shorten the prompt"
        )),
        Rejection::Concurrency { limit } => GatewayError::TooManyRequests {
            message: format!("too many requests in flight: your tier allows {limit} at once"),
            retry_after_secs: 1,
            headers: Vec::new(),
            reason: "rate",
        },
    }
}
