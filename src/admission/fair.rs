//! Token-weighted fair share among a queue's tenants: the Virtual Token Counter ("Fairness in
//! Serving Large Language Models", OSDI 2024). Each tenant's counter is the weighted service it
//! has been given (input and output tokens, weighted); when a slot frees, the backlogged tenant
//! with the least counter goes next; a tenant that becomes backlogged starts at the least counter
//! of those already waiting, so idle time banks no credit. Priorities stay strict above it: only
//! the best priority present competes. Within a tenant, earliest deadline first, then arrival (a
//! request without a deadline sorts after every one with: it has the most slack). The deadline
//! only orders a tenant's own requests: it never moves a tenant's turn ahead of another's, so a
//! short deadline buys no share.
//!
//! Pure bookkeeping over the waitlist's keys; the [`super::waitlist::Waitlist`] owns the waiters.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::waitlist::Key;

/// Weights of the service a request is charged, per token, and the locality window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FairWeights {
    /// Per prompt token.
    pub input: f64,
    /// Per completion token (decode costs more per token than prefill; VTC's default is 2).
    pub output: f64,
    /// Weighted tokens a tenant may be ahead of the least served and still go first when the
    /// workers already hold its next request's prefix (0: strict least-counter order).
    pub locality_window: f64,
    /// Slots past the pool's capacity that a tenant holding less than its equal share may
    /// borrow instead of waiting for a heavier tenant's request to end (0: none).
    pub borrow_slots: usize,
}

/// Default [`FairWeights::locality_window`]: about one request's service (a 1k-token prompt
/// and a 512-token answer at weights 1 and 2). VTC already lets backlogged counters drift apart
/// by up to twice the largest request's service; a window of one typical request at most
/// loosens that bound by the same order, and is enough for the tenants that take turns to
/// hand a warm worker its cached prefix instead of a cold one.
pub const DEFAULT_LOCALITY_WINDOW: f64 = 2048.0;

impl Default for FairWeights {
    fn default() -> Self {
        Self {
            input: 1.0,
            output: 2.0,
            locality_window: DEFAULT_LOCALITY_WINDOW,
            borrow_slots: 0,
        }
    }
}

impl FairWeights {
    /// The service of `input` prompt and `output` completion tokens.
    pub fn cost(&self, input: u64, output: u64) -> f64 {
        self.input * input as f64 + self.output * output as f64
    }
}

/// One tenant's waiters at one priority, as (due, arrival sequence): earliest due first.
type Lane = BTreeSet<(u64, u64)>;

/// Idle tenants' counters kept at most: past it, those not ahead of the queue's virtual time go
/// (a return would lift them to it anyway), then, if still too many, every idle one (a return
/// starts at the virtual time, gaining at most the lead it had): bounded memory.
const KEEP_IDLE: usize = 256;

/// The counters and, per priority, each tenant's waiting arrivals.
#[derive(Debug, Default)]
pub struct FairShare {
    /// Weighted service given per tenant.
    counters: HashMap<Arc<str>, f64>,
    /// Priority (best first) → tenant → its waiters in the order they go.
    lanes: BTreeMap<Reverse<u32>, HashMap<Arc<str>, Lane>>,
    /// Waiters per tenant, over all priorities: a tenant is backlogged while it has one.
    backlog: HashMap<Arc<str>, usize>,
    /// The least counter among backlogged tenants, as of the last change (never goes back).
    vtime: f64,
    /// Slots each tenant holds now (tenants holding none are not kept): who may borrow.
    held: HashMap<Arc<str>, usize>,
}

impl FairShare {
    /// A waiter of `tenant` joined under `key`, due by `due` (the caller's clock; `u64::MAX`:
    /// no deadline). A tenant that was not backlogged is lifted to the least counter of those
    /// waiting (to the virtual time when nobody waits).
    pub fn joined(&mut self, key: Key, tenant: &Arc<str>, due: u64) {
        if !self.backlog.contains_key(tenant) {
            let lift = self.least_backlogged().unwrap_or(self.vtime);
            let counter = self.counters.entry(Arc::clone(tenant)).or_insert(0.0);
            *counter = counter.max(lift);
        }
        *self.backlog.entry(Arc::clone(tenant)).or_insert(0) += 1;
        let lane = self.lanes.entry(key.0).or_default();
        lane.entry(Arc::clone(tenant))
            .or_default()
            .insert((due, key.1));
    }

    /// The waiter of `tenant` under `key`, due by `due`, left (served, refused, expired, gone).
    pub fn left(&mut self, key: Key, tenant: &str, due: u64) {
        if let Some(lane) = self.lanes.get_mut(&key.0) {
            if let Some(seqs) = lane.get_mut(tenant) {
                seqs.remove(&(due, key.1));
                if seqs.is_empty() {
                    lane.remove(tenant);
                }
            }
            if lane.is_empty() {
                self.lanes.remove(&key.0);
            }
        }
        if let Some(waiting) = self.backlog.get_mut(tenant) {
            *waiting = waiting.saturating_sub(1);
            if *waiting == 0 {
                self.backlog.remove(tenant);
            }
        }
        self.advance();
    }

    /// The key that goes next: at the best priority present, the first waiter (earliest due,
    /// then earliest arrival) of the tenant with the least counter (ties: the earlier arrival).
    pub fn next(&self) -> Option<Key> {
        let (priority, lane) = self.lanes.iter().next()?;
        lane.iter()
            .filter_map(|(tenant, seqs)| Some((self.counter(tenant), seqs.first()?.1)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, seq)| (*priority, seq))
    }

    /// Each tenant's next key at the best priority present, for the tenants whose counter is
    /// within `window` of the least there: least counter first (ties: the earlier arrival).
    /// The first is [`next`](Self::next); the others may go before it for locality.
    pub fn near(&self, window: f64) -> Vec<Key> {
        let Some((priority, lane)) = self.lanes.iter().next() else {
            return Vec::new();
        };
        let mut heads: Vec<(f64, u64)> = lane
            .iter()
            .filter_map(|(tenant, seqs)| Some((self.counter(tenant), seqs.first()?.1)))
            .collect();
        heads.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let least = heads.first().map_or(0.0, |h| h.0);
        heads
            .into_iter()
            .take_while(|h| h.0 <= least + window.max(0.0))
            .map(|(_, seq)| (*priority, seq))
            .collect()
    }

    /// Adds `service` (possibly negative: a correction once the real usage is known) to
    /// `tenant`'s counter.
    pub fn charge(&mut self, tenant: &str, service: f64) {
        if !service.is_finite() {
            return;
        }
        let counter = match self.counters.get_mut(tenant) {
            Some(counter) => {
                *counter = (*counter + service).max(0.0);
                *counter
            }
            None => {
                self.counters.insert(Arc::from(tenant), service.max(0.0));
                service.max(0.0)
            }
        };
        if self.backlog.is_empty() {
            // Served with nobody waiting: whoever comes next starts level with it.
            self.vtime = self.vtime.max(counter);
        }
        self.advance();
        self.forget_idle();
    }

    /// `tenant`'s counter (0 for one never served).
    pub fn counter(&self, tenant: &str) -> f64 {
        self.counters.get(tenant).copied().unwrap_or(0.0)
    }

    /// Waiters served before `key` (a waiter of `tenant` due by `due`) if the counters stay
    /// level: those of better priority, the tenant's own ahead of it (earlier due, or as due and
    /// earlier), and from every other tenant at its priority as many as it has ahead plus one.
    /// What `Retry-After` and the deadline check are computed from.
    pub fn position(&self, key: Key, tenant: &str, due: u64) -> usize {
        let better: usize = self
            .lanes
            .range(..key.0)
            .flat_map(|(_, lane)| lane.values())
            .map(BTreeSet::len)
            .sum();
        let Some(lane) = self.lanes.get(&key.0) else {
            return better;
        };
        let own = lane
            .get(tenant)
            .map_or(0, |seqs| seqs.range(..(due, key.1)).count());
        let others: usize = lane
            .iter()
            .filter(|(t, _)| t.as_ref() != tenant)
            .map(|(_, seqs)| seqs.len().min(own + 1))
            .sum();
        better + own + others
    }

    /// The waiter a full queue refuses to make room for a waiter of `tenant` at `priority`:
    /// at the worst priority present, the last to go (latest due) of the tenant with the most waiters
    /// there (ties: the larger counter). `None` when that waiter is better than the newcomer:
    /// a better priority, or a tenant no more backlogged there than the newcomer's plus one.
    pub fn victim(&self, priority: u32, tenant: &str) -> Option<Key> {
        let (worst, lane) = self.lanes.iter().next_back()?;
        let (heavy, seqs) = lane.iter().max_by(|a, b| {
            a.1.len()
                .cmp(&b.1.len())
                .then(self.counter(a.0).total_cmp(&self.counter(b.0)))
        })?;
        let key = (*worst, seqs.last()?.1);
        if worst.0 < priority {
            return Some(key);
        }
        let newcomer = lane.get(tenant).map_or(0, BTreeSet::len);
        (worst.0 == priority && heavy.as_ref() != tenant && seqs.len() > newcomer + 1)
            .then_some(key)
    }

    /// `tenant` took a slot (at once or from the queue).
    pub fn took_slot(&mut self, tenant: &str) {
        match self.held.get_mut(tenant) {
            Some(n) => *n += 1,
            None => {
                self.held.insert(Arc::from(tenant), 1);
            }
        }
    }

    /// `tenant` gave a slot back.
    pub fn gave_slot(&mut self, tenant: &str) {
        if let Some(n) = self.held.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.held.remove(tenant);
            }
        }
    }

    /// Whether `tenant` holds fewer than its equal share of `capacity` slots, shared among the
    /// tenants that hold slots or wait (itself counted): such a tenant may borrow a slot past
    /// the capacity rather than wait behind a heavier one's requests in flight.
    pub fn under_share(&self, tenant: &str, capacity: usize) -> bool {
        let waiting_only = self
            .backlog
            .keys()
            .filter(|t| !self.held.contains_key(*t))
            .count();
        let known = self.held.contains_key(tenant) || self.backlog.contains_key(tenant);
        let active = self.held.len() + waiting_only + usize::from(!known);
        let held = self.held.get(tenant).copied().unwrap_or(0);
        held.saturating_mul(active) < capacity
    }

    /// The key that may borrow a slot past `capacity`: at the best priority present, the first
    /// waiter of the least served tenant [under its share](Self::under_share).
    pub fn next_under_share(&self, capacity: usize) -> Option<Key> {
        let (priority, lane) = self.lanes.iter().next()?;
        lane.iter()
            .filter(|(tenant, _)| self.under_share(tenant, capacity))
            .filter_map(|(tenant, seqs)| Some((self.counter(tenant), seqs.first()?.1)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, seq)| (*priority, seq))
    }

    /// Backlogged tenants.
    pub fn backlogged(&self) -> usize {
        self.backlog.len()
    }

    /// Each backlogged tenant with its counter and waiters, least counter first (for status).
    pub fn backlog(&self) -> Vec<(Arc<str>, f64, usize)> {
        let mut all: Vec<_> = self
            .backlog
            .iter()
            .map(|(tenant, &waiting)| (Arc::clone(tenant), self.counter(tenant), waiting))
            .collect();
        all.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        all
    }

    /// The least counter among backlogged tenants.
    fn least_backlogged(&self) -> Option<f64> {
        self.backlog
            .keys()
            .map(|t| self.counter(t))
            .min_by(f64::total_cmp)
    }

    /// Moves the virtual time up to the least backlogged counter.
    fn advance(&mut self) {
        if let Some(least) = self.least_backlogged() {
            self.vtime = self.vtime.max(least);
        }
    }

    /// Forgets idle tenants' counters that a return would lift to the virtual time anyway.
    fn forget_idle(&mut self) {
        if self.counters.len() <= self.backlog.len() + KEEP_IDLE {
            return;
        }
        let (vtime, backlog) = (self.vtime, &self.backlog);
        self.counters
            .retain(|tenant, counter| backlog.contains_key(tenant) || *counter > vtime);
        if self.counters.len() > self.backlog.len() + KEEP_IDLE {
            let backlog = &self.backlog;
            self.counters
                .retain(|tenant, _| backlog.contains_key(tenant));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    fn key(priority: u32, seq: u64) -> Key {
        (Reverse(priority), seq)
    }

    /// No deadline.
    const NO: u64 = u64::MAX;

    #[test]
    fn within_a_tenant_earliest_deadline_first_then_arrival() {
        let mut f = FairShare::default();
        let a = t("a");
        f.joined(key(0, 0), &a, NO);
        f.joined(key(0, 1), &a, 500);
        f.joined(key(0, 2), &a, 200);
        f.joined(key(0, 3), &a, 500);
        assert_eq!(f.position(key(0, 2), "a", 200), 0, "earliest due first");
        assert_eq!(
            f.position(key(0, 0), "a", NO),
            3,
            "no deadline: most slack, last"
        );
        let mut order = Vec::new();
        while let Some(next) = f.next() {
            let due = [NO, 500, 200, 500][next.1 as usize];
            f.left(next, "a", due);
            order.push(next.1);
        }
        assert_eq!(order, [2, 1, 3, 0], "as due: arrival order");
        // A full list refuses the one with the most slack, not the latest arrival.
        f.joined(key(0, 4), &a, 100);
        f.joined(key(0, 5), &a, NO);
        f.joined(key(0, 6), &a, 300);
        assert_eq!(f.victim(0, "b"), Some(key(0, 5)));
    }

    #[test]
    fn near_lists_the_tenants_within_the_window_least_served_first() {
        let mut f = FairShare::default();
        let (a, b, c) = (t("a"), t("b"), t("c"));
        f.joined(key(0, 0), &a, NO);
        f.joined(key(0, 1), &b, NO);
        f.joined(key(0, 2), &c, NO);
        f.joined(key(0, 3), &c, 5);
        f.charge("a", 100.0);
        f.charge("c", 50.0);
        assert_eq!(f.near(0.0), [key(0, 1)], "strict: the least only");
        assert_eq!(f.near(60.0), [key(0, 1), key(0, 3)], "c's most urgent");
        assert_eq!(f.near(1e9), [key(0, 1), key(0, 3), key(0, 0)]);
        f.joined(key(7, 4), &a, NO);
        assert_eq!(f.near(1e9), [key(7, 4)], "only the best priority");
    }

    #[test]
    fn a_short_deadline_does_not_take_another_tenants_turn() {
        let mut f = FairShare::default();
        let (a, b) = (t("a"), t("b"));
        f.joined(key(0, 0), &b, NO);
        f.charge("a", 100.0);
        f.joined(key(0, 1), &a, 1);
        // b has the least counter: its waiter goes, however urgent a's is.
        assert_eq!(f.next(), Some(key(0, 0)));
    }

    #[test]
    fn the_least_served_backlogged_tenant_goes_next() {
        let mut f = FairShare::default();
        let (a, b) = (t("a"), t("b"));
        for seq in 0..4 {
            f.joined(key(0, seq), &a, NO);
        }
        f.joined(key(0, 4), &b, NO);
        // Both start level: the earlier waiter (a's) goes first.
        assert_eq!(f.next(), Some(key(0, 0)));
        f.left(key(0, 0), "a", NO);
        f.charge("a", 100.0);
        // a has 100, b 0: b's waiter goes before a's earlier ones.
        assert_eq!(f.next(), Some(key(0, 4)));
        f.left(key(0, 4), "b", NO);
        f.charge("b", 10.0);
        assert_eq!(f.next(), Some(key(0, 1)));
    }

    #[test]
    fn a_returning_tenant_starts_at_the_virtual_time_not_with_banked_credit() {
        let mut f = FairShare::default();
        let (a, b) = (t("a"), t("b"));
        for seq in 0..3 {
            f.joined(key(0, seq), &a, NO);
            f.left(key(0, seq), "a", NO);
            f.charge("a", 1000.0);
        }
        f.joined(key(0, 10), &a, NO);
        // b was idle while a was served alone: it starts at a's level, not at 0.
        f.joined(key(0, 11), &b, NO);
        assert_eq!(f.counter("b"), f.counter("a"));
        assert_eq!(f.next(), Some(key(0, 10)), "level counters: arrival order");
    }

    #[test]
    fn a_better_priority_goes_first_whatever_its_counter() {
        let mut f = FairShare::default();
        let (a, b) = (t("a"), t("b"));
        f.joined(key(0, 0), &a, NO);
        f.joined(key(5, 1), &b, NO);
        f.charge("b", 1e9);
        assert_eq!(f.next(), Some(key(5, 1)));
        assert_eq!(f.position(key(0, 0), "a", NO), 1);
    }

    #[test]
    fn position_counts_other_tenants_turns_interleaved() {
        let mut f = FairShare::default();
        let (a, b, c) = (t("a"), t("b"), t("c"));
        for seq in 0..10 {
            f.joined(key(0, seq), &a, NO);
        }
        f.joined(key(0, 10), &b, NO);
        f.joined(key(0, 11), &c, NO);
        f.joined(key(0, 12), &c, NO);
        // b's only waiter: one of a's and one of c's may go before it.
        assert_eq!(f.position(key(0, 10), "b", NO), 2);
        // a's 5th: 4 of its own, 1 of b's, 2 of c's.
        assert_eq!(f.position(key(0, 4), "a", NO), 4 + 1 + 2);
    }

    #[test]
    fn a_full_queue_makes_room_from_the_heaviest_tenant_only_for_a_lighter_one() {
        let mut f = FairShare::default();
        let (a, b) = (t("a"), t("b"));
        for seq in 0..5 {
            f.joined(key(0, seq), &a, NO);
        }
        f.joined(key(0, 5), &b, NO);
        assert_eq!(f.victim(0, "b"), Some(key(0, 4)), "a's latest goes for b");
        assert_eq!(f.victim(0, "a"), None, "a does not push out its own or b's");
        assert_eq!(f.victim(0, "c"), Some(key(0, 4)));
        assert_eq!(
            f.victim(1, "a"),
            Some(key(0, 4)),
            "a better priority always may"
        );
    }

    #[test]
    fn idle_counters_are_forgotten_past_a_bound() {
        let mut f = FairShare::default();
        let busy = t("busy");
        f.joined(key(0, 0), &busy, NO);
        f.charge("busy", 10.0);
        for i in 0..(KEEP_IDLE as u64 + 50) {
            let name = format!("t{i}");
            f.joined(key(0, i + 1), &t(&name), NO);
            f.left(key(0, i + 1), &name, NO);
            f.charge(&name, 1.0);
        }
        assert!(f.counters.len() <= KEEP_IDLE + 2, "{}", f.counters.len());
        assert_eq!(
            f.counter("busy"),
            10.0,
            "a backlogged tenant keeps its counter"
        );
        assert_eq!(f.backlogged(), 1);
    }

    #[test]
    fn nonsense_charges_are_ignored_and_counters_stay_non_negative() {
        let mut f = FairShare::default();
        f.charge("a", f64::NAN);
        f.charge("a", f64::INFINITY);
        assert_eq!(f.counter("a"), 0.0);
        f.charge("a", 5.0);
        f.charge("a", -50.0);
        assert_eq!(f.counter("a"), 0.0);
    }
}
