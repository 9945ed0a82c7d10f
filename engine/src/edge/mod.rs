//! The HTTP plumbing every request crosses before any endpoint sees it, as tower layers shared by
//! the gateway's public listener and the engine worker's server:
//!
//! 1. [`request_id`]: the client's `x-request-id` when usable, else a fresh one, on the request
//!    and echoed on every answer;
//! 2. [`trace_context`]: a malformed W3C `traceparent` (and its `tracestate`) is dropped, so only
//!    well-formed trace context travels on;
//! 3. [`in_flight`]: an optional cap on requests in flight, answers included, past which a
//!    request gets 503 at once;
//! 4. [`body_limit`]: the request body is bounded in size and in time (one deadline for the whole
//!    body, so a trickling client cannot hold a request open), with typed errors the endpoint maps.
//!
//! Domain decisions (tenants, admission, routing) stay in plain async code behind the stack.

pub mod body_limit;
pub mod in_flight;
pub mod request_id;
pub mod trace_context;

use std::convert::Infallible;

use hyper::body::{Body, Incoming};
use hyper::{Request, Response};

pub use body_limit::{BodyError, BodyLimitLayer, BodyLimits, LimitedBody};
pub use in_flight::{InFlight, InFlightBody, InFlightLayer};
pub use request_id::{REQUEST_ID, RequestIdLayer};
pub use trace_context::TraceContextLayer;

/// The whole stack around `inner`, outermost first.
pub type Edge<S, L> = request_id::RequestId<
    trace_context::TraceContext<in_flight::InFlightLimit<body_limit::BodyLimit<S, L>>>,
>;

/// Wraps `inner` in the stack. `limits` is read once per request (a gateway reload may change
/// them between two requests of one connection); `in_flight` counts requests, and holds the cap,
/// across every connection sharing it.
pub fn stack<S, L>(inner: S, limits: L, in_flight: std::sync::Arc<InFlight>) -> Edge<S, L>
where
    L: Fn() -> BodyLimits + Clone,
{
    tower::ServiceBuilder::new()
        .layer(RequestIdLayer)
        .layer(TraceContextLayer)
        .layer(InFlightLayer::new(in_flight))
        .layer(BodyLimitLayer::new(limits))
        .service(inner)
}

/// The stack as hyper's service for one connection (hyper calls `&self`; each request clones the
/// stack, which holds only `Arc`s and the limits closure, and drives it with `oneshot`).
pub type HyperEdge<S, L> = hyper_util::service::TowerToHyperService<Edge<S, L>>;

/// [`stack`] over `inner`, ready for `serve_connection`.
pub fn hyper_service<S, L, B>(
    inner: S,
    limits: L,
    in_flight: std::sync::Arc<InFlight>,
) -> HyperEdge<S, L>
where
    S: tower::Service<Request<LimitedBody<Incoming>>, Response = Response<B>, Error = Infallible>
        + Clone,
    B: Body + Unpin,
    L: Fn() -> BodyLimits + Clone,
{
    hyper_util::service::TowerToHyperService::new(stack(inner, limits, in_flight))
}
