//! Request ids: the client's `x-request-id` when it is usable (1 to 128 visible ASCII
//! characters), else a fresh one. The request carries it on (to the endpoint, and from the
//! gateway to its worker) and every answer echoes it, refusals made by later layers included.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response};

/// `x-request-id`, built at compile time (a `&str` name allocates per insert).
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client request id kept; a longer one is replaced.
pub const MAX_LEN: usize = 128;

static SEQ: AtomicU64 = AtomicU64::new(1);

/// Whether a client's id is kept: 1 to [`MAX_LEN`] visible ASCII characters.
pub fn usable(v: &HeaderValue) -> bool {
    !v.is_empty() && v.len() <= MAX_LEN && v.to_str().is_ok()
}

/// A fresh id: 16 hex digits of the wall clock in nanoseconds (ids sort by arrival) and 16 of a
/// hash of this process's request sequence number.
pub fn fresh() -> HeaderValue {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let mut id = [0u8; 32];
    put_hex(&mut id[..16], nanos);
    put_hex(&mut id[16..], xxhash_rust::xxh3::xxh3_64(&n.to_le_bytes()));
    // Hex digits are always a valid header value.
    HeaderValue::from_bytes(&id).unwrap_or(HeaderValue::from_static("0"))
}

/// Writes `v` as lowercase hex digits into `out` (16 bytes).
fn put_hex(out: &mut [u8], v: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in out.iter_mut().enumerate() {
        *b = DIGITS[((v >> ((15 - i) * 4)) & 0xf) as usize];
    }
}

/// The layer of [`RequestId`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestIdLayer;

impl<S> tower::Layer<S> for RequestIdLayer {
    type Service = RequestId<S>;

    fn layer(&self, inner: S) -> RequestId<S> {
        RequestId { inner }
    }
}

/// Gives each request an id and echoes it on the answer.
#[derive(Debug, Clone)]
pub struct RequestId<S> {
    inner: S,
}

impl<S, B, R> tower::Service<Request<B>> for RequestId<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = RequestIdFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let id = match req.headers().get(REQUEST_ID) {
            Some(v) if usable(v) && req.headers().get_all(REQUEST_ID).iter().nth(1).is_none() => {
                v.clone()
            }
            _ => {
                let id = fresh();
                req.headers_mut().insert(REQUEST_ID, id.clone());
                id
            }
        };
        RequestIdFuture {
            inner: self.inner.call(req),
            id: Some(id),
        }
    }
}

pin_project_lite::pin_project! {
    /// The answer of [`RequestId`]: the inner one with `x-request-id` set.
    pub struct RequestIdFuture<F> {
        #[pin]
        inner: F,
        id: Option<HeaderValue>,
    }
}

impl<F, R, E> Future for RequestIdFuture<F>
where
    F: Future<Output = Result<Response<R>, E>>,
{
    type Output = Result<Response<R>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = std::task::ready!(this.inner.poll(cx))?;
        if let Some(id) = this.id.take() {
            res.headers_mut().insert(REQUEST_ID, id);
        }
        Poll::Ready(Ok(res))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, ServiceExt};

    /// A service answering with the request id it saw in a header of its own.
    fn echo() -> impl tower::Service<
        Request<()>,
        Response = Response<()>,
        Error = std::convert::Infallible,
        Future = impl Send,
    > + Clone {
        tower::service_fn(|req: Request<()>| async move {
            let mut res = Response::new(());
            if let Some(v) = req.headers().get(REQUEST_ID) {
                res.headers_mut().insert("x-seen", v.clone());
            }
            Ok(res)
        })
    }

    #[tokio::test]
    async fn a_usable_client_id_is_kept_and_echoed() {
        let req = Request::builder()
            .header("x-request-id", "client-42")
            .body(())
            .unwrap();
        let res = RequestIdLayer.layer(echo()).oneshot(req).await.unwrap();
        assert_eq!(res.headers()["x-seen"], "client-42");
        assert_eq!(res.headers()[REQUEST_ID], "client-42");
    }

    #[tokio::test]
    async fn a_missing_long_or_repeated_id_is_replaced_by_a_fresh_one() {
        let long = "x".repeat(MAX_LEN + 1);
        for headers in [vec![], vec![long.as_str()], vec!["a", "b"], vec![""]] {
            let mut req = Request::builder();
            for h in &headers {
                req = req.header("x-request-id", *h);
            }
            let res = RequestIdLayer
                .layer(echo())
                .oneshot(req.body(()).unwrap())
                .await
                .unwrap();
            let id = res.headers()[REQUEST_ID].to_str().unwrap().to_string();
            assert_eq!(id.len(), 32, "{headers:?}");
            assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
            assert_eq!(
                res.headers()["x-seen"],
                id.as_str(),
                "the request carries it on"
            );
            assert_eq!(res.headers().get_all(REQUEST_ID).iter().count(), 1);
        }
    }

    #[test]
    fn fresh_ids_differ() {
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| fresh()).collect();
        assert_eq!(ids.len(), 1000);
    }
}
