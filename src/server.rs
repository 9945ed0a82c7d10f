//! Listeners and lifecycle: the public listener (plain or TLS), the admin listener, config reload
//! triggers (file change, SIGHUP, admin), and the drain on SIGTERM / Ctrl-C.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use notify::Watcher;
use tokio::net::TcpListener;

use crate::config::TlsConfig;
use crate::error::ResBody;
use crate::gateway::{ConfigSource, Gateway};

/// Bound listeners, ready to serve.
pub struct Listeners {
    /// Public listener.
    pub public: TcpListener,
    /// Admin listener.
    pub admin: TcpListener,
    /// TLS for the public listener.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

/// Binds the public and admin addresses of the current snapshot.
pub async fn bind(gw: &Gateway) -> Result<Listeners, String> {
    let live = gw.live();
    let s = &live.snapshot;
    let public = TcpListener::bind(s.listen)
        .await
        .map_err(|e| format!("cannot bind {}: {e}", s.listen))?;
    let admin = TcpListener::bind(s.admin.listen)
        .await
        .map_err(|e| format!("cannot bind admin {}: {e}", s.admin.listen))?;
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
    let graceful = Arc::new(GracefulShutdown::new());
    let public = tokio::spawn(accept_loop(
        gw.clone(),
        listeners.public,
        listeners.tls,
        graceful.clone(),
        false,
    ));
    let admin = tokio::spawn(accept_loop(
        gw.clone(),
        listeners.admin,
        None,
        graceful.clone(),
        true,
    ));
    shutdown_signal().await;
    gw.start_drain();
    tracing::info!("draining: refusing new connections, finishing in-flight requests");
    public.abort();
    admin.abort();
    // The accept loops hold the shutdown handle: wait until they are really gone.
    let _ = public.await;
    let _ = admin.await;
    let grace = gw.live().snapshot.drain_grace;
    let graceful = Arc::try_unwrap(graceful).map_err(|_| "graceful shutdown still shared")?;
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(?grace, "grace period over; exiting with requests in flight");
    }
    Ok(())
}

async fn accept_loop(
    gw: Arc<Gateway>,
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    graceful: Arc<GracefulShutdown>,
    is_admin: bool,
) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let gw = gw.clone();
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let gw = gw.clone();
            async move {
                let res: Response<ResBody> = if is_admin {
                    crate::admin::handle(gw, req).await
                } else {
                    crate::handler::handle(gw, req).await
                };
                Ok::<_, Infallible>(res)
            }
        });
        match &tls {
            None => {
                let conn = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                // A watcher, not the handle: connection tasks must not keep shutdown waiting
                // for them to let go of it.
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let tls_stream = match tokio::time::timeout(
                        Duration::from_secs(10),
                        acceptor.accept(stream),
                    )
                    .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                    let conn = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls_stream), svc)
                        .into_owned();
                    let _ = watcher.watch(conn).await;
                });
            }
        }
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
        let dirs: Vec<PathBuf> = gw
            .live()
            .snapshot
            .files
            .iter()
            .filter_map(|f| f.parent().map(PathBuf::from))
            .collect();
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            if let Ok(ev) = ev
                && !matches!(ev.kind, notify::EventKind::Access(_))
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
