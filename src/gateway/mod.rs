//! The running gateway: the current snapshot with its pools (swapped atomically on reload), the
//! shared HTTP client and metrics, and the background loops. One file per job:
//! - [`reload`]: re-reading the config, and what only a restart may change;
//! - [`live`]: building the pools, tenants, canaries and shadows of a snapshot;
//! - [`publish`]: the metrics written outside the request path (scrape-time gauges, canary and
//!   degradation decisions, index sizes);
//! - [`background`]: the worker poll loop and the KV event subscriptions it opens;
//! - [`discovery`]: DNS discovery of a pool's workers;
//! - [`replay`]: the replayed regression prompts of `quality.regression`.

mod background;
mod discovery;
mod live;
mod publish;
mod reload;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::task::AbortHandle;

use crate::canary::Canary;
use crate::config::{Snapshot, TenantSpec};
use crate::limits::{InProcessLimiter, Limiter};
use crate::metrics::GatewayMetrics;
use crate::tenants::KeyTable;
use crate::upstream::{self, UpstreamClient};
use crate::workers::pool::PoolRuntime;

/// Starts each tenant's day and month spend from the ledger.
fn seed_budgets(
    book: &crate::budgets::BudgetBook,
    reader: &dyn crate::ledger::LedgerReader,
) -> Result<(), String> {
    use crate::budgets::Period;
    let now = crate::utc::now_ms();
    for period in [Period::Day, Period::Month] {
        let spend = reader
            .spend_since(period.start(now))
            .map_err(|e| format!("cannot read budget spend from the usage ledger: {e}"))?;
        for (tenant, nano) in spend {
            book.seed(&tenant, period, nano, now);
        }
    }
    Ok(())
}

/// One compiled configuration and the pools built from it; requests hold it until they finish.
pub struct Live {
    /// The configuration.
    pub snapshot: Arc<Snapshot>,
    /// Pools in snapshot order.
    pub pools: Vec<Arc<PoolRuntime>>,
    /// API key digests → index into `snapshot.tenants`.
    pub keys: KeyTable,
    /// Canary state per model (clients' name), kept across reloads that keep its spec.
    pub canaries: HashMap<String, Arc<Mutex<Canary>>>,
    /// Shadow traffic per model (clients' name).
    pub shadows: HashMap<String, crate::shadow::Shadow>,
    /// The caller of a config without tenants: `anonymous`, of the default tier.
    pub anonymous: crate::config::TenantSpec,
    discovery: Vec<AbortHandle>,
}

impl Drop for Live {
    fn drop(&mut self) {
        for task in &self.discovery {
            task.abort();
        }
    }
}

/// Where the configuration comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigSource {
    /// A file on disk (reloadable).
    File(PathBuf),
    /// The embedded default (`infergate up` without `--config`).
    Embedded,
}

/// Outcome of the latest reload attempt, for the admin status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReloadStatus {
    /// Successful reloads since start.
    pub ok: u64,
    /// Rejected reloads since start.
    pub failed: u64,
    /// Errors of the latest rejected attempt (empty after a success).
    pub last_error: String,
}

/// Shared state of the gateway.
pub struct Gateway {
    live: ArcSwap<Live>,
    /// Gateway metrics.
    pub metrics: Arc<GatewayMetrics>,
    /// The triage figures polled from workers, re-exported per pool and worker (registered in
    /// `metrics`; the polls update it).
    pub triage: Arc<crate::workers::triage_export::TriageExport>,
    /// Pooled client to workers.
    pub client: UpstreamClient,
    /// Per-tenant rate and concurrency limits.
    pub limiter: Arc<dyn Limiter>,
    /// Request body bytes held gateway-wide (`limits.max_buffered_body_bytes`).
    pub body_budget: Arc<crate::request_body::BodyBudget>,
    /// Requests in flight on the public listener, against `limits.max_requests_in_flight`.
    pub in_flight: Arc<infergate_engine::edge::InFlight>,
    /// The usage ledger, when one is kept.
    pub ledger: Option<Arc<crate::ledger::UsageLedger>>,
    /// The flight-record trace file's writer (`trace:`), when one is kept; set at start.
    pub trace: Option<Arc<crate::trace::TraceWriter>>,
    /// The flight records' OTLP exporter (`trace.otlp`), when one is configured; set at start.
    pub otlp: Option<Arc<crate::trace::otlp::OtlpExporter>>,
    /// The quality worker: sampled answers' signals and the drift windows (`quality:`).
    pub quality: Arc<crate::quality::QualitySampler>,
    /// Tenants' spend against their budgets.
    pub budgets: Arc<crate::budgets::BudgetBook>,
    /// Fleet mode: tenant limits shared through Redis (`state.redis`).
    pub shared: Option<Arc<crate::limits::SharedLimiter>>,
    /// Fleet mode: the shared directory of prefix homes (`state.redis.prefix_homes`).
    pub prefix_homes: Option<Arc<crate::workers::prefix_homes::PrefixHomes>>,
    extra_tenants: Vec<TenantSpec>,
    draining: AtomicBool,
    /// Set when the drain's grace is over: streams and requests still waiting end now.
    grace_over: tokio::sync::watch::Sender<bool>,
    /// A receiver of `grace_over`, lent to requests (cloned only by those that wait on it).
    grace_watch: tokio::sync::watch::Receiver<bool>,
    source: ConfigSource,
    spawned: HashMap<String, Vec<String>>,
    reload_status: Mutex<ReloadStatus>,
    reload_lock: tokio::sync::Mutex<()>,
    /// `--listen` / `--admin-listen` given on the command line, re-applied to every reload.
    listen_overrides: Mutex<(Option<std::net::SocketAddr>, Option<std::net::SocketAddr>)>,
}

impl Gateway {
    /// Builds the gateway from a validated snapshot. `spawned` maps pool names to the URLs of
    /// workers this process started for the pool's `spawn` entries; `extra_tenants` (the demo
    /// tenant of `up`) serve whenever the config declares no tenants of its own. Budgets start
    /// from what `ledger` recorded this day and month.
    pub fn new(
        snapshot: Snapshot,
        source: ConfigSource,
        (spawned, extra_tenants): (HashMap<String, Vec<String>>, Vec<TenantSpec>),
        ledger: Option<Arc<crate::ledger::UsageLedger>>,
    ) -> Result<Arc<Self>, String> {
        let budgets = Arc::new(crate::budgets::BudgetBook::new());
        let shared = match &snapshot.redis {
            Some(settings) => Some(crate::limits::SharedLimiter::new(
                settings.clone(),
                snapshot.forward.total_timeout,
            )?),
            None => None,
        };
        if let Some(l) = &ledger {
            seed_budgets(&budgets, l.reader().as_ref())?;
        }
        let metrics = Arc::new(GatewayMetrics::new().map_err(|e| e.to_string())?);
        let triage = Arc::new(
            crate::workers::triage_export::TriageExport::new().map_err(|e| e.to_string())?,
        );
        metrics
            .register(triage.clone())
            .map_err(|e| e.to_string())?;
        let trace = match &snapshot.trace {
            Some(config) => Some(crate::trace::TraceWriter::start(
                config,
                metrics.trace_lines.clone(),
            )?),
            None => None,
        };
        let otlp = match &snapshot.otlp {
            Some(config) => Some(crate::trace::otlp::OtlpExporter::start(
                config,
                metrics.otlp_spans.clone(),
            )?),
            None => None,
        };
        let quality =
            crate::quality::QualitySampler::start(metrics.clone(), snapshot.quality.queue)?;
        if let Some(d) = &snapshot.quality.drift {
            metrics.drift_threshold.set(d.psi_threshold);
        }
        let client = upstream::client(snapshot.forward.connect_timeout);
        let (grace_over, grace_watch) = tokio::sync::watch::channel(false);
        let gw = Arc::new(Self {
            live: ArcSwap::from_pointee(Live {
                snapshot: Arc::new(snapshot.clone()),
                pools: Vec::new(),
                keys: KeyTable::new(&[]),
                canaries: HashMap::new(),
                shadows: HashMap::new(),
                anonymous: live::anonymous(&snapshot),
                discovery: Vec::new(),
            }),
            metrics,
            triage,
            client,
            limiter: Arc::new(InProcessLimiter::new()),
            body_budget: Arc::default(),
            in_flight: Arc::new(infergate_engine::edge::InFlight::new(None)),
            ledger,
            trace,
            otlp,
            quality,
            budgets,
            prefix_homes: shared
                .as_ref()
                .filter(|s| s.settings().prefix_homes)
                .map(|s| crate::workers::prefix_homes::PrefixHomes::new(s.clone())),
            shared,
            extra_tenants,
            draining: AtomicBool::new(false),
            grace_over,
            grace_watch,
            source,
            spawned,
            reload_status: Mutex::new(ReloadStatus::default()),
            reload_lock: tokio::sync::Mutex::new(()),
            listen_overrides: Mutex::new((None, None)),
        });
        let live = gw.build_live(snapshot, None);
        gw.live.store(Arc::new(live));
        Ok(gw)
    }

    /// The configuration and pools now in force.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Where the config comes from.
    pub fn source(&self) -> &ConfigSource {
        &self.source
    }

    /// Ends what is still in flight at the end of the drain's grace: each stream gets an SSE
    /// error event and `[DONE]`, each request still waiting for its worker a 503.
    pub fn end_grace(&self) {
        self.grace_over.send_replace(true);
    }

    /// A receiver that sees [`end_grace`](Self::end_grace) (clone it to wait on it).
    pub fn grace_over(&self) -> &tokio::sync::watch::Receiver<bool> {
        &self.grace_watch
    }

    /// True once a drain started.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Starts draining: readiness fails from now on.
    pub fn start_drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Ready: not draining, shared state reachable when the config fails closed, every worker
    /// polled at least once (so that a pool whose workers are warm is not refused for a moment
    /// after start while its first poll is under way), and at least one healthy, warm worker.
    pub fn is_ready(&self) -> bool {
        let live = self.live();
        let workers = || {
            live.pools
                .iter()
                .flat_map(|p| p.workers().iter().cloned().collect::<Vec<_>>())
        };
        !self.is_draining()
            && !self.shared.as_ref().is_some_and(|s| s.blocks_readiness())
            && workers().all(|w| w.warmth() != crate::workers::state::Warmth::Unknown)
            && workers().any(|w| w.is_healthy() && w.is_warm())
    }
}
