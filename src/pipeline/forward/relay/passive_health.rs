//! Passive health: each request is a turn on its worker, judged when it fails or its body ends.
//! The judgement (a failure of some kind, or a success) feeds the worker's outlier detection and
//! counts what it did: an ejection by the failure that tipped it, a probe's result. Called by the
//! send (a failure before the first byte) and by the body (how the answer ended).

use crate::metrics::GatewayMetrics;
use crate::workers::state::{Attempt, HealthChange};

/// Judges a request's `turn` on its worker (a `failure` of that kind, or a success) and counts
/// what that did: an ejection by the failure that tipped it, a probe's result.
pub fn judge(
    turn: Attempt,
    failure: Option<&'static str>,
    metrics: &GatewayMetrics,
    pool: &str,
    request_id: &str,
) {
    let probe = turn.is_probe();
    if failure.is_none() && !probe {
        // Most requests: a success that changes nothing worth counting.
        turn.succeeded();
        return;
    }
    let worker = turn.worker().clone();
    let change = match failure {
        None => turn.succeeded(),
        Some(_) => turn.failed(),
    };
    if probe {
        let result = if failure.is_none() {
            "passed"
        } else {
            "failed"
        };
        metrics.probes.with_label_values(&[pool, result]).inc();
    }
    match change {
        HealthChange::Ejected => {
            let kind = failure.unwrap_or("unknown");
            metrics.ejections.with_label_values(&[pool]).inc();
            metrics
                .outlier_ejections
                .with_label_values(&[pool, kind])
                .inc();
            tracing::warn!(request_id, pool, worker = %worker.url, kind, probe, "worker ejected after failed requests");
        }
        HealthChange::Readmitted => {
            tracing::info!(pool, worker = %worker.url, "worker passed its probe: back to its full share");
        }
        HealthChange::None => {}
    }
}
