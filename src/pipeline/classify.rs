//! Phase **classify** (after the split, before admission): a request whose shape matches a
//! shape class of routing.yaml (`crate::routing::shape_class`) goes to the class's pool, so it
//! queues behind, is admitted by and is refused (429, Retry-After from that pool's drain rate)
//! with its own kind; it takes the class's deadline when it named none. The class labels its
//! metrics to the end (`Exit::shape_class`).

use std::time::Duration;

use super::ctx::RequestCtx;
use super::validate::request::ValidRequest;
use crate::gateway::Live;
use crate::metrics::GatewayMetrics;
use crate::routing::shape_class::{Shape, classify as first_match};

/// The label of a request no class matched.
pub(crate) const UNCLASSIFIED: &str = "unclassified";

/// Classifies the request for a caller of `tier`, served by `served` (a canary version's
/// model, else the model it asked for): moves it to its class's pool and returns the deadline
/// it now has. Nothing happens without classes.
pub(super) fn classify(
    live: &Live,
    valid: &mut ValidRequest,
    (tier, served): (&str, Option<&str>),
    prompt_tokens: u64,
    deadline: Option<Duration>,
    metrics: &GatewayMetrics,
    ctx: &mut RequestCtx,
) -> Option<Duration> {
    let classes = &live.snapshot.shape_classes;
    if classes.is_empty() {
        return deadline;
    }
    let shape = Shape {
        prompt_tokens,
        max_tokens: valid.max_tokens,
        n: valid.n,
        media_parts: valid.media_parts,
        tier,
        model: served.unwrap_or(&valid.model),
    };
    let found = first_match(classes, &shape);
    let Some(class) = found else {
        if let Some(pool) = live.snapshot.pools.get(valid.pool) {
            metrics
                .shape_class_requests
                .with_label_values(&[UNCLASSIFIED, pool.name.as_str()])
                .inc();
        }
        ctx.exit.shape_class(UNCLASSIFIED);
        return deadline;
    };
    if class.pool != valid.pool {
        valid.pool = class.pool;
        ctx.exit.pool(&class.pool_name);
    }
    metrics
        .shape_class_requests
        .with_label_values(&[class.name.as_str(), class.pool_name.as_str()])
        .inc();
    ctx.exit.shape_class(&class.name);
    deadline.or(class.deadline)
}
