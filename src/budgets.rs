//! Tenant spending budgets: USD per UTC day or month, hard (refuse with 429 until the reset) or
//! soft (flag only). A request is checked at admission against what the tenant has spent plus
//! the estimates of its requests still in flight; the request admitted below the limit completes
//! even when its own cost crosses it, and the next one is refused. Pure bookkeeping on a clock
//! passed in; the gateway seeds it from the usage ledger at start.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::pricing::format_usd_cents;
use crate::utc;

/// How often a budget resets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    /// Each UTC day.
    Day,
    /// Each UTC calendar month.
    Month,
}

impl Period {
    /// `day` or `month`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Month => "month",
        }
    }

    /// Start of the period holding `ms`.
    pub fn start(self, ms: i64) -> i64 {
        match self {
            Self::Day => utc::day_start(ms),
            Self::Month => utc::month_start(ms),
        }
    }

    /// End (the next reset) of the period holding `ms`.
    pub fn end(self, ms: i64) -> i64 {
        match self {
            Self::Day => utc::day_start(ms) + utc::DAY_MS,
            Self::Month => utc::next_month_start(ms),
        }
    }
}

/// One budget of a tenant or tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetSpec {
    /// Reset period.
    pub period: Period,
    /// Limit in nano-USD.
    pub limit_nano: u64,
    /// Hard budgets refuse once reached; soft ones only flag.
    pub hard: bool,
}

impl BudgetSpec {
    /// `hard` or `soft`.
    pub fn kind(&self) -> &'static str {
        if self.hard { "hard" } else { "soft" }
    }
}

/// A hard budget that has been reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetRefusal {
    /// The budget.
    pub spec: BudgetSpec,
    /// Spend so far in the period (settled plus in flight), nano-USD.
    pub spent_nano: u64,
    /// When the period resets, Unix ms.
    pub reset_ms: i64,
    /// Milliseconds until the reset.
    pub retry_after_ms: i64,
}

impl BudgetRefusal {
    /// The client's message: the budget, the spend and the reset time.
    pub fn message(&self, tenant: &str) -> String {
        format!(
            "tenant `{tenant}` has reached its {} budget of {} (spent {}); it resets at {}",
            self.spec.period.as_str(),
            format_usd_cents(self.spec.limit_nano),
            format_usd_cents(self.spent_nano),
            utc::iso_time(self.reset_ms)
        )
    }
}

/// What a check found: soft budgets already reached (the request goes ahead).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetCheck {
    /// Soft budgets at or over their limit.
    pub soft_over: Vec<BudgetSpec>,
    /// Of those, the ones found over for the first time this period (to log once).
    pub soft_first: Vec<(BudgetSpec, u64)>,
}

/// One budget's state, for `/admin/budgets` and the dashboard.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BudgetStatus {
    /// Tenant.
    pub tenant: String,
    /// `day` or `month`.
    pub period: &'static str,
    /// `hard` or `soft`.
    pub kind: &'static str,
    /// Limit, nano-USD.
    pub limit_nanousd: u64,
    /// Settled spend in the period, nano-USD.
    pub spent_nanousd: u64,
    /// Estimates of requests in flight, nano-USD.
    pub in_flight_nanousd: u64,
    /// Limit minus spend (0 when over).
    pub remaining_nanousd: u64,
    /// Start of the period, ISO time.
    pub period_start: String,
    /// Next reset, ISO time.
    pub resets_at: String,
    /// When spend reaches the limit at the period's average rate so far; `None` when it will not
    /// before the reset (or nothing was spent).
    pub projected_exhaustion: Option<String>,
    /// Whether the limit is reached.
    pub reached: bool,
}

/// Spend of one tenant in one period instance.
#[derive(Debug, Clone, Copy, Default)]
struct Spend {
    period_start: i64,
    settled: u64,
    in_flight: u64,
    /// A soft budget over its limit was reported this period.
    soft_reported: bool,
    /// Settled here but not yet added to the fleet's shared total (fleet mode).
    unshared: u64,
    /// Seeded from the ledger and not yet offered to the shared store.
    seeded: bool,
}

impl Spend {
    /// Rolls over to the period holding `now` (settled spend starts again at 0).
    fn at(&mut self, period: Period, now: i64) -> &mut Self {
        let start = period.start(now);
        if start != self.period_start {
            self.period_start = start;
            self.settled = 0;
            self.soft_reported = false;
            self.unshared = 0;
            self.seeded = false;
        }
        self
    }
}

/// Per tenant: spend per period. Cheap to check (one lock, a map probe).
#[derive(Debug, Default)]
pub struct BudgetBook {
    spend: Mutex<HashMap<(String, Period), Spend>>,
}

impl BudgetBook {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the settled spend of `tenant` in the period holding `now` (from the ledger at start).
    pub fn seed(&self, tenant: &str, period: Period, spent_nano: u64, now: i64) {
        if let Ok(mut map) = self.spend.lock() {
            let s = map.entry((tenant.to_string(), period)).or_default();
            let s = s.at(period, now);
            s.settled = spent_nano;
            s.seeded = true;
        }
    }

    /// Fleet mode, step 1: every (tenant, period) this replica tracks, with the spend settled
    /// here since the last exchange (taken) and its ledger seed the first time (offered only
    /// if the shared store has no total yet).
    pub fn take_unshared(&self, now: i64) -> Vec<SharedSpend> {
        let Ok(mut map) = self.spend.lock() else {
            return Vec::new();
        };
        map.iter_mut()
            .map(|((tenant, period), s)| {
                let s = s.at(*period, now);
                let out = SharedSpend {
                    tenant: tenant.clone(),
                    period: *period,
                    period_start: s.period_start,
                    delta: s.unshared,
                    // The seed is what the ledger said, without what settled here since.
                    seed: s.seeded.then_some(s.settled.saturating_sub(s.unshared)),
                };
                s.unshared = 0;
                s.seeded = false;
                out
            })
            .collect()
    }

    /// Fleet mode, step 2: the fleet's total after adding this replica's `delta`; what settled
    /// here meanwhile stays on top of it.
    pub fn apply_shared(&self, spend: &SharedSpend, total: u64, now: i64) {
        if let Ok(mut map) = self.spend.lock()
            && let Some(s) = map.get_mut(&(spend.tenant.clone(), spend.period))
        {
            let s = s.at(spend.period, now);
            if s.period_start == spend.period_start {
                s.settled = total.saturating_add(s.unshared);
            }
        }
    }

    /// Fleet mode, when the exchange failed: the taken delta is kept for the next one.
    pub fn restore_unshared(&self, spend: &SharedSpend, now: i64) {
        if let Ok(mut map) = self.spend.lock()
            && let Some(s) = map.get_mut(&(spend.tenant.clone(), spend.period))
        {
            let s = s.at(spend.period, now);
            if s.period_start == spend.period_start {
                s.unshared = s.unshared.saturating_add(spend.delta);
                s.seeded |= spend.seed.is_some();
            }
        }
    }

    /// Checks `budgets` of `tenant` at `now`; when none refuses, `estimate` is reserved against
    /// each period until [`settle`](Self::settle).
    pub fn admit(
        &self,
        tenant: &str,
        budgets: &[BudgetSpec],
        estimate: u64,
        now: i64,
    ) -> Result<BudgetCheck, BudgetRefusal> {
        let mut check = BudgetCheck::default();
        if budgets.is_empty() {
            return Ok(check);
        }
        let Ok(mut map) = self.spend.lock() else {
            return Ok(check);
        };
        // Hard budgets first: of those reached, the one that resets last decides Retry-After
        // (a day budget's midnight would only be refused again under a reached month budget).
        let mut refusal: Option<BudgetRefusal> = None;
        for b in budgets.iter().filter(|b| b.hard) {
            let s = map.entry((tenant.to_string(), b.period)).or_default();
            let s = s.at(b.period, now);
            let spent = s.settled.saturating_add(s.in_flight);
            let reset_ms = b.period.end(now);
            if spent >= b.limit_nano && refusal.as_ref().is_none_or(|r| reset_ms > r.reset_ms) {
                refusal = Some(BudgetRefusal {
                    spec: *b,
                    spent_nano: spent,
                    reset_ms,
                    retry_after_ms: reset_ms - now,
                });
            }
        }
        if let Some(r) = refusal {
            return Err(r);
        }
        for b in budgets.iter().filter(|b| !b.hard) {
            let s = map.entry((tenant.to_string(), b.period)).or_default();
            let s = s.at(b.period, now);
            let spent = s.settled.saturating_add(s.in_flight);
            if spent >= b.limit_nano {
                check.soft_over.push(*b);
                if !s.soft_reported {
                    s.soft_reported = true;
                    check.soft_first.push((*b, spent));
                }
            }
        }
        for period in periods(budgets) {
            if let Some(s) = map.get_mut(&(tenant.to_string(), period)) {
                s.in_flight = s.in_flight.saturating_add(estimate);
            }
        }
        Ok(check)
    }

    /// Replaces a reserved `estimate` by the `actual` cost, counted in the period holding `now`.
    /// `periods` are those [`admit`](Self::admit) reserved in.
    pub fn settle(&self, tenant: &str, periods: &[Period], estimate: u64, actual: u64, now: i64) {
        if periods.is_empty() {
            return;
        }
        let Ok(mut map) = self.spend.lock() else {
            return;
        };
        for &period in periods {
            let s = map.entry((tenant.to_string(), period)).or_default();
            s.in_flight = s.in_flight.saturating_sub(estimate);
            let s = s.at(period, now);
            s.settled = s.settled.saturating_add(actual);
            s.unshared = s.unshared.saturating_add(actual);
        }
    }

    /// The state of each of `budgets` of `tenant` at `now`.
    pub fn status(&self, tenant: &str, budgets: &[BudgetSpec], now: i64) -> Vec<BudgetStatus> {
        let Ok(mut map) = self.spend.lock() else {
            return Vec::new();
        };
        budgets
            .iter()
            .map(|b| {
                let s = *map
                    .entry((tenant.to_string(), b.period))
                    .or_default()
                    .at(b.period, now);
                let (start, end) = (b.period.start(now), b.period.end(now));
                let used = s.settled.saturating_add(s.in_flight);
                BudgetStatus {
                    tenant: tenant.to_string(),
                    period: b.period.as_str(),
                    kind: b.kind(),
                    limit_nanousd: b.limit_nano,
                    spent_nanousd: s.settled,
                    in_flight_nanousd: s.in_flight,
                    remaining_nanousd: b.limit_nano.saturating_sub(used),
                    period_start: utc::iso_time(start),
                    resets_at: utc::iso_time(end),
                    projected_exhaustion: projected(start, now, end, s.settled, b.limit_nano)
                        .map(utc::iso_time),
                    reached: used >= b.limit_nano,
                }
            })
            .collect()
    }
}

/// One tenant's spend in one period, as exchanged with the fleet's shared store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedSpend {
    /// Tenant.
    pub tenant: String,
    /// Period.
    pub period: Period,
    /// Start of the period instance, Unix ms (part of the shared key).
    pub period_start: i64,
    /// Nano-USD settled here since the last exchange.
    pub delta: u64,
    /// This replica's ledger seed, offered once (the store keeps the first one it gets).
    pub seed: Option<u64>,
}

/// The distinct periods of `budgets`.
pub fn periods(budgets: &[BudgetSpec]) -> Vec<Period> {
    // No capacity up front: most tenants have no budget, and an empty Vec allocates nothing.
    let mut out: Vec<Period> = Vec::new();
    for b in budgets {
        if !out.contains(&b.period) {
            out.push(b.period);
        }
    }
    out
}

/// When `spent` over `[start, now)` reaches `limit` at the same average rate; `None` when that
/// falls after `end` or nothing was spent. Already reached: `now`.
pub fn projected(start: i64, now: i64, end: i64, spent: u64, limit: u64) -> Option<i64> {
    if spent >= limit {
        return Some(now);
    }
    let elapsed = now - start;
    if spent == 0 || elapsed <= 0 {
        return None;
    }
    let at = start as i128 + (elapsed as i128 * limit as i128) / spent as i128;
    (at <= end as i128).then_some(at as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: BudgetSpec = BudgetSpec {
        period: Period::Day,
        limit_nano: 1_000,
        hard: true,
    };
    const MONTH_SOFT: BudgetSpec = BudgetSpec {
        period: Period::Month,
        limit_nano: 1_500,
        hard: false,
    };

    fn t(text: &str) -> i64 {
        utc::parse_time(text).unwrap_or_default()
    }

    #[test]
    fn the_request_that_crosses_completes_and_the_next_is_refused() {
        let book = BudgetBook::new();
        let now = t("2026-12-01T10:00:00Z");
        let budgets = [DAY];
        assert!(book.admit("a", &budgets, 400, now).is_ok());
        book.settle("a", &[Period::Day], 400, 900, now);
        // 900 spent < 1,000: admitted, though its estimate would cross.
        assert!(book.admit("a", &budgets, 400, now).is_ok());
        book.settle("a", &[Period::Day], 400, 300, now);
        let refused = book.admit("a", &budgets, 1, now).err();
        let r = refused.as_ref().map(|r| (r.spent_nano, r.reset_ms));
        assert_eq!(r, Some((1_200, t("2026-12-02"))));
        assert_eq!(
            refused.map(|r| r.retry_after_ms),
            Some(14 * 3_600_000),
            "Retry-After is the time to the UTC midnight"
        );
        // Another tenant is untouched; the next day starts at zero.
        assert!(book.admit("b", &budgets, 1, now).is_ok());
        assert!(
            book.admit("a", &budgets, 1, t("2026-12-02T00:00:01Z"))
                .is_ok()
        );
    }

    #[test]
    fn of_two_reached_hard_budgets_the_later_reset_is_the_retry_after() {
        let book = BudgetBook::new();
        let now = t("2026-12-10T10:00:00Z");
        let month = BudgetSpec {
            period: Period::Month,
            limit_nano: 500,
            hard: true,
        };
        book.seed("a", Period::Day, 5_000, now);
        book.seed("a", Period::Month, 5_000, now);
        let r = book.admit("a", &[DAY, month], 1, now).err();
        assert_eq!(r.map(|r| r.reset_ms), Some(t("2027-01-01")));
    }

    #[test]
    fn shared_totals_replace_local_spend_and_keep_what_settled_meanwhile() {
        let book = BudgetBook::new();
        let now = t("2026-12-01T10:00:00Z");
        book.seed("a", Period::Day, 100, now);
        assert!(book.admit("a", &[DAY], 10, now).is_ok());
        book.settle("a", &[Period::Day], 10, 40, now);
        let taken = book.take_unshared(now);
        assert_eq!(taken.len(), 1);
        assert_eq!((taken[0].delta, taken[0].seed), (40, Some(100)));
        // While the exchange runs, 5 more settle here.
        assert!(book.admit("a", &[DAY], 1, now).is_ok());
        book.settle("a", &[Period::Day], 1, 5, now);
        // The fleet total (other replicas included) is 900.
        book.apply_shared(&taken[0], 900, now);
        assert_eq!(book.status("a", &[DAY], now)[0].spent_nanousd, 905);
        let again = book.take_unshared(now);
        assert_eq!((again[0].delta, again[0].seed), (5, None));
        // A failed exchange keeps the delta for the next one.
        book.restore_unshared(&again[0], now);
        assert_eq!(book.take_unshared(now)[0].delta, 5);
    }

    #[test]
    fn requests_in_flight_count_against_the_budget() {
        let book = BudgetBook::new();
        let now = t("2026-12-01T10:00:00Z");
        assert!(book.admit("a", &[DAY], 600, now).is_ok());
        assert!(book.admit("a", &[DAY], 600, now).is_ok());
        // 1,200 in flight ≥ 1,000: a third is refused before either finishes.
        assert!(book.admit("a", &[DAY], 600, now).is_err());
        // Both end up costing little: room again.
        book.settle("a", &[Period::Day], 600, 10, now);
        book.settle("a", &[Period::Day], 600, 10, now);
        assert!(book.admit("a", &[DAY], 600, now).is_ok());
    }

    #[test]
    fn soft_budgets_flag_and_admit() {
        let book = BudgetBook::new();
        let now = t("2026-12-15T00:00:00Z");
        book.seed("a", Period::Month, 2_000, now);
        let check = book.admit("a", &[MONTH_SOFT], 5, now);
        assert_eq!(
            check.map(|c| (c.soft_over, c.soft_first)),
            Ok((vec![MONTH_SOFT], vec![(MONTH_SOFT, 2_000)]))
        );
        // Reported once a period.
        let again = book.admit("a", &[MONTH_SOFT], 5, now);
        assert_eq!(again.map(|c| c.soft_first.len()), Ok(0));
        let status = book.status("a", &[MONTH_SOFT], now);
        assert_eq!(status.len(), 1);
        assert!(status[0].reached);
        assert_eq!(status[0].resets_at, "2027-01-01T00:00:00Z");
        // A new month resets the spend.
        let next = book.status("a", &[MONTH_SOFT], t("2027-01-01T00:00:00Z"));
        assert_eq!(next[0].spent_nanousd, 0);
    }

    #[test]
    fn exhaustion_is_projected_from_the_average_rate() {
        let (start, end) = (0, 100);
        // Half the limit in a fifth of the period: exhausted at 40.
        assert_eq!(projected(start, 20, end, 50, 100), Some(40));
        // A tenth in half the period: not before the reset.
        assert_eq!(projected(start, 50, end, 10, 100), None);
        assert_eq!(projected(start, 50, end, 0, 100), None);
        assert_eq!(projected(start, 50, end, 100, 100), Some(50));
    }
}
