//! Degrade: the target pool's current level decides what the caller's tier gets: shed,
//! a refused long prompt, a capped `max_tokens`, or the fallback model. The decision itself is
//! [`crate::degrade::TierActions::verdict`], shared with the simulator.

use super::ctx::RequestCtx;
use crate::degrade::Verdict;
use crate::error::GatewayError;
use crate::gateway::{Gateway, Live};
use crate::pipeline::validate::request::ValidRequest;

/// Applies the pool's degradation actions for `tier`: shed (429), refuse a long prompt (503),
/// cap `max_tokens`, or send to the fallback model. Alters the request in place (it is not moved:
/// a move copies it) and returns the labels of what changed it (for `x-infergate-degraded`).
pub(super) fn degrade(
    gw: &Gateway,
    live: &Live,
    valid: &mut ValidRequest,
    tier: &str,
    prompt_tokens: u64,
    ctx: &mut RequestCtx,
) -> Result<Vec<&'static str>, GatewayError> {
    let Some(pool) = live.pools.get(valid.pool) else {
        return Ok(Vec::new());
    };
    let (actions, state) = pool.degrade.for_tier(tier);
    let Some((level, name, retry)) = state else {
        return Ok(Vec::new());
    };
    let count = |action: &str| {
        gw.metrics
            .degraded
            .with_label_values(&[&pool.name, action])
            .inc();
    };
    let retry_after_secs = crate::limits::retry_after_secs(retry);
    let (cap, fallback) = match actions.verdict(&valid.model, prompt_tokens, valid.max_tokens) {
        Verdict::Shed => {
            count("shed");
            return Err(GatewayError::TooManyRequests {
                message: format!(
                    "pool `{}` is degraded (level {level} `{name}`): requests of tier `{tier}` are shed; retry later",
                    pool.name
                ),
                retry_after_secs,
                headers: vec![("x-infergate-degraded", "shed".to_string())],
                reason: "degraded",
            });
        }
        Verdict::RefuseLong { max_prompt_tokens } => {
            count("refuse_long_prompts");
            return Err(GatewayError::Degraded {
                message: format!(
                    "pool `{}` is degraded (level {level} `{name}`): prompts of tier `{tier}` are limited to {max_prompt_tokens} tokens and this one is about {prompt_tokens}",
                    pool.name
                ),
                retry_after_secs,
                action: "refuse_long_prompts",
            });
        }
        Verdict::Serve {
            cap_max_tokens,
            fallback_model,
        } => (cap_max_tokens, fallback_model),
    };
    let mut labels = Vec::new();
    if let Some(cap) = cap {
        // The client's own field keeps its name; every limit field is capped.
        let keys = valid.endpoint.limit_keys();
        for &key in keys {
            if valid.body.has_value(key) {
                valid.body.set(key, cap.to_string());
            }
        }
        if let Some(&last) = keys.last()
            && keys.iter().all(|k| !valid.body.has(k))
        {
            valid.body.set(last, cap.to_string());
        }
        valid.max_tokens = u64::from(cap);
        labels.push("cap_max_tokens");
        count("cap_max_tokens");
    }
    // A fallback model missing from this snapshot leaves the request on its own model.
    if let Some(model) = fallback
        && let Some(route) = live.snapshot.model(model)
    {
        valid.body.set_string("model", route.upstream_name());
        valid.pool = route.pool;
        valid.model = model.to_string();
        ctx.exit.model(model);
        labels.push("fallback");
        count("fallback");
    }
    Ok(labels)
}
