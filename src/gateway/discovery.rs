//! DNS discovery: a pool's worker set re-resolved on its interval.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::workers::pool::PoolRuntime;
use crate::workers::state::WorkerState;

/// Re-resolves a pool's DNS names on their interval (a Kubernetes headless Service lists one A
/// record per ready pod) and swaps the pool's worker set when it changes.
pub(super) async fn discover_dns(
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
                    .or_insert_with(|| {
                        Arc::new(WorkerState::new(url).gated(pool.dialect.has_ready()))
                    })
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
