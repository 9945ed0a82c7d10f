//! Reload: re-read the config file and swap it in, keeping the old one on any error, and refuse
//! the changes that only a restart can apply (listeners, TLS, ledger, shared state, prices that
//! change without a new version).

use std::path::PathBuf;
use std::sync::Arc;

use super::{ConfigSource, Gateway, ReloadStatus};
use crate::config::{self, ConfigErrors, Snapshot};

impl Gateway {
    /// Keeps the command line's `--listen` / `--admin-listen`, so a reload compares like with
    /// like.
    pub fn keep_listen_overrides(
        &self,
        o: (Option<std::net::SocketAddr>, Option<std::net::SocketAddr>),
    ) {
        *self
            .listen_overrides
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = o;
    }

    /// A reloaded snapshot with the command line's addresses, or why it cannot apply live:
    /// listeners and TLS are bound once, at start.
    pub(super) fn check_restart_only(
        &self,
        mut snapshot: Snapshot,
    ) -> Result<Snapshot, ConfigErrors> {
        let (listen, admin) = *self
            .listen_overrides
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(l) = listen {
            snapshot.listen = l;
        }
        if let Some(a) = admin {
            snapshot.admin.listen = a;
        }
        let now = self.live().snapshot.clone();
        let mut changed = Vec::new();
        if snapshot.listen != now.listen {
            changed.push(format!("`listen` ({} → {})", now.listen, snapshot.listen));
        }
        if snapshot.admin.listen != now.admin.listen {
            changed.push(format!(
                "`admin.listen` ({} → {})",
                now.admin.listen, snapshot.admin.listen
            ));
        }
        if snapshot.tls != now.tls {
            changed.push("`tls`".to_string());
        }
        if snapshot.ledger != now.ledger {
            changed.push("`ledger`".to_string());
        }
        if snapshot.otlp != now.otlp {
            changed.push("`trace.otlp`".to_string());
        }
        if snapshot.redis != now.redis {
            changed.push("`state`".to_string());
        }
        let (old, new) = (&now.prices, &snapshot.prices);
        let same_prices = old.models == new.models && old.tier_multipliers == new.tier_multipliers;
        if new.version > old.version
            && let Some(l) = &self.ledger
            && let Err(e) = l.note_prices(new)
        {
            return Err(ConfigErrors(vec![config::ConfigError {
                file: PathBuf::new(),
                line: None,
                column: None,
                message: format!("{e}; the running prices keep serving"),
            }]));
        }
        if new.version < old.version || (new.version == old.version && !same_prices) {
            let prices_file = snapshot
                .files
                .iter()
                .find(|f| f.ends_with("prices.yaml"))
                .cloned()
                .unwrap_or_default();
            return Err(ConfigErrors(vec![config::ConfigError {
                file: prices_file,
                line: None,
                column: None,
                message: format!(
                    "prices changed but `version` went from {} to {}: raise it above {} so every cost names the prices it used; the running prices keep serving",
                    old.version, new.version, old.version
                ),
            }]));
        }
        if changed.is_empty() {
            return Ok(snapshot);
        }
        let file = match &self.source {
            ConfigSource::File(p) => p.clone(),
            ConfigSource::Embedded => PathBuf::new(),
        };
        Err(ConfigErrors(vec![config::ConfigError {
            file,
            line: None,
            column: None,
            message: format!(
                "{} changed: restart the gateway to apply it; the running config keeps serving",
                changed.join(", ")
            ),
        }]))
    }

    /// The latest reload outcome.
    pub fn reload_status(&self) -> ReloadStatus {
        self.reload_status
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// Re-reads the config file and swaps it in; on error the old snapshot keeps serving.
    pub async fn reload(self: &Arc<Self>) -> Result<(), ConfigErrors> {
        let _one_at_a_time = self.reload_lock.lock().await;
        let result = match &self.source {
            ConfigSource::File(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || config::load(&path))
                    .await
                    .unwrap_or_else(|e| {
                        Err(ConfigErrors(vec![config::ConfigError {
                            file: PathBuf::new(),
                            line: None,
                            column: None,
                            message: format!("reload task failed: {e}"),
                        }]))
                    })
            }
            ConfigSource::Embedded => Ok((*self.live().snapshot).clone()),
        }
        .and_then(|s| self.check_restart_only(s));
        let mut status = self.reload_status.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(snapshot) => {
                let previous = self.live();
                let live = self.build_live(snapshot, Some(&previous));
                self.live.store(Arc::new(live));
                status.ok += 1;
                status.last_error.clear();
                self.metrics.reloads.with_label_values(&["ok"]).inc();
                tracing::info!("configuration reloaded");
                Ok(())
            }
            Err(errors) => {
                status.failed += 1;
                status.last_error = errors.to_string();
                self.metrics.reloads.with_label_values(&["rejected"]).inc();
                tracing::error!(errors = %errors, "configuration rejected; the previous one keeps serving");
                Err(errors)
            }
        }
    }
}
