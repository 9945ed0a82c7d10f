//! Serving: binding the listeners and the gateway's lifecycle ([`serve`]: poll loop, reload
//! triggers, the two listeners, the drain on SIGTERM / Ctrl-C). The parts, one file each:
//! [`accept`] (the accept loop: connection caps, h2 sniffing, TLS, hyper's timers, the drain's
//! watch), [`connections`] (caps in all and per client IP), [`head_cut`] (the 408 for a head
//! that never ended), [`admin_thread`] (the admin listener on its own thread) and [`reload`]
//! (SIGHUP, config file changes, the shutdown signal). The request path itself is
//! [`crate::pipeline`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use infergate_engine::edge;
use tokio::net::TcpListener;

use crate::config::TlsConfig;
use crate::gateway::Gateway;

mod accept;
mod admin_thread;
mod connections;
mod head_cut;
mod reload;

use accept::accept_loop;
use admin_thread::spawn_admin_thread;
use reload::{shutdown_signal, spawn_reload_triggers};

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
    tokio::spawn(gw.clone().replay_loop());
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
