//! Listeners and lifecycle: the public listener (plain or TLS), the admin listener, config reload
//! triggers (file change, SIGHUP, admin), and the drain on SIGTERM / Ctrl-C.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use infergate_engine::edge::{self, LimitedBody};
use notify::Watcher;
use tokio::net::TcpListener;

use crate::config::{ConnectionLimits, TlsConfig};
use crate::error::{GatewayError, ResBody};
use crate::gateway::{ConfigSource, Gateway};
use crate::metrics::GatewayMetrics;

/// Bound listeners, ready to serve.
pub struct Listeners {
    /// Public listener.
    pub public: TcpListener,
    /// Admin listener.
    pub admin: TcpListener,
    /// TLS for the public listener.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Pending connections the kernel may queue before `accept()` (it caps this at
/// `net.core.somaxconn`): a burst of connects waits there instead of having SYNs dropped and
/// retried a second later, which would delay every client, health probes included.
const LISTEN_BACKLOG: u32 = 65_535;

/// A listener on `addr` with [`LISTEN_BACKLOG`] (tokio's `bind` uses 1,024).
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds the public and admin addresses of the current snapshot.
pub async fn bind(gw: &Gateway) -> Result<Listeners, String> {
    let live = gw.live();
    let s = &live.snapshot;
    let public = listen(s.listen).map_err(|e| format!("cannot bind {}: {e}", s.listen))?;
    let admin =
        listen(s.admin.listen).map_err(|e| format!("cannot bind admin {}: {e}", s.admin.listen))?;
    let tls = match &s.tls {
        Some(t) => Some(tls_acceptor(t)?),
        None => None,
    };
    Ok(Listeners { public, admin, tls })
}

/// Builds a rustls acceptor from PEM files (HTTP/2 and HTTP/1.1 by ALPN).
pub fn tls_acceptor(t: &TlsConfig) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(&t.cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read TLS certificate {}: {e}", t.cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(&t.key)
        .map_err(|e| format!("cannot read TLS key {}: {e}", t.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS certificate/key: {e}"))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

/// Serves until SIGTERM / Ctrl-C, then drains: readiness fails, listeners close, in-flight
/// requests get the configured grace period.
pub async fn serve(gw: Arc<Gateway>, listeners: Listeners) -> Result<(), String> {
    tokio::spawn(gw.clone().poll_loop());
    spawn_reload_triggers(&gw);
    let graceful = Arc::new(edge::Drain::new());
    let public = tokio::spawn(accept_loop(
        gw.clone(),
        listeners.public,
        listeners.tls,
        graceful.clone(),
        None,
    ));
    let (admin, admin_stop) = spawn_admin_thread(gw.clone(), listeners.admin, graceful.clone())?;
    shutdown_signal().await;
    gw.start_drain();
    tracing::info!("draining: refusing new connections, finishing in-flight requests");
    public.abort();
    admin_stop.notify_one();
    // The accept loops hold the shutdown handle: wait until they are really gone.
    let _ = public.await;
    let _ = tokio::task::spawn_blocking(move || admin.join()).await;
    let grace = gw.live().snapshot.drain_grace;
    let graceful = Arc::try_unwrap(graceful).map_err(|_| "graceful shutdown still shared")?;
    // Clients who never finished a request get no grace: a body still arriving is answered 503
    // now, and a connection whose first head is unfinished is answered 408 by the drain below
    // (one idle, or between requests, hyper closes at once).
    gw.body_budget.close();
    let shutdown = graceful.shutdown();
    tokio::pin!(shutdown);
    if tokio::time::timeout(grace, &mut shutdown).await.is_err() {
        // Streams get an error event and `[DONE]`, waiting requests a 503; then they close.
        tracing::warn!(
            ?grace,
            "grace period over; ending the requests still in flight"
        );
        gw.end_grace();
        // Half a second for the final events and 503s to be written; a connection idle or still
        // sending its head has no answer coming and does not hold the exit.
        if tokio::time::timeout(END_OF_GRACE_FLUSH, &mut shutdown)
            .await
            .is_err()
        {
            tracing::warn!("exiting with connections still open");
        }
    }
    Ok(())
}

/// Raises the open-file soft limit to the hard limit (each client and upstream connection is a
/// descriptor; distributions often start services at 1,024) and logs both.
pub fn raise_open_file_limit() {
    use rlimit::Resource;
    match Resource::NOFILE.get() {
        Ok((soft, hard)) if soft < hard => match Resource::NOFILE.set(hard, hard) {
            Ok(()) => tracing::info!(from = soft, to = hard, "raised the open-file soft limit"),
            Err(e) => {
                tracing::warn!(soft, hard, error = %e, "could not raise the open-file soft limit")
            }
        },
        Ok((soft, hard)) => tracing::info!(soft, hard, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "could not read the open-file limit"),
    }
}

/// How long, past the grace, the requests it ended get to write their last bytes.
const END_OF_GRACE_FLUSH: Duration = Duration::from_millis(500);

/// Open client connections, in all and per client IP, against the live `limits:`.
#[derive(Default)]
struct ConnectionCounts {
    total: u32,
    per_ip: HashMap<IpAddr, u32>,
}

/// Holds one connection's place in [`ConnectionCounts`] until dropped.
struct ConnectionSlot {
    counts: Arc<Mutex<ConnectionCounts>>,
    ip: IpAddr,
    metrics: Arc<GatewayMetrics>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut c = self
            .counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.per_ip.remove(&self.ip);
            }
        }
        self.metrics.connections_open.set(i64::from(c.total));
    }
}

/// Takes a connection slot for `ip`, or says which cap refused it.
fn take_slot(
    gw: &Arc<Gateway>,
    counts: &Arc<Mutex<ConnectionCounts>>,
    ip: IpAddr,
    limits: ConnectionLimits,
) -> Result<ConnectionSlot, &'static str> {
    let mut c = counts
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if c.total >= limits.max_connections {
        return Err("max_connections");
    }
    let n = c.per_ip.entry(ip).or_insert(0);
    if *n >= limits.max_connections_per_ip {
        return Err("max_connections_per_ip");
    }
    *n += 1;
    c.total += 1;
    gw.metrics.connections_open.set(i64::from(c.total));
    Ok(ConnectionSlot {
        counts: counts.clone(),
        ip,
        metrics: gw.metrics.clone(),
    })
}

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

/// Runs the admin listener on its own thread and runtime, so a flood of client connections on
/// the public listener cannot delay liveness and readiness probes: `/healthz` and `/readyz` are
/// answered on that thread, every other admin route is handed to the main runtime (where reloads
/// and their background tasks belong). Stopped by notifying the returned handle.
fn spawn_admin_thread(
    gw: Arc<Gateway>,
    listener: TcpListener,
    graceful: Arc<edge::Drain>,
) -> Result<(std::thread::JoinHandle<()>, Arc<tokio::sync::Notify>), String> {
    let main = tokio::runtime::Handle::current();
    let listener = listener
        .into_std()
        .map_err(|e| format!("admin listener: {e}"))?;
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    let thread = std::thread::Builder::new()
        .name("infergate-admin".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the admin runtime");
                    return;
                }
            };
            rt.block_on(async move {
                let listener = match TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot serve the admin listener");
                        return;
                    }
                };
                tokio::select! {
                    () = accept_loop(gw, listener, None, graceful, Some(main)) => {}
                    () = stopped.notified() => {}
                }
            });
        })
        .map_err(|e| format!("cannot start the admin thread: {e}"))?;
    Ok((thread, stop))
}

async fn accept_loop(
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

/// The HTTP/2 client preface (prior knowledge, `h2c`).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether a plain connection speaks HTTP/2, from its first bytes (without consuming them);
/// `None` when the client has not said enough within `within`.
async fn sniff_h2(stream: &tokio::net::TcpStream, within: Duration) -> Option<bool> {
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
enum HeadCut {
    /// hyper's header timer fired.
    TimedOut,
    /// A drain started before the connection's first request began.
    Draining,
}

/// Whether a client connection ended (as `ended` and `begun` say) for want of a complete head,
/// counting those that ended on hyper's header timer: then it may still be told why.
fn head_cut(
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
fn spare_of(stream: &tokio::net::TcpStream) -> Option<std::net::TcpStream> {
    use std::os::fd::AsFd;
    let fd = stream.as_fd().try_clone_to_owned().ok()?;
    Some(std::net::TcpStream::from(fd))
}

/// The whole HTTP/1.1 408 answer for a header block that did not arrive within `limit`, or was
/// not complete when the drain started.
fn head_cut_answer(cut: HeadCut, limit: Duration) -> Vec<u8> {
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
fn answer_head_cut(spare: &std::net::TcpStream, cut: HeadCut, limit: Duration) {
    use std::io::Write;
    // Non-blocking and small: it fits the socket buffer, and a failure changes nothing.
    let mut spare = spare;
    let _ = spare.write_all(&head_cut_answer(cut, limit));
}

/// A stream with two owners: hyper serves the connection through one handle, and the accept
/// task takes the stream back through the other once hyper is done (to answer a timeout on a
/// TLS connection, where the raw socket cannot be written). Only one side polls at a time, so
/// the lock is never contended.
struct SharedStream<S>(Arc<Mutex<S>>);

impl<S> Clone for SharedStream<S> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S: Unpin> SharedStream<S> {
    fn new(stream: S) -> Self {
        Self(Arc::new(Mutex::new(stream)))
    }

    /// The stream, once every other handle is gone.
    fn into_inner(self) -> Option<S> {
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

/// Reload on SIGHUP and on changes to any config file (watching their directories, so that a
/// Kubernetes ConfigMap's `..data` symlink swap is seen).
fn spawn_reload_triggers(gw: &Arc<Gateway>) {
    #[cfg(unix)]
    {
        let gw = gw.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let Ok(mut hup) = signal(SignalKind::hangup()) else {
                return;
            };
            while hup.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading configuration");
                let _ = gw.reload().await;
            }
        });
    }
    if let ConfigSource::File(_) = gw.source() {
        let files: Vec<PathBuf> = gw.live().snapshot.files.clone();
        let mut dirs: Vec<PathBuf> = files
            .iter()
            .filter_map(|f| f.parent().map(PathBuf::from))
            .collect();
        dirs.sort();
        dirs.dedup();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            if let Ok(ev) = ev
                && !matches!(ev.kind, notify::EventKind::Access(_))
                && ev.paths.iter().any(|p| is_config_change(p, &files))
            {
                let _ = tx.try_send(());
            }
        });
        let mut watcher = match watcher {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch config files; reload with SIGHUP or the admin API");
                return;
            }
        };
        for dir in dirs {
            if let Err(e) = watcher.watch(dir.as_path(), notify::RecursiveMode::NonRecursive) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch config directory");
            }
        }
        let gw = gw.clone();
        tokio::spawn(async move {
            let _keep_alive = watcher;
            while rx.recv().await.is_some() {
                // Editors write in several steps: let the burst settle before reading.
                tokio::time::sleep(Duration::from_millis(150)).await;
                while rx.try_recv().is_ok() {}
                let _ = gw.reload().await;
            }
        });
    }
}

/// Whether a change at `path` in a watched directory concerns the config: one of its `files`
/// (notify names them as the watched directory joined with the file name), or a Kubernetes
/// ConfigMap's atomic swap (`..data`, `..2024_01_01_...`). Anything else there, such as the
/// gateway's own log file, is not a reason to reload.
fn is_config_change(path: &std::path::Path, files: &[PathBuf]) -> bool {
    files.iter().any(|f| f == path)
        || path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(".."))
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
