//! Admit: the request waits in its pool's bounded priority queue (tier priority, then arrival,
//! or with `fair_share` the tenant with the least weighted service), leaving at once if the
//! client goes. A full queue, or a wait past its deadline, is a 429 with
//! a Retry-After from the observed drain rate (503 while draining).

use std::time::Instant;

use super::ctx::RequestCtx;
use crate::admission::{Permit, Refusal, Ticket};
use crate::config::TierSpec;
use crate::error::GatewayError;
use crate::workers::pool::PoolRuntime;

/// Waits for `pool`'s permit at `tier`'s priority for `tenant`, whose request may use
/// `tokens` (prompt estimate, most completion tokens): with fair share, its estimated service.
pub(super) async fn admit(
    pool: &PoolRuntime,
    (tier, tenant): (&TierSpec, &str),
    tokens: (u64, u64),
    ctx: &mut RequestCtx,
) -> Result<Permit, GatewayError> {
    let (_, queue) = &pool.admission;
    let depth = &pool.series.queue_depth;
    depth.set(queue.depth() as f64 + 1.0);
    let cost = queue
        .fair_share()
        .map_or(0.0, |weights| weights.cost(tokens.0, tokens.1));
    let ticket = Ticket {
        priority: tier.priority,
        tenant,
        cost,
    };
    let permit = queue.admit(ticket, Instant::now()).await;
    depth.set(queue.depth() as f64);
    let permit = permit.map_err(|refusal| {
        let secs = crate::limits::retry_after_secs(refusal.retry_after());
        match refusal {
            Refusal::Draining { .. } => GatewayError::Draining,
            other => GatewayError::TooManyRequests {
                message: format!("pool `{}`: {other}", pool.name),
                retry_after_secs: secs,
                headers: Vec::new(),
                reason: other.reason(),
            },
        }
    })?;
    pool.series
        .queue_wait
        .observe(permit.waited().as_secs_f64());
    pool.degrade.record_queue_wait(permit.waited());
    ctx.exit.queued(permit.waited());
    Ok(permit)
}
