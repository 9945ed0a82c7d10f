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
    // The runtime and the listener's registration are made here, not on the new thread: one
    // that cannot be made (no descriptor left, say) fails the gateway's start, instead of a
    // thread that returns later and leaves the admin port closed behind a running gateway.
    let rt = AdminRuntime(Some(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the admin runtime: {e}"))?,
    ));
    let listener = {
        let _entered = rt.get().enter();
        TcpListener::from_std(listener)
            .map_err(|e| format!("cannot serve the admin listener: {e}"))?
    };
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    let thread = std::thread::Builder::new()
        .name("infergate-admin".into())
        .spawn(move || {
            rt.get().block_on(async move {
                tokio::select! {
                    () = accept_loop(gw, listener, None, graceful, Some(main)) => {}
                    () = stopped.notified() => {}
                }
            });
        })
        .map_err(|e| format!("cannot start the admin thread: {e}"))?;
    Ok((thread, stop))
}

/// The admin thread's runtime, shut down without waiting when dropped: it is built on the main
/// runtime's thread, where dropping it (on an error before its thread starts) must not block.
struct AdminRuntime(Option<tokio::runtime::Runtime>);

impl AdminRuntime {
    fn get(&self) -> &tokio::runtime::Runtime {
        // Some until dropped.
        self.0.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for AdminRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}
