//! The per-request context every phase reads and fills in: who asked, for what, where it went,
//! and whether an answer exists (the usage row of a client that left before one is written when
//! the context drops).

use std::sync::Arc;
use std::time::Instant;

use hyper::Request;
use infergate_engine::edge::request_id::{self, REQUEST_ID};

use crate::ledger::UsageRow;

/// Who asked: known once authentication passed.
pub(super) struct Caller {
    pub(super) tenant: String,
    /// Short id of the caller's API key (empty for the anonymous tenant).
    pub(super) key_id: String,
}

/// What was asked for and where it goes: known once validation passed; degradation (a fallback
/// model, another pool) and the split (a version) may change it.
pub(super) struct Target {
    /// The model the client is served as (a degradation fallback replaces the one it named).
    pub(super) model: String,
    pub(super) pool: String,
    /// The version (canary arm) the split chose.
    pub(super) version: Option<String>,
}

/// Per-request context shared by the phases.
pub(crate) struct RequestCtx {
    pub(super) request_id: String,
    pub(super) started: Instant,
    /// Arrival, Unix ms (for the usage ledger).
    pub(super) started_ms: i64,
    /// `None` until authenticated.
    pub(super) caller: Option<Caller>,
    /// `None` until validated.
    pub(super) target: Option<Target>,
    /// Time waited in the admission queue.
    pub(super) queue_ms: Option<u64>,
    /// The ledger, once the caller is known; with `row_owned` false at drop, the client left
    /// before any answer (hyper dropped the request) and the row is written here.
    pub(super) ledger: Option<Arc<crate::ledger::UsageLedger>>,
    /// An answer or error exists: its row is written by the body's account or by [`account`].
    pub(super) row_owned: bool,
    /// A worker's answer is being relayed: its request count and tenant outcome are recorded
    /// when its body ends, when the outcome is known (a stream can still fail after its 200).
    pub(super) counted_at_end: bool,
}

impl Drop for RequestCtx {
    fn drop(&mut self) {
        if self.row_owned || self.caller.is_none() {
            return;
        }
        if let Some(ledger) = &self.ledger {
            // nginx's code for a client that closed the connection before the answer.
            ledger.record(self.ended_row(499, "client_gone"));
        }
    }
}

impl RequestCtx {
    /// The usage-ledger row of this request as far as the phases got.
    pub(super) fn usage_row(&self) -> UsageRow {
        let (tenant, key_id) = self
            .caller
            .as_ref()
            .map(|c| (c.tenant.clone(), c.key_id.clone()))
            .unwrap_or_default();
        let (model, pool, version) = self
            .target
            .as_ref()
            .map(|t| {
                let version = t.version.clone().unwrap_or_default();
                (t.model.clone(), t.pool.clone(), version)
            })
            .unwrap_or_default();
        UsageRow {
            request_id: self.request_id.clone(),
            start_ms: self.started_ms,
            tenant,
            key_id,
            model,
            version,
            pool,
            queue_ms: self.queue_ms,
            ..UsageRow::default()
        }
    }

    /// The caller's tenant, once authenticated.
    pub(super) fn tenant(&self) -> Option<&str> {
        self.caller.as_ref().map(|c| c.tenant.as_str())
    }

    /// Records the pool the request now targets (degradation and the split may each move it).
    pub(super) fn move_to_pool(&mut self, pool: &str) {
        if let Some(t) = &mut self.target {
            t.pool.replace_range(.., pool);
        }
    }

    /// The row of a request that ends here, without an answer from a worker.
    pub(super) fn ended_row(&self, status: u16, reason: &str) -> UsageRow {
        UsageRow {
            end_ms: crate::utc::now_ms(),
            status,
            reason: reason.to_string(),
            total_ms: self.started.elapsed().as_millis() as u64,
            ..self.usage_row()
        }
    }
}

/// Accept: the request id the edge set (the client's, or a fresh one) and the arrival time.
pub(super) fn accept<B>(req: &Request<B>) -> RequestCtx {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    // The edge set a usable id; a fresh one only for a caller that skipped it.
    let request_id = match req.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok()) {
        Some(id) => id.to_owned(),
        None => request_id::fresh().to_str().unwrap_or_default().to_owned(),
    };
    RequestCtx {
        request_id,
        started: Instant::now(),
        started_ms: i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX),
        caller: None,
        target: None,
        queue_ms: None,
        ledger: None,
        row_owned: false,
        counted_at_end: false,
    }
}
