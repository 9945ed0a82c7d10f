//! The gateway's own Prometheus metrics. Labels stay bounded: model and pool names come from
//! config, worker labels from discovered URLs, never request ids, keys or prompts.

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, Opts, Registry, TextEncoder,
};

use std::sync::{Arc, Mutex};

use crate::fast_maps::NamesMap;
use crate::routing::RouteReason;

/// A shared collector registered by reference, so the gateway keeps a handle to update it.
struct ArcCollector<C>(Arc<C>);

impl<C: prometheus::core::Collector> prometheus::core::Collector for ArcCollector<C> {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.0.collect()
    }
}

/// Every gateway metric.
pub struct GatewayMetrics {
    registry: Registry,
    /// `infergate_requests_total{model,pool,status}`.
    pub requests: IntCounterVec,
    /// `infergate_ttft_seconds{pool}`: first body byte of the upstream answer, seen at the gateway.
    pub ttft: HistogramVec,
    /// `infergate_inter_chunk_seconds{pool}`: gaps between streamed chunks.
    pub itl: HistogramVec,
    /// `infergate_request_duration_seconds{pool}`: end to end.
    pub e2e: HistogramVec,
    /// `infergate_upstream_errors_total{pool,kind}`.
    pub upstream_errors: IntCounterVec,
    /// `infergate_upstream_usage_rejected_total{pool,reason}`: usage numbers a worker reported
    /// that the request cannot have used (see [`crate::usage_check`]).
    pub usage_rejected: IntCounterVec,
    /// Workers whose first usage lie was logged (each is logged once).
    usage_liars: Mutex<std::collections::HashSet<String>>,
    /// `infergate_retries_total{pool}`.
    pub retries: IntCounterVec,
    /// `infergate_worker_ejections_total{pool}`: every ejection, by polls or by requests.
    pub ejections: IntCounterVec,
    /// `infergate_worker_outlier_ejections_total{pool,kind}`: ejections by failed requests
    /// (passive health), by the failure that tipped them (`first_byte_timeout`, `connect`,
    /// `send`, `status_503`, `status_5xx`, `mid_stream`, `idle_timeout`, `error_event`, `no_done`).
    pub outlier_ejections: IntCounterVec,
    /// `infergate_worker_probes_total{pool,result}`: probe requests to workers back from an
    /// ejection, `passed` (full share again) or `failed` (ejected again, for longer).
    pub probes: IntCounterVec,
    /// `infergate_routing_decisions_total{pool,reason}`.
    pub decisions: IntCounterVec,
    /// `infergate_routing_prefix_lost_total{pool,reason}`: picks where the worker holding the
    /// longest prefix lost, by why (queue, fit, health).
    pub prefix_lost: IntCounterVec,
    /// `infergate_routing_predicted_cached_tokens_total{pool}`: cached tokens routing expected.
    pub predicted_cached: IntCounterVec,
    /// `infergate_routing_actual_cached_tokens_total{pool}`: cached tokens the workers reported,
    /// over the same answers as the prediction counter.
    pub actual_cached: IntCounterVec,
    /// `infergate_routing_cached_tokens_unreported_total{pool}`: answers without a cached-token
    /// count (the worker does not report `prompt_tokens_details.cached_tokens`).
    pub cached_unreported: IntCounterVec,
    /// `infergate_routing_index_blocks{pool,worker}`: prefix blocks the index holds per worker.
    pub index_blocks: GaugeVec,
    /// `infergate_routing_kv_events_live{pool,worker}`: 1 while routing reads the worker's KV
    /// events (precise mode), 0 on the approximate index.
    pub kv_events_live: GaugeVec,
    /// `infergate_routing_vllm_kv_batches_total{pool}`: vLLM KV-event batches applied to the index.
    pub vllm_kv_batches: IntCounterVec,
    /// `infergate_routing_vllm_kv_rejected_total{pool,reason}`: vLLM KV-event messages refused
    /// (`frames`, `topic`, `oversize`, `malformed`, `schema`, `vocab`); each drops the worker to
    /// the approximate index until a good batch comes.
    pub vllm_kv_rejected: IntCounterVec,
    /// `infergate_routing_vllm_kv_missed_total{pool}`: vLLM KV-event batches never received
    /// (gaps in the publisher's sequence numbers).
    pub vllm_kv_missed: IntCounterVec,
    /// `infergate_worker_polls_total{pool,worker}`: `/metrics` polls of the worker, whatever
    /// their outcome (each worker is polled on its own schedule).
    pub worker_polls: IntCounterVec,
    /// `infergate_worker_poll_failures_total{pool,reason}`: failed polls by reason (timeout,
    /// connect, status, read, too_large, invalid_value, no_metrics; see `PollFailure`).
    pub poll_failures: IntCounterVec,
    /// `infergate_connections_open`: client connections open on the public listener.
    pub connections_open: IntGauge,
    /// `infergate_request_body_bytes_held`: memory of request bodies held gateway-wide (their
    /// buffers' capacity, reserved before it is allocated), against
    /// `limits.max_buffered_body_bytes`.
    pub body_bytes_held: IntGauge,
    /// `infergate_connections_refused_total{reason}`: connections closed at accept by a cap.
    pub connections_refused: IntCounterVec,
    /// `infergate_accept_errors_total`: failed `accept()` calls (each followed by a back-off).
    pub accept_errors: IntCounter,
    /// `infergate_requests_shed_total`: requests refused (503) at `limits.max_requests_in_flight`.
    pub requests_shed: IntCounter,
    /// `infergate_requests_in_flight`: public requests in flight, counted while a cap is set.
    pub requests_in_flight: IntGauge,
    /// `infergate_client_timeouts_total{reason}`: client connections closed by a timer.
    pub client_timeouts: IntCounterVec,
    /// `infergate_worker_in_flight{pool,worker}`.
    pub worker_in_flight: GaugeVec,
    /// `infergate_worker_waiting{pool,worker}` (polled).
    pub worker_waiting: GaugeVec,
    /// `infergate_worker_running{pool,worker}` (polled).
    pub worker_running: GaugeVec,
    /// `infergate_worker_kv_usage{pool,worker}` (polled, 0..1).
    pub worker_kv_usage: GaugeVec,
    /// `infergate_worker_healthy{pool,worker}` (1 or 0).
    pub worker_healthy: GaugeVec,
    /// `infergate_config_reloads_total{result}`.
    pub reloads: IntCounterVec,
    /// `infergate_tenant_requests_total{tenant,outcome}` (outcome: ok, client_error, rejected, upstream_error, cancelled).
    pub tenant_requests: IntCounterVec,
    /// `infergate_tenant_tokens_total{tenant,kind}` (kind: prompt, completion).
    pub tenant_tokens: IntCounterVec,
    /// `infergate_tenant_cost_nanousd_total{tenant,model}`: what requests cost at the prices in force.
    pub tenant_cost: IntCounterVec,
    /// `infergate_tenant_prompt_tokens_total{tenant,model}`: prompt tokens, cached ones included.
    pub tenant_prompt_tokens: IntCounterVec,
    /// `infergate_tenant_cached_tokens_total{tenant,model}`: prompt tokens served from prefix cache.
    pub tenant_cached_tokens: IntCounterVec,
    /// `infergate_tenant_completion_tokens_total{tenant,model}`.
    pub tenant_completion_tokens: IntCounterVec,
    /// `infergate_unpriced_requests_total{model}`: answers of a model prices.yaml has no price for.
    pub unpriced: IntCounterVec,
    /// `infergate_budget_soft_exceeded_total{tenant,period}`: requests admitted over a soft budget.
    pub budget_soft_exceeded: IntCounterVec,
    /// `infergate_ledger_rows_total{result}` (written, dropped, failed), read from the writer.
    pub ledger_rows: IntCounterVec,
    /// `infergate_ledger_queue_rows`: rows waiting for the ledger writer.
    pub ledger_queue: IntGauge,
    /// `infergate_state_fallback`: 1 while Redis is unreachable and limits use the local share.
    pub state_fallback: IntGauge,
    /// `infergate_state_replicas`: live gateway replicas counted through Redis heartbeats.
    pub state_replicas: IntGauge,
    /// `infergate_state_errors_total`: Redis calls that failed or timed out.
    pub state_errors: IntCounter,
    /// `infergate_state_lease_calls_total{call}` (fetch, renew, give, refresh): Redis calls for quota leases.
    pub state_lease_calls: IntCounterVec,
    /// `infergate_state_prefix_homes_total{event}` (claimed, moved, sync): the shared directory of
    /// prefix homes (`state.redis.prefix_homes`): new prefixes claimed for the fleet, homes moved
    /// by this replica's proposals, and directory syncs.
    pub state_prefix_homes: IntCounterVec,
    /// `infergate_rejections_total{tenant,reason}` (auth, rate, queue_full, queue_timeout, deadline, validation, draining).
    pub rejections: IntCounterVec,
    /// `infergate_queue_depth{pool}`: requests waiting for admission.
    pub queue_depth: GaugeVec,
    /// `infergate_fair_share_jain_index{pool}`: Jain's index of the service the admission queue
    /// gave the tenants it kept waiting a whole window (`admission::jain`; its last such window).
    pub fair_share_jain: GaugeVec,
    /// `infergate_queue_wait_seconds{pool}`: time admitted requests waited.
    pub queue_wait: HistogramVec,
    /// `infergate_tenant_queue_wait_seconds{tenant}`: time each tenant's admitted requests
    /// waited (what fair share evens out; tenants come from config).
    pub tenant_queue_wait: HistogramVec,
    /// `infergate_degradation_level{pool}`: 0 = normal service.
    pub degradation_level: GaugeVec,
    /// `infergate_degradation_transitions_total{pool,direction}`.
    pub degradation_transitions: IntCounterVec,
    /// `infergate_degraded_requests_total{pool,action}`: requests altered or refused by degradation.
    pub degraded: IntCounterVec,
    /// `infergate_version_requests_total{model,version,outcome}` (ok, error, cancelled by the client).
    pub version_requests: IntCounterVec,
    /// `infergate_canary_weight{model,version}`: share of sessions in percent.
    pub canary_weight: GaugeVec,
    /// `infergate_canary_decisions_total{model,decision}` (hold, promote, rollback, done).
    pub canary_decisions: IntCounterVec,
    /// `infergate_shadow_requests_total{model,outcome}` (ok, error, dropped).
    pub shadow_requests: IntCounterVec,
    /// `infergate_shadow_status_match_total{model,match}`: shadow status equal to the client's.
    pub shadow_status_match: IntCounterVec,
    /// `infergate_shadow_latency_ratio{model}`: shadow latency / client's latency.
    pub shadow_latency_ratio: HistogramVec,
    /// `infergate_shadow_output_ratio{model}`: shadow output tokens / client's.
    pub shadow_output_ratio: HistogramVec,
    /// The per-tenant series of each tenant and model seen, resolved once per pair.
    tenant_models: Mutex<NamesMap<String, NamesMap<String, Arc<TenantModelSeries>>>>,
    /// `infergate_flight_records_total{result}`: engine flight records on relayed answers (ok,
    /// invalid: came but ignored, absent).
    pub flight_records: IntCounterVec,
    /// `infergate_shape_class_requests_total{class,pool}`: requests by shape class (routing.yaml
    /// `shape_classes:`; `unclassified` for those no class matched), counted once classes exist.
    pub shape_class_requests: IntCounterVec,
    /// `infergate_shape_class_ttft_seconds{class,path}`: time to the first body byte, by class
    /// and the path the engine's flight record names (`unknown` without one).
    pub shape_class_ttft: HistogramVec,
    /// `infergate_shape_class_max_gap_seconds{class,path}`: each answer's longest gap between
    /// body chunks (a freeze mid-answer).
    pub shape_class_max_gap: HistogramVec,
    /// `infergate_shape_class_e2e_seconds{class,path}`: end-to-end duration.
    pub shape_class_e2e: HistogramVec,
    /// `infergate_trace_lines_total{result}`: trace file lines (written, dropped: queue full,
    /// failed, unsampled).
    pub trace_lines: IntCounterVec,
    /// `infergate_otlp_spans_total{result}`: spans of the OTLP export (exported, dropped: queue
    /// full, failed: the collector refused or did not answer in time).
    pub otlp_spans: IntCounterVec,
    /// `infergate_quality_sampled_total{tenant,model,version}`: answers scored for quality
    /// signals (tenants and models come from config, versions from the canary spec).
    pub quality_sampled: IntCounterVec,
    /// `infergate_quality_signal_total{tenant,model,version,signal}`: scored answers that raised
    /// a signal (`quality::signals::SIGNAL_NAMES`).
    pub quality_signals: IntCounterVec,
    /// `infergate_quality_dropped_total`: answers not handed to the quality worker (queue full).
    pub quality_dropped: IntCounter,
    /// `infergate_drift_psi{model,version,feature}`: PSI of the latest drift window against
    /// its reference (`quality::windows::FEATURES`).
    pub drift_psi: GaugeVec,
    /// `infergate_drift_tenant_psi{tenant,feature}`: the same per tenant, over all its models.
    pub drift_tenant_psi: GaugeVec,
    /// `infergate_drift_psi_threshold`: `quality.drift.psi_threshold`, for the alert rule.
    pub drift_threshold: Gauge,
    /// `infergate_route_cached_tokens_total{pool,kind}`: the explained hit rate, over answers
    /// that report cached tokens: `predicted` (what routing expected on the worker it chose),
    /// `delivered` (what the worker reported), `available` (the best routing knew of on any
    /// healthy worker at pick time).
    pub route_cached_tokens: IntCounterVec,
    /// `infergate_quality_regression_total{model,version,signal}`: replayed regression prompts
    /// whose answer raised a signal (`quality.regression`; models and versions from config).
    pub quality_regression: IntCounterVec,
    /// `infergate_quality_regression_runs_total{model,version,result}`: replayed regression
    /// prompts by result (`ok`: answered 2xx and scored, `error`: anything else).
    pub quality_regression_runs: IntCounterVec,
}

/// The counters a settled request of one tenant and model adds to (six label lookups a request
/// otherwise, each hashing its labels under a lock).
pub struct TenantModelSeries {
    /// `infergate_tenant_tokens_total{tenant,kind="prompt"}`.
    pub prompt_tokens: IntCounter,
    /// `infergate_tenant_tokens_total{tenant,kind="completion"}`.
    pub completion_tokens: IntCounter,
    /// `infergate_tenant_cost_nanousd_total{tenant,model}`.
    pub cost: IntCounter,
    /// `infergate_tenant_prompt_tokens_total{tenant,model}`.
    pub model_prompt_tokens: IntCounter,
    /// `infergate_tenant_cached_tokens_total{tenant,model}`.
    pub model_cached_tokens: IntCounter,
    /// `infergate_tenant_completion_tokens_total{tenant,model}`.
    pub model_completion_tokens: IntCounter,
    /// `infergate_unpriced_requests_total{model}`, once the model turned out to have no price.
    pub unpriced: std::sync::OnceLock<IntCounter>,
}

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];
const GAP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5,
    1.0, 2.5,
];

const RATIO_BUCKETS: &[f64] = &[0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0];

fn ratio_hist(
    registry: &Registry,
    name: &str,
    help: &str,
) -> Result<HistogramVec, prometheus::Error> {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(RATIO_BUCKETS.to_vec()),
        &["model"],
    )?;
    registry.register(Box::new(h.clone()))?;
    Ok(h)
}

/// One pool's per-request series, resolved once when the pool is built: a label lookup hashes
/// the labels and takes a lock, and these run on every request.
#[derive(Clone)]
pub struct PoolSeries {
    /// The pool's name, the `pool` label.
    pub pool: String,
    /// `infergate_ttft_seconds{pool}`.
    pub ttft: Histogram,
    /// `infergate_itl_seconds{pool}`.
    pub itl: Histogram,
    /// `infergate_e2e_seconds{pool}`.
    pub e2e: Histogram,
    /// `infergate_queue_depth{pool}`.
    pub queue_depth: Gauge,
    /// `infergate_queue_wait_seconds{pool}`.
    pub queue_wait: Histogram,
    /// Predicted cached prompt tokens, `{pool}`.
    pub predicted_cached: IntCounter,
    /// Cached prompt tokens the workers reported, `{pool}`.
    pub actual_cached: IntCounter,
    /// Answers without a cached-token count, `{pool}`.
    pub cached_unreported: IntCounter,
    /// `infergate_route_cached_tokens_total{pool,kind}` for `predicted`, `delivered` and
    /// `available`, in that order.
    pub route_cached: [IntCounter; 3],
    /// `infergate_routing_decisions_total{pool,reason}` by [`RouteReason`] index, each made at
    /// its first pick (a reason never chosen has no series).
    decisions: [std::sync::OnceLock<IntCounter>; RouteReason::ALL.len()],
}

impl PoolSeries {
    /// Counts a pick for `reason`.
    pub fn count_decision(&self, metrics: &GatewayMetrics, reason: RouteReason) {
        let labels = [self.pool.as_str(), reason.as_str()];
        match self.decisions.get(reason as usize) {
            Some(cell) => cell
                .get_or_init(|| metrics.decisions.with_label_values(&labels))
                .inc(),
            // A reason added without a slot here is still counted, the slow way.
            None => metrics.decisions.with_label_values(&labels).inc(),
        }
    }
}

impl GatewayMetrics {
    /// The per-request series of `pool`.
    pub fn pool_series(&self, pool: &str) -> Arc<PoolSeries> {
        let l = [pool];
        Arc::new(PoolSeries {
            pool: pool.to_string(),
            ttft: self.ttft.with_label_values(&l),
            itl: self.itl.with_label_values(&l),
            e2e: self.e2e.with_label_values(&l),
            queue_depth: self.queue_depth.with_label_values(&l),
            queue_wait: self.queue_wait.with_label_values(&l),
            predicted_cached: self.predicted_cached.with_label_values(&l),
            actual_cached: self.actual_cached.with_label_values(&l),
            cached_unreported: self.cached_unreported.with_label_values(&l),
            route_cached: ["predicted", "delivered", "available"]
                .map(|kind| self.route_cached_tokens.with_label_values(&[pool, kind])),
            decisions: Default::default(),
        })
    }

    /// Registers every metric in a fresh registry.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let counter =
            |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
                let c = IntCounterVec::new(Opts::new(name, help), labels)?;
                registry.register(Box::new(c.clone()))?;
                Ok(c)
            };
        let gauge = |name: &str, help: &str| -> Result<GaugeVec, prometheus::Error> {
            let g = GaugeVec::new(Opts::new(name, help), &["pool", "worker"])?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let hist =
            |name: &str, help: &str, buckets: &[f64]| -> Result<HistogramVec, prometheus::Error> {
                let h = HistogramVec::new(
                    HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                    &["pool"],
                )?;
                registry.register(Box::new(h.clone()))?;
                Ok(h)
            };
        Ok(Self {
            requests: counter(
                "infergate_requests_total",
                "Requests by model, pool and HTTP status.",
                &["model", "pool", "status"],
            )?,
            ttft: hist(
                "infergate_ttft_seconds",
                "Time to the first upstream body byte, at the gateway.",
                LATENCY_BUCKETS,
            )?,
            itl: hist(
                "infergate_inter_chunk_seconds",
                "Gaps between streamed chunks, at the gateway.",
                GAP_BUCKETS,
            )?,
            e2e: hist(
                "infergate_request_duration_seconds",
                "End-to-end request duration at the gateway.",
                LATENCY_BUCKETS,
            )?,
            upstream_errors: counter(
                "infergate_upstream_errors_total",
                "Upstream failures by kind.",
                &["pool", "kind"],
            )?,
            usage_rejected: counter(
                "infergate_upstream_usage_rejected_total",
                "Usage numbers from workers outside what the request made possible, replaced by the gateway's own count.",
                &["pool", "reason"],
            )?,
            usage_liars: Mutex::default(),
            retries: counter(
                "infergate_retries_total",
                "Requests retried on another worker before the first byte.",
                &["pool"],
            )?,
            ejections: counter(
                "infergate_worker_ejections_total",
                "Workers ejected after consecutive failures (polls or requests).",
                &["pool"],
            )?,
            outlier_ejections: counter(
                "infergate_worker_outlier_ejections_total",
                "Workers ejected after consecutive failed requests, by the last failure's kind.",
                &["pool", "kind"],
            )?,
            probes: counter(
                "infergate_worker_probes_total",
                "Probe requests to workers back from an ejection, by result.",
                &["pool", "result"],
            )?,
            decisions: counter(
                "infergate_routing_decisions_total",
                "Routing decisions by reason.",
                &["pool", "reason"],
            )?,
            prefix_lost: counter(
                "infergate_routing_prefix_lost_total",
                "Picks where the worker holding the longest prefix lost, by reason.",
                &["pool", "reason"],
            )?,
            predicted_cached: counter(
                "infergate_routing_predicted_cached_tokens_total",
                "Prompt tokens routing predicted the chosen worker had cached.",
                &["pool"],
            )?,
            actual_cached: counter(
                "infergate_routing_actual_cached_tokens_total",
                "Prompt tokens the workers reported cached, for the same answers.",
                &["pool"],
            )?,
            cached_unreported: counter(
                "infergate_routing_cached_tokens_unreported_total",
                "Answers whose usage had no prompt_tokens_details.cached_tokens.",
                &["pool"],
            )?,
            index_blocks: gauge(
                "infergate_routing_index_blocks",
                "Prefix blocks the routing index holds for the worker.",
            )?,
            connections_open: {
                let g = IntGauge::new(
                    "infergate_connections_open",
                    "Client connections open on the public listener.",
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            body_bytes_held: {
                let g = IntGauge::new(
                    "infergate_request_body_bytes_held",
                    "Memory of request bodies held gateway-wide (buffer capacity, reserved before use).",
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            connections_refused: counter(
                "infergate_connections_refused_total",
                "Client connections closed at accept because a connection cap was reached.",
                &["reason"],
            )?,
            accept_errors: {
                let c = IntCounter::new(
                    "infergate_accept_errors_total",
                    "Failed accept() calls on the public or admin listener; each backs off.",
                )?;
                registry.register(Box::new(c.clone()))?;
                c
            },
            requests_shed: {
                let c = IntCounter::new(
                    "infergate_requests_shed_total",
                    "Requests refused with 503 at limits.max_requests_in_flight, before any work.",
                )?;
                registry.register(Box::new(c.clone()))?;
                c
            },
            requests_in_flight: {
                let g = IntGauge::new(
                    "infergate_requests_in_flight",
                    "Public requests in flight, answers still streaming included (counted while limits.max_requests_in_flight is set).",
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            client_timeouts: counter(
                "infergate_client_timeouts_total",
                "Client connections closed by a timer (header_read, tls_handshake).",
                &["reason"],
            )?,
            worker_polls: counter(
                "infergate_worker_polls_total",
                "Polls of the worker's /metrics, whatever their outcome.",
                &["pool", "worker"],
            )?,
            poll_failures: counter(
                "infergate_worker_poll_failures_total",
                "Failed polls of workers' /metrics, by reason.",
                &["pool", "reason"],
            )?,
            kv_events_live: gauge(
                "infergate_routing_kv_events_live",
                "1 while routing reads the worker's KV events (precise mode), 0 on the approximate index.",
            )?,
            vllm_kv_batches: counter(
                "infergate_routing_vllm_kv_batches_total",
                "vLLM KV-event batches (ZMQ) applied to the routing index.",
                &["pool"],
            )?,
            vllm_kv_rejected: counter(
                "infergate_routing_vllm_kv_rejected_total",
                "vLLM KV-event messages refused, by reason (frames, topic, oversize, malformed, schema, vocab).",
                &["pool", "reason"],
            )?,
            vllm_kv_missed: counter(
                "infergate_routing_vllm_kv_missed_total",
                "vLLM KV-event batches never received (gaps in the publisher's sequence numbers).",
                &["pool"],
            )?,
            worker_in_flight: gauge(
                "infergate_worker_in_flight",
                "Requests this gateway has in flight on the worker.",
            )?,
            worker_waiting: gauge(
                "infergate_worker_waiting",
                "Requests waiting in the worker's engine (polled).",
            )?,
            worker_running: gauge(
                "infergate_worker_running",
                "Requests running in the worker's engine (polled).",
            )?,
            worker_kv_usage: gauge(
                "infergate_worker_kv_usage",
                "KV-cache usage of the worker, 0..1 (polled).",
            )?,
            worker_healthy: gauge(
                "infergate_worker_healthy",
                "1 when the worker is in rotation, 0 when ejected.",
            )?,
            reloads: counter(
                "infergate_config_reloads_total",
                "Config reload attempts by result.",
                &["result"],
            )?,
            tenant_requests: counter(
                "infergate_tenant_requests_total",
                "Requests per tenant by outcome.",
                &["tenant", "outcome"],
            )?,
            tenant_tokens: counter(
                "infergate_tenant_tokens_total",
                "Tokens per tenant as reported by the workers (prompt, completion).",
                &["tenant", "kind"],
            )?,
            tenant_cost: counter(
                "infergate_tenant_cost_nanousd_total",
                "Cost per tenant and model in nano-USD, at the prices in force.",
                &["tenant", "model"],
            )?,
            tenant_prompt_tokens: counter(
                "infergate_tenant_prompt_tokens_total",
                "Prompt tokens per tenant and model (cached ones included).",
                &["tenant", "model"],
            )?,
            tenant_cached_tokens: counter(
                "infergate_tenant_cached_tokens_total",
                "Prompt tokens served from the workers' prefix cache, per tenant and model.",
                &["tenant", "model"],
            )?,
            tenant_completion_tokens: counter(
                "infergate_tenant_completion_tokens_total",
                "Completion tokens per tenant and model.",
                &["tenant", "model"],
            )?,
            unpriced: counter(
                "infergate_unpriced_requests_total",
                "Answers of a model without a price in prices.yaml (costed at 0).",
                &["model"],
            )?,
            budget_soft_exceeded: counter(
                "infergate_budget_soft_exceeded_total",
                "Requests admitted while the tenant was over a soft budget.",
                &["tenant", "period"],
            )?,
            ledger_rows: counter(
                "infergate_ledger_rows_total",
                "Usage ledger rows by result (written, dropped when the queue was full, failed).",
                &["result"],
            )?,
            ledger_queue: {
                let g = IntGauge::new(
                    "infergate_ledger_queue_rows",
                    "Usage rows waiting for the ledger writer.",
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            state_fallback: {
                let g = IntGauge::new(
                    "infergate_state_fallback",
                    "1 while Redis is unreachable and tenant limits use this replica's local share.",
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            state_replicas: {
                let g = IntGauge::new(
                    "infergate_state_replicas",
                    "Gateway replicas counted through Redis heartbeats (the local share's divisor).",
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            state_errors: {
                let c = IntCounter::new(
                    "infergate_state_errors_total",
                    "Redis calls that failed or timed out.",
                )?;
                registry.register(Box::new(c.clone()))?;
                c
            },
            state_lease_calls: counter(
                "infergate_state_lease_calls_total",
                "Redis calls for quota leases: fetch (a request waited); renew, give and refresh (background).",
                &["call"],
            )?,
            state_prefix_homes: counter(
                "infergate_state_prefix_homes_total",
                "The shared directory of prefix homes: new prefixes claimed for the fleet (claimed), homes moved on this replica's proposal (moved), directory syncs (sync).",
                &["event"],
            )?,
            rejections: counter(
                "infergate_rejections_total",
                "Requests refused by the gateway, per tenant and reason.",
                &["tenant", "reason"],
            )?,
            queue_depth: {
                let g = GaugeVec::new(
                    Opts::new("infergate_queue_depth", "Requests waiting for admission."),
                    &["pool"],
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            fair_share_jain: {
                let g = GaugeVec::new(
                    Opts::new(
                        "infergate_fair_share_jain_index",
                        "Jain's index of the weighted tokens served to the tenants backlogged for \
                         a whole window of 64 started requests (the last window with two).",
                    ),
                    &["pool"],
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            queue_wait: hist(
                "infergate_queue_wait_seconds",
                "Time admitted requests waited in the admission queue.",
                LATENCY_BUCKETS,
            )?,
            tenant_queue_wait: {
                let h = HistogramVec::new(
                    HistogramOpts::new(
                        "infergate_tenant_queue_wait_seconds",
                        "Time each tenant's admitted requests waited in the admission queue.",
                    )
                    .buckets(LATENCY_BUCKETS.to_vec()),
                    &["tenant"],
                )?;
                registry.register(Box::new(h.clone()))?;
                h
            },
            degradation_level: {
                let g = GaugeVec::new(
                    Opts::new(
                        "infergate_degradation_level",
                        "Degradation level of the pool; 0 is normal service.",
                    ),
                    &["pool"],
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            degradation_transitions: counter(
                "infergate_degradation_transitions_total",
                "Degradation level changes by direction.",
                &["pool", "direction"],
            )?,
            degraded: counter(
                "infergate_degraded_requests_total",
                "Requests altered or refused by degradation, by action.",
                &["pool", "action"],
            )?,
            version_requests: counter(
                "infergate_version_requests_total",
                "Requests per model version by outcome.",
                &["model", "version", "outcome"],
            )?,
            canary_weight: {
                let g = GaugeVec::new(
                    Opts::new(
                        "infergate_canary_weight",
                        "Share of sessions sent to each version, percent.",
                    ),
                    &["model", "version"],
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            canary_decisions: counter(
                "infergate_canary_decisions_total",
                "Canary analysis decisions.",
                &["model", "decision"],
            )?,
            shadow_requests: counter(
                "infergate_shadow_requests_total",
                "Shadow copies by outcome.",
                &["model", "outcome"],
            )?,
            shadow_status_match: counter(
                "infergate_shadow_status_match_total",
                "Shadow answers whose status matched the client's.",
                &["model", "match"],
            )?,
            shadow_latency_ratio: ratio_hist(
                &registry,
                "infergate_shadow_latency_ratio",
                "Shadow latency over the client's latency.",
            )?,
            shadow_output_ratio: ratio_hist(
                &registry,
                "infergate_shadow_output_ratio",
                "Shadow output tokens over the client's.",
            )?,
            tenant_models: Mutex::default(),
            shape_class_requests: counter(
                "infergate_shape_class_requests_total",
                "Requests by shape class (routing.yaml shape_classes; unclassified: none matched) and pool.",
                &["class", "pool"],
            )?,
            shape_class_ttft: class_hist(
                &registry,
                "infergate_shape_class_ttft_seconds",
                "Time to the first upstream body byte by shape class and execution path.",
                LATENCY_BUCKETS,
            )?,
            shape_class_max_gap: class_hist(
                &registry,
                "infergate_shape_class_max_gap_seconds",
                "Each answer's longest gap between body chunks by shape class and execution path.",
                GAP_BUCKETS,
            )?,
            shape_class_e2e: class_hist(
                &registry,
                "infergate_shape_class_e2e_seconds",
                "End-to-end request duration by shape class and execution path.",
                LATENCY_BUCKETS,
            )?,
            flight_records: counter(
                "infergate_flight_records_total",
                "Engine flight records on relayed answers by result (ok, invalid, absent).",
                &["result"],
            )?,
            trace_lines: counter(
                "infergate_trace_lines_total",
                "Trace file lines by result (written, dropped, failed, unsampled).",
                &["result"],
            )?,
            otlp_spans: counter(
                "infergate_otlp_spans_total",
                "OTLP trace export spans by result (exported, dropped, failed).",
                &["result"],
            )?,
            quality_sampled: counter(
                "infergate_quality_sampled_total",
                "Answers scored for quality signals.",
                &["tenant", "model", "version"],
            )?,
            quality_signals: counter(
                "infergate_quality_signal_total",
                "Scored answers that raised a quality signal, by signal.",
                &["tenant", "model", "version", "signal"],
            )?,
            quality_dropped: {
                let c = IntCounter::new(
                    "infergate_quality_dropped_total",
                    "Answers not handed to the quality worker because its queue was full.",
                )?;
                registry.register(Box::new(c.clone()))?;
                c
            },
            drift_psi: {
                let g = GaugeVec::new(
                    Opts::new(
                        "infergate_drift_psi",
                        "PSI of the latest drift window against its reference, by feature.",
                    ),
                    &["model", "version", "feature"],
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            drift_tenant_psi: {
                let g = GaugeVec::new(
                    Opts::new(
                        "infergate_drift_tenant_psi",
                        "PSI of a tenant's latest drift window against its reference, by feature.",
                    ),
                    &["tenant", "feature"],
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            drift_threshold: {
                let g = Gauge::new(
                    "infergate_drift_psi_threshold",
                    "PSI above which drift is reported (quality.drift.psi_threshold).",
                )?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            route_cached_tokens: counter(
                "infergate_route_cached_tokens_total",
                "Cached prompt tokens per answer reporting them: predicted by routing for the \
                 chosen worker, delivered by the worker, available on the best healthy worker.",
                &["pool", "kind"],
            )?,
            quality_regression: counter(
                "infergate_quality_regression_total",
                "Replayed regression prompts whose answer raised a quality signal, by signal.",
                &["model", "version", "signal"],
            )?,
            quality_regression_runs: counter(
                "infergate_quality_regression_runs_total",
                "Replayed regression prompts by result (ok, error).",
                &["model", "version", "result"],
            )?,
            registry,
        })
    }

    /// True the first time `worker` is seen reporting impossible usage (so it is logged once);
    /// the set is bounded, past it nothing more is logged.
    pub fn first_usage_lie(&self, worker: &str) -> bool {
        const MAX_REMEMBERED: usize = 4096;
        let Ok(mut seen) = self.usage_liars.lock() else {
            return false;
        };
        // Looked up before the copy: a worker that keeps lying costs no allocation a request.
        !seen.contains(worker) && seen.len() < MAX_REMEMBERED && seen.insert(worker.to_owned())
    }

    /// The series of `tenant`'s requests to `model` (labels bounded like the metrics': tenants
    /// and models come from config).
    pub fn tenant_model(&self, tenant: &str, model: &str) -> Arc<TenantModelSeries> {
        let mut known = self
            .tenant_models
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(s) = known.get(tenant).and_then(|m| m.get(model)) {
            return s.clone();
        }
        let m = [tenant, model];
        let series = Arc::new(TenantModelSeries {
            prompt_tokens: self.tenant_tokens.with_label_values(&[tenant, "prompt"]),
            completion_tokens: self
                .tenant_tokens
                .with_label_values(&[tenant, "completion"]),
            cost: self.tenant_cost.with_label_values(&m),
            model_prompt_tokens: self.tenant_prompt_tokens.with_label_values(&m),
            model_cached_tokens: self.tenant_cached_tokens.with_label_values(&m),
            model_completion_tokens: self.tenant_completion_tokens.with_label_values(&m),
            unpriced: std::sync::OnceLock::new(),
        });
        known
            .entry(tenant.to_string())
            .or_default()
            .insert(model.to_string(), series.clone());
        series
    }

    /// Registers a collector of the gateway's own (one that owns its series, e.g. the triage
    /// figures polled from workers); it is shared, so its owner keeps updating it.
    pub fn register<C: prometheus::core::Collector + 'static>(
        &self,
        collector: Arc<C>,
    ) -> Result<(), prometheus::Error> {
        self.registry.register(Box::new(ArcCollector(collector)))
    }

    /// Updates the per-worker gauges of the worker at `url` from its routing view `v`.
    pub fn observe_worker(&self, pool: &str, url: &str, v: &crate::routing::WorkerView) {
        let l = [pool, url];
        self.worker_in_flight
            .with_label_values(&l)
            .set(f64::from(v.in_flight));
        self.worker_waiting.with_label_values(&l).set(v.waiting);
        self.worker_running.with_label_values(&l).set(v.running);
        self.worker_kv_usage.with_label_values(&l).set(v.kv_usage);
        self.worker_healthy
            .with_label_values(&l)
            .set(if v.healthy { 1.0 } else { 0.0 });
    }

    /// Prometheus text of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            return format!("# error encoding metrics: {e}\n");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// A histogram by shape class and execution path, registered in `registry`.
fn class_hist(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> Result<HistogramVec, prometheus::Error> {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        &["class", "path"],
    )?;
    registry.register(Box::new(h.clone()))?;
    Ok(h)
}
