//! The request path as one pipeline. [`service`] is the public listener's service: the edge
//! layers shared with the engine server ([`infergate_engine::edge`]: request id, trace context,
//! the in-flight cap, the body's size and time bounds) around [`handle`], which accepts a request
//! and sends it to its endpoint; a generation request then goes through [`run`], which calls the
//! phases in order, each in its own file and each either passing the request on or answering it:
//!
//! 1. **accept** (the edge layers, then [`accept`], [`ctx`]): request id, trace context, body
//!    bounds, arrival time, header hygiene;
//! 2. **authenticate** ([`authenticate`]): bearer key → tenant and tier, and the tenant's
//!    concurrency slot (taken before the body, so unfinished uploads count against it);
//! 3. **read and validate** ([`validate`]): the bounded body, the OpenAI request against the
//!    snapshot and tier, the prompt's token count and the context check;
//! 4. **meter** ([`meter`]): cost budgets and rate limits reserve the request's cost (prompt
//!    plus `max_tokens × n`, at the dearest of the model's versions) into an
//!    [`Account`](reservation::Account), which settles it against the real usage;
//! 5. **degrade** ([`degrade`]): the pool's level decides shed, refuse, cap or fallback;
//! 6. **split** ([`split`]): the canary version, sticky per session;
//! 7. **classify** ([`classify`]): a shape class of routing.yaml moves the request to its own
//!    pool, with its own deadline;
//! 8. **admit** ([`admit`]): the pool's priority queue;
//! 9. **route** ([`route`]): the pool's policy picks a worker;
//! 10. **forward** ([`forward`]), with the shadow copy started first ([`mirror`]): the answer
//!     streams back through;
//! 11. **account** ([`account`]): the request's one exit, opened at accept and filled in by the
//!     phases, finishes once with the outcome: metrics, tenant outcome, canary sample, shadow
//!     comparison, usage row, and the reservation settled. For a relayed answer the exit rides in
//!     the body's end hook, so a stream that fails after its 200 counts as the failure it is; a
//!     client that leaves before any answer drops it unfinished, which accounts it as gone.

mod accept;
mod account;
mod admit;
mod authenticate;
mod classify;
mod ctx;
mod degrade;
pub mod forward;
mod meter;
mod mirror;
mod models;
mod replay;
mod reservation;
pub mod route;
mod split;
pub mod validate;

#[cfg(test)]
mod tests;

use std::convert::Infallible;
use std::sync::Arc;

use hyper::body::{Body, Bytes};
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use infergate_engine::edge::{self, BodyLimits, InFlightBody, LimitedBody};

use crate::error::{GatewayError, ResBody, json_response};
use crate::gateway::Gateway;
use crate::limits::ConcurrencySlot;
use crate::pipeline::validate::request::Endpoint;
use ctx::RequestCtx;

/// The request bodies the pipeline reads: hyper's from a connection, or any other (tests
/// drive the phases in-process with `Full<Bytes>`).
pub trait RequestBody:
    Body<Data = Bytes, Error: std::fmt::Display> + Send + Unpin + 'static
{
}

impl<B> RequestBody for B where
    B: Body<Data = Bytes, Error: std::fmt::Display> + Send + Unpin + 'static
{
}

/// The public listener's service over `B` bodies: the edge layers around [`handle`] (the
/// listener adds its own connection bookkeeping to the same stack; tests drive this one with
/// `tower::ServiceExt::oneshot`).
pub fn service<B: RequestBody>(
    gw: Arc<Gateway>,
) -> impl tower::Service<
    Request<B>,
    Response = Response<InFlightBody<ResBody>>,
    Error = Infallible,
    Future: Send,
> + Clone {
    let in_flight = gw.in_flight.clone();
    let limits = public_limits(gw.clone());
    let inner = tower::service_fn(move |req: Request<LimitedBody<B>>| handle(gw.clone(), req));
    edge::stack(inner, limits, in_flight)
}

/// The body bounds of public requests, read from the live snapshot per request (a reload
/// applies to the next request, on any connection).
pub fn public_limits(gw: Arc<Gateway>) -> impl Fn() -> BodyLimits + Clone + Send + 'static {
    move || crate::request_body::body_limits(&gw.live().snapshot)
}

/// Serves one request on the public listener, behind the edge layers.
pub async fn handle<B: RequestBody>(
    gw: Arc<Gateway>,
    req: Request<LimitedBody<B>>,
) -> Result<Response<ResBody>, Infallible> {
    let mut ctx = ctx::accept(&req, &gw.metrics);
    let dispatched = accept::hygiene(&req).map(|()| dispatch(&gw, req.method(), req.uri().path()));
    let res = match dispatched {
        Err(e) => Err(e),
        Ok(Dispatch::Answer(res)) => res,
        // On the heap and built in place: the phases' future is several KiB, which awaiting it
        // here would copy into this one (BENCHMARKS.md, issue 12).
        Ok(Dispatch::Generate(endpoint)) => edge::boxed(|| run(&gw, req, endpoint, &mut ctx)).await,
    };
    let (res, err) = match res {
        Ok(r) => (r, None),
        Err(e) => (e.into_response(), Some(e)),
    };
    // A relayed answer took the exit with it (its body's end accounts it); anything else is
    // accounted now.
    let status = res.status();
    ctx.exit.relay().finish(account::Outcome::Answered {
        status,
        err: err.as_ref(),
    });
    Ok(res)
}

/// Where a request that passed [`accept::hygiene`] goes (not to be confused with the route
/// phase, which picks a worker).
enum Dispatch {
    /// Through the phases ([`run`]).
    Generate(Endpoint),
    /// Answered here, at once.
    Answer(Result<Response<ResBody>, GatewayError>),
}

/// The endpoint of a request: a generation, or an answer made here (models, health, metrics,
/// the errors of unknown paths and methods).
fn dispatch(gw: &Gateway, method: &Method, path: &str) -> Dispatch {
    let answer = match (method, path) {
        (&Method::POST, "/v1/chat/completions") => {
            return Dispatch::Generate(Endpoint::ChatCompletions);
        }
        (&Method::POST, "/v1/completions") => return Dispatch::Generate(Endpoint::Completions),
        (&Method::POST, "/v1/embeddings") => return Dispatch::Generate(Endpoint::Embeddings),
        (&Method::POST, "/v1/responses") => return Dispatch::Generate(Endpoint::Responses),
        (&Method::GET, "/v1/models") => Ok(models::models(gw)),
        (&Method::GET, p) if p.starts_with("/v1/models/") => {
            models::model(gw, &p["/v1/models/".len()..])
        }
        (&Method::GET, "/healthz") => Ok(json_response(StatusCode::OK, "{\"status\":\"ok\"}")),
        // vLLM's, SGLang's and TGI's name for readiness, which tools such as guidellm check first.
        (&Method::GET, "/readyz" | "/health") => Ok(if gw.is_ready() {
            json_response(StatusCode::OK, "{\"ready\":true}")
        } else {
            json_response(StatusCode::SERVICE_UNAVAILABLE, "{\"ready\":false}")
        }),
        (&Method::GET, "/metrics") if gw.live().snapshot.metrics_public => {
            let mut r = json_response(StatusCode::OK, gw.render_metrics());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            Ok(r)
        }
        (
            _,
            "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/embeddings"
            | "/v1/responses"
            | "/v1/models",
        ) => Err(GatewayError::MethodNotAllowed),
        (_, p) if p.starts_with("/v1/") => Err(GatewayError::NotFound(format!(
            "no route for {p}: this gateway serves POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, POST /v1/responses, GET /v1/models and GET /v1/models/{{model}}"
        ))),
        _ => Err(GatewayError::NotFound(format!("no route for {path}"))),
    };
    Dispatch::Answer(answer)
}

/// One generation request through every phase, in order. The account created by metering
/// settles once: when the response body ends, or with a full refund if it never starts.
async fn run<B: RequestBody>(
    gw: &Arc<Gateway>,
    req: Request<LimitedBody<B>>,
    endpoint: Endpoint,
    ctx: &mut RequestCtx,
) -> Result<Response<ResBody>, GatewayError> {
    if gw.is_draining() {
        return Err(GatewayError::Draining);
    }
    // The request finishes on the snapshot it started with, whatever reloads happen meanwhile.
    let live = gw.live();
    let snapshot = &live.snapshot;
    let (parts, body) = req.into_parts();

    let (tenant, key_id) = authenticate::authenticate(&live, &parts.headers)?;
    ctx.exit.caller(
        (&tenant.name, &key_id),
        gw.ledger.clone(),
        snapshot.prices.version,
    );
    ctx.exit.trace(gw.trace.clone(), gw.otlp.clone());
    let tier = snapshot
        .tier(&tenant.tier)
        .ok_or_else(|| GatewayError::Internal(format!("tier `{}` missing", tenant.tier)))?;
    let slot = ConcurrencySlot::take(gw.limiter.clone(), &tenant.name, &tier.limits())
        .map_err(|r| meter::rejection_error(r, 0))?;

    let deadline = admit::deadline(&parts.headers, tier)?;
    let validated =
        validate::read_and_validate(gw, endpoint, &parts.headers, body, snapshot, tier).await?;
    let prompt_tokens = validated.prompt_tokens;
    let pool = pool_at(&live, validated.valid.pool)?;
    ctx.exit.target(&validated.valid.model, &pool.name);
    if ctx.exit.traced() {
        let v = &validated.valid;
        let traceparent = parts.headers.get(edge::trace_context::TRACEPARENT);
        let shape = account::TracedShape {
            prompt_estimate: Some(prompt_tokens),
            prompt_bytes: u64::try_from(v.features.prompt_bytes).ok(),
            session: v.features.session_key.map(|k| format!("{k:016x}")),
            prefix: crate::trace::prefix_marks(&v.features.prefix_hashes),
            features: Some(crate::trace::TraceFeatures::of_body(
                v.body.raw(),
                v.n,
                v.media_parts,
            )),
        };
        ctx.exit
            .traced_request((v.endpoint.path(), v.max_tokens), shape, traceparent);
    }

    let meter::Metered {
        account,
        reservation,
    } = meter::meter(
        gw,
        snapshot,
        (tenant, tier),
        &validated.valid,
        prompt_tokens,
        (slot, validated.body_hold),
        ctx,
    )
    .await?;
    ctx.exit.account(account);

    // Degrade and split run after the reservation: the usage goes where the request goes.
    let mut valid = validated.valid;
    let degraded = degrade::degrade(gw, &live, &mut valid, &tier.name, prompt_tokens, ctx)?;
    ctx.exit.pool(&pool_at(&live, valid.pool)?.name);
    let version = split::split(&live, &mut valid, (&tenant.name, &ctx.request_id))?;
    let deadline = classify::classify(
        &live,
        &mut valid,
        (
            &tier.name,
            version.as_ref().map(|v| v.served_model.as_str()),
        ),
        prompt_tokens,
        deadline,
        &gw.metrics,
        ctx,
    );
    let pool = pool_at(&live, valid.pool)?;
    ctx.exit.pool(&pool.name);
    if let Some(v) = &version {
        ctx.exit.version(v);
    }

    let most_output = valid.max_tokens.saturating_mul(u64::from(valid.n));
    let tokens = (prompt_tokens, most_output);
    let admitted = (tier, tenant.name.as_str());
    let asked = (tokens, deadline, valid.features.prefix_hashes.as_slice());
    let permit = admit::admit(pool, admitted, asked, &gw.metrics, ctx).await?;
    if let Some(account) = ctx.exit.account_mut() {
        account.hold(permit);
    }

    // From here on a failure counts against the version that was to serve the request.
    ctx.exit.serving(version.clone());
    let by_load = !endpoint.generates();
    if let Some(homes) = gw.prefix_homes.as_ref().filter(|_| !by_load) {
        valid.features.home = homes.home(pool, &valid.features).await;
    }
    let Some(first) = route::pick(pool, &valid.features, by_load, &gw.metrics) else {
        return Err(GatewayError::NoHealthyWorker(pool.name.clone()));
    };
    let shadow = mirror::mirror(gw, &live, &valid, endpoint, &ctx.request_id);
    ctx.exit.shadow(shadow);
    // The edge let only a well-formed one through.
    let traceparent = parts.headers.get(edge::trace_context::TRACEPARENT);
    // Built in place on the heap, as `run` itself is (see `handle`).
    let mut res = edge::boxed(|| {
        forward::forward(
            gw,
            snapshot,
            (pool, first),
            &valid,
            (endpoint, traceparent),
            ctx,
        )
    })
    .await?;
    forward::decorate(&mut res, version.as_ref(), &degraded, &reservation.headers);
    Ok(res)
}

/// The pool a request now targets (validation, degradation and the split may each change it).
fn pool_at(
    live: &crate::gateway::Live,
    index: usize,
) -> Result<&Arc<crate::workers::pool::PoolRuntime>, GatewayError> {
    live.pools
        .get(index)
        .ok_or_else(|| GatewayError::Internal("model routes to a missing pool".into()))
}
