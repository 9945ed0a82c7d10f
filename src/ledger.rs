//! The account phase's guard: holds a request's rate-limit reservation, concurrency slot, body
//! bytes and admission permit, and settles them exactly once: with the real usage when the
//! response body ends, or as a full refund when the request dies before an answer (Drop).

use std::sync::Arc;
use std::time::Instant;

use crate::admission::Permit;
use crate::limits::{ConcurrencySlot, Limiter};
use crate::metrics::GatewayMetrics;
use crate::proxy::body::EndReport;
use crate::request_body::BodyHold;

/// One request's open account.
pub struct Ledger {
    limiter: Arc<dyn Limiter>,
    metrics: Arc<GatewayMetrics>,
    tenant: String,
    reserved: u64,
    prompt_estimate: u64,
    slot: Option<ConcurrencySlot>,
    body: Option<BodyHold>,
    permit: Option<Permit>,
    settled: bool,
}

impl Ledger {
    /// Opens an account for `tenant`, which reserved `reserved` tokens (`prompt_estimate` of them
    /// for the prompt) and holds `slot` and the request body's `body` bytes until it settles.
    pub fn new(
        limiter: Arc<dyn Limiter>,
        metrics: Arc<GatewayMetrics>,
        tenant: &str,
        reserved: u64,
        prompt_estimate: u64,
        (slot, body): (ConcurrencySlot, BodyHold),
    ) -> Self {
        Self {
            limiter,
            metrics,
            tenant: tenant.to_string(),
            reserved,
            prompt_estimate,
            slot: Some(slot),
            body: Some(body),
            permit: None,
            settled: false,
        }
    }

    /// Attaches the admission permit, released when the account settles.
    pub fn hold(&mut self, permit: Permit) {
        self.permit = Some(permit);
    }

    /// Settles with what the response reported: real usage when the worker sent it, else the
    /// prompt estimate plus one token per streamed content chunk.
    pub fn settle(mut self, end: EndReport) {
        let (prompt, completion) = match end.usage {
            Some(u) => (u.prompt, u.completion),
            None => (self.prompt_estimate, end.content_events),
        };
        let t = &self.tenant;
        self.metrics
            .tenant_tokens
            .with_label_values(&[t, "prompt"])
            .inc_by(prompt);
        self.metrics
            .tenant_tokens
            .with_label_values(&[t, "completion"])
            .inc_by(completion);
        self.close(prompt + completion);
    }

    fn close(&mut self, actual: u64) {
        if self.settled {
            return;
        }
        self.settled = true;
        self.limiter
            .reconcile(&self.tenant, self.reserved, actual, Instant::now());
        self.slot = None;
        self.body = None;
        self.permit = None;
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        // No answer came back (routing or upstream failure): nothing was spent upstream.
        self.close(0);
    }
}
