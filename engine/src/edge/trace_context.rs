//! W3C Trace Context at the edge: a request's `traceparent` travels on only when it is
//! well-formed. A malformed or repeated one is removed, and its `tracestate` with it (the
//! Trace Context spec: without a valid parent the state means nothing).

use std::task::{Context, Poll};

use hyper::Request;
use hyper::header::HeaderName;

/// `traceparent`.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate`.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Whether a `traceparent` is well-formed W3C Trace Context (`00-<32 hex>-<16 hex>-<2 hex>`,
/// ids not all zero; a later version may append fields).
pub fn valid_traceparent(v: &[u8]) -> bool {
    let hex = |b: &[u8]| !b.is_empty() && b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let nonzero = |b: &[u8]| b.iter().any(|&c| c != b'0');
    if v.len() < 55 || (v.len() > 55 && (v[..2] == *b"00" || v[55] != b'-')) {
        return false;
    }
    let (version, trace, parent, flags) = (&v[0..2], &v[3..35], &v[36..52], &v[53..55]);
    v[2] == b'-'
        && v[35] == b'-'
        && v[52] == b'-'
        && hex(version)
        && version != b"ff"
        && hex(trace)
        && nonzero(trace)
        && hex(parent)
        && nonzero(parent)
        && hex(flags)
}

/// The layer of [`TraceContext`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceContextLayer;

impl<S> tower::Layer<S> for TraceContextLayer {
    type Service = TraceContext<S>;

    fn layer(&self, inner: S) -> TraceContext<S> {
        TraceContext { inner }
    }
}

/// Drops malformed trace context from requests.
#[derive(Debug, Clone)]
pub struct TraceContext<S> {
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for TraceContext<S>
where
    S: tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        let headers = req.headers_mut();
        let keep = {
            let mut all = headers.get_all(TRACEPARENT).iter();
            match (all.next(), all.next()) {
                (None, _) => true,
                (Some(v), None) => valid_traceparent(v.as_bytes()),
                (Some(_), Some(_)) => false,
            }
        };
        if !keep {
            headers.remove(TRACEPARENT);
            headers.remove(TRACESTATE);
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, ServiceExt};

    const OK: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_is_checked_against_the_w3c_format() {
        assert!(valid_traceparent(OK.as_bytes()));
        // A later version may append fields after a dash.
        assert!(valid_traceparent(
            b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
        ));
        for bad in [
            &b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"[..],
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            b"junk",
            &[b'a'; 8192][..],
        ] {
            assert!(
                !valid_traceparent(bad),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// What reaches the service behind the layer: (traceparents, tracestates).
    async fn passed(headers: &[(&str, &str)]) -> (usize, usize) {
        let svc = TraceContextLayer.layer(tower::service_fn(|req: Request<()>| async move {
            let h = req.headers();
            Ok::<_, std::convert::Infallible>((
                h.get_all(TRACEPARENT).iter().count(),
                h.get_all(TRACESTATE).iter().count(),
            ))
        }));
        let mut req = Request::builder();
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        svc.oneshot(req.body(()).unwrap()).await.unwrap()
    }

    #[tokio::test]
    async fn only_well_formed_trace_context_travels_on() {
        assert_eq!(
            passed(&[("traceparent", OK), ("tracestate", "a=1")]).await,
            (1, 1)
        );
        assert_eq!(passed(&[("tracestate", "a=1")]).await, (0, 1));
        assert_eq!(
            passed(&[("traceparent", "junk"), ("tracestate", "a=1")]).await,
            (0, 0)
        );
        assert_eq!(
            passed(&[
                ("traceparent", OK),
                ("traceparent", OK),
                ("tracestate", "a")
            ])
            .await,
            (0, 0),
            "two parents: which one?"
        );
    }
}
