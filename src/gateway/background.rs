//! Background loops: every worker's metrics polled on the snapshot's interval, then the KV event
//! subscriptions of cache-aware pools, canary ticks, index sizes and degradation levels.

use std::sync::Arc;
use std::time::Duration;

use super::Gateway;
use crate::config;
use crate::routing::PolicyConfig;
use crate::workers::kv_events;
use crate::workers::poller::{PollSettings, poll_worker};
use crate::workers::pool::PoolRuntime;

impl Gateway {
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
