//! The order of requests waiting for a slot, shared by the gateway's admission queue and the
//! simulator's: best priority first, then arrival; at most `max_queue` waiters, a full list making
//! room for a strictly higher priority by refusing its lowest-priority, latest waiter. With fair
//! share on ([`Waitlist::fair`]), tenants at the best priority take turns by least weighted
//! service ([`super::fair`]), and a full list also makes room for a lighter tenant by refusing
//! the heaviest one's latest waiter; a tenant's own waiters go earliest due first, and
//! [`Waitlist::pop_near`] lets a waiter the caller calls warm (its prefix cached where it would
//! go) go before a less served tenant within a window. Pure bookkeeping: the callers own slots,
//! time, wake-ups and the router's view.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::fair::FairShare;
use super::jain::{JainMeter, JainSummary};

/// Where a waiter stands: (priority, higher first; arrival sequence).
pub type Key = (Reverse<u32>, u64);

/// What adding a waiter did.
#[derive(Debug, PartialEq, Eq)]
pub enum Push<T> {
    /// It waits under `key`; `evicted` is the lower-priority waiter refused to make room, with
    /// the position it held.
    Queued {
        /// The new waiter's place.
        key: Key,
        /// (position, waiter) refused to keep the bound.
        evicted: Option<(usize, T)>,
    },
    /// The list is full of waiters at least as good: `item` is refused; `position` is where it
    /// would have stood.
    Full {
        /// Waiters ahead of it.
        position: usize,
        /// The refused waiter, handed back.
        item: T,
    },
}

/// Who waits, for fair share: its tenant and the service it will be charged when it goes.
#[derive(Debug, Clone, Copy)]
pub struct Ticket<'a> {
    /// Admission priority, higher first.
    pub priority: u32,
    /// The tenant it is served for ("" for requests without one: they share one turn).
    pub tenant: &'a str,
    /// Weighted tokens charged to the tenant when it goes (an estimate; see [`Waitlist::settle`]).
    pub cost: f64,
    /// When it must have started, on the caller's clock (ms); with fair share a tenant's own
    /// waiters go earliest due first (`None`: after those with one). First come ignores it.
    pub due: Option<u64>,
    /// The request's chained prefix hashes (the router's features; empty: none), which the
    /// gateway's queue asks the router about for locality. The waitlist itself ignores it.
    pub prefix: &'a [u64],
}

impl Ticket<'_> {
    /// The due time as the lanes sort it: no deadline sorts last.
    fn due_key(&self) -> u64 {
        self.due.unwrap_or(u64::MAX)
    }
}

/// A waiter and what fair share needs of it.
#[derive(Debug)]
struct Entry<T> {
    item: T,
    tenant: Arc<str>,
    cost: f64,
    /// [`Ticket::due`], `u64::MAX` for none.
    due: u64,
}

/// Waiters in admission order.
#[derive(Debug)]
pub struct Waitlist<T> {
    waiters: BTreeMap<Key, Entry<T>>,
    next_seq: u64,
    /// Most waiters at once; `None` = unbounded.
    max_queue: Option<usize>,
    /// Turns among tenants; `None`: first come within a priority.
    fair: Option<FairShare>,
    /// How evenly the backlogged tenants are served (first come or fair share alike).
    jain: JainMeter,
}

impl<T> Waitlist<T> {
    /// An empty list holding at most `max_queue` waiters (`None`: unbounded), first come first
    /// served within a priority.
    pub fn new(max_queue: Option<usize>) -> Self {
        Self {
            waiters: BTreeMap::new(),
            next_seq: 0,
            max_queue,
            fair: None,
            jain: JainMeter::default(),
        }
    }

    /// An empty list whose tenants take turns by least weighted service within a priority.
    pub fn fair(max_queue: Option<usize>) -> Self {
        Self {
            fair: Some(FairShare::default()),
            ..Self::new(max_queue)
        }
    }

    /// The bound on waiters (`None`: unbounded).
    pub fn max_queue(&self) -> Option<usize> {
        self.max_queue
    }

    /// True when tenants take turns by fair share.
    pub fn is_fair(&self) -> bool {
        self.fair.is_some()
    }

    /// Adds a waiter of `priority` (no tenant, no cost), or refuses it (or a worse waiter) when
    /// the list is full.
    pub fn push(&mut self, priority: u32, item: T) -> Push<T> {
        let ticket = Ticket {
            priority,
            tenant: "",
            cost: 0.0,
            due: None,
            prefix: &[],
        };
        self.push_ticket(ticket, item)
    }

    /// Adds a waiter with its ticket, or refuses it (or a worse or heavier waiter) when full.
    pub fn push_ticket(&mut self, ticket: Ticket<'_>, item: T) -> Push<T> {
        let key = (Reverse(ticket.priority), self.next_seq);
        let mut evicted = None;
        if self.max_queue.is_some_and(|max| self.waiters.len() >= max) {
            let victim = match &self.fair {
                Some(fair) => fair.victim(ticket.priority, ticket.tenant),
                None => self
                    .waiters
                    .last_key_value()
                    .map(|(worst, _)| *worst)
                    .filter(|worst| *worst > key),
            };
            let Some(victim) = victim else {
                let position = self.ahead(&key, ticket.tenant, ticket.due_key());
                return Push::Full { position, item };
            };
            let position = self.position(&victim);
            evicted = self.take(&victim).map(|e| (position, e.item));
        }
        self.next_seq += 1;
        let tenant: Arc<str> = Arc::from(ticket.tenant);
        let due = ticket.due_key();
        if let Some(fair) = &mut self.fair {
            fair.joined(key, &tenant, due);
        }
        self.jain.joined(&tenant);
        let cost = ticket.cost;
        let entry = Entry {
            item,
            tenant,
            cost,
            due,
        };
        self.waiters.insert(key, entry);
        Push::Queued { key, evicted }
    }

    /// The waiter that goes next, taken out; with fair share its tenant is charged its cost.
    pub fn pop_best(&mut self) -> Option<T> {
        let key = match &self.fair {
            Some(fair) => fair.next()?,
            None => *self.waiters.first_key_value()?.0,
        };
        self.start(&key)
    }

    /// As [`pop_best`](Self::pop_best), preferring locality: with fair share, among the tenants
    /// within `window` weighted tokens of the least served (at the best priority), the least
    /// served one whose next waiter `warm` accepts (its prefix is held where it would go) goes
    /// instead. Only a tenant's next waiter is asked, so its own order (deadline, arrival)
    /// holds. First come ignores `warm`.
    pub fn pop_near(&mut self, window: f64, mut warm: impl FnMut(&T) -> bool) -> Option<T> {
        let near = match &self.fair {
            Some(fair) if window > 0.0 => fair.near(window),
            _ => return self.pop_best(),
        };
        let &first = near.first()?;
        let key = if near.len() > 1 {
            near.into_iter()
                .find(|key| self.waiters.get(key).is_some_and(|e| warm(&e.item)))
                .unwrap_or(first)
        } else {
            first
        };
        self.start(&key)
    }

    /// With fair share, the waiter that may borrow a slot past `capacity` (its tenant holds
    /// less than its equal share: [`FairShare::under_share`]), taken out and charged. `None`
    /// for first come, or when every waiting tenant holds its share.
    pub fn pop_borrower(&mut self, capacity: usize) -> Option<T> {
        let key = self.fair.as_ref()?.next_under_share(capacity)?;
        self.start(&key)
    }

    /// The waiter under `key` starts: taken out, its tenant charged its cost (and measured).
    fn start(&mut self, key: &Key) -> Option<T> {
        let (tenant, cost) = self
            .waiters
            .get(key)
            .map(|e| (Arc::clone(&e.tenant), e.cost))?;
        // Measured before it leaves: a tenant whose last waiter this is was still backlogged.
        self.jain.started(&tenant, cost);
        let entry = self.take(key)?;
        if let Some(fair) = &mut self.fair {
            fair.charge(&entry.tenant, entry.cost);
        }
        Some(entry.item)
    }

    /// A request of `tenant` costing `cost` starts without waiting (a free slot, or one lent):
    /// served all the same, so its tenant's turn counts it, and it holds a slot.
    pub fn start_at_once(&mut self, tenant: &str, cost: f64) {
        self.jain.started(tenant, cost);
        if let Some(fair) = &mut self.fair {
            fair.charge(tenant, cost);
        }
        self.took_slot(tenant);
    }

    /// With fair share, whether `tenant` holds less than its equal share of `capacity` slots.
    pub fn under_share(&self, tenant: &str, capacity: usize) -> bool {
        self.fair
            .as_ref()
            .is_some_and(|f| f.under_share(tenant, capacity))
    }

    /// With fair share, `tenant` took a slot (counted for [`under_share`](Self::under_share)).
    pub fn took_slot(&mut self, tenant: &str) {
        if let Some(fair) = &mut self.fair {
            fair.took_slot(tenant);
        }
    }

    /// With fair share, `tenant` gave its slot back.
    pub fn gave_slot(&mut self, tenant: &str) {
        if let Some(fair) = &mut self.fair {
            fair.gave_slot(tenant);
        }
    }

    /// Corrects `tenant`'s charge by `delta` once its request's real usage is known (the real
    /// weighted tokens less the estimate charged when it went); first come only measures it.
    pub fn settle(&mut self, tenant: &str, delta: f64) {
        self.jain.correct(tenant, delta);
        if let Some(fair) = &mut self.fair {
            fair.charge(tenant, delta);
        }
    }

    /// With fair share, each backlogged tenant, its weighted service and its waiters, least
    /// served first; `None` for first come.
    pub fn fair_backlog(&self) -> Option<Vec<(Arc<str>, f64, usize)>> {
        self.fair.as_ref().map(FairShare::backlog)
    }

    /// Jain's index of the service given to tenants backlogged whole windows ([`super::jain`]).
    pub fn jain(&self) -> JainSummary {
        self.jain.summary()
    }

    /// `tenant`'s weighted service so far (0 without fair share).
    pub fn served(&self, tenant: &str) -> f64 {
        self.fair.as_ref().map_or(0.0, |f| f.counter(tenant))
    }

    /// The waiter under `key`, taken out, if it still waits.
    pub fn remove(&mut self, key: &Key) -> Option<T> {
        self.take(key).map(|e| e.item)
    }

    /// Waiters served before `key` (with fair share, if counters stay level).
    pub fn position(&self, key: &Key) -> usize {
        let (tenant, due) = self
            .waiters
            .get(key)
            .map_or(("", u64::MAX), |e| (e.tenant.as_ref(), e.due));
        self.ahead(key, tenant, due)
    }

    /// Waiters that would be served before a waiter with `ticket` pushed now.
    pub fn position_of_new(&self, ticket: Ticket<'_>) -> usize {
        let key = (Reverse(ticket.priority), self.next_seq);
        self.ahead(&key, ticket.tenant, ticket.due_key())
    }

    /// Waiters served before a waiter of `tenant`, due by `due`, standing at `key`.
    fn ahead(&self, key: &Key, tenant: &str, due: u64) -> usize {
        match &self.fair {
            Some(fair) => fair.position(*key, tenant, due),
            None => self.waiters.range(..key).count(),
        }
    }

    /// Takes the entry under `key` out of the list and of the fair-share lanes.
    fn take(&mut self, key: &Key) -> Option<Entry<T>> {
        let entry = self.waiters.remove(key)?;
        if let Some(fair) = &mut self.fair {
            fair.left(*key, &entry.tenant, entry.due);
        }
        self.jain.left(&entry.tenant);
        Some(entry)
    }

    /// Waiters now.
    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    /// True when nobody waits.
    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// Takes every waiter out, best priority and earliest first.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + use<T> {
        if let Some(fair) = &mut self.fair {
            for (key, entry) in &self.waiters {
                fair.left(*key, &entry.tenant, entry.due);
            }
        }
        for entry in self.waiters.values() {
            self.jain.left(&entry.tenant);
        }
        std::mem::take(&mut self.waiters)
            .into_values()
            .map(|e| e.item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_priority_first_then_arrival() {
        let mut w = Waitlist::new(None);
        for (id, priority) in [(0, 1), (1, 10), (2, 0), (3, 10), (4, 1)] {
            assert!(matches!(
                w.push(priority, id),
                Push::Queued { evicted: None, .. }
            ));
        }
        let order: Vec<i32> = std::iter::from_fn(|| w.pop_best()).collect();
        assert_eq!(order, [1, 3, 0, 4, 2]);
    }

    #[test]
    fn a_full_list_refuses_or_evicts_its_lowest_latest_waiter() {
        let mut w = Waitlist::new(Some(2));
        let Push::Queued { key: first, .. } = w.push(1, "a") else {
            panic!("queued");
        };
        w.push(1, "b");
        assert_eq!(
            w.push(1, "c"),
            Push::Full {
                position: 2,
                item: "c"
            }
        );
        match w.push(10, "d") {
            Push::Queued { evicted, .. } => assert_eq!(evicted, Some((1, "b")), "latest low goes"),
            full => panic!("{full:?}"),
        }
        assert_eq!(w.len(), 2);
        assert_eq!(w.position(&first), 1, "behind the higher priority");
        assert_eq!(w.remove(&first), Some("a"));
        assert_eq!(w.remove(&first), None, "gone once");
        assert_eq!(w.drain().collect::<Vec<_>>(), ["d"]);
        assert!(w.is_empty());
    }

    fn ticket(tenant: &str, cost: f64) -> Ticket<'_> {
        Ticket {
            priority: 0,
            tenant,
            cost,
            due: None,
            prefix: &[],
        }
    }

    /// Three tenants kept waiting, `a` having sent ten times as many: first come serves them as
    /// they arrived (Jain's index near 0.47 over the backlogged), fair share evenly (near 1).
    #[test]
    fn the_jain_meter_tells_first_come_from_fair_share_under_a_flood() {
        let jain = |mut w: Waitlist<String>| {
            for seq in 0..1200 {
                let tenant = ["b", "c", "a", "a", "a", "a", "a", "a", "a", "a", "a", "a"][seq % 12];
                w.push_ticket(ticket(tenant, 100.0), format!("{tenant}{seq}"));
            }
            for _ in 0..crate::admission::jain::WINDOW_STARTS * 4 {
                assert!(w.pop_best().is_some());
            }
            w.jain()
        };
        let fcfs = jain(Waitlist::new(None));
        let fair = jain(Waitlist::fair(None));
        assert_eq!((fcfs.windows, fair.windows), (4, 4));
        assert!(fcfs.mean < 0.6, "{fcfs:?}");
        assert!(fair.min > 0.95, "{fair:?}");
    }

    #[test]
    fn with_fair_share_a_flooding_tenant_does_not_take_its_neighbours_turns() {
        let mut w = Waitlist::fair(None);
        // a queues 6 heavy requests before b and c queue one light request each.
        for i in 0..6 {
            w.push_ticket(ticket("a", 1000.0), format!("a{i}"));
        }
        w.push_ticket(ticket("b", 100.0), "b0".into());
        w.push_ticket(ticket("c", 100.0), "c0".into());
        let order: Vec<String> = std::iter::from_fn(|| w.pop_best()).collect();
        // a's first goes (all level, earliest), then b and c before a's backlog.
        assert_eq!(order[..3], ["a0", "b0", "c0"]);
        assert!(w.served("a") >= 6000.0 && w.served("b") == 100.0);
    }

    #[test]
    fn with_fair_share_a_full_list_refuses_the_heaviest_tenant_not_a_newcomer() {
        let mut w = Waitlist::fair(Some(4));
        for i in 0..4 {
            w.push_ticket(ticket("a", 1.0), i);
        }
        // a's fifth is refused (it would push out its own)...
        assert!(matches!(
            w.push_ticket(ticket("a", 1.0), 4),
            Push::Full { item: 4, .. }
        ));
        // ...but b's first takes the place of a's latest.
        match w.push_ticket(ticket("b", 1.0), 10) {
            Push::Queued { evicted, .. } => assert_eq!(evicted.map(|e| e.1), Some(3)),
            full => panic!("{full:?}"),
        }
        assert_eq!(w.len(), 4);
    }

    #[test]
    fn within_the_window_a_warm_waiter_goes_before_a_cold_less_served_one() {
        let mut w = Waitlist::fair(None);
        w.push_ticket(ticket("a", 100.0), "a-cold");
        w.push_ticket(ticket("b", 100.0), "b-warm");
        w.settle("b", 50.0);
        let warm = |item: &&str| item.ends_with("warm");
        // b is 50 ahead of a: outside a window of 10, a goes; within 100, b's warm one does.
        let mut narrow = Waitlist::fair(None);
        narrow.push_ticket(ticket("a", 100.0), "a-cold");
        narrow.push_ticket(ticket("b", 100.0), "b-warm");
        narrow.settle("b", 50.0);
        assert_eq!(narrow.pop_near(10.0, warm), Some("a-cold"));
        assert_eq!(w.pop_near(100.0, warm), Some("b-warm"));
        assert_eq!(w.served("b"), 150.0, "charged as any turn");
        assert_eq!(
            w.pop_near(100.0, warm),
            Some("a-cold"),
            "nobody warm: least"
        );
        // First come: arrival, whatever is warm.
        let mut fifo = Waitlist::new(None);
        fifo.push(0, "cold");
        fifo.push(0, "warm");
        assert_eq!(fifo.pop_near(1e9, warm), Some("cold"));
    }

    #[test]
    fn settling_corrects_a_tenants_turn() {
        let mut w = Waitlist::fair(None);
        w.push_ticket(ticket("a", 500.0), 0);
        assert_eq!(w.pop_best(), Some(0));
        assert_eq!(w.served("a"), 500.0);
        w.settle("a", -400.0);
        assert_eq!(w.served("a"), 100.0);
        let mut fifo: Waitlist<u8> = Waitlist::new(None);
        fifo.settle("a", 5.0);
        assert_eq!(fifo.served("a"), 0.0, "first come keeps no counters");
    }
}
