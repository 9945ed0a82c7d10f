//! The per-request context every phase reads and fills in: the request id, its arrival, and
//! its one exit ([`Exit`]), whose usage row the phases fill in as they learn who asked, for what
//! and where it goes.

use std::sync::Arc;
use std::time::Instant;

use hyper::Request;
use infergate_engine::edge::request_id::{self, REQUEST_ID};

use super::account::Exit;
use crate::metrics::GatewayMetrics;

/// Per-request context shared by the phases.
pub(crate) struct RequestCtx {
    pub(super) request_id: String,
    pub(super) started: Instant,
    /// Accounts the request once, however it ends (see [`super::account`]).
    pub(super) exit: Exit,
}

/// Accept: the request id the edge set (the client's, or a fresh one), the arrival time, and
/// the request's exit, open from here on.
pub(super) fn accept<B>(req: &Request<B>, metrics: &Arc<GatewayMetrics>) -> RequestCtx {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    // The edge set a usable id; a fresh one only for a caller that skipped it.
    let request_id = match req.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok()) {
        Some(id) => id.to_owned(),
        None => request_id::fresh().to_str().unwrap_or_default().to_owned(),
    };
    let started = Instant::now();
    let start_ms = i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX);
    RequestCtx {
        exit: Exit::open(metrics.clone(), &request_id, started, start_ms),
        request_id,
        started,
    }
}
