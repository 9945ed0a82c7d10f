//! The running gateway: the current snapshot with its pools (swapped atomically on reload), the
//! shared HTTP client and metrics, and the background loops (load polling, DNS discovery).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::task::AbortHandle;

use crate::canary::{Canary, Decision};
use crate::config::{self, ConfigErrors, Snapshot, TenantSpec, WorkerSource};
use crate::degrade::live::PoolDegradation;
use crate::limits::{InProcessLimiter, Limiter};
use crate::metrics::GatewayMetrics;
use crate::routing;
use crate::routing::PolicyConfig;
use crate::tenants::KeyTable;
use crate::upstream::{self, UpstreamClient};
use crate::workers::kv_events;
use crate::workers::poller::{PollSettings, poll_worker};
use crate::workers::pool::{PolicyHolder, PoolRuntime};
use crate::workers::state::{KvEventsState, WorkerState};

/// Raises a Prometheus counter to `total`, a count kept elsewhere (the ledger writer, the Redis
/// client). One lock for all: two scrapes at once must not both add the same difference.
fn catch_up(counter: &prometheus::IntCounter, total: u64) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    counter.inc_by(total.saturating_sub(counter.get()));
}

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
    /// Pooled client to workers.
    pub client: UpstreamClient,
    /// Per-tenant rate and concurrency limits.
    pub limiter: Arc<dyn Limiter>,
    /// Request body bytes held gateway-wide (`limits.max_buffered_body_bytes`).
    pub body_budget: Arc<crate::request_body::BodyBudget>,
    /// The usage ledger, when one is kept.
    pub ledger: Option<Arc<crate::ledger::UsageLedger>>,
    /// Tenants' spend against their budgets.
    pub budgets: Arc<crate::budgets::BudgetBook>,
    /// Fleet mode: tenant limits shared through Redis (`state.redis`).
    pub shared: Option<Arc<crate::limits::SharedLimiter>>,
    extra_tenants: Vec<TenantSpec>,
    draining: AtomicBool,
    /// Set when the drain's grace is over: streams and requests still waiting end now.
    grace_over: tokio::sync::watch::Sender<bool>,
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
        let client = upstream::client(snapshot.forward.connect_timeout);
        let gw = Arc::new(Self {
            live: ArcSwap::from_pointee(Live {
                snapshot: Arc::new(snapshot.clone()),
                pools: Vec::new(),
                keys: KeyTable::new(&[]),
                canaries: HashMap::new(),
                shadows: HashMap::new(),
                discovery: Vec::new(),
            }),
            metrics,
            client,
            limiter: Arc::new(InProcessLimiter::new()),
            body_budget: Arc::default(),
            ledger,
            budgets,
            shared,
            extra_tenants,
            draining: AtomicBool::new(false),
            grace_over: tokio::sync::watch::channel(false).0,
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
    fn check_restart_only(&self, mut snapshot: Snapshot) -> Result<Snapshot, ConfigErrors> {
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

    /// The configuration and pools now in force.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Where the config comes from.
    pub fn source(&self) -> &ConfigSource {
        &self.source
    }

    /// The Prometheus text of every gateway metric, with the gauges read at scrape time.
    pub fn render_metrics(&self) -> String {
        self.metrics
            .body_bytes_held
            .set(i64::try_from(self.body_budget.held()).unwrap_or(i64::MAX));
        if let Some(s) = &self.shared {
            let m = &self.metrics;
            m.state_fallback.set(i64::from(!s.is_healthy()));
            m.state_replicas.set(i64::from(s.replicas()));
            catch_up(
                &m.state_errors,
                s.errors.load(std::sync::atomic::Ordering::Relaxed),
            );
        }
        if let Some(l) = &self.ledger {
            use std::sync::atomic::Ordering::Relaxed;
            let c = &l.counters;
            for (result, n) in [
                ("written", c.written.load(Relaxed)),
                ("dropped", c.dropped.load(Relaxed)),
                ("failed", c.failed.load(Relaxed)),
            ] {
                catch_up(&self.metrics.ledger_rows.with_label_values(&[result]), n);
            }
            self.metrics
                .ledger_queue
                .set(i64::try_from(l.queued()).unwrap_or(i64::MAX));
        }
        self.metrics.render()
    }

    /// Ends what is still in flight at the end of the drain's grace: each stream gets an SSE
    /// error event and `[DONE]`, each request still waiting for its worker a 503.
    pub fn end_grace(&self) {
        self.grace_over.send_replace(true);
    }

    /// A receiver that sees [`end_grace`](Self::end_grace).
    pub fn grace_over(&self) -> tokio::sync::watch::Receiver<bool> {
        self.grace_over.subscribe()
    }

    /// True once a drain started.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Starts draining: readiness fails from now on.
    pub fn start_drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Ready: not draining, shared state reachable when the config fails closed, and at least
    /// one healthy worker.
    pub fn is_ready(&self) -> bool {
        !self.is_draining()
            && !self.shared.as_ref().is_some_and(|s| s.blocks_readiness())
            && self
                .live()
                .pools
                .iter()
                .any(|p| p.workers().iter().any(|w| w.is_healthy()))
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

    /// Builds pools for `snapshot`, reusing worker state (in-flight counts, health) by URL and
    /// policies (with their learned prefix index) whose settings did not change.
    fn build_live(self: &Arc<Self>, mut snapshot: Snapshot, previous: Option<&Live>) -> Live {
        if snapshot.tenants.is_empty() {
            snapshot.tenants = self.extra_tenants.clone();
        }
        let mut old_workers: HashMap<String, Arc<WorkerState>> = HashMap::new();
        let mut old_policies: HashMap<String, Arc<PolicyHolder>> = HashMap::new();
        let mut old_queues = HashMap::new();
        let mut old_degrade = HashMap::new();
        if let Some(prev) = previous {
            for p in &prev.pools {
                for w in p.workers().iter() {
                    old_workers.insert(w.url.clone(), w.clone());
                }
                old_policies.insert(p.name.clone(), p.policy().clone());
                old_queues.insert(p.name.clone(), p.admission.clone());
                old_degrade.insert(p.name.clone(), p.degrade.clone());
            }
        }
        let worker_for = |url: &str| {
            old_workers
                .get(url)
                .cloned()
                .unwrap_or_else(|| Arc::new(WorkerState::new(url)))
        };
        let mut pools = Vec::new();
        let mut discovery = Vec::new();
        for spec in &snapshot.pools {
            let mut workers = Vec::new();
            let mut dns = Vec::new();
            for source in &spec.workers {
                match source {
                    WorkerSource::Url(url) => workers.push(worker_for(url)),
                    WorkerSource::Spawn { .. } => {}
                    WorkerSource::Dns {
                        name,
                        port,
                        scheme,
                        interval,
                    } => dns.push((name.clone(), *port, scheme.clone(), *interval)),
                }
            }
            if spec
                .workers
                .iter()
                .any(|s| matches!(s, WorkerSource::Spawn { .. }))
            {
                for url in self.spawned.get(&spec.name).into_iter().flatten() {
                    workers.push(worker_for(url));
                }
            }
            let policy = match old_policies.get(&spec.name) {
                Some(p) if p.config == spec.policy => p.clone(),
                _ => Arc::new(PolicyHolder {
                    config: spec.policy.clone(),
                    policy: routing::build(&spec.policy),
                }),
            };
            // Queued requests survive a reload unless the pool's admission bounds changed.
            let admission = match old_queues.get(&spec.name) {
                Some((old_spec, queue)) if *old_spec == spec.admission => {
                    (old_spec.clone(), queue.clone())
                }
                _ => (
                    spec.admission.clone(),
                    PoolRuntime::new_queue(&spec.admission),
                ),
            };
            // The degradation level survives a reload; the (possibly edited) policy is swapped in.
            let policy_for_pool = snapshot.degradation.get(&spec.name).cloned();
            let degrade = match old_degrade.get(&spec.name) {
                Some(d) => {
                    d.set_policy(policy_for_pool);
                    d.clone()
                }
                None => PoolDegradation::new(policy_for_pool),
            };
            let pool = Arc::new(PoolRuntime::new(
                &spec.name,
                spec.dialect,
                workers.clone(),
                policy,
                admission,
                degrade,
                self.metrics.pool_series(&spec.name),
            ));
            if !dns.is_empty() {
                let task = tokio::spawn(discover_dns(
                    pool.clone(),
                    workers,
                    dns,
                    old_workers.clone(),
                ));
                discovery.push(task.abort_handle());
            }
            pools.push(pool);
        }
        let mut canaries = HashMap::new();
        for (model, spec) in &snapshot.canaries {
            let kept = previous.and_then(|prev| {
                let same = prev.snapshot.canaries.get(model) == Some(spec);
                same.then(|| prev.canaries.get(model).cloned()).flatten()
            });
            let state = kept.unwrap_or_else(|| {
                Arc::new(Mutex::new(Canary::new(spec, std::time::Instant::now())))
            });
            canaries.insert(model.clone(), state);
        }
        let shadows = snapshot
            .shadows
            .iter()
            .map(|(m, spec)| (m.clone(), crate::shadow::Shadow::new(spec.clone())))
            .collect();
        Live {
            keys: KeyTable::new(&snapshot.tenants),
            canaries,
            shadows,
            snapshot: Arc::new(snapshot),
            pools,
            discovery,
        }
    }

    /// Feeds a pool's degradation signals and moves its level when due; logs and counts changes.
    fn tick_degradation(&self, pool: &PoolRuntime, now: std::time::Instant) {
        let workers = pool.workers();
        let kv: Vec<f64> = workers
            .iter()
            .filter(|w| w.is_healthy())
            .map(|w| w.view().kv_usage)
            .collect();
        let kv_mean = (!kv.is_empty()).then(|| kv.iter().sum::<f64>() / kv.len() as f64);
        let depth = pool.admission.1.depth() as u64;
        if let Some(t) = pool.degrade.tick(depth, kv_mean, now) {
            self.record_transition(&pool.name, &t);
        }
        self.metrics
            .degradation_level
            .with_label_values(&[&pool.name])
            .set(pool.degrade.status().level as f64);
    }

    /// Logs a canary decision, counts it and publishes the weights.
    pub fn record_decision(&self, model: &str, canary: &Mutex<Canary>, d: &Decision) {
        match d {
            Decision::Hold { .. } => tracing::debug!(model, decision = ?d, "canary"),
            Decision::Rollback { .. } => tracing::warn!(model, decision = ?d, "canary rolled back"),
            _ => tracing::info!(model, decision = ?d, "canary"),
        }
        self.metrics
            .canary_decisions
            .with_label_values(&[model, d.label()])
            .inc();
        self.publish_weights(model, canary);
    }

    /// Sets the weight gauges of a model's versions to what they are now.
    pub fn publish_weights(&self, model: &str, canary: &Mutex<Canary>) {
        if let Ok(c) = canary.lock() {
            for (version, weight) in c.weights() {
                self.metrics
                    .canary_weight
                    .with_label_values(&[model, &version])
                    .set(f64::from(weight));
            }
        }
    }

    /// Logs a level change and counts it.
    pub fn record_transition(&self, pool: &str, t: &crate::degrade::Transition) {
        let direction = if t.to > t.from { "up" } else { "down" };
        tracing::warn!(pool, from = t.from, to = t.to, reason = %t.reason, "degradation level changed");
        self.metrics
            .degradation_transitions
            .with_label_values(&[pool, direction])
            .inc();
        self.metrics
            .degradation_level
            .with_label_values(&[pool])
            .set(t.to as f64);
    }

    /// Sets the per-worker index size gauges of a pool's policy.
    fn publish_index_sizes(&self, pool: &PoolRuntime) {
        let sizes = pool.policy().policy.index_sizes();
        for w in pool.workers().iter() {
            let blocks = sizes
                .iter()
                .find(|(k, _)| *k == w.key)
                .map_or(0, |&(_, n)| n);
            self.metrics
                .index_blocks
                .with_label_values(&[&pool.name, &w.url])
                .set(blocks as f64);
            let live = w.kv_events() == KvEventsState::Live;
            self.metrics
                .kv_events_live
                .with_label_values(&[&pool.name, &w.url])
                .set(if live { 1.0 } else { 0.0 });
        }
    }

    /// Opens a KV event subscription to each healthy worker of a cache-aware pool that has none
    /// (precise mode); workers without events keep the approximate index.
    fn open_kv_event_streams(
        self: &Arc<Self>,
        pool: &Arc<PoolRuntime>,
        health: &config::HealthConfig,
    ) {
        if !matches!(pool.policy().config, PolicyConfig::Prefix(_)) {
            return;
        }
        for worker in pool.workers().iter() {
            if !worker.is_healthy() || !worker.should_subscribe_kv_events() {
                continue;
            }
            let gw = self.clone();
            let name = pool.name.clone();
            let worker = worker.clone();
            let open_timeout = health.timeout;
            // Our engine beats every 2 s: three missed beats (or a slow poll) mean it is gone.
            let silence = (health.poll_interval * 3).max(Duration::from_secs(6));
            tokio::spawn(async move {
                let client = gw.client.clone();
                let current = move || {
                    gw.live()
                        .pools
                        .iter()
                        .find(|p| p.name == name)
                        .map(|p| p.policy().clone())
                };
                kv_events::subscribe(client, worker, current, open_timeout, silence).await;
            });
        }
    }

    /// Polls every worker's metrics forever, on the current snapshot's interval.
    pub async fn poll_loop(self: Arc<Self>) {
        loop {
            let live = self.live();
            let health = live.snapshot.health.clone();
            let settings = PollSettings {
                timeout: health.timeout,
                eject_after: health.eject_after,
                readmit_after: health.readmit_after,
            };
            let mut tasks = Vec::new();
            for pool in &live.pools {
                for worker in pool.workers().iter() {
                    let (gw, pool, worker) = (self.clone(), pool.clone(), worker.clone());
                    tasks.push(tokio::spawn(async move {
                        poll_worker(&gw.client, &worker, &pool, settings, &gw.metrics).await;
                    }));
                }
            }
            for t in tasks {
                let _ = t.await;
            }
            for pool in &live.pools {
                self.open_kv_event_streams(pool, &health);
            }
            let now = std::time::Instant::now();
            for (model, canary) in &live.canaries {
                let decision = canary.lock().map(|mut c| c.tick(now)).unwrap_or(None);
                match decision {
                    Some(d) => self.record_decision(model, canary, &d),
                    None => self.publish_weights(model, canary),
                }
            }
            for pool in &live.pools {
                self.publish_index_sizes(pool);
                pool.update_capacity();
                self.tick_degradation(pool, now);
                self.metrics
                    .queue_depth
                    .with_label_values(&[&pool.name])
                    .set(pool.admission.1.depth() as f64);
            }
            drop(live);
            tokio::time::sleep(health.poll_interval).await;
        }
    }
}

/// Re-resolves a pool's DNS names on their interval (a Kubernetes headless Service lists one A
/// record per ready pod) and swaps the pool's worker set when it changes.
async fn discover_dns(
    pool: Arc<PoolRuntime>,
    fixed: Vec<Arc<WorkerState>>,
    names: Vec<(String, u16, String, Duration)>,
    mut known: HashMap<String, Arc<WorkerState>>,
) {
    let interval = names
        .iter()
        .map(|n| n.3)
        .min()
        .unwrap_or(Duration::from_secs(5));
    let mut last: Vec<String> = Vec::new();
    loop {
        let mut urls = Vec::new();
        for (name, port, scheme, _) in &names {
            match tokio::net::lookup_host((name.as_str(), *port)).await {
                Ok(addrs) => {
                    for a in addrs {
                        let host = match a {
                            std::net::SocketAddr::V4(v4) => v4.ip().to_string(),
                            std::net::SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
                        };
                        urls.push(format!("{scheme}://{host}:{port}"));
                    }
                }
                Err(e) => {
                    tracing::warn!(pool = %pool.name, name, error = %e, "DNS lookup failed; keeping the last set")
                }
            }
        }
        urls.sort();
        urls.dedup();
        if !urls.is_empty() && urls != last {
            let mut workers = fixed.clone();
            for url in &urls {
                let w = known
                    .entry(url.clone())
                    .or_insert_with(|| Arc::new(WorkerState::new(url)))
                    .clone();
                workers.push(w);
            }
            tracing::info!(pool = %pool.name, workers = urls.len(), "DNS discovery updated the worker set");
            pool.set_workers(workers);
            last = urls;
        }
        tokio::time::sleep(interval).await;
    }
}
