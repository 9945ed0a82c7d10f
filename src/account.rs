//! The account phase's guard: holds a request's rate-limit reservation, budget reservation,
//! concurrency slot, body bytes and admission permit, and settles them exactly once: with the
//! real usage when the response body ends (pricing it, counting it per tenant and model, and
//! writing its usage-ledger row), or as a full refund when the request dies before an answer
//! (Drop; the handler then writes the refusal's row).

use std::sync::Arc;
use std::time::Instant;

use crate::admission::Permit;
use crate::budgets::{BudgetBook, Period};
use crate::ledger::{UsageLedger, UsageRow};
use crate::limits::{ConcurrencySlot, Limiter};
use crate::metrics::GatewayMetrics;
use crate::pricing::{Prices, TokenCounts};
use crate::proxy::body::EndReport;
use crate::proxy::usage_check::{self, UsageBounds, UsageCheckConfig};
use crate::request_body::BodyHold;

/// What the account needs to price a request and write its ledger row.
pub struct Usage {
    /// The row so far: request id, start, tenant, key id, model, version, pool, queue time.
    pub row: UsageRow,
    /// The prices of the snapshot the request started on.
    pub prices: Arc<Prices>,
    /// The model that served it (a canary version's model), priced first.
    pub served_model: String,
    /// The tenant's tier (for its price multiplier).
    pub tier: String,
    /// Where rows go; `None` when no ledger is configured.
    pub ledger: Option<Arc<UsageLedger>>,
    /// The tenant's budget book and the periods this request reserved `budget_estimate` in.
    pub budgets: Arc<BudgetBook>,
    /// Periods reserved in.
    pub budget_periods: Vec<Period>,
    /// Nano-USD reserved against the budgets.
    pub budget_estimate: u64,
    /// What the request made possible, to check the worker's usage against.
    pub bounds: UsageBounds,
    /// How far the worker's usage may stray from it.
    pub check: UsageCheckConfig,
}

/// One request's open account.
pub struct Account {
    limiter: Arc<dyn Limiter>,
    metrics: Arc<GatewayMetrics>,
    tenant: String,
    reserved: u64,
    prompt_estimate: u64,
    slot: Option<ConcurrencySlot>,
    body: Option<BodyHold>,
    permit: Option<Permit>,
    usage: Option<Usage>,
    /// The request's bounds on usage and the check's settings (kept when `usage` is taken).
    bounds: (UsageBounds, UsageCheckConfig),
    /// The pool that served it, for the usage check's counter.
    pool: String,
    /// Where the rate reservation is held when fleet mode admitted it.
    shared: Option<(
        Arc<crate::limits::SharedLimiter>,
        crate::limits::TierLimits,
        crate::limits::Held,
    )>,
    started: Instant,
    settled: bool,
    /// The tier limits no rate in process: the limiter holds nothing to settle.
    unrated: bool,
}

impl Account {
    /// Opens an account for `tenant`, which reserved `reserved` tokens (`prompt_estimate` of them
    /// for the prompt) and holds `slot` and the request body's `body` bytes until it settles.
    pub fn new(
        limiter: Arc<dyn Limiter>,
        metrics: Arc<GatewayMetrics>,
        tenant: &str,
        (reserved, prompt_estimate): (u64, u64),
        (slot, body): (ConcurrencySlot, BodyHold),
        usage: Usage,
        started: Instant,
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
            bounds: (usage.bounds, usage.check),
            pool: usage.row.pool.clone(),
            usage: Some(usage),
            shared: None,
            started,
            settled: false,
            unrated: false,
        }
    }

    /// Settles the rate reservation in fleet mode's shared store (or its local share).
    pub fn shared_by(
        &mut self,
        limiter: Arc<crate::limits::SharedLimiter>,
        limits: crate::limits::TierLimits,
        held: crate::limits::Held,
    ) {
        self.shared = Some((limiter, limits, held));
    }

    /// Points the usage at where the request finally went: its `model`, `pool` and `version`,
    /// served by `served_model` (degradation and the canary split run after metering).
    pub fn retarget(
        &mut self,
        (model, pool, version): (&str, &str, Option<&str>),
        served_model: &str,
    ) {
        if self.pool != pool {
            self.pool = pool.to_string();
        }
        if let Some(u) = &mut self.usage {
            u.row.model = model.to_string();
            if u.ledger.is_some() {
                u.row.pool = pool.to_string();
                u.row.version = version.unwrap_or_default().to_string();
            }
            u.served_model = served_model.to_string();
        }
    }

    /// Marks the reservation as made without rate limits: settling skips the limiter.
    pub fn unrated(&mut self) {
        self.unrated = true;
    }

    /// Attaches the admission permit (and the time it waited), released when the account settles.
    pub fn hold(&mut self, permit: Permit) {
        if let Some(u) = &mut self.usage {
            u.row.queue_ms = Some(permit.waited().as_millis() as u64);
        }
        self.permit = Some(permit);
    }

    /// Settles with what the response reported: the worker's usage when it sent one within
    /// what the request made possible (each field outside it replaced by the gateway's own
    /// count), else the prompt estimate plus one token per streamed content chunk (cached
    /// tokens then 0).
    pub fn settle(mut self, end: EndReport) {
        let tokens = match end.usage {
            Some(u) => self.checked(u, &end),
            // An error answer without usage (a worker's 4xx/5xx) did no billable work.
            None if !(200..300).contains(&end.status) => TokenCounts::default(),
            None => TokenCounts {
                prompt: self.prompt_estimate,
                cached: 0,
                completion: end.content_events,
            },
        };
        match self.usage.take() {
            Some(usage) => self.charge(usage, tokens, end),
            None => {
                let t = &self.tenant;
                let m = &self.metrics;
                m.tenant_tokens
                    .with_label_values(&[t, "prompt"])
                    .inc_by(tokens.prompt);
                m.tenant_tokens
                    .with_label_values(&[t, "completion"])
                    .inc_by(tokens.completion);
            }
        }
        self.close(tokens.prompt.saturating_add(tokens.completion));
    }

    /// The worker's usage `u` as checked against the request's bounds; a rejection is counted
    /// per pool and reason, and logged once per worker.
    fn checked(&self, u: crate::proxy::usage::TokenUsage, end: &EndReport) -> TokenCounts {
        let (bounds, cfg) = &self.bounds;
        let own_completion = (end.content_events > 0).then_some(end.content_events);
        let checked = usage_check::check(u, bounds, cfg, own_completion);
        for reason in checked.rejections() {
            self.metrics
                .usage_rejected
                .with_label_values(&[&self.pool, reason.as_str()])
                .inc();
            if self.metrics.first_usage_lie(&end.worker) {
                tracing::warn!(
                    worker = %end.worker,
                    pool = %self.pool,
                    reason = reason.as_str(),
                    reported_prompt = u.prompt,
                    reported_completion = u.completion,
                    reported_cached = ?u.cached,
                    "a worker reported usage the request cannot have used: billing the gateway's own count (logged once per worker)"
                );
            }
        }
        checked.tokens
    }

    /// Prices the request, counts it, settles its budgets and writes its row.
    fn charge(&self, mut usage: Usage, tokens: TokenCounts, end: EndReport) {
        let row = &mut usage.row;
        let cost = usage
            .prices
            .cost(&usage.served_model, &row.model, &usage.tier, tokens);
        let m = &self.metrics;
        let series = m.tenant_model(&self.tenant, &row.model);
        series.prompt_tokens.inc_by(tokens.prompt);
        series.completion_tokens.inc_by(tokens.completion);
        series.cost.inc_by(cost.nano_usd);
        series.model_prompt_tokens.inc_by(tokens.prompt);
        series.model_cached_tokens.inc_by(tokens.cached);
        series.model_completion_tokens.inc_by(tokens.completion);
        if !cost.priced {
            series
                .unpriced
                .get_or_init(|| m.unpriced.with_label_values(&[row.model.as_str()]))
                .inc();
        }
        let now = crate::utc::now_ms();
        usage.budgets.settle(
            &self.tenant,
            &usage.budget_periods,
            usage.budget_estimate,
            cost.nano_usd,
            now,
        );
        if let Some(ledger) = &usage.ledger {
            row.end_ms = now;
            row.status = end.status;
            row.reason = if end.client_gone {
                "client_gone".into()
            } else if !end.completed {
                "upstream_failed".into()
            } else if !(200..300).contains(&end.status) {
                "upstream_status".into()
            } else {
                String::new()
            };
            row.worker = end.worker;
            row.prompt_tokens = tokens.prompt;
            row.cached_tokens = tokens.cached;
            row.completion_tokens = tokens.completion;
            row.cost_nanousd = cost.nano_usd;
            row.price_version = cost.price_version;
            row.ttft_ms = end.ttft.map(|d| d.as_millis() as u64);
            row.total_ms = self.started.elapsed().as_millis() as u64;
            ledger.record(std::mem::take(row));
        }
    }

    fn close(&mut self, actual: u64) {
        if self.settled {
            return;
        }
        self.settled = true;
        match self.shared.take() {
            Some((shared, limits, held)) => {
                shared.settle(&self.tenant, &limits, held, (self.reserved, actual));
            }
            None if self.unrated => {}
            None => self
                .limiter
                .reconcile(&self.tenant, self.reserved, actual, Instant::now()),
        }
        // No answer came back: the budget reservation is released, nothing was spent.
        if let Some(u) = self.usage.take() {
            u.budgets.settle(
                &self.tenant,
                &u.budget_periods,
                u.budget_estimate,
                0,
                crate::utc::now_ms(),
            );
        }
        self.slot = None;
        self.body = None;
        self.permit = None;
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        // No answer came back (routing or upstream failure): nothing was spent upstream.
        self.close(0);
    }
}
