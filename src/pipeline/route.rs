//! Route: the pool's routing policy picks one healthy worker from its live view (cache-aware in a
//! `prefix` pool, by load for embeddings), counted by its reason ([`PoolRuntime::pick`]). The
//! forward phase asks the pool again, without the workers already tried, before a retry.

use crate::metrics::GatewayMetrics;
use crate::routing::RequestFeatures;
use crate::workers::pool::PoolRuntime;
pub use crate::workers::pool::Routed;

/// The worker for a request with `features`; `None` when no healthy one is left. `by_load`
/// routes by load even in a cache-aware pool.
pub fn pick(
    pool: &PoolRuntime,
    features: &RequestFeatures,
    by_load: bool,
    metrics: &GatewayMetrics,
) -> Option<Routed> {
    pool.pick(features, &[], by_load, metrics)
}
