//! Polls every worker's `/metrics` on an interval: the load feeds routing, failures eject.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;

use crate::metrics::GatewayMetrics;
use crate::upstream::UpstreamClient;
use crate::workers::load_metrics::parse_load;
use crate::workers::pool::PoolRuntime;
use crate::workers::state::{HealthChange, WorkerState};

/// Health settings applied by a poll.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PollSettings {
    /// Time allowed for one scrape.
    pub timeout: Duration,
    /// Consecutive failures that eject.
    pub eject_after: u32,
    /// Consecutive successes that re-admit.
    pub readmit_after: u32,
}

/// Scrapes one worker once and updates its state. A restart (new start time or KV size) or a
/// re-admission voids what routing learned about the worker's cache.
pub async fn poll_worker(
    client: &UpstreamClient,
    worker: &Arc<WorkerState>,
    pool_rt: &PoolRuntime,
    settings: PollSettings,
    metrics: &GatewayMetrics,
) {
    let pool = pool_rt.name.as_str();
    // Between polls is as good a time as any to close connections nobody used for a while.
    worker.conns.evict_idle(std::time::Instant::now());
    let result = tokio::time::timeout(settings.timeout, scrape(client, &worker.url)).await;
    let outcome = match result {
        Ok(Ok(text)) => parse_load(&text, pool_rt.dialect),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("timed out after {:?}", settings.timeout)),
    };
    let change = match outcome {
        Ok(load) => {
            if worker.record_load(load) {
                tracing::info!(pool, worker = %worker.url, "worker restarted: its prefix index entries are dropped");
                pool_rt.forget_worker(worker.key);
            }
            metrics.observe_worker(pool, worker);
            worker.record_success(settings.readmit_after)
        }
        Err(e) => {
            tracing::debug!(worker = %worker.url, error = %e, "metrics poll failed");
            worker.record_failure(settings.eject_after)
        }
    };
    match change {
        HealthChange::Ejected => {
            metrics.ejections.with_label_values(&[pool]).inc();
            tracing::warn!(pool, worker = %worker.url, "worker ejected after failed polls");
        }
        HealthChange::Readmitted => {
            tracing::info!(pool, worker = %worker.url, "worker re-admitted");
            pool_rt.forget_worker(worker.key);
        }
        HealthChange::None => {}
    }
    metrics.observe_worker(pool, worker);
}

async fn scrape(client: &UpstreamClient, base: &str) -> Result<String, String> {
    let uri: hyper::Uri = format!("{base}/metrics")
        .parse()
        .map_err(|e| format!("bad worker URL {base}: {e}"))?;
    let req = hyper::Request::get(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let res = client.request(req).await.map_err(|e| e.to_string())?;
    if !res.status().is_success() {
        return Err(format!("/metrics answered {}", res.status()));
    }
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}
