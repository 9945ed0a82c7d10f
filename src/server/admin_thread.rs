//! The admin listener on its own thread and runtime.

use std::sync::Arc;

use infergate_engine::edge::{self};
use tokio::net::TcpListener;

use super::accept::accept_loop;
use crate::gateway::Gateway;

/// Runs the admin listener on its own thread and runtime, so a flood of client connections on
/// the public listener cannot delay liveness and readiness probes: `/healthz` and `/readyz` are
/// answered on that thread, every other admin route is handed to the main runtime (where reloads
/// and their background tasks belong). Stopped by notifying the returned handle.
pub(super) fn spawn_admin_thread(
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
