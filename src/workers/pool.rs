//! A pool at run time: its current workers (swapped as discovery changes them) and its routing
//! policy. Worker state and a policy's learned index survive config reloads that keep them.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::admission::AdmissionSpec;
use crate::admission::{AdmissionQueue, QueueConfig};
use crate::degrade::live::PoolDegradation;
use crate::metrics::GatewayMetrics;
use crate::routing::least_load::LeastLoad;
use crate::routing::{Decision, PolicyConfig, RequestFeatures, RoutingPolicy, WorkerView};
use crate::workers::load_metrics::Dialect;
use crate::workers::state::WorkerState;

/// A worker and why the policy chose it.
pub type Routed = (Arc<WorkerState>, Decision);

/// A routing policy together with the settings it was built from.
pub struct PolicyHolder {
    /// Settings from `policies/routing.yaml`.
    pub config: PolicyConfig,
    /// The built policy.
    pub policy: Box<dyn RoutingPolicy>,
}

/// One pool of interchangeable workers.
pub struct PoolRuntime {
    /// Pool name from config.
    pub name: String,
    /// Metrics dialect of its workers.
    pub dialect: Dialect,
    /// Shared with the admission queue's locality view.
    workers: Arc<ArcSwap<Vec<Arc<WorkerState>>>>,
    policy: Arc<PolicyHolder>,
    /// Bounded priority queue in front of the workers, and the settings it was built from.
    pub admission: (AdmissionSpec, AdmissionQueue),
    /// Degradation level, signals and policy of the pool.
    pub degrade: Arc<PoolDegradation>,
    /// Routes the requests that leave no KV behind (embeddings) in a cache-aware pool.
    by_load: LeastLoad,
    /// Its per-request metric series.
    pub series: Arc<crate::metrics::PoolSeries>,
}

impl PoolRuntime {
    /// A pool over `workers` routed by `policy`.
    pub fn new(
        name: &str,
        dialect: Dialect,
        workers: Vec<Arc<WorkerState>>,
        policy: Arc<PolicyHolder>,
        admission: (AdmissionSpec, AdmissionQueue),
        degrade: Arc<PoolDegradation>,
        series: Arc<crate::metrics::PoolSeries>,
    ) -> Self {
        let pool = Self {
            series,
            name: name.to_string(),
            dialect,
            workers: Arc::new(ArcSwap::from_pointee(workers)),
            policy,
            admission,
            degrade,
            by_load: LeastLoad::default(),
        };
        pool.update_capacity();
        pool.tell_warmth();
        pool
    }

    /// With fair share, gives the queue the router's view for locality: a prefix is warm when
    /// the policy's index has it on a healthy worker with a free slot. The view holds the
    /// workers and the policy, not the pool, so a queue kept over a reload gets the new one.
    fn tell_warmth(&self) {
        let (spec, queue) = &self.admission;
        if queue.fair_share().is_none_or(|f| f.locality_window <= 0.0) {
            return;
        }
        let (workers, policy) = (Arc::clone(&self.workers), Arc::clone(&self.policy));
        let per_worker = spec.max_in_flight_per_worker;
        queue.set_warmth(Arc::new(move |prefix: &[u64]| {
            let views: Vec<WorkerView> = workers
                .load()
                .iter()
                .map(|w| w.view())
                .filter(|v| v.healthy && (v.in_flight as usize) < per_worker)
                .collect();
            !views.is_empty() && policy.policy.holds_prefix(prefix, &views)
        }));
    }

    /// A fresh admission queue for `spec`.
    pub fn new_queue(spec: &AdmissionSpec) -> AdmissionQueue {
        AdmissionQueue::new(QueueConfig {
            capacity: spec.max_in_flight_per_worker,
            max_queue: spec.max_queue,
            max_wait: spec.max_wait,
            fair_share: spec.fair_share,
        })
    }

    /// Sizes the admission capacity to the healthy workers (at least one worker's worth, so
    /// that with every worker down requests fail fast in routing instead of queueing).
    pub fn update_capacity(&self) {
        let healthy = self.workers().iter().filter(|w| w.is_healthy()).count();
        let (spec, queue) = &self.admission;
        queue.set_capacity(spec.max_in_flight_per_worker * healthy.max(1));
    }

    /// The current workers.
    pub fn workers(&self) -> Arc<Vec<Arc<WorkerState>>> {
        self.workers.load_full()
    }

    /// Replaces the worker set (DNS re-resolution); the policy forgets the workers that left.
    pub fn set_workers(&self, workers: Vec<Arc<WorkerState>>) {
        let old = self.workers.swap(Arc::new(workers));
        let now = self.workers();
        for gone in old.iter().filter(|w| !now.iter().any(|n| n.key == w.key)) {
            self.policy.policy.forget(gone.key);
        }
        self.update_capacity();
    }

    /// Voids what the policy learned about a worker's cache (it restarted or was re-admitted).
    pub fn forget_worker(&self, key: u64) {
        self.policy.policy.forget(key);
    }

    /// The policy (shared with the next snapshot when its settings are unchanged).
    pub fn policy(&self) -> &Arc<PolicyHolder> {
        &self.policy
    }

    /// [`route`](Self::route), with the pick counted by its reason (and a prefix its holders
    /// lost, by why): the route phase's pick and the forward phase's re-pick before a retry.
    pub fn pick(
        &self,
        features: &RequestFeatures,
        exclude: &[u64],
        by_load: bool,
        metrics: &GatewayMetrics,
    ) -> Option<Routed> {
        let (worker, decision) = self.route(features, exclude, by_load)?;
        self.series.count_decision(metrics, decision.reason);
        if let Some(lost) = decision.lost {
            metrics
                .prefix_lost
                .with_label_values(&[&self.name, lost.as_str()])
                .inc();
        }
        Some((worker, decision))
    }

    /// The workers as routing sees them now, when this pool homes prefixes approximately
    /// (`prefix` policy, some worker without KV events): what a fleet's shared directory of
    /// homes serves (see `workers::prefix_homes`); else `None`.
    pub fn approximate_views(&self) -> Option<Vec<WorkerView>> {
        if !matches!(self.policy.config, PolicyConfig::Prefix(_)) {
            return None;
        }
        let views: Vec<WorkerView> = self.workers().iter().map(|w| w.view()).collect();
        self.policy
            .policy
            .homes_prefixes_approximately(&views)
            .then_some(views)
    }

    /// Routes a request among the current workers, skipping those in `exclude` (already tried).
    /// With `by_load` (embeddings: they leave no KV to reuse), a cache-aware pool routes it by
    /// load instead, and records nothing in its prefix index; a pool whose operator chose
    /// another policy keeps it.
    pub fn route(
        &self,
        features: &RequestFeatures,
        exclude: &[u64],
        by_load: bool,
    ) -> Option<(Arc<WorkerState>, Decision)> {
        let workers = self.workers();
        let views: Vec<WorkerView> = workers
            .iter()
            .map(|w| {
                let mut v = w.view();
                if exclude.contains(&v.key) {
                    v.healthy = false;
                }
                v
            })
            .collect();
        if by_load && matches!(self.policy.config, PolicyConfig::Prefix(_)) {
            let decision = self.by_load.select(features, &views)?;
            let worker = workers.get(decision.index)?.clone();
            return Some((worker, decision));
        }
        let decision = self.policy.policy.select(features, &views)?;
        let worker = workers.get(decision.index)?.clone();
        self.policy.policy.observe(features, &views[decision.index]);
        Some((worker, decision))
    }
}
