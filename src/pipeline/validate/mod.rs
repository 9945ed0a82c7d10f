//! Read and validate: the body (bounded in size and time, counted against the gateway-wide body
//! budget), then the OpenAI request checked against the snapshot and the caller's tier, and the
//! prompt's token count, which metering, the context check and degradation use.

mod messages;
pub mod request;

use hyper::HeaderMap;
use hyper::body::{Body, Bytes};

use crate::config::{Snapshot, TierSpec};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::request_body::{BodyHold, read_body};
use infergate_engine::edge::LimitedBody;
use request::{Endpoint, PromptSize, ValidRequest, check_context, validate};

/// A validated request and what its prompt counts in tokens.
pub(super) struct Validated {
    /// The request.
    pub valid: ValidRequest,
    /// Its prompt's tokens: exact for token ids, the model's tokenizer where a limit needs the
    /// number, else four bytes a token (what accounting falls back to).
    pub prompt_tokens: u64,
    /// The body's share of the gateway-wide body budget, held until the request ends.
    pub body_hold: BodyHold,
}

/// Reads the body of a request to `endpoint` and validates it.
pub(super) async fn read_and_validate<B>(
    gw: &Gateway,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: LimitedBody<B>,
    snapshot: &Snapshot,
    tier: &TierSpec,
) -> Result<Validated, GatewayError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let (body, body_hold) = read_body(body, snapshot.max_buffered_body_bytes, &gw.body_budget)
        .await
        .inspect_err(|e| {
            if let GatewayError::BodyTimeout(_) = e {
                gw.metrics
                    .client_timeouts
                    .with_label_values(&["body_read"])
                    .inc();
            }
        })?;
    let valid = validate(endpoint, headers, body, snapshot, tier)?;
    let pool = snapshot
        .pools
        .get(valid.pool)
        .ok_or_else(|| GatewayError::Internal("model routes to a missing pool".into()))?;
    // The tokenizer costs CPU: it runs only when a token budget, a context check, a
    // degradation limit or a shape class can use the number.
    let exact_needed = tier.tokens_per_minute.is_some()
        || valid.max_context.is_some()
        || snapshot.degradation.contains_key(&pool.name)
        || !snapshot.shape_classes.is_empty();
    let prompt_tokens = match &valid.prompt {
        PromptSize::Tokens(n) => *n,
        PromptSize::Text(t) if !exact_needed => (t.len() as u64).div_ceil(4),
        PromptSize::Text(t) if t.len() < 4096 => valid.estimator.count(t),
        // A long prompt's lines counted before (a repeated system prompt) are looked up here;
        // the new lines are counted here too when short (a thread hand-off costs more), else off
        // the reactor.
        PromptSize::Text(t) => {
            let est = valid.estimator;
            let (known, new) = est.count_known(t);
            if new.iter().map(|p| p.len()).sum::<usize>() < 4096 {
                known + est.count_pieces(&new)
            } else {
                let new: Vec<String> = new.into_iter().map(str::to_owned).collect();
                known
                    + tokio::task::spawn_blocking(move || est.count_pieces(&new))
                        .await
                        .map_err(|e| {
                            GatewayError::Internal(format!("token estimate failed: {e}"))
                        })?
            }
        }
    };
    check_context(&valid, prompt_tokens)?;
    Ok(Validated {
        valid,
        prompt_tokens,
        body_hold,
    })
}
