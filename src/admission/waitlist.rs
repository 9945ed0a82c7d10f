//! The order of requests waiting for a slot, shared by the gateway's admission queue and the
//! simulator's: best priority first, then arrival; at most `max_queue` waiters, a full list making
//! room for a strictly higher priority by refusing its lowest-priority, latest waiter. Pure
//! bookkeeping: the callers own slots, time and wake-ups.

use std::cmp::Reverse;
use std::collections::BTreeMap;

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

/// Waiters in admission order.
#[derive(Debug)]
pub struct Waitlist<T> {
    waiters: BTreeMap<Key, T>,
    next_seq: u64,
    /// Most waiters at once; `None` = unbounded.
    max_queue: Option<usize>,
}

impl<T> Waitlist<T> {
    /// An empty list holding at most `max_queue` waiters (`None`: unbounded).
    pub fn new(max_queue: Option<usize>) -> Self {
        Self {
            waiters: BTreeMap::new(),
            next_seq: 0,
            max_queue,
        }
    }

    /// Adds a waiter of `priority`, or refuses it (or a worse waiter) when the list is full.
    pub fn push(&mut self, priority: u32, item: T) -> Push<T> {
        let key = (Reverse(priority), self.next_seq);
        let mut evicted = None;
        if self.max_queue.is_some_and(|max| self.waiters.len() >= max) {
            let evict = self
                .waiters
                .last_key_value()
                .is_some_and(|(worst, _)| *worst > key);
            if !evict {
                let position = self.position(&key);
                return Push::Full { position, item };
            }
            let position = self.waiters.len().saturating_sub(1);
            evicted = self.waiters.pop_last().map(|(_, w)| (position, w));
        }
        self.next_seq += 1;
        self.waiters.insert(key, item);
        Push::Queued { key, evicted }
    }

    /// The best waiter, taken out.
    pub fn pop_best(&mut self) -> Option<T> {
        self.waiters.pop_first().map(|(_, w)| w)
    }

    /// The waiter under `key`, taken out, if it still waits.
    pub fn remove(&mut self, key: &Key) -> Option<T> {
        self.waiters.remove(key)
    }

    /// Waiters ahead of `key`.
    pub fn position(&self, key: &Key) -> usize {
        self.waiters.range(..key).count()
    }

    /// Waiters now.
    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    /// True when nobody waits.
    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// Takes every waiter out, best first.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + use<T> {
        std::mem::take(&mut self.waiters).into_values()
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
}
