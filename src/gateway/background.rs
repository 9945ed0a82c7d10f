//! Background loops: each worker's metrics polled by its own task on the snapshot's interval (so
//! a hung worker delays nobody else's polls), and one loop on the same interval for the rest:
//! starting and stopping those tasks as workers come and go, the KV event subscriptions of
//! cache-aware pools, canary ticks, index sizes and degradation levels.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::AbortHandle;

use super::{Gateway, Live};
use crate::config;
use crate::routing::PolicyConfig;
use crate::workers::kv_events::{self, StreamSettings};
use crate::workers::poller::{PollSettings, poll_worker};
use crate::workers::pool::PoolRuntime;
use crate::workers::state::KvEventsState;
use crate::workers::vllm_events;

/// A worker's poll task is keyed by its pool's name and its key (hash of its URL).
type PollerKey = (String, u64);

/// The running poll tasks; they stop with the loop that keeps them.
#[derive(Default)]
struct Pollers(HashMap<PollerKey, AbortHandle>);

impl Drop for Pollers {
    fn drop(&mut self) {
        for task in self.0.values() {
            task.abort();
        }
    }
}

impl Gateway {
    /// Opens a KV event subscription to each healthy worker of a cache-aware pool that has none
    /// (precise mode); workers without events keep the approximate index. The subscription's
    /// task reopens a lost stream itself, with backoff, while the worker stays in the pool.
    /// A pool with `kv_events:` (vLLM) subscribes to each worker's ZMQ publisher instead.
    fn open_kv_event_streams(
        self: &Arc<Self>,
        pool: &Arc<PoolRuntime>,
        health: &config::HealthConfig,
        vllm: Option<&config::VllmKvEventsSpec>,
    ) {
        if !matches!(pool.policy().config, PolicyConfig::Prefix(_)) {
            return;
        }
        let settings = StreamSettings {
            open_timeout: health.timeout,
            // Our engine beats every 2 s: three missed beats (or a slow poll) mean it is gone.
            silence_timeout: (health.poll_interval * 3).max(Duration::from_secs(6)),
            max_line_bytes: health.max_kv_event_line_bytes,
            first_backoff: health.poll_interval,
            max_backoff: health.kv_events_max_backoff,
        };
        for worker in pool.workers().iter() {
            if !worker.is_healthy() || !worker.should_subscribe_kv_events() {
                continue;
            }
            let gw = self.clone();
            let name = pool.name.clone();
            let worker = worker.clone();
            let key = worker.key;
            let source = match vllm {
                None => None,
                Some(spec) => match spec.endpoint_for(&worker.url) {
                    Some(endpoint) => Some(vllm_events::Source {
                        endpoint,
                        topic: spec.topic.clone(),
                        vocab: spec.vocab.clone(),
                        pool: name.clone(),
                    }),
                    None => {
                        worker.set_kv_events(KvEventsState::Unsupported);
                        continue;
                    }
                },
            };
            tokio::spawn(async move {
                let client = gw.client.clone();
                let metrics = gw.metrics.clone();
                // The pool's policy while the worker is still one of its workers.
                let current = move || {
                    gw.live()
                        .pools
                        .iter()
                        .find(|p| p.name == name)
                        .filter(|p| p.workers().iter().any(|w| w.key == key))
                        .map(|p| p.policy().clone())
                };
                match source {
                    Some(source) => {
                        vllm_events::subscribe(worker, current, source, settings, metrics).await
                    }
                    None => kv_events::subscribe(client, worker, current, settings).await,
                };
            });
        }
    }

    /// Starts a poll task for each worker of `live` that has none, and stops those of workers
    /// no longer there (removed by a reload or by discovery).
    fn keep_pollers(self: &Arc<Self>, live: &Live, Pollers(pollers): &mut Pollers) {
        let wanted: HashSet<PollerKey> = live
            .pools
            .iter()
            .flat_map(|p| {
                p.workers()
                    .iter()
                    .map(|w| (p.name.clone(), w.key))
                    .collect::<Vec<_>>()
            })
            .collect();
        // The triage series of workers a reload removed go with their pollers.
        let polled: HashSet<(String, String)> = live
            .pools
            .iter()
            .flat_map(|p| {
                p.workers()
                    .iter()
                    .map(|w| (p.name.clone(), w.url.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        self.triage.retain(&polled);
        pollers.retain(|key, task| {
            let keep = wanted.contains(key) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        for key in wanted {
            if let std::collections::hash_map::Entry::Vacant(slot) = pollers.entry(key) {
                let task = tokio::spawn(self.clone().poll_worker_forever(slot.key().clone()));
                slot.insert(task.abort_handle());
            }
        }
    }

    /// Polls one worker, then waits the interval, for as long as it is in its pool; each poll
    /// reads the snapshot then in force (settings, pool) afresh.
    async fn poll_worker_forever(self: Arc<Self>, (pool_name, key): PollerKey) {
        loop {
            let live = self.live();
            let Some(pool) = live.pools.iter().find(|p| p.name == pool_name).cloned() else {
                return;
            };
            let Some(worker) = pool.workers().iter().find(|w| w.key == key).cloned() else {
                return;
            };
            let health = &live.snapshot.health;
            let settings = PollSettings {
                timeout: health.timeout,
                eject_after: health.eject_after,
                readmit_after: health.readmit_after,
                max_scrape_bytes: health.max_scrape_bytes,
            };
            let interval = live.snapshot.health.poll_interval;
            // An old snapshot is not kept alive by a poll in progress.
            drop(live);
            poll_worker(
                &self.client,
                &worker,
                &pool,
                settings,
                (&self.metrics, &self.triage),
            )
            .await;
            drop((pool, worker));
            tokio::time::sleep(interval).await;
        }
    }

    /// Keeps every worker polled, and runs the pool-wide work on the current snapshot's
    /// interval, forever.
    pub async fn poll_loop(self: Arc<Self>) {
        let mut pollers = Pollers::default();
        loop {
            let live = self.live();
            let health = live.snapshot.health.clone();
            self.keep_pollers(&live, &mut pollers);
            for pool in &live.pools {
                let spec = live.snapshot.pool(&pool.name).map(|(_, p)| p);
                let vllm = spec.and_then(|p| p.kv_events.as_ref());
                self.open_kv_event_streams(pool, &health, vllm);
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
