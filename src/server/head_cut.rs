//! A connection whose request head never ended: telling h2 from HTTP/1.1 by its first bytes,
//! and answering 408 on the socket hyper gave up on (or, over TLS, on the stream taken back).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use infergate_engine::edge::{self};

use crate::metrics::GatewayMetrics;

/// The HTTP/2 client preface (prior knowledge, `h2c`).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether a plain connection speaks HTTP/2, from its first bytes (without consuming them);
/// `None` when the client has not said enough within `within`.
pub(super) async fn sniff_h2(stream: &tokio::net::TcpStream, within: Duration) -> Option<bool> {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 24];
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        if buf[..n] != H2_PREFACE[..n] {
            return Some(false);
        }
        if n == H2_PREFACE.len() {
            return Some(true);
        }
        // A partial preface: wait for more bytes (peek returns at once while data is queued).
        tokio::time::timeout_at(deadline, stream.readable())
            .await
            .ok()?
            .ok()?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Why a connection ended with its head unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeadCut {
    /// hyper's header timer fired.
    TimedOut,
    /// A drain started before the connection's first request began.
    Draining,
}

/// Whether a client connection ended (as `ended` and `begun` say) for want of a complete head,
/// counting those that ended on hyper's header timer: then it may still be told why.
pub(super) fn head_cut(
    metrics: &GatewayMetrics,
    ended: Result<(), Box<dyn std::error::Error + Send + Sync>>,
    begun: &edge::Begun,
) -> Option<HeadCut> {
    if begun.dropped_unbegun() {
        return Some(HeadCut::Draining);
    }
    let e = ended.err()?;
    let timeout = e
        .downcast_ref::<hyper::Error>()
        .is_some_and(hyper::Error::is_timeout);
    if timeout {
        metrics
            .client_timeouts
            .with_label_values(&["header_read"])
            .inc();
    }
    timeout.then_some(HeadCut::TimedOut)
}

/// A duplicate of `stream`'s socket (one `dup`; the stream stays registered with the runtime),
/// or `None` if the OS would not duplicate it.
pub(super) fn spare_of(stream: &tokio::net::TcpStream) -> Option<std::net::TcpStream> {
    use std::os::fd::AsFd;
    let fd = stream.as_fd().try_clone_to_owned().ok()?;
    Some(std::net::TcpStream::from(fd))
}

/// The whole HTTP/1.1 408 answer for a header block that did not arrive within `limit`, or was
/// not complete when the drain started.
pub(super) fn head_cut_answer(cut: HeadCut, limit: Duration) -> Vec<u8> {
    let message = match cut {
        HeadCut::TimedOut => format!("the request headers did not arrive within {limit:?}"),
        HeadCut::Draining => {
            "the gateway is shutting down and the request headers were not complete".to_owned()
        }
    };
    let body = serde_json::json!({"error": {
        "message": message,
        "type": "invalid_request_error", "param": null, "code": 408,
    }})
    .to_string();
    let mut answer = format!(
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(body.as_bytes());
    answer
}

/// Writes a 408 on `spare` (the socket hyper just gave up on for a head that never ended).
pub(super) fn answer_head_cut(spare: &std::net::TcpStream, cut: HeadCut, limit: Duration) {
    use std::io::Write;
    // Non-blocking and small: it fits the socket buffer, and a failure changes nothing.
    let mut spare = spare;
    let _ = spare.write_all(&head_cut_answer(cut, limit));
}

/// A stream with two owners: hyper serves the connection through one handle, and the accept
/// task takes the stream back through the other once hyper is done (to answer a timeout on a
/// TLS connection, where the raw socket cannot be written). Only one side polls at a time, so
/// the lock is never contended.
pub(super) struct SharedStream<S>(Arc<Mutex<S>>);

impl<S> Clone for SharedStream<S> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S: Unpin> SharedStream<S> {
    /// A first handle on `stream`.
    pub(super) fn new(stream: S) -> Self {
        Self(Arc::new(Mutex::new(stream)))
    }

    /// The stream, once every other handle is gone.
    pub(super) fn into_inner(self) -> Option<S> {
        let mutex = Arc::try_unwrap(self.0).ok()?;
        Some(mutex.into_inner().unwrap_or_else(|p| p.into_inner()))
    }

    /// Runs `f` on the pinned stream (a poisoned lock still holds a usable stream).
    fn with<T>(&self, f: impl FnOnce(std::pin::Pin<&mut S>) -> T) -> T {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(std::pin::Pin::new(&mut *guard))
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for SharedStream<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.with(|s| s.poll_read(cx, buf))
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for SharedStream<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.with(|s| s.poll_write(cx, buf))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.with(|s| s.poll_flush(cx))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.with(|s| s.poll_shutdown(cx))
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.with(|s| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_write_vectored()
    }
}
