//! An optional cap on requests in flight, counted from arrival until the answer's body is done
//! (a stream holds its place until its last event), shared by every connection of a server.
//! Reads (`GET`, `HEAD`) are neither counted nor refused: health checks, metrics scrapes and
//! model lists get through a server at its cap.
//! Past the cap a request gets 503 at once, with a `Retry-After` from what was observed: the
//! mean time a request holds its place, divided among the places (one frees that often).
//!
//! Without a cap nothing is counted: the layer costs a load and a branch.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use http_body_util::Full;
use hyper::body::{Body, Bytes, Frame, SizeHint};
use hyper::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response};
use tokio::time::Instant;

use crate::openai::ApiError;

/// No cap.
const UNCAPPED: usize = usize::MAX;

/// The requests in flight on one server and its cap.
#[derive(Debug)]
pub struct InFlight {
    cap: AtomicUsize,
    now: AtomicUsize,
    shed: AtomicU64,
    /// Moving mean of the time a request held its place, in microseconds (0: none seen yet).
    mean_us: AtomicU64,
}

impl InFlight {
    /// A counter with `cap` (`None`: no cap).
    pub fn new(cap: Option<usize>) -> Self {
        Self {
            cap: AtomicUsize::new(cap.unwrap_or(UNCAPPED)),
            now: AtomicUsize::new(0),
            shed: AtomicU64::new(0),
            mean_us: AtomicU64::new(0),
        }
    }

    /// Sets the cap (a reload). Requests that arrived while there was none are not counted.
    pub fn set_cap(&self, cap: Option<usize>) {
        self.cap.store(cap.unwrap_or(UNCAPPED), Ordering::Relaxed);
    }

    /// Counted requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.now.load(Ordering::Relaxed)
    }

    /// Requests refused at the cap since start.
    pub fn shed(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }

    /// A place for one request, `Ok(None)` when there is no cap, or the seconds to wait.
    fn enter(self: &Arc<Self>) -> Result<Option<InFlightGuard>, (usize, u64)> {
        let cap = self.cap.load(Ordering::Relaxed);
        if cap == UNCAPPED {
            return Ok(None);
        }
        if self.now.fetch_add(1, Ordering::AcqRel) >= cap {
            self.now.fetch_sub(1, Ordering::AcqRel);
            self.shed.fetch_add(1, Ordering::Relaxed);
            return Err((cap, self.retry_after_secs(cap)));
        }
        Ok(Some(InFlightGuard {
            counter: self.clone(),
            since: Instant::now(),
        }))
    }

    /// Whole seconds until a place is likely to free: with `cap` requests each holding theirs
    /// for the observed mean, one frees every mean / cap. At least 1 (HTTP's unit).
    pub fn retry_after_secs(&self, cap: usize) -> u64 {
        let mean = self.mean_us.load(Ordering::Relaxed);
        let per_place = mean / (cap.max(1) as u64);
        per_place.div_ceil(1_000_000).max(1)
    }

    fn observe(&self, held_us: u64) {
        // A lost update between two threads only skips one sample of a moving mean.
        let mean = self.mean_us.load(Ordering::Relaxed);
        let next = if mean == 0 {
            held_us
        } else {
            mean - mean / 16 + held_us / 16
        };
        self.mean_us.store(next.max(1), Ordering::Relaxed);
    }
}

/// One request's place, given back when its answer's body is dropped.
#[derive(Debug)]
pub struct InFlightGuard {
    counter: Arc<InFlight>,
    since: Instant,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.counter.now.fetch_sub(1, Ordering::AcqRel);
        let held = u64::try_from(self.since.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.counter.observe(held);
    }
}

/// The layer of [`InFlightLimit`].
#[derive(Debug, Clone)]
pub struct InFlightLayer {
    counter: Arc<InFlight>,
}

impl InFlightLayer {
    /// Requests counted in `counter`, against its cap.
    pub fn new(counter: Arc<InFlight>) -> Self {
        Self { counter }
    }
}

impl<S> tower::Layer<S> for InFlightLayer {
    type Service = InFlightLimit<S>;

    fn layer(&self, inner: S) -> InFlightLimit<S> {
        InFlightLimit {
            inner,
            counter: self.counter.clone(),
        }
    }
}

/// Refuses requests past the cap; the others hold a place until their answer is done.
#[derive(Debug, Clone)]
pub struct InFlightLimit<S> {
    inner: S,
    counter: Arc<InFlight>,
}

impl<S, Q, B> tower::Service<Request<Q>> for InFlightLimit<S>
where
    S: tower::Service<Request<Q>, Response = Response<B>>,
{
    type Response = Response<InFlightBody<B>>;
    type Error = S::Error;
    type Future = InFlightFuture<S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Q>) -> Self::Future {
        let read = matches!(*req.method(), Method::GET | Method::HEAD);
        match if read { Ok(None) } else { self.counter.enter() } {
            Ok(guard) => InFlightFuture::Served {
                inner: self.inner.call(req),
                guard,
            },
            Err((cap, secs)) => InFlightFuture::Refused {
                answer: Some(refusal(cap, secs)),
            },
        }
    }
}

/// The 503 of a request past the cap.
fn refusal<B>(cap: usize, secs: u64) -> Response<InFlightBody<B>> {
    let err = ApiError::unavailable(
        format!("{cap} requests are in flight, this server's limit; retry after {secs} s"),
        secs,
    );
    let mut res = Response::new(InFlightBody {
        inner: Inner::Refused(Full::new(Bytes::from(err.to_json()))),
    });
    *res.status_mut() = err.status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs));
    res
}

pin_project_lite::pin_project! {
    /// The answer of [`InFlightLimit`].
    #[project = InFlightProj]
    pub enum InFlightFuture<F, B> {
        /// Passed on: the guard moves into the answer's body.
        Served { #[pin] inner: F, guard: Option<InFlightGuard> },
        /// Refused at the cap.
        Refused { answer: Option<Response<InFlightBody<B>>> },
    }
}

impl<F, B, E> Future for InFlightFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<InFlightBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            InFlightProj::Served { inner, guard } => {
                let res = std::task::ready!(inner.poll(cx))?;
                let guard = guard.take();
                Poll::Ready(Ok(res.map(|body| InFlightBody {
                    inner: Inner::Served {
                        body,
                        _guard: guard,
                    },
                })))
            }
            InFlightProj::Refused { answer } => match answer.take() {
                Some(res) => Poll::Ready(Ok(res)),
                None => Poll::Pending,
            },
        }
    }
}

/// An answer's body holding its request's place, or the refusal's.
pub struct InFlightBody<B> {
    inner: Inner<B>,
}

enum Inner<B> {
    Served {
        body: B,
        _guard: Option<InFlightGuard>,
    },
    Refused(Full<Bytes>),
}

impl<B> Body for InFlightBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match &mut self.inner {
            Inner::Served { body, .. } => Pin::new(body).poll_frame(cx),
            Inner::Refused(full) => match std::task::ready!(Pin::new(full).poll_frame(cx)) {
                Some(Ok(frame)) => Poll::Ready(Some(Ok(frame))),
                Some(Err(never)) => match never {},
                None => Poll::Ready(None),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Served { body, .. } => body.is_end_stream(),
            Inner::Refused(full) => full.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Served { body, .. } => body.size_hint(),
            Inner::Refused(full) => full.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::{Layer, ServiceExt};

    fn served(
        counter: &Arc<InFlight>,
    ) -> InFlightLimit<
        impl tower::Service<
            Request<()>,
            Response = Response<Full<Bytes>>,
            Error = std::convert::Infallible,
        > + Clone,
    > {
        InFlightLayer::new(counter.clone()).layer(tower::service_fn(|_req: Request<()>| async {
            Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }))
    }

    fn post() -> Request<()> {
        Request::post("/v1/chat/completions").body(()).unwrap()
    }

    #[tokio::test]
    async fn answers_hold_their_place_until_their_body_is_dropped() {
        let counter = Arc::new(InFlight::new(Some(2)));
        let a = served(&counter).oneshot(post()).await.unwrap();
        let b = served(&counter).oneshot(post()).await.unwrap();
        assert_eq!(
            counter.in_flight(),
            2,
            "an answer's body still being sent counts"
        );
        let refused = served(&counter).oneshot(post()).await.unwrap();
        assert_eq!(refused.status(), 503);
        assert_eq!(refused.headers()[RETRY_AFTER], "1");
        let text = refused.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("2 requests are in flight"),
            "{json}"
        );
        assert_eq!(counter.shed(), 1);
        assert_eq!(counter.in_flight(), 2, "a refusal takes no place");
        let body = a.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ok");
        assert_eq!(counter.in_flight(), 1);
        drop(b);
        assert_eq!(counter.in_flight(), 0);
        let c = served(&counter).oneshot(post()).await.unwrap();
        assert_eq!(c.status(), 200);
        let _held = served(&counter).oneshot(post()).await.unwrap();
        let get = served(&counter).oneshot(Request::new(())).await.unwrap();
        assert_eq!(get.status(), 200, "reads pass a server at its cap");
        assert_eq!(counter.in_flight(), 2, "and take no place");
    }

    #[tokio::test]
    async fn without_a_cap_nothing_is_counted_and_a_cap_applies_on_reload() {
        let counter = Arc::new(InFlight::new(None));
        let a = served(&counter).oneshot(post()).await.unwrap();
        assert_eq!(counter.in_flight(), 0);
        counter.set_cap(Some(1));
        let b = served(&counter).oneshot(post()).await.unwrap();
        assert_eq!(b.status(), 200, "the uncounted request takes no place");
        let c = served(&counter).oneshot(post()).await.unwrap();
        assert_eq!(c.status(), 503);
        drop((a, b));
        counter.set_cap(None);
        let d = served(&counter).oneshot(post()).await.unwrap();
        assert_eq!(d.status(), 200);
    }

    #[test]
    fn retry_after_is_the_mean_hold_shared_among_the_places() {
        let counter = InFlight::new(Some(4));
        assert_eq!(
            counter.retry_after_secs(4),
            1,
            "nothing observed: the least"
        );
        counter.observe(40_000_000);
        assert_eq!(
            counter.retry_after_secs(4),
            10,
            "40 s holds, 4 places: one frees every 10 s"
        );
        assert_eq!(counter.retry_after_secs(400), 1);
    }
}
