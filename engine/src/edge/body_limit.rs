//! Request bodies bounded in size and in time. The layer wraps each request's body in a
//! [`LimitedBody`], whose frames stop with a typed [`BodyError`] once the body passes its size
//! (a declared `Content-Length` over it fails at the first read, before any byte is taken) or
//! its deadline: one deadline for the whole body, set when the headers arrived, so a client
//! trickling a byte at a time cannot hold a request open. The endpoint maps the error to its
//! answer (413, 408, 400), after [`LimitedBody::discard`] where a client may still be sending.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, SizeHint};
use hyper::{Request, header::CONTENT_LENGTH};
use tokio::time::{Instant, Sleep};

/// Most bytes of an oversized body read and dropped by [`LimitedBody::discard`].
pub const DISCARD_LIMIT: usize = 8 * 1024 * 1024;
/// Longest time [`LimitedBody::discard`] spends.
const DISCARD_TIME: Duration = Duration::from_secs(2);

/// The bounds of one request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// Largest body, in bytes.
    pub max_bytes: usize,
    /// Time for the whole body, from the moment its headers arrived.
    pub timeout: Duration,
}

impl BodyLimits {
    /// Whether a body of `len` bytes is over the size limit.
    pub fn too_large(&self, len: usize) -> bool {
        len > self.max_bytes
    }
}

/// Why a body stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// The body (or its `Content-Length`) passed `limit` bytes.
    TooLarge {
        /// The size limit.
        limit: usize,
    },
    /// The body did not end within `limit` of its headers.
    TimedOut {
        /// The time limit.
        limit: Duration,
    },
    /// The connection failed while the body was read.
    Read(String),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLarge { limit } => write!(f, "request body exceeds {limit} bytes"),
            Self::TimedOut { limit } => {
                write!(f, "the request body did not arrive within {limit:?}")
            }
            Self::Read(e) => write!(f, "could not read the request body: {e}"),
        }
    }
}

impl std::error::Error for BodyError {}

/// A request body under [`BodyLimits`].
pub struct LimitedBody<B> {
    inner: B,
    limits: BodyLimits,
    declared: Option<u64>,
    read: usize,
    deadline: Instant,
    /// Made on the first read that has to wait (a body that came with its headers needs none).
    timer: Option<Pin<Box<Sleep>>>,
    /// An error was returned: the body is over.
    failed: bool,
}

impl<B> LimitedBody<B> {
    /// `inner` under `limits` from now; `declared` is its `Content-Length`, if it has one.
    pub fn new(inner: B, declared: Option<u64>, limits: BodyLimits) -> Self {
        Self {
            inner,
            limits,
            declared,
            read: 0,
            deadline: Instant::now() + limits.timeout,
            timer: None,
            failed: false,
        }
    }

    /// The body's `Content-Length`, when it declared one.
    pub fn declared(&self) -> Option<u64> {
        self.declared
    }

    /// The bounds this body is read under.
    pub fn limits(&self) -> BodyLimits {
        self.limits
    }
}

impl<B> LimitedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    /// Reads and drops up to [`DISCARD_LIMIT`] more bytes (for at most two seconds, never past
    /// the body's deadline), so a client still sending an oversized body reaches the answer
    /// instead of a reset connection.
    pub async fn discard(&mut self) {
        let until = self.deadline.min(Instant::now() + DISCARD_TIME);
        let mut dropped = 0usize;
        while dropped < DISCARD_LIMIT {
            match tokio::time::timeout_at(until, self.inner.frame()).await {
                Ok(Some(Ok(frame))) => dropped += frame.data_ref().map_or(0, Bytes::len),
                _ => return,
            }
        }
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        let too_large = |limits: BodyLimits| BodyError::TooLarge {
            limit: limits.max_bytes,
        };
        if this.declared.is_some_and(|n| {
            this.limits
                .too_large(usize::try_from(n).unwrap_or(usize::MAX))
        }) {
            this.failed = true;
            return Poll::Ready(Some(Err(too_large(this.limits))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.read += frame.data_ref().map_or(0, Bytes::len);
                if this.limits.too_large(this.read) {
                    this.failed = true;
                    return Poll::Ready(Some(Err(too_large(this.limits))));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.failed = true;
                Poll::Ready(Some(Err(BodyError::Read(e.to_string()))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let deadline = this.deadline;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.failed = true;
                        Poll::Ready(Some(Err(BodyError::TimedOut {
                            limit: this.limits.timeout,
                        })))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The layer of [`BodyLimit`]; `limits` is read once per request.
#[derive(Debug, Clone)]
pub struct BodyLimitLayer<L> {
    limits: L,
}

impl<L> BodyLimitLayer<L> {
    /// Bodies under the limits `limits` returns when a request arrives.
    pub fn new(limits: L) -> Self {
        Self { limits }
    }
}

impl<S, L: Clone> tower::Layer<S> for BodyLimitLayer<L> {
    type Service = BodyLimit<S, L>;

    fn layer(&self, inner: S) -> BodyLimit<S, L> {
        BodyLimit {
            inner,
            limits: self.limits.clone(),
        }
    }
}

/// Puts each request's body under [`BodyLimits`].
#[derive(Debug, Clone)]
pub struct BodyLimit<S, L> {
    inner: S,
    limits: L,
}

impl<S, L, B> tower::Service<Request<B>> for BodyLimit<S, L>
where
    S: tower::Service<Request<LimitedBody<B>>>,
    L: Fn() -> BodyLimits,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> S::Future {
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let limits = (self.limits)();
        self.inner
            .call(req.map(|body| LimitedBody::new(body, declared, limits)))
    }
}

/// Reads a whole body (the engine's endpoints; the gateway reads its own under a budget).
pub async fn read_to_bytes<B>(body: LimitedBody<B>) -> Result<Bytes, BodyError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut body = body;
    let mut buf = Vec::with_capacity(body.declared().map_or(0, |n| {
        usize::try_from(n).unwrap_or(0).min(body.limits().max_bytes)
    }));
    loop {
        match body.frame().await {
            None => return Ok(Bytes::from(buf)),
            Some(Err(e)) => {
                if matches!(e, BodyError::TooLarge { .. }) {
                    body.discard().await;
                }
                return Err(e);
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use tower::{Layer, ServiceExt};

    const LIMITS: BodyLimits = BodyLimits {
        max_bytes: 10,
        timeout: Duration::from_secs(5),
    };

    /// What the service behind the layer reads of a body sent with `content_length`.
    async fn read<B>(body: B, content_length: Option<&str>) -> Result<Bytes, BodyError>
    where
        B: Body<Data = Bytes> + Unpin + Send + 'static,
        B::Error: std::fmt::Display,
    {
        let svc = BodyLimitLayer::new(|| LIMITS).layer(tower::service_fn(
            |req: Request<LimitedBody<B>>| async move {
                Ok::<_, std::convert::Infallible>(read_to_bytes(req.into_body()).await)
            },
        ));
        let mut req = Request::builder();
        if let Some(n) = content_length {
            req = req.header(CONTENT_LENGTH, n);
        }
        svc.oneshot(req.body(body).unwrap()).await.unwrap()
    }

    #[tokio::test]
    async fn a_body_within_the_limit_is_read_whole() {
        let got = read(Full::new(Bytes::from_static(b"0123456789")), Some("10")).await;
        assert_eq!(got.unwrap(), Bytes::from_static(b"0123456789"));
    }

    #[tokio::test]
    async fn a_body_over_the_limit_fails_whether_declared_or_not() {
        let big = || Full::new(Bytes::from_static(b"0123456789a"));
        let too_large = Err(BodyError::TooLarge { limit: 10 });
        assert_eq!(read(big(), None).await, too_large, "counted as it streams");
        assert_eq!(
            read(Full::new(Bytes::new()), Some("11")).await,
            too_large,
            "refused on its Content-Length before a byte is read"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_body_times_out_on_one_deadline_for_the_whole_body() {
        // 1 byte a second: every gap is short, the whole is past the 5 s deadline.
        let got = read(Trickle::new(8, Duration::from_secs(1)), None).await;
        assert_eq!(
            got,
            Err(BodyError::TimedOut {
                limit: Duration::from_secs(5)
            })
        );
        let got = read(Trickle::new(4, Duration::from_secs(1)), None).await;
        assert_eq!(got.unwrap().len(), 4, "a slow body within its time is read");
    }

    /// A body of one-byte frames with a pause before each.
    struct Trickle {
        left: usize,
        gap: Duration,
        sleep: Option<Pin<Box<Sleep>>>,
    }

    impl Trickle {
        fn new(left: usize, gap: Duration) -> Self {
            Self {
                left,
                gap,
                sleep: None,
            }
        }
    }

    impl Body for Trickle {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if self.left == 0 {
                return Poll::Ready(None);
            }
            let gap = self.gap;
            let sleep = self
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
            std::task::ready!(sleep.as_mut().poll(cx));
            self.sleep = None;
            self.left -= 1;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
        }
    }
}
