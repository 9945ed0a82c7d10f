//! A request's reservation: its rate-limit reservation, budget reservation, concurrency slot,
//! body bytes and admission permit, settled exactly once by the request's exit (the account
//! phase, [`super::account`]): with the real usage when a worker's answer ends
//! (checked, priced and counted per tenant and model; the exit writes the usage row), or as a
//! full refund when the request dies before an answer (Drop).

use std::sync::Arc;
use std::time::Instant;

use crate::admission::Permit;
use crate::budgets::{BudgetBook, Period};
use crate::limits::{ConcurrencySlot, Limiter};
use crate::metrics::GatewayMetrics;
use crate::pipeline::forward::relay::body::EndReport;
use crate::pricing::{Prices, TokenCounts};
use crate::request_body::BodyHold;
use crate::usage_check::{self, UsageBounds, UsageCheckConfig};

/// What the account needs to price a request.
pub struct Usage {
    /// The prices of the snapshot the request started on.
    pub prices: Arc<Prices>,
    /// The tenant's tier (for its price multiplier).
    pub tier: String,
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

/// What a settled request was billed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Tokens billed.
    pub tokens: TokenCounts,
    /// Their cost, nano-USD.
    pub cost_nanousd: u64,
    /// Version of the prices it was priced at.
    pub price_version: u32,
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
    /// Where the rate reservation is held when fleet mode admitted it.
    shared: Option<(
        Arc<crate::limits::SharedLimiter>,
        crate::limits::TierLimits,
        crate::limits::Held,
    )>,
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
            usage: Some(usage),
            shared: None,
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

    /// Marks the reservation as made without rate limits: settling skips the limiter.
    pub fn unrated(&mut self) {
        self.unrated = true;
    }

    /// Attaches the admission permit, released when the account settles.
    pub fn hold(&mut self, permit: Permit) {
        self.permit = Some(permit);
    }

    /// Settles with what the response reported: the worker's usage when it sent one within
    /// what the request made possible (each field outside it replaced by the gateway's own
    /// count), else the prompt estimate plus one token per streamed content chunk (cached
    /// tokens then 0). `target` is the request's model, the model priced first (a canary
    /// version's) and its pool. Returns what was billed, for the usage row.
    pub fn settle(mut self, end: &EndReport, target: (&str, &str, &str)) -> Settled {
        let (model, served_model, pool) = target;
        let tokens = match end.usage {
            Some(u) => self.checked(u, end, pool),
            // An error answer without usage (a worker's 4xx/5xx) did no billable work.
            None if !(200..300).contains(&end.status) => TokenCounts::default(),
            None => TokenCounts {
                prompt: self.prompt_estimate,
                cached: 0,
                completion: end.content_events,
            },
        };
        let settled = match self.usage.take() {
            Some(usage) => self.charge(usage, tokens, (model, served_model)),
            None => Settled {
                tokens,
                ..Settled::default()
            },
        };
        if let Some(permit) = self.permit.as_mut() {
            // Fair share: the tenant's turn is charged what was really served.
            permit.settle(tokens.prompt, tokens.completion);
        }
        self.close(tokens.prompt.saturating_add(tokens.completion));
        settled
    }

    /// The worker's usage `u` as checked against the request's bounds; a rejection is counted
    /// per pool and reason, and logged once per worker.
    fn checked(
        &self,
        u: crate::usage_check::TokenUsage,
        end: &EndReport,
        pool: &str,
    ) -> TokenCounts {
        let (bounds, cfg) = &self.bounds;
        let own_completion = (end.content_events > 0).then_some(end.content_events);
        let checked = usage_check::check(u, bounds, cfg, own_completion);
        for reason in checked.rejections() {
            self.metrics
                .usage_rejected
                .with_label_values(&[pool, reason.as_str()])
                .inc();
            if self.metrics.first_usage_lie(&end.worker) {
                tracing::warn!(
                    worker = %end.worker,
                    pool,
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

    /// Prices the request as `served_model` (else `model`), counts it per tenant and model,
    /// and settles its budgets.
    fn charge(
        &self,
        usage: Usage,
        tokens: TokenCounts,
        (model, served_model): (&str, &str),
    ) -> Settled {
        let cost = usage.prices.cost(served_model, model, &usage.tier, tokens);
        let m = &self.metrics;
        let series = m.tenant_model(&self.tenant, model);
        series.prompt_tokens.inc_by(tokens.prompt);
        series.completion_tokens.inc_by(tokens.completion);
        series.cost.inc_by(cost.nano_usd);
        series.model_prompt_tokens.inc_by(tokens.prompt);
        series.model_cached_tokens.inc_by(tokens.cached);
        series.model_completion_tokens.inc_by(tokens.completion);
        if !cost.priced {
            series
                .unpriced
                .get_or_init(|| m.unpriced.with_label_values(&[model]))
                .inc();
        }
        usage.budgets.settle(
            &self.tenant,
            &usage.budget_periods,
            usage.budget_estimate,
            cost.nano_usd,
            crate::utc::now_ms(),
        );
        Settled {
            tokens,
            cost_nanousd: cost.nano_usd,
            price_version: cost.price_version,
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
