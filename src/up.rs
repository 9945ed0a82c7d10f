//! `infergate up` and `infergate gateway`: load the config (a file, or the embedded default),
//! start the workers its `spawn` entries declare, wait until they are ready, then serve.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{self, Snapshot, TenantSpec, WorkerSource};
use crate::gateway::{ConfigSource, Gateway};
use crate::supervisor::{Supervisor, SupervisorConfig, WorkerSpec};

/// Flags of `infergate up` / `infergate gateway`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunArgs {
    /// Gateway config file (default for `up`: the embedded `config/infergate.yaml`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override the public listen address (port 0 picks a free one).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Override the admin listen address.
    #[arg(long)]
    pub admin_listen: Option<SocketAddr>,
    /// Override the number of workers of every `spawn` entry running the sim backend (cpu and
    /// other backends keep the config's count: each loads a real model).
    #[arg(long)]
    pub workers: Option<usize>,
}

/// Sets the count of every `spawn` entry whose worker runs the sim backend (the engine's
/// default) to `n` (at least 1).
pub fn scale_sim_spawns(snapshot: &mut Snapshot, n: usize) {
    for pool in &mut snapshot.pools {
        for w in &mut pool.workers {
            if let WorkerSource::Spawn { count, args } = w
                && spawn_backend(args) == "sim"
            {
                *count = n.max(1);
            }
        }
    }
}

/// The `--backend` a spawn entry's arguments name; `sim` when they name none.
fn spawn_backend(args: &[String]) -> &str {
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--backend" {
            return it.next().map_or("sim", String::as_str);
        }
        if let Some(value) = arg.strip_prefix("--backend=") {
            return value;
        }
    }
    "sim"
}

/// Loads the snapshot named by `config`, or the embedded default.
pub fn load_snapshot(config: Option<&Path>) -> Result<(Snapshot, ConfigSource), String> {
    match config {
        Some(path) => config::load(path)
            .map(|s| (s, ConfigSource::File(path.to_path_buf())))
            .map_err(|e| format!("invalid configuration:\n{e}")),
        None => config::load_embedded("<embedded>/")
            .map(|s| (s, ConfigSource::Embedded))
            .map_err(|e| format!("invalid embedded configuration:\n{e}")),
    }
}

/// Runs the gateway (and its spawned workers) on a loaded config until SIGTERM / Ctrl-C.
pub async fn run(
    args: RunArgs,
    loaded: (Snapshot, ConfigSource),
    demo_key: bool,
) -> Result<(), String> {
    let (mut snapshot, source) = loaded;
    // Before the workers start, so they inherit it.
    crate::server::raise_open_file_limit();
    // Before any worker starts, so a ledger that cannot open leaves nothing behind.
    let ledger = open_ledger(&snapshot.ledger, &snapshot.prices, demo_key)?;
    let has_budgets = snapshot.tiers.iter().any(|t| !t.budgets.is_empty())
        || snapshot.tenant_budgets.values().any(|b| !b.is_empty());
    if ledger.is_none() && has_budgets {
        eprintln!(
            "warning: budgets are configured but no usage ledger is kept (`ledger:`): spend starts at 0 at every restart"
        );
    }
    let overrides = (args.listen, args.admin_listen);
    if let Some(listen) = args.listen {
        snapshot.listen = listen;
    }
    if let Some(admin) = args.admin_listen {
        // The same rule as the config's: the admin API leaves loopback only behind a key.
        if !admin.ip().is_loopback() && snapshot.admin.api_key.is_none() {
            return Err(format!(
                "--admin-listen {admin} is not a loopback address: set admin.api_key_env in the config to the environment variable holding the admin key"
            ));
        }
        snapshot.admin.listen = admin;
    }
    if let Some(n) = args.workers {
        scale_sim_spawns(&mut snapshot, n);
    }
    let mut specs = Vec::new();
    for pool in &snapshot.pools {
        for w in &pool.workers {
            if let WorkerSource::Spawn { count, args } = w {
                for _ in 0..*count {
                    // The worker binds a port of its own; the supervisor learns it.
                    let port = 0;
                    let mut full = vec!["engine".to_string()];
                    full.extend(args.iter().cloned());
                    specs.push(WorkerSpec {
                        pool: pool.name.clone(),
                        args: full,
                        port,
                    });
                }
            }
        }
    }
    let supervisor = if specs.is_empty() {
        None
    } else {
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
        eprintln!("starting {} local engine worker(s)...", specs.len());
        Some(
            Supervisor::start(
                specs,
                SupervisorConfig {
                    exe,
                    ready_timeout: Duration::from_secs(60),
                    // The gateway has drained (its grace) before the workers are stopped, so
                    // they have nothing left to finish: half a second, and `up` exits within
                    // its grace plus a second.
                    stop_grace: Duration::from_millis(500),
                    backoff_min: Duration::from_millis(200),
                    backoff_max: Duration::from_secs(10),
                },
            )
            .await?,
        )
    };
    let mut spawned: HashMap<String, Vec<String>> = HashMap::new();
    if let Some(s) = &supervisor {
        for (pool, url) in s.urls() {
            spawned.entry(pool).or_default().push(url);
        }
    }
    // `up` with a config that declares no tenants: a demo tenant with a key made fresh now, so
    // no shipped file ever holds a usable key.
    let mut extra = Vec::new();
    let mut demo = None;
    if demo_key && snapshot.tenants.is_empty() {
        let key =
            crate::tenants::generate_key().map_err(|e| format!("cannot make a demo key: {e}"))?;
        let tier = snapshot
            .default_tier
            .clone()
            .or_else(|| snapshot.tiers.first().map(|t| t.name.clone()))
            .unwrap_or_default();
        extra.push(TenantSpec {
            name: "demo".into(),
            tier,
            key_hashes: vec![crate::tenants::hash_key(&key)],
        });
        demo = Some(key);
    }
    let result = serve_gateway(
        snapshot,
        source,
        (spawned, extra),
        demo,
        overrides,
        ledger.clone(),
    )
    .await;
    if let Some(l) = ledger {
        // Whatever is still queued is written before exit.
        let _ = tokio::task::spawn_blocking(move || l.close()).await;
    }
    if let Some(s) = supervisor {
        s.shutdown().await;
    }
    result
}

/// The usage ledger `ledger:` asks for; `infergate up` (`in_cache`) keeps one in its cache
/// directory when the config says nothing.
fn open_ledger(
    config: &crate::ledger::LedgerConfig,
    prices: &crate::pricing::Prices,
    in_cache: bool,
) -> Result<Option<Arc<crate::ledger::UsageLedger>>, String> {
    use crate::ledger::{LedgerConfig, LedgerSettings, UsageLedger};
    let settings = match config {
        LedgerConfig::On(s) => s.clone(),
        LedgerConfig::Unset if in_cache => LedgerSettings::at(
            infergate_engine::model::default_model::cache_root().join("ledger.sqlite"),
        ),
        LedgerConfig::Unset | LedgerConfig::Off => return Ok(None),
    };
    let place = settings.backend.describe();
    let ledger = UsageLedger::open(&settings).map_err(|e| format!("usage ledger {place}: {e}"))?;
    ledger
        .note_prices(prices)
        .map_err(|e| format!("usage ledger {place}: {e}"))?;
    println!("usage ledger: {place}");
    Ok(Some(ledger))
}

async fn serve_gateway(
    snapshot: Snapshot,
    source: ConfigSource,
    tenants: (HashMap<String, Vec<String>>, Vec<TenantSpec>),
    demo_key: Option<String>,
    overrides: (Option<SocketAddr>, Option<SocketAddr>),
    ledger: Option<Arc<crate::ledger::UsageLedger>>,
) -> Result<(), String> {
    let first_model = snapshot.models.first().map(|m| m.name.clone());
    let has_tenants = !snapshot.tenants.is_empty() || !tenants.1.is_empty();
    let tls = snapshot.tls.is_some();
    let gw = Gateway::new(snapshot, source, tenants, ledger)?;
    if let Some(s) = &gw.shared {
        s.start(gw.budgets.clone()).await;
        let state = if s.is_healthy() {
            "shared through Redis"
        } else {
            "local share (Redis unreachable)"
        };
        println!("tenant limits: {state}");
    }
    if let Some(homes) = &gw.prefix_homes {
        let weak = Arc::downgrade(&gw);
        homes.start(move || weak.upgrade().map(|gw| gw.live().pools.clone()));
    }
    gw.keep_listen_overrides(overrides);
    let listeners = crate::server::bind(&gw).await?;
    let public = listeners.public.local_addr().map_err(|e| e.to_string())?;
    let admin = listeners.admin.local_addr().map_err(|e| e.to_string())?;
    let scheme = if tls { "https" } else { "http" };
    println!("infergate gateway listening on {scheme}://{public}");
    println!("admin listening on http://{admin}");
    let auth = match &demo_key {
        Some(key) => {
            println!("demo API key (new at every start): {key}");
            format!(" -H 'authorization: Bearer {key}'")
        }
        // Auth is on: the curl needs a key, which only the operator has.
        None if has_tenants => {
            println!("auth is on: set INFERGATE_API_KEY to one of the configured tenants' keys");
            " -H \"authorization: Bearer $INFERGATE_API_KEY\"".to_string()
        }
        None => String::new(),
    };
    if let Some(model) = first_model {
        println!(
            "try:\n  curl -N {scheme}://{public}/v1/chat/completions{auth} -H 'content-type: application/json' \\\n    -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}],\"max_tokens\":32,\"stream\":true}}'"
        );
    }
    tracing::info!(%public, %admin, "gateway ready");
    crate::server::serve(gw, listeners).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_flag_scales_sim_spawns_only() {
        let (mut snapshot, _) = load_snapshot(None).unwrap();
        scale_sim_spawns(&mut snapshot, 3);
        let counts: Vec<(String, usize)> = snapshot
            .pools
            .iter()
            .flat_map(|p| {
                p.workers.iter().filter_map(|w| match w {
                    WorkerSource::Spawn { count, .. } => Some((p.name.clone(), *count)),
                    _ => None,
                })
            })
            .collect();
        let of = |pool: &str| counts.iter().find(|(p, _)| p == pool).map(|(_, c)| *c);
        assert_eq!(of("cpu"), Some(1), "{counts:?}");
        assert!(
            counts
                .iter()
                .filter(|(p, _)| p != "cpu")
                .all(|(_, c)| *c == 3),
            "{counts:?}"
        );
        assert_eq!(spawn_backend(&["--backend=cpu".into()]), "cpu");
        assert_eq!(spawn_backend(&["--gpu".into(), "h100".into()]), "sim");
    }
}
