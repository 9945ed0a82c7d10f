//! What starts a reload (SIGHUP, a change to a config file) and what starts the drain
//! (SIGTERM, Ctrl-C).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify::Watcher;

use crate::gateway::{ConfigSource, Gateway};

/// Reload on SIGHUP and on changes to any config file (watching their directories, so that a
/// Kubernetes ConfigMap's `..data` symlink swap is seen).
pub(super) fn spawn_reload_triggers(gw: &Arc<Gateway>) {
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

pub(super) async fn shutdown_signal() {
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
