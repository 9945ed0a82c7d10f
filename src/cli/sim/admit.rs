//! The simulated fleet's admission stage, the gateway's (`infergate::admission`) on virtual time: a
//! fixed number of slots (in-flight requests per worker × workers) handed out at once while free;
//! beyond them, requests wait in the gateway's own order ([`Waitlist`]: best priority first, then
//! arrival, up to `max_queue` of them) for at most `max_wait`; with fair share, by the gateway's
//! turns and locality window ([`Waitlist::pop_near`], asked about the routing policy's view).
//! Pure bookkeeping: the fleet's event loop owns time and routing.

use std::collections::BTreeMap;

use crate::workload::PlannedRequest;
use infergate::admission::FairWeights;
use infergate::admission::waitlist::{Key, Push, Ticket, Waitlist};

/// Where a waiter stands in the queue; also the key of its expiry.
pub(super) type QueueKey = Key;

/// A request that passed degradation and waits for (or is about to get) a slot.
#[derive(Debug)]
pub(super) struct Waiting {
    /// The planned request, its output length already capped by degradation.
    pub req: PlannedRequest,
    /// Prompt tokens as sent (template included).
    pub prompt_tokens: u64,
    /// Send time, seconds: the latency origin.
    pub arrival: f64,
}

/// What queueing a request did.
#[derive(Debug, Default)]
pub(super) struct Enqueued {
    /// The request's key, when it now waits.
    pub queued: Option<QueueKey>,
    /// The request refused (429) to keep the bound: the new one, or an evicted lower priority.
    pub refused: Option<Waiting>,
}

/// Slots and the priority queue of the whole fleet.
#[derive(Debug)]
pub(super) struct Admission {
    /// Requests in flight at once; 0 = no admission stage (everything is routed at once).
    capacity: usize,
    /// Longest wait before a 429, seconds.
    max_wait: f64,
    /// Tenant → priority; unlisted tenants (and requests without one) get 0.
    priorities: BTreeMap<String, u32>,
    waiters: Waitlist<Waiting>,
    /// Fair-share weights, when tenants take turns.
    fair: Option<FairWeights>,
    /// Slots past `capacity` lent to tenants under their equal share (fair share only).
    borrow: usize,
}

impl Admission {
    /// No admission stage: every request is routed on arrival.
    pub(super) fn off() -> Self {
        Self::new(0, 0, 0.0, BTreeMap::new())
    }

    /// `capacity` slots, at most `max_queue` waiters (0 = unbounded) for at most `max_wait` s.
    pub(super) fn new(
        capacity: usize,
        max_queue: usize,
        max_wait: f64,
        priorities: BTreeMap<String, u32>,
    ) -> Self {
        Self {
            capacity,
            max_wait,
            priorities,
            waiters: Waitlist::new((max_queue > 0).then_some(max_queue)),
            fair: None,
            borrow: 0,
        }
    }

    /// Tenants take turns by token-weighted fair share (`None`: first come), as the gateway's.
    pub(super) fn with_fair_share(mut self, fair: Option<FairWeights>) -> Self {
        if let Some(weights) = fair {
            self.waiters = Waitlist::fair(self.waiters.max_queue());
            self.fair = Some(weights);
            self.borrow = weights.borrow_slots;
        }
        self
    }

    /// The queue ticket of `w`: its tier's priority, its tenant and, with fair share, the
    /// weighted tokens it will be served (the workload's output length is its `max_tokens`).
    fn ticket<'a>(&self, w: &'a Waiting) -> Ticket<'a> {
        let tenant = w.req.tenant.as_deref();
        Ticket {
            priority: self.priority(tenant),
            tenant: tenant.unwrap_or(""),
            // Fair share's default weights under first come, which still measures fairness.
            cost: self
                .fair
                .unwrap_or_default()
                .cost(w.prompt_tokens, u64::from(w.req.output_tokens)),
            // Planned requests carry no deadline: a tenant's own go in arrival order.
            due: None,
            prefix: &[],
        }
    }

    /// Jain's index of the queue's service to tenants backlogged whole windows.
    pub(super) fn jain(&self) -> infergate::admission::jain::JainSummary {
        self.waiters.jain()
    }

    /// `w` goes to a worker without waiting: with fair share its tenant's turn counts it too.
    pub(super) fn served_at_once(&mut self, w: &Waiting) {
        let ticket = self.ticket(w);
        self.waiters.start_at_once(ticket.tenant, ticket.cost);
    }

    /// A waiter popped from the queue took its slot (with fair share, counted for borrowing).
    pub(super) fn took_slot(&mut self, w: &Waiting) {
        self.waiters
            .took_slot(w.req.tenant.as_deref().unwrap_or(""));
    }

    /// A request of `tenant` in flight ended: its slot is back.
    pub(super) fn gave_slot(&mut self, tenant: Option<&str>) {
        self.waiters.gave_slot(tenant.unwrap_or(""));
    }

    /// Whether a request of `tenant` arriving with `in_flight` requests in flight may borrow a
    /// slot past the capacity (the gateway's rule: its tenant holds less than its equal share).
    pub(super) fn may_borrow(&self, in_flight: usize, tenant: Option<&str>) -> bool {
        self.lends(in_flight)
            && self
                .waiters
                .under_share(tenant.unwrap_or(""), self.capacity)
    }

    /// With `in_flight` requests in flight, the waiter that may borrow a slot past the
    /// capacity, taken out of the queue.
    pub(super) fn pop_borrower(&mut self, in_flight: usize) -> Option<Waiting> {
        if !self.lends(in_flight) {
            return None;
        }
        self.waiters.pop_borrower(self.capacity)
    }

    /// True when the capacity is taken but slots remain to lend.
    fn lends(&self, in_flight: usize) -> bool {
        self.is_on()
            && self.borrow > 0
            && in_flight >= self.capacity
            && in_flight < self.capacity.saturating_add(self.borrow)
    }

    /// True when requests pass through slots and the queue.
    pub(super) fn is_on(&self) -> bool {
        self.capacity > 0
    }

    /// True when a request may be routed now, given the requests in flight.
    pub(super) fn has_slot(&self, in_flight: usize) -> bool {
        !self.is_on() || in_flight < self.capacity
    }

    /// Longest wait in the queue, seconds.
    pub(super) fn max_wait(&self) -> f64 {
        self.max_wait
    }

    /// Requests waiting.
    pub(super) fn len(&self) -> usize {
        self.waiters.len()
    }

    /// The admission priority of a tenant.
    pub(super) fn priority(&self, tenant: Option<&str>) -> u32 {
        tenant
            .and_then(|t| self.priorities.get(t))
            .copied()
            .unwrap_or(0)
    }

    /// Queues `w`, or refuses it (or a worse waiter) when the queue is full.
    pub(super) fn enqueue(&mut self, w: Waiting) -> Enqueued {
        let tenant = w.req.tenant.clone().unwrap_or_default();
        let Ticket { priority, cost, .. } = self.ticket(&w);
        let ticket = Ticket {
            priority,
            tenant: &tenant,
            cost,
            due: None,
            prefix: &[],
        };
        match self.waiters.push_ticket(ticket, w) {
            Push::Queued { key, evicted } => Enqueued {
                queued: Some(key),
                refused: evicted.map(|(_, w)| w),
            },
            Push::Full { item, .. } => Enqueued {
                queued: None,
                refused: Some(item),
            },
        }
    }

    /// The best waiter (highest priority, then earliest), taken out of the queue.
    #[cfg(test)]
    pub(super) fn pop_best(&mut self) -> Option<Waiting> {
        self.waiters.pop_best()
    }

    /// The waiter that goes next, as the gateway's queue picks it: with fair share, a tenant
    /// within the locality window whose next request `warm` holds (a free worker has its
    /// prefix, by the router's view) may go before the least served one.
    pub(super) fn pop_next(&mut self, warm: impl FnMut(&Waiting) -> bool) -> Option<Waiting> {
        let window = self.fair.map_or(0.0, |f| f.locality_window);
        self.waiters.pop_near(window, warm)
    }

    /// Slots per worker, of `workers` (0 without an admission stage).
    pub(super) fn per_worker(&self, workers: usize) -> usize {
        self.capacity / workers.max(1)
    }

    /// The waiter under `key`, if it still waits (its expiry came due).
    pub(super) fn remove(&mut self, key: QueueKey) -> Option<Waiting> {
        self.waiters.remove(&key)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn waiting(id: u64, tenant: &str) -> Waiting {
        Waiting {
            req: PlannedRequest {
                id,
                at: Duration::ZERO,
                tenant: Some(tenant.to_owned()),
                class: None,
                session: None,
                group: None,
                prompt: Vec::new(),
                output_tokens: 1,
                features: None,
            },
            prompt_tokens: 0,
            arrival: id as f64,
        }
    }

    fn tiers() -> BTreeMap<String, u32> {
        [("free".to_owned(), 1), ("paid".to_owned(), 10)].into()
    }

    #[test]
    fn best_priority_first_then_arrival() {
        let mut q = Admission::new(1, 0, 30.0, tiers());
        for (id, tenant) in [
            (0, "free"),
            (1, "paid"),
            (2, "other"),
            (3, "paid"),
            (4, "free"),
        ] {
            assert!(q.enqueue(waiting(id, tenant)).queued.is_some());
        }
        let order: Vec<u64> = std::iter::from_fn(|| q.pop_best().map(|w| w.req.id)).collect();
        assert_eq!(order, [1, 3, 0, 4, 2]);
    }

    #[test]
    fn a_full_queue_refuses_or_evicts_a_lower_priority() {
        let mut q = Admission::new(1, 2, 30.0, tiers());
        let first = q.enqueue(waiting(0, "free")).queued;
        q.enqueue(waiting(1, "free"));
        let refused = q.enqueue(waiting(2, "free"));
        assert_eq!(refused.queued, None);
        assert_eq!(refused.refused.map(|w| w.req.id), Some(2));
        let evicting = q.enqueue(waiting(3, "paid"));
        assert!(evicting.queued.is_some());
        assert_eq!(
            evicting.refused.map(|w| w.req.id),
            Some(1),
            "latest free goes"
        );
        assert_eq!(q.len(), 2);
        let key = first.unwrap_or_default();
        assert_eq!(q.remove(key).map(|w| w.req.id), Some(0));
        assert!(q.remove(key).is_none(), "gone once");
    }

    #[test]
    fn with_fair_share_a_warm_waiter_within_the_window_goes_first() {
        let fair = |window| {
            Admission::new(1, 0, 30.0, BTreeMap::new()).with_fair_share(Some(FairWeights {
                locality_window: window,
                ..FairWeights::default()
            }))
        };
        for (window, first) in [(0.0, 0), (1e6, 1)] {
            let mut q = fair(window);
            q.served_at_once(&waiting(9, "a"));
            q.enqueue(waiting(0, "b"));
            q.enqueue(waiting(1, "a"));
            // Level counters (b starts at a's): strict turns take b's earlier request; within
            // a window a's later, warm one (request 1) goes instead.
            let got = q.pop_next(|w| w.req.id == 1).map(|w| w.req.id);
            assert_eq!(got, Some(first), "window {window}");
        }
    }

    #[test]
    fn off_routes_everything() {
        let q = Admission::off();
        assert!(!q.is_on());
        assert!(q.has_slot(1_000_000));
        assert_eq!(q.priority(Some("paid")), 0);
    }
}
