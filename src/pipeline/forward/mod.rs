//! Forward: the request goes to its routed worker through the pooled client and the answer
//! streams back through; the request's exit rides in the answer's end hook, so the account phase
//! runs when the body ends (or the client leaves), by how it really ended.

pub mod relay;
pub mod upstream_body;

use hyper::Response;
use hyper::header::HeaderValue;

use super::account::Outcome;
use super::ctx::RequestCtx;
use super::route::Routed;
use super::split::VersionChoice;
use crate::config::Snapshot;
use crate::error::{GatewayError, ResBody};
use crate::gateway::Gateway;
use crate::pipeline::validate::request::{Endpoint, ValidRequest};
use crate::workers::pool::PoolRuntime;
use relay::body::OnEnd;
use relay::send::{ForwardSettings, Outbound, forward as send};

/// The forward settings of `snapshot`.
pub fn settings(snapshot: &Snapshot) -> ForwardSettings {
    let f = &snapshot.forward;
    ForwardSettings {
        first_byte_timeout: f.first_byte_timeout,
        idle_timeout: f.idle_timeout,
        total_timeout: f.total_timeout,
        retries: f.retries,
        outlier: snapshot.outlier,
        debug_headers: snapshot.debug_headers,
        connect_timeout: f.connect_timeout,
    }
}

/// Sends `valid` to `first` (retrying others of `pool` before the first byte) and returns the
/// answer; when a worker answers, the request's exit moves into the answer's end hook, which
/// accounts it when the body ends (a stream can still fail after its 200).
pub(super) async fn forward(
    gw: &Gateway,
    snapshot: &Snapshot,
    (pool, first): (&PoolRuntime, Routed),
    valid: &ValidRequest,
    (endpoint, traceparent): (Endpoint, Option<&HeaderValue>),
    ctx: &mut RequestCtx,
) -> Result<Response<ResBody>, GatewayError> {
    let quality = &snapshot.quality;
    // Only answers that generate text are windowed and scored (embeddings have no text); the
    // capture reads chat and completions `choices` and the Responses API's output items.
    let generates = endpoint.generates();
    let sampled = generates && quality.sampled(&pool.name, &ctx.request_id);
    let body = valid.body.bytes();
    if sampled || (generates && quality.drift.is_some()) {
        let asked = match sampled {
            true => crate::quality::capture::asked_of(&body),
            false => Default::default(),
        };
        ctx.exit.quality(gw.quality.clone(), quality.clone(), asked);
    }
    let exit = &mut ctx.exit;
    let mut on_end = move |attempts| -> Option<OnEnd> {
        let mut exit = exit.relay();
        exit.attempts(attempts);
        Some(Box::new(move |end| exit.finish(Outcome::Relayed(end))))
    };
    let out = Outbound {
        path: endpoint.path(),
        // The one place the upstream body is built, after every phase has had its say.
        body,
        stream: valid.stream,
        // OpenAI's chat and completions streams end with `data: [DONE]`; Responses streams end
        // with their `response.completed` event instead.
        expects_done: matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Completions),
        by_load: !endpoint.generates(),
        features: &valid.features,
        request_id: &ctx.request_id,
        traceparent,
        started: ctx.started,
        hide_usage_chunk: valid.stream && !valid.client_wants_usage,
        grace_over: gw.grace_over(),
        on_end: &mut on_end,
        capture: sampled,
    };
    send(pool, first, out, settings(snapshot), &gw.metrics).await
}

/// The gateway's own headers on an answer: the version that served it, the degradation actions
/// that changed it and the caller's rate-limit state.
pub(super) fn decorate(
    res: &mut Response<ResBody>,
    version: Option<&VersionChoice>,
    degraded: &[&str],
    rate: &crate::limits::RateHeaders,
) {
    if let Some(v) = version
        && let Ok(h) = HeaderValue::from_str(&v.name)
    {
        res.headers_mut().insert("x-infergate-version", h);
    }
    if !degraded.is_empty()
        && let Ok(v) = HeaderValue::from_str(&degraded.join(","))
    {
        res.headers_mut().insert("x-infergate-degraded", v);
    }
    rate.insert_into(res.headers_mut());
}
