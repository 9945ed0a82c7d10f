//! The HTTP plumbing every request crosses before any endpoint sees it, as tower layers shared by
//! the gateway's listeners (public and admin) and the engine worker's server:
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
//! [`drain`] shuts a listener's connections down gracefully, for both servers too.
//!
//! Domain decisions (tenants, admission, routing) stay in plain async code behind the stack.

pub mod body_limit;
pub mod drain;
pub mod in_flight;
pub mod request_id;
pub mod trace_context;

use std::convert::Infallible;

use hyper::body::{Body, Incoming};
use hyper::{Request, Response};

pub use body_limit::{BodyError, BodyLimitLayer, BodyLimits, LimitedBody};
pub use drain::{Begun, Drain};
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

/// The stack over a handler, as hyper's service for one connection. hyper calls `&self`, tower
/// `&mut self`: the connection's one stack sits in a `RefCell`, borrowed only for the
/// synchronous `call` (never across an await, so never twice at once), which saves cloning the
/// stack's `Arc`s per request. `call` comes without a `poll_ready` round: every layer is ready
/// when its inner service is, and the handler (a `service_fn`) always is. A handler whose future
/// is large should return it [`boxed`]: each wrapper and hyper's slot would otherwise move it by
/// value (callgrind, the gateway's 8.7 KiB pipeline future: about 18k instructions a request of
/// `memcpy`, against 5.5k boxed in place).
#[derive(Debug)]
pub struct HyperEdge<S>(std::cell::RefCell<S>);

impl<S, R> hyper::service::Service<R> for HyperEdge<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, req: R) -> S::Future {
        self.0.borrow_mut().call(req)
    }
}

/// The future `make` returns, on the heap: the layers then move a pointer instead of the
/// handler's future, which is several KiB for the gateway's pipeline (allocated first and
/// written once, so the compiler can build it in place rather than copy it in).
pub fn boxed<F: std::future::Future>(make: impl FnOnce() -> F) -> std::pin::Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

/// [`stack`] over `handler`, ready for `serve_connection`.
pub fn hyper_service<F, Fut, L, B>(
    handler: F,
    limits: L,
    in_flight: std::sync::Arc<InFlight>,
) -> HyperEdge<Edge<tower::util::ServiceFn<F>, L>>
where
    F: FnMut(Request<LimitedBody<Incoming>>) -> Fut + Clone,
    Fut: std::future::Future<Output = Result<Response<B>, Infallible>>,
    B: Body + Unpin,
    L: Fn() -> BodyLimits + Clone,
{
    HyperEdge(std::cell::RefCell::new(stack(
        tower::service_fn(handler),
        limits,
        in_flight,
    )))
}
