//! Forward: the request goes to its routed worker through the pooled client, the answer streams
//! back through, and when its body ends (or the client leaves) the hook here accounts it: the
//! request count and tenant outcome by how it really ended, the shadow comparison, the canary
//! sample and the settlement of the reservation.

use hyper::Response;
use hyper::header::HeaderValue;

use super::account::{end_outcome, served_well};
use super::ctx::RequestCtx;
use super::route::Routed;
use super::split::VersionChoice;
use crate::account::Account;
use crate::config::Snapshot;
use crate::error::{GatewayError, ResBody};
use crate::gateway::Gateway;
use crate::proxy::forward::{ForwardSettings, Outbound, forward as send};
use crate::request::{Endpoint, ValidRequest};
use crate::shadow::PrimaryOutcome;
use crate::workers::pool::PoolRuntime;

/// What the answer's end reports to besides the account.
pub(super) struct Listeners {
    /// The canary version that serves it.
    pub version: Option<VersionChoice>,
    /// The shadow comparison waiting for the client's own outcome.
    pub shadow: Option<tokio::sync::oneshot::Sender<PrimaryOutcome>>,
}

/// The forward settings of `snapshot`.
fn settings(snapshot: &Snapshot) -> ForwardSettings {
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
/// answer; `account` settles when its body ends.
#[expect(
    clippy::too_many_arguments,
    reason = "the forward phase joins the request, its route, its account and its listeners"
)]
pub(super) async fn forward(
    gw: &Gateway,
    snapshot: &Snapshot,
    (pool, first): (&PoolRuntime, Routed),
    valid: &ValidRequest,
    endpoint: Endpoint,
    traceparent: Option<&HeaderValue>,
    (account, listeners): (Box<Account>, Listeners),
    ctx: &mut RequestCtx,
) -> Result<Response<ResBody>, GatewayError> {
    let Listeners { version, shadow } = listeners;
    let started = ctx.started;
    let out = Outbound {
        path: endpoint.path(),
        // The one place the upstream body is built, after every phase has had its say.
        body: valid.body.bytes(),
        stream: valid.stream,
        // OpenAI's chat and completions streams end with `data: [DONE]`; Responses streams end
        // with their `response.completed` event instead.
        expects_done: matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Completions),
        by_load: !endpoint.generates(),
        features: &valid.features,
        request_id: &ctx.request_id,
        traceparent,
        started,
        hide_usage_chunk: valid.stream && !valid.client_wants_usage,
        grace_over: gw.grace_over(),
        on_end: Some(Box::new({
            let version = version.clone();
            let metrics = gw.metrics.clone();
            let target = ctx
                .target
                .as_ref()
                .map(|t| (t.model.clone(), t.pool.clone()));
            let tenant = ctx.tenant().map(str::to_owned);
            move |end| {
                let (status, outcome) = end_outcome(&end);
                if let Some((model, pool)) = &target {
                    metrics
                        .requests
                        .with_label_values(&[model, pool, status.as_str()])
                        .inc();
                }
                if let Some(tenant) = &tenant {
                    metrics
                        .tenant_requests
                        .with_label_values(&[tenant, outcome])
                        .inc();
                }
                if let Some(tx) = shadow {
                    let _ = tx.send(PrimaryOutcome {
                        status: end.status,
                        output_tokens: end.usage.map_or(end.content_events, |u| u.completion),
                        latency: started.elapsed(),
                    });
                }
                // A client that hangs up says nothing about the version that served it: counted
                // as cancelled, kept out of the canary analysis.
                if let Some(v) = &version {
                    if end.client_gone {
                        v.count(&metrics, "cancelled");
                    } else {
                        v.record(&metrics, served_well(&end), end.ttft, end.max_gap);
                    }
                }
                account.settle(end);
            }
        })),
    };
    let forwarded = send(pool, first, out, settings(snapshot), &gw.metrics).await;
    if let (Err(_), Some(v)) = (&forwarded, &version) {
        // No answer at all counts against the version too.
        v.record(&gw.metrics, false, None, None);
    }
    let res = forwarded?;
    ctx.counted_at_end = true;
    Ok(res)
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
