//! The accept loop: connection caps, h2 sniffing, TLS, hyper's timers, the drain's watch,
//! and the 408 for a head that never ended.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use infergate_engine::edge::{self, LimitedBody};
use tokio::net::TcpListener;

use super::connections::{ConnectionCounts, take_slot};
use super::head_cut::{
    SharedStream, answer_head_cut, head_cut, head_cut_answer, sniff_h2, spare_of,
};
use crate::config::ConnectionLimits;
use crate::error::{GatewayError, ResBody};
use crate::gateway::Gateway;

/// First and longest pause after a failed `accept()` (out of file descriptors, most often).
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_secs(1));

/// The most an HTTP/1.1 connection's read buffer holds (hyper's default is ~400 KiB), and so
/// the largest request head. A body streams through it in frames the body reader copies out:
/// every open connection keeps one, uncounted by `limits.max_buffered_body_bytes`, so it is kept
/// small (50 uploads held ~20 MiB of read buffers at hyper's default, kept by the allocator
/// after they closed). 64 KiB is above what proxies in front of us send (nginx 32 KiB, Envoy
/// 60 KiB of headers).
const READ_BUFFER: usize = 64 * 1024;

/// A connection builder with hyper's timers on: a header not complete within
/// `header_read_timeout` (also the longest an idle keep-alive connection waits for its next
/// request) closes the connection; HTTP/2 peers that stop answering pings are closed too.
fn connection_builder(limits: ConnectionLimits, h2: bool) -> auto::Builder<TokioExecutor> {
    let b = auto::Builder::new(TokioExecutor::new());
    let mut b = if h2 { b.http2_only() } else { b.http1_only() };
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(READ_BUFFER);
    b.http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(20)))
        .keep_alive_timeout(Duration::from_secs(20));
    b
}

pub(super) async fn accept_loop(
    gw: Arc<Gateway>,
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    graceful: Arc<edge::Drain>,
    admin_of: Option<tokio::runtime::Handle>,
) {
    let is_admin = admin_of.is_some();
    // Admin requests are not capped: probes and reloads must get through a flood.
    let in_flight = if is_admin {
        Arc::new(edge::InFlight::new(None))
    } else {
        gw.in_flight.clone()
    };
    let counts = Arc::new(Mutex::new(ConnectionCounts::default()));
    let mut backoff = ACCEPT_BACKOFF.0;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                backoff = ACCEPT_BACKOFF.0;
                accepted
            }
            Err(e) => {
                // EMFILE and friends do not go away by retrying at once: back off, so the
                // connections already open keep their CPU.
                gw.metrics.accept_errors.inc();
                if backoff == ACCEPT_BACKOFF.0 {
                    tracing::warn!(error = %e, "accept failed; backing off");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
                continue;
            }
        };
        let limits = gw.live().snapshot.connections;
        let slot = if is_admin {
            None
        } else {
            match take_slot(&gw, &counts, peer.ip(), limits) {
                Ok(slot) => Some(slot),
                Err(reason) => {
                    // Refuse fast: closing costs less than serving a 503 to a flood.
                    gw.metrics
                        .connections_refused
                        .with_label_values(&[reason])
                        .inc();
                    drop(stream);
                    continue;
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let gw_conn = gw.clone();
        let main = admin_of.clone();
        let served = edge::Begun::new();
        let served_svc = served.clone();
        let handler = move |req: Request<LimitedBody<Incoming>>| {
            let gw = gw_conn.clone();
            let main = main.clone();
            served_svc.set();
            let served: Pin<
                Box<dyn Future<Output = Result<Response<ResBody>, Infallible>> + Send>,
            > = match main {
                // The pipeline's future itself, built in place: wrapping it in another would
                // copy its several KiB into the wrapper.
                None => edge::boxed(move || crate::pipeline::handle(gw, req)),
                Some(main) => edge::boxed(move || async move {
                    Ok(match crate::admin::probe(&gw, &req) {
                        Some(res) => res,
                        None => main
                            .spawn(crate::admin::handle(gw, req))
                            .await
                            .unwrap_or_else(|e| {
                                GatewayError::Internal(format!("admin request failed: {e}"))
                                    .into_response()
                            }),
                    })
                }),
            };
            served
        };
        // The edge layers shared with the engine server: request id, trace context, the
        // in-flight cap and the body's bounds, read per request from the live snapshot.
        let gw_limits = gw.clone();
        let body_limits = move || {
            if is_admin {
                crate::admin::body_limits(&gw_limits)
            } else {
                crate::request_body::body_limits(&gw_limits.live().snapshot)
            }
        };
        let svc = edge::hyper_service(handler, body_limits, in_flight.clone());
        let metrics = gw.metrics.clone();
        match &tls {
            None => {
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let _slot = slot;
                    // hyper's header timer starts only once the protocol is known: sniff it here,
                    // under the same deadline, so a silent or trickling client cannot wait forever.
                    let h2 = match sniff_h2(&stream, limits.header_read_timeout).await {
                        Some(h2) => h2,
                        None => {
                            metrics
                                .client_timeouts
                                .with_label_values(&["header_read"])
                                .inc();
                            return;
                        }
                    };
                    // A second handle on the socket: when hyper's header timer closes a connection
                    // that sent part of its first request, the client still gets its 408.
                    let spare = spare_of(&stream);
                    let conn = connection_builder(limits, h2)
                        .serve_connection(TokioIo::new(stream), svc)
                        .into_owned();
                    let watched = if h2 {
                        watcher.watch(conn)
                    } else {
                        watcher.watch_begun(conn, served.clone())
                    };
                    let ended = watched.await;
                    if let Some(cut) = head_cut(&metrics, ended, &served)
                        && !h2
                        && !served.is_set()
                        && let Some(spare) = spare
                    {
                        answer_head_cut(&spare, cut, limits.header_read_timeout);
                    }
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                // A watcher, not the handle: connection tasks must not keep shutdown waiting
                // for them to let go of it.
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let _slot = slot;
                    let tls_stream = match tokio::time::timeout(
                        limits.header_read_timeout,
                        acceptor.accept(stream),
                    )
                    .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            metrics
                                .client_timeouts
                                .with_label_values(&["tls_handshake"])
                                .inc();
                            return;
                        }
                    };
                    let h2 = tls_stream.get_ref().1.alpn_protocol() == Some(b"h2");
                    // hyper owns one handle and this task keeps the other: when the header timer
                    // closes a connection that sent part of its first request, the client still
                    // gets its 408, encrypted.
                    let shared = SharedStream::new(tls_stream);
                    let conn = connection_builder(limits, h2)
                        .serve_connection(TokioIo::new(shared.clone()), svc)
                        .into_owned();
                    let watched = if h2 {
                        watcher.watch(conn)
                    } else {
                        watcher.watch_begun(conn, served.clone())
                    };
                    let ended = watched.await;
                    if let Some(cut) = head_cut(&metrics, ended, &served)
                        && !h2
                        && !served.is_set()
                        && let Some(mut tls_stream) = shared.into_inner()
                    {
                        use tokio::io::AsyncWriteExt;
                        let answer = head_cut_answer(cut, limits.header_read_timeout);
                        let _ = tokio::time::timeout(Duration::from_secs(1), async {
                            tls_stream.write_all(&answer).await?;
                            tls_stream.shutdown().await
                        })
                        .await;
                    }
                });
            }
        }
    }
}
