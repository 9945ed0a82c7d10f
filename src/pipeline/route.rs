//! Route: the pool's routing policy picks one healthy worker from its live view (cache-aware in a
//! `prefix` pool, by load for embeddings). Each pick is counted by its reason; forwarding asks
//! again, without the workers already tried, before a retry.

use std::sync::Arc;

use crate::metrics::GatewayMetrics;
use crate::routing::{Decision, RequestFeatures};
use crate::workers::pool::PoolRuntime;
use crate::workers::state::WorkerState;

/// A worker and why the policy chose it.
pub type Routed = (Arc<WorkerState>, Decision);

/// The worker for a request with `features`, none of `tried`; `None` when no healthy one is
/// left. `by_load` routes by load even in a cache-aware pool.
pub fn pick(
    pool: &PoolRuntime,
    features: &RequestFeatures,
    tried: &[u64],
    by_load: bool,
    metrics: &GatewayMetrics,
) -> Option<Routed> {
    let (worker, decision) = pool.route(features, tried, by_load)?;
    pool.series.count_decision(metrics, decision.reason);
    if let Some(lost) = decision.lost {
        metrics
            .prefix_lost
            .with_label_values(&[&pool.name, lost.as_str()])
            .inc();
    }
    Some((worker, decision))
}
