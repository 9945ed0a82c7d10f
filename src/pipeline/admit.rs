//! Admit: the request waits in its pool's bounded priority queue (tier priority, then arrival,
//! or with `fair_share` the tenant with the least weighted service), leaving at once if the
//! client goes. A request with a deadline (`x-infergate-deadline-ms`, where its tier allows one)
//! is refused at once when the predicted wait is already past it, and waits no longer than it. A full queue, or a wait past its deadline, is a 429 with
//! a Retry-After from the observed drain rate (503 while draining).

use std::time::{Duration, Instant};

use hyper::HeaderMap;

use super::ctx::RequestCtx;
use crate::admission::{Permit, Refusal, Ticket};
use crate::config::TierSpec;
use crate::error::GatewayError;
use crate::metrics::GatewayMetrics;
use crate::workers::pool::PoolRuntime;

/// The header a client names its TTFT deadline in, whole milliseconds.
pub const DEADLINE_HEADER: &str = "x-infergate-deadline-ms";
/// The longest deadline a request may name: one hour.
const MAX_DEADLINE_MS: u64 = 3_600_000;

/// The request's deadline: `x-infergate-deadline-ms`, raised to the tier's `min_deadline` (a
/// client cannot buy an earlier turn by claiming a short one: a deadline only ever refuses it
/// sooner). A 400 when it is not a whole number of milliseconds in 1..=3600000, or when the
/// tier takes no deadlines.
pub(super) fn deadline(
    headers: &HeaderMap,
    tier: &TierSpec,
) -> Result<Option<Duration>, GatewayError> {
    let Some(value) = headers.get(DEADLINE_HEADER) else {
        return Ok(None);
    };
    let bad = |why: &str| GatewayError::bad_request(format!("{DEADLINE_HEADER}: {why}"), None);
    let ms: u64 = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|ms| (1..=MAX_DEADLINE_MS).contains(ms))
        .ok_or_else(|| bad("give whole milliseconds from 1 to 3600000"))?;
    let Some(floor) = tier.min_deadline else {
        return Err(bad(&format!(
            "tier `{}` takes no deadlines (its `min_deadline` in tenants.yaml is not set)",
            tier.name
        )));
    };
    Ok(Some(Duration::from_millis(ms).max(floor)))
}

/// Waits for `pool`'s permit at `tier`'s priority for `tenant`, whose request may use
/// `tokens` (prompt estimate, most completion tokens): with fair share, its estimated service.
/// With a `deadline`, refused at once when the queue predicts a longer wait. `prefix` (the
/// router's prefix hashes) lets fair share prefer a request whose prefix a free worker holds.
pub(super) async fn admit(
    pool: &PoolRuntime,
    (tier, tenant): (&TierSpec, &str),
    (tokens, deadline, prefix): ((u64, u64), Option<Duration>, &[u64]),
    metrics: &GatewayMetrics,
    ctx: &mut RequestCtx,
) -> Result<Permit, GatewayError> {
    let (_, queue) = &pool.admission;
    let depth = &pool.series.queue_depth;
    depth.set(queue.depth() as f64 + 1.0);
    // Weighted at fair share's weights (the defaults under first come, which still measures
    // how evenly it serves: `admission::jain`).
    let cost = queue
        .fair_share()
        .unwrap_or_default()
        .cost(tokens.0, tokens.1);
    let ticket = Ticket {
        priority: tier.priority,
        tenant,
        cost,
        due: None, // the queue sets it from `deadline`
        prefix,
    };
    let permit = queue.admit(ticket, deadline, Instant::now()).await;
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
    if let Ok(h) = metrics
        .tenant_queue_wait
        .get_metric_with_label_values(&[tenant])
    {
        h.observe(permit.waited().as_secs_f64());
    }
    pool.degrade.record_queue_wait(permit.waited());
    ctx.exit.queued(permit.waited());
    Ok(permit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(min_deadline: Option<Duration>) -> TierSpec {
        TierSpec {
            name: "t".into(),
            priority: 0,
            requests_per_minute: None,
            tokens_per_minute: None,
            max_concurrent: None,
            max_tokens: 16,
            default_max_tokens: 16,
            models: vec!["*".into()],
            budgets: Vec::new(),
            min_deadline,
        }
    }

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(DEADLINE_HEADER, value.parse().unwrap());
        h
    }

    #[test]
    fn a_deadline_is_raised_to_the_tiers_floor_and_checked() {
        let floor = tier(Some(Duration::from_millis(200)));
        assert_eq!(deadline(&HeaderMap::new(), &floor), Ok(None));
        assert_eq!(
            deadline(&with("1500"), &floor),
            Ok(Some(Duration::from_millis(1500)))
        );
        // Claiming a shorter deadline than the tier allows buys nothing.
        assert_eq!(
            deadline(&with("5"), &floor),
            Ok(Some(Duration::from_millis(200)))
        );
        for bad in ["0", "-3", "1.5", "soon", "3600001"] {
            let err = deadline(&with(bad), &floor).unwrap_err();
            assert!(
                matches!(&err, GatewayError::BadRequest { message, .. } if message.contains("whole milliseconds")),
                "{bad}: {err:?}"
            );
        }
        let err = deadline(&with("500"), &tier(None)).unwrap_err();
        assert!(
            matches!(&err, GatewayError::BadRequest { message, .. } if message.contains("takes no deadlines")),
            "{err:?}"
        );
    }
}
