//! Account: the request's one exit. Whatever happened — a refusal or a failure answered here, a
//! worker's answer relayed to its end (or broken off), a client that left before any answer —
//! [`Exit::finish`] runs exactly once with the [`Outcome`], and writes the request's metrics,
//! tenant outcome, canary sample, shadow comparison and usage-ledger row, and settles its rate
//! limits and budgets. The exit lives in the request context while the phases fill in its row;
//! when a worker answers it moves into the answer's end hook; if it is dropped unfinished (the
//! client went away and hyper dropped the request), it finishes as [`Outcome::Gone`].

use std::sync::Arc;
use std::time::Instant;

use hyper::StatusCode;

use super::reservation::Account;
use super::split::VersionChoice;
use crate::error::GatewayError;
use crate::ledger::{RowText, UsageLedger, UsageRow};
use crate::metrics::GatewayMetrics;
use crate::pipeline::forward::relay::attempts::Attempts;
use crate::pipeline::forward::relay::body::EndReport;
use crate::quality::signals::Asked;
use crate::quality::{QualityConfig, QualityJob, QualitySampler};
use crate::shadow::PrimaryOutcome;
use crate::trace::otlp::OtlpExporter;
use crate::trace::{TraceLine, TraceWriter};

/// How a request ended.
pub(super) enum Outcome<'a> {
    /// Answered by the gateway: `err` is the refusal or failure (`None` for an answer the
    /// gateway made itself, e.g. `GET /v1/models`).
    Answered {
        status: StatusCode,
        err: Option<&'a GatewayError>,
    },
    /// A worker's answer, relayed until its body ended, broke off or its client left.
    Relayed(EndReport),
    /// The client left before any answer.
    Gone,
}

/// A traced request's shape, what a replay of the trace needs (see `TraceLine`).
#[derive(Debug, Clone, Default)]
pub(crate) struct TracedShape {
    /// The gateway's prompt-token estimate.
    pub prompt_estimate: Option<u64>,
    /// The canonical prompt's bytes.
    pub prompt_bytes: Option<u64>,
    /// Session key hash, hex.
    pub session: Option<String>,
    /// Prefix marks (`trace::prefix_marks`).
    pub prefix: Vec<String>,
    /// Features that change the engine's path.
    pub features: Option<crate::trace::TraceFeatures>,
}

/// The request's one exit: its usage row as far as the phases got, and everything its end
/// reports to. Empty (`Default`) once finished or moved on: then it does nothing.
#[derive(Default)]
pub(crate) struct Exit {
    /// `None` once finished (or moved into the relay's end hook).
    metrics: Option<Arc<GatewayMetrics>>,
    /// The usage row: request id, arrival, tenant, key, model, pool, version, queue time.
    row: UsageRow,
    /// The caller is known (authenticated): its outcome is counted and its row written.
    caller: bool,
    /// The request was validated: its model and pool label the request count.
    targeted: bool,
    /// Where the row goes, once the caller is known.
    ledger: Option<Arc<UsageLedger>>,
    /// Version of the prices of the snapshot the request started on.
    price_version: u32,
    /// The model priced first: the canary version's model, else the row's.
    served_model: Option<String>,
    /// The reservation, settled at the end (refunded whole when there was no answer).
    account: Option<Box<Account>>,
    /// The canary version that serves the request, once admitted.
    version: Option<VersionChoice>,
    /// The shadow comparison waiting for the client's own outcome.
    shadow: Option<tokio::sync::oneshot::Sender<PrimaryOutcome>>,
    started: Option<Instant>,
    /// Where the request's trace line goes (`trace:`), when a trace file is kept.
    trace: Option<Arc<TraceWriter>>,
    /// Where its spans go (`trace.otlp`), when they are exported.
    otlp: Option<Arc<OtlpExporter>>,
    /// The endpoint's path and the completion bound, for the trace.
    request: Option<(&'static str, u64)>,
    /// The request's shape as a replay needs it (prompt estimate, session, prefix marks).
    shape: TracedShape,
    /// Its shape class, when routing.yaml declares classes (`classify`).
    shape_class: Option<String>,
    /// The client's `traceparent`, kept only while a trace is kept.
    traceparent: Option<String>,
    /// The attempts on workers, once one answered.
    attempts: Attempts,
    /// Where the answer goes for its quality signals and drift windows, when it does.
    quality: Option<QualityHook>,
}

/// The quality worker, the config in force and what the request asked of its answer.
struct QualityHook {
    sampler: Arc<QualitySampler>,
    config: Arc<QualityConfig>,
    asked: Asked,
}

impl Drop for Exit {
    fn drop(&mut self) {
        // Unfinished: hyper dropped the request, so the client left before any answer.
        self.end(Outcome::Gone);
    }
}

impl Exit {
    /// An open exit for the request `request_id`, which arrived at `started` (Unix ms `start_ms`).
    pub(super) fn open(
        metrics: Arc<GatewayMetrics>,
        request_id: &str,
        started: Instant,
        start_ms: i64,
    ) -> Self {
        let mut exit = Self::default();
        exit.metrics = Some(metrics);
        exit.row.request_id = RowText::new(request_id);
        exit.row.start_ms = start_ms;
        exit.started = Some(started);
        exit
    }

    /// The caller authenticated as `tenant` with key `key_id`; its row goes to `ledger`.
    pub(super) fn caller(
        &mut self,
        (tenant, key_id): (&str, &str),
        ledger: Option<Arc<UsageLedger>>,
        price_version: u32,
    ) {
        self.row.tenant = RowText::name(tenant);
        self.row.key_id = RowText::new(key_id);
        self.caller = true;
        self.ledger = ledger;
        self.price_version = price_version;
    }

    /// The caller's tenant, once authenticated.
    pub(super) fn tenant(&self) -> Option<&str> {
        self.caller.then_some(self.row.tenant.as_str())
    }

    /// The trace file and the OTLP exporter the request's line goes to, if any.
    pub(super) fn trace(
        &mut self,
        trace: Option<Arc<TraceWriter>>,
        otlp: Option<Arc<OtlpExporter>>,
    ) {
        self.trace = trace;
        self.otlp = otlp;
    }

    /// True when the request's line goes anywhere.
    pub(super) fn traced(&self) -> bool {
        self.trace.is_some() || self.otlp.is_some()
    }

    /// What the trace says of the request: its endpoint's path, its completion bound, its
    /// shape and the client's `traceparent`.
    pub(super) fn traced_request(
        &mut self,
        (path, max_tokens): (&'static str, u64),
        shape: TracedShape,
        traceparent: Option<&hyper::header::HeaderValue>,
    ) {
        self.request = Some((path, max_tokens));
        self.shape = shape;
        self.traceparent = traceparent.and_then(|v| v.to_str().ok()).map(str::to_owned);
    }

    /// The request's shape class (or `unclassified`), which labels its latency at the end.
    pub(super) fn shape_class(&mut self, class: &str) {
        self.shape_class = Some(class.to_owned());
    }

    /// The answer goes to `sampler` for its quality signals (when sampled) and drift windows.
    pub(super) fn quality(
        &mut self,
        sampler: Arc<QualitySampler>,
        config: Arc<QualityConfig>,
        asked: Asked,
    ) {
        self.quality = Some(QualityHook {
            sampler,
            config,
            asked,
        });
    }

    /// The attempts that led to the worker that answered.
    pub(super) fn attempts(&mut self, attempts: Attempts) {
        self.attempts = attempts;
    }

    /// The request was validated: it asks for `model`, served by `pool`.
    pub(super) fn target(&mut self, model: &str, pool: &str) {
        self.row.model = RowText::name(model);
        self.row.pool = RowText::name(pool);
        self.targeted = true;
    }

    /// The model the request is now served as (a degradation fallback).
    pub(super) fn model(&mut self, model: &str) {
        self.row.model = RowText::name(model);
    }

    /// The pool the request now goes to (degradation and the split may each move it).
    pub(super) fn pool(&mut self, pool: &str) {
        if self.row.pool != pool {
            self.row.pool = RowText::name(pool);
        }
    }

    /// The canary version the split chose: named in the row, priced as its own model.
    pub(super) fn version(&mut self, version: &VersionChoice) {
        self.row.version = RowText::name(&version.name);
        self.served_model = Some(version.served_model.clone());
    }

    /// The reservation metering made.
    pub(super) fn account(&mut self, account: Box<Account>) {
        self.account = Some(account);
    }

    /// The reservation, while the request runs (admission attaches its permit to it).
    pub(super) fn account_mut(&mut self) -> Option<&mut Account> {
        self.account.as_deref_mut()
    }

    /// Time waited in the admission queue.
    pub(super) fn queued(&mut self, waited: std::time::Duration) {
        self.row.queue_ms = Some(waited.as_millis() as u64);
    }

    /// Time waited in the admission queue, once admitted.
    #[cfg(test)]
    pub(super) fn queue_ms(&self) -> Option<u64> {
        self.row.queue_ms
    }

    /// The canary version that serves the request, set once admitted: from then on a routing
    /// or upstream failure counts against it.
    pub(super) fn serving(&mut self, version: Option<VersionChoice>) {
        self.version = version;
    }

    /// The shadow comparison waiting for the client's own outcome.
    pub(super) fn shadow(&mut self, shadow: Option<tokio::sync::oneshot::Sender<PrimaryOutcome>>) {
        self.shadow = shadow;
    }

    /// Moves the exit on (into the relayed answer's end hook), leaving an empty one here.
    pub(super) fn relay(&mut self) -> Exit {
        std::mem::take(self)
    }

    /// Accounts the request once, by how it ended.
    pub(super) fn finish(mut self, outcome: Outcome<'_>) {
        self.end(outcome);
    }

    fn end(&mut self, outcome: Outcome<'_>) {
        let Some(metrics) = self.metrics.take() else {
            return;
        };
        match outcome {
            Outcome::Answered { status, err } => self.answered(&metrics, status, err),
            Outcome::Relayed(end) => self.relayed(&metrics, end),
            Outcome::Gone => {
                // nginx's code for a client that closed the connection before the answer.
                if self.caller {
                    self.record(self.ended_row(499, "client_gone"));
                }
            }
        }
        // Whatever was not settled above (no answer) is refunded whole here.
        self.account = None;
    }

    /// A refusal, a failure before any worker answered, or an answer the gateway made.
    fn answered(&mut self, m: &GatewayMetrics, status: StatusCode, err: Option<&GatewayError>) {
        if self.targeted {
            m.requests
                .with_label_values(&[&self.row.model, &self.row.pool, status.as_str()])
                .inc();
        }
        let tenant = self.tenant().unwrap_or("unknown");
        // `upstream` and `internal` failures are not refusals of the caller.
        let reason = err.map(GatewayError::reason);
        let refused = reason.filter(|r| !matches!(*r, "upstream" | "internal"));
        if let Some(reason) = reason {
            if let Some(reason) = refused {
                m.rejections.with_label_values(&[tenant, reason]).inc();
            }
            // A refusal of a known caller is a ledger row too (an unknown one is not: a flood
            // of bad keys must not fill the ledger).
            if self.caller {
                let mut row = self.ended_row(status.as_u16(), reason);
                row.price_version = self.price_version;
                self.record(row);
            }
            // No answer at all from a version that was routed to counts against it.
            if let Some(v) = &self.version {
                v.record(m, false, None, None);
            }
        }
        if !self.caller && err.is_none() {
            return;
        }
        let outcome = match refused {
            Some(_) => "rejected",
            None => outcome_of(status.as_u16()),
        };
        m.tenant_requests
            .with_label_values(&[tenant, outcome])
            .inc();
    }

    /// A worker's answer, at the end of its body: counted by how it really ended (a stream can
    /// still fail after its 200), compared with its shadow, sampled for the canary, settled.
    fn relayed(&mut self, m: &GatewayMetrics, mut end: EndReport) {
        let (status, outcome) = end_outcome(&end);
        if self.targeted {
            m.requests
                .with_label_values(&[&self.row.model, &self.row.pool, status.as_str()])
                .inc();
        }
        if let Some(tenant) = self.tenant() {
            m.tenant_requests
                .with_label_values(&[tenant, outcome])
                .inc();
        }
        let elapsed = self.started.map(|s| s.elapsed()).unwrap_or_default();
        m.flight_records
            .with_label_values(&[end.flight.label()])
            .inc();
        self.write_trace(&end, status.as_u16(), elapsed);
        if let Some(class) = &self.shape_class {
            let path = end.flight.record().map_or("unknown", |r| r.path());
            let labels = [class.as_str(), path];
            if let Some(ttft) = end.ttft {
                m.shape_class_ttft
                    .with_label_values(&labels)
                    .observe(ttft.as_secs_f64());
            }
            if let Some(gap) = end.max_gap {
                m.shape_class_max_gap
                    .with_label_values(&labels)
                    .observe(gap.as_secs_f64());
            }
            m.shape_class_e2e
                .with_label_values(&labels)
                .observe(elapsed.as_secs_f64());
        }
        if let Some(tx) = self.shadow.take() {
            let _ = tx.send(PrimaryOutcome {
                status: end.status,
                output_tokens: end.usage.map_or(end.content_events, |u| u.completion),
                latency: elapsed,
            });
        }
        // A client that hangs up says nothing about the version that served it: counted as
        // cancelled, kept out of the canary analysis.
        if let Some(v) = &self.version {
            if end.client_gone {
                v.count(m, "cancelled");
            } else {
                v.record(m, served_well(&end), end.ttft, end.max_gap);
            }
        }
        let Some(account) = self.account.take() else {
            self.submit_quality(&mut end, None);
            return;
        };
        let served = self.served_model.as_deref().unwrap_or(&self.row.model);
        let settled = account.settle(&end, (&self.row.model, served, &self.row.pool));
        self.submit_quality(&mut end, Some(settled.tokens));
        if self.ledger.is_none() {
            return;
        }
        let mut row = std::mem::take(&mut self.row);
        row.end_ms = crate::utc::now_ms();
        row.status = end.status;
        row.reason = if end.client_gone {
            "client_gone".into()
        } else if !end.completed {
            "upstream_failed".into()
        } else if !(200..300).contains(&end.status) {
            "upstream_status".into()
        } else {
            RowText::EMPTY
        };
        row.prompt_tokens = settled.tokens.prompt;
        row.cached_tokens = settled.tokens.cached;
        row.completion_tokens = settled.tokens.completion;
        row.cost_nanousd = settled.cost_nanousd;
        row.price_version = settled.price_version;
        row.ttft_ms = end.ttft.map(|d| d.as_millis() as u64);
        row.total_ms = elapsed.as_millis() as u64;
        row.worker = RowText::name(&end.worker);
        self.record(row);
    }

    /// Hands a whole answer to the quality worker (when the request has a hook), with its
    /// `tokens` as checked against the request (never the worker's word unchecked).
    fn submit_quality(&mut self, end: &mut EndReport, tokens: Option<crate::pricing::TokenCounts>) {
        let Some(q) = self.quality.take() else { return };
        // Only a whole answer says anything about its quality.
        if !served_well(end) {
            return;
        }
        let version = match self.row.version.is_empty() {
            true => RowText::name("default"),
            false => self.row.version.clone(),
        };
        q.sampler.submit(QualityJob {
            tenant: match self.caller {
                true => self.row.tenant.clone(),
                false => RowText::name("unknown"),
            },
            model: self.row.model.clone(),
            version,
            capture: end.capture.take(),
            asked: q.asked,
            usage: tokens.map(|t| crate::usage_check::TokenUsage {
                prompt: t.prompt,
                completion: t.completion,
                cached: Some(t.cached),
            }),
            canary: self.version.as_ref().map(|v| {
                Box::new(crate::canary::VersionWindow {
                    canary: v.canary.clone(),
                    index: v.index,
                }) as Box<dyn crate::quality::sampler::SignalWindow>
            }),
            config: q.config,
        });
    }

    /// Queues the request's trace line for the trace file and the OTLP exporter (each when
    /// kept and the request is in its sample): the gateway's view of it, its attempts and the
    /// engine's flight record.
    fn write_trace(&self, end: &EndReport, status: u16, elapsed: std::time::Duration) {
        let id = &self.row.request_id;
        let file = self.trace.as_ref().filter(|t| {
            let sampled = t.sampled(id);
            if !sampled {
                t.unsampled();
            }
            sampled
        });
        let otlp = self.otlp.as_ref().filter(|o| o.sampled(id));
        if file.is_none() && otlp.is_none() {
            return;
        }
        let row = &self.row;
        let (endpoint, max_tokens) = self.request.unzip();
        let started = self.started.unwrap_or_else(Instant::now);
        let line = TraceLine {
            request_id: row.request_id.to_string(),
            start_ms: row.start_ms,
            tenant: row.tenant.to_string(),
            endpoint: endpoint.unwrap_or_default(),
            model: row.model.to_string(),
            served_model: self
                .served_model
                .clone()
                .unwrap_or_else(|| row.model.to_string()),
            // Embeddings generate nothing: no bound.
            max_tokens: max_tokens.filter(|_| endpoint != Some("/v1/embeddings")),
            traceparent: self.traceparent.clone(),
            version: row.version.to_string(),
            pool: row.pool.to_string(),
            class: self.shape_class.clone(),
            worker: end.worker.clone(),
            status,
            stream: end.stream,
            queue_ms: row.queue_ms,
            ttft_ms: end.ttft.map(crate::trace::millis),
            total_ms: crate::trace::millis(elapsed),
            prompt_tokens: end.usage.map(|u| u.prompt),
            prompt_estimate: self.shape.prompt_estimate,
            prompt_bytes: self.shape.prompt_bytes,
            session: self.shape.session.clone(),
            prefix: self.shape.prefix.clone(),
            features: self.shape.features,
            completion_tokens: end.usage.map(|u| u.completion),
            flight_status: end.flight.label(),
            flight: end.flight.record().cloned(),
            attempts: self
                .attempts
                .lines(started, (&end.worker, end.status), started + elapsed),
        };
        if let Some(file) = file {
            file.push(line.to_json());
        }
        if let Some(otlp) = otlp {
            otlp.push(line);
        }
    }

    /// The row of a request that ends here, without an answer from a worker.
    fn ended_row(&self, status: u16, reason: &str) -> UsageRow {
        UsageRow {
            end_ms: crate::utc::now_ms(),
            status,
            reason: RowText::new(reason),
            total_ms: self.started.map_or(0, |s| s.elapsed().as_millis() as u64),
            ..self.row.clone()
        }
    }

    fn record(&self, row: UsageRow) {
        if let Some(ledger) = &self.ledger {
            ledger.record(row);
        }
    }
}

/// The `status` label and tenant outcome of a relayed answer, from how its body ended: a body
/// the worker broke off (a reset, an error event, a stream cut before `[DONE]`, a short body) is
/// a 502 whatever status its headers had (a held whole answer: the 5xx its client got), and a
/// client that left is nginx's 499.
pub(super) fn end_outcome(
    end: &crate::pipeline::forward::relay::body::EndReport,
) -> (StatusCode, &'static str) {
    if end.client_gone {
        (CLIENT_CLOSED, "cancelled")
    } else if !end.completed {
        let status = StatusCode::from_u16(end.status)
            .ok()
            .filter(StatusCode::is_server_error)
            .unwrap_or(StatusCode::BAD_GATEWAY);
        (status, "upstream_error")
    } else {
        // A status hyper accepted from the worker is a valid code.
        let status = StatusCode::from_u16(end.status).unwrap_or(StatusCode::BAD_GATEWAY);
        (status, outcome_of(end.status))
    }
}

/// Whether a relayed answer counts as a success of the version that served it (the canary's
/// analysis sample): read to its end, whole, with a 2xx. A stream that carried an error event
/// or stopped before `[DONE]` is a failure whatever its head said.
pub(super) fn served_well(end: &crate::pipeline::forward::relay::body::EndReport) -> bool {
    end.completed && (200..300).contains(&end.status)
}

/// nginx's 499: the client closed the connection before the answer ended.
const CLIENT_CLOSED: StatusCode = match StatusCode::from_u16(499) {
    Ok(s) => s,
    Err(_) => StatusCode::BAD_REQUEST,
};

/// The tenant outcome of an answer with HTTP `status`.
pub(super) fn outcome_of(status: u16) -> &'static str {
    match status {
        200..=399 => "ok",
        400..=499 => "client_error",
        _ => "upstream_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::forward::relay::body::EndReport;

    #[test]
    fn a_body_the_worker_broke_is_an_upstream_error_whatever_its_head_said() {
        let end = |status, completed, client_gone| EndReport {
            status,
            completed,
            client_gone,
            ..EndReport::default()
        };
        assert_eq!(end_outcome(&end(200, true, false)), (StatusCode::OK, "ok"));
        let broken = (StatusCode::BAD_GATEWAY, "upstream_error");
        assert_eq!(end_outcome(&end(200, false, false)), broken);
        assert_eq!(end_outcome(&end(404, false, false)), broken);
        assert_eq!(
            end_outcome(&end(504, false, false)),
            (StatusCode::GATEWAY_TIMEOUT, "upstream_error")
        );
        assert_eq!(end_outcome(&end(200, false, true)).1, "cancelled");
        assert!(served_well(&end(200, true, false)));
        assert!(!served_well(&end(200, false, false)), "a broken stream");
        assert!(!served_well(&end(503, true, false)));
        assert_eq!(
            end_outcome(&end(429, true, false)),
            (StatusCode::TOO_MANY_REQUESTS, "client_error")
        );
    }
}
