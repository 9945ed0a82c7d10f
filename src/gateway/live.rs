//! The live snapshot: the pools, key table, canaries and shadows built from one config, reusing
//! worker state, policies, queues and degradation signals across reloads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::discovery::discover_dns;
use super::{Gateway, Live};
use crate::canary::Canary;
use crate::config::{Snapshot, WorkerSource};
use crate::degrade::live::PoolDegradation;
use crate::routing;
use crate::tenants::KeyTable;
use crate::workers::pool::{PolicyHolder, PoolRuntime};
use crate::workers::state::WorkerState;

impl Gateway {
    /// Builds pools for `snapshot`, reusing worker state (in-flight counts, health) by URL and
    /// policies (with their learned prefix index) whose settings did not change.
    pub(super) fn build_live(
        self: &Arc<Self>,
        mut snapshot: Snapshot,
        previous: Option<&Live>,
    ) -> Live {
        self.in_flight.set_cap(
            snapshot
                .connections
                .max_requests_in_flight
                .map(|n| n as usize),
        );
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
        let worker_for = |url: &str, gated: bool| {
            old_workers
                .get(url)
                .cloned()
                .unwrap_or_else(|| Arc::new(WorkerState::new(url).gated(gated)))
        };
        let mut pools = Vec::new();
        let mut discovery = Vec::new();
        for spec in &snapshot.pools {
            let mut workers = Vec::new();
            let mut dns = Vec::new();
            let gated = spec.dialect.has_ready();
            for source in &spec.workers {
                match source {
                    WorkerSource::Url(url) => workers.push(worker_for(url, gated)),
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
                    workers.push(worker_for(url, gated));
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
            anonymous: anonymous(&snapshot),
            snapshot: Arc::new(snapshot),
            pools,
            discovery,
        }
    }
}

/// The anonymous tenant of `snapshot`: every caller when it declares no tenants, in its default
/// tier (or its first).
pub(super) fn anonymous(snapshot: &Snapshot) -> crate::config::TenantSpec {
    crate::config::TenantSpec {
        name: "anonymous".into(),
        tier: snapshot.default_tier.clone().unwrap_or_else(|| {
            snapshot
                .tiers
                .first()
                .map(|t| t.name.clone())
                .unwrap_or_default()
        }),
        key_hashes: Vec::new(),
    }
}
