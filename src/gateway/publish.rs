//! Metrics written outside the request path: the gauges read at scrape time, canary decisions
//! and weights, degradation levels and transitions, and each pool's index sizes.

use std::sync::Mutex;

use super::Gateway;
use crate::canary::{Canary, Decision};
use crate::workers::pool::PoolRuntime;
use crate::workers::state::KvEventsState;

/// Raises a Prometheus counter to `total`, a count kept elsewhere (the ledger writer, the Redis
/// client). One lock for all: two scrapes at once must not both add the same difference.
fn catch_up(counter: &prometheus::IntCounter, total: u64) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    counter.inc_by(total.saturating_sub(counter.get()));
}

impl Gateway {
    /// The Prometheus text of every gateway metric, with the gauges read at scrape time.
    pub fn render_metrics(&self) -> String {
        self.metrics
            .body_bytes_held
            .set(i64::try_from(self.body_budget.held()).unwrap_or(i64::MAX));
        catch_up(&self.metrics.requests_shed, self.in_flight.shed());
        self.metrics
            .requests_in_flight
            .set(i64::try_from(self.in_flight.in_flight()).unwrap_or(i64::MAX));
        if let Some(s) = &self.shared {
            let m = &self.metrics;
            m.state_fallback.set(i64::from(!s.is_healthy()));
            m.state_replicas.set(i64::from(s.replicas()));
            catch_up(
                &m.state_errors,
                s.errors.load(std::sync::atomic::Ordering::Relaxed),
            );
            if let Some(calls) = s.lease_calls() {
                use std::sync::atomic::Ordering::Relaxed;
                for (call, n) in [
                    ("fetch", calls.fetch.load(Relaxed)),
                    ("renew", calls.renew.load(Relaxed)),
                    ("give", calls.give.load(Relaxed)),
                    ("refresh", calls.refresh.load(Relaxed)),
                ] {
                    catch_up(&m.state_lease_calls.with_label_values(&[call]), n);
                }
            }
        }
        if let Some(h) = &self.prefix_homes {
            use std::sync::atomic::Ordering::Relaxed;
            let c = &h.counters;
            for (event, n) in [
                ("claimed", c.claimed.load(Relaxed)),
                ("moved", c.moved.load(Relaxed)),
                ("sync", c.synced.load(Relaxed)),
            ] {
                catch_up(
                    &self.metrics.state_prefix_homes.with_label_values(&[event]),
                    n,
                );
            }
        }
        for pool in &self.live().pools {
            // Only once a window had two tenants waiting throughout: before that there is
            // nothing to compare, and a 1 would claim a fairness nobody tested.
            if let Some(last) = pool.admission.1.jain().last {
                self.metrics
                    .fair_share_jain
                    .with_label_values(&[&pool.name])
                    .set(last.index);
            }
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

    /// Feeds a pool's degradation signals and moves its level when due; logs and counts changes.
    pub(super) fn tick_degradation(&self, pool: &PoolRuntime, now: std::time::Instant) {
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
    pub(super) fn publish_index_sizes(&self, pool: &PoolRuntime) {
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
}
