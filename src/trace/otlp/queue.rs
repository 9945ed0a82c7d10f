//! The exporter's queue, as pure logic: records wait here until a batch is full or its oldest
//! record has waited `delay`; past `capacity` a new record is refused (the caller counts it
//! dropped) rather than the queue growing or the request waiting. Time is an argument, so the
//! tests need no clock.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A bounded queue that releases records in batches, by size or by age.
#[derive(Debug)]
pub struct Batcher<T> {
    items: VecDeque<(Instant, T)>,
    capacity: usize,
    batch: usize,
    delay: Duration,
}

impl<T> Batcher<T> {
    /// A queue of at most `capacity` records, released `batch` at a time (at least 1), or fewer
    /// once the oldest has waited `delay`.
    pub fn new(capacity: usize, batch: usize, delay: Duration) -> Self {
        Self {
            items: VecDeque::new(),
            capacity,
            batch: batch.max(1),
            delay,
        }
    }

    /// Queues `item` (arrived at `now`); gives it back when the queue is full.
    pub fn push(&mut self, item: T, now: Instant) -> Result<(), T> {
        if self.items.len() >= self.capacity {
            return Err(item);
        }
        self.items.push_back((now, item));
        Ok(())
    }

    /// Records waiting.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// How long until a batch is due: zero when one is due now, `None` when the queue is empty
    /// (nothing will be due until a push).
    pub fn due_in(&self, now: Instant) -> Option<Duration> {
        let (oldest, _) = self.items.front()?;
        if self.items.len() >= self.batch {
            return Some(Duration::ZERO);
        }
        Some((*oldest + self.delay).saturating_duration_since(now))
    }

    /// The next batch (oldest first, at most `batch` records) when one is due at `now`; empty
    /// otherwise.
    pub fn take_due(&mut self, now: Instant) -> Vec<T> {
        if self.due_in(now) != Some(Duration::ZERO) {
            return Vec::new();
        }
        self.take()
    }

    /// The next batch whether due or not (a final flush).
    pub fn take(&mut self) -> Vec<T> {
        let n = self.items.len().min(self.batch);
        self.items.drain(..n).map(|(_, item)| item).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_full_batch_is_due_at_once_and_a_partial_one_after_the_delay() {
        let t0 = Instant::now();
        let mut q = Batcher::new(10, 3, 100 * MS);
        assert_eq!(q.due_in(t0), None, "empty: nothing due until a push");
        q.push(1, t0).unwrap();
        q.push(2, t0 + 10 * MS).unwrap();
        assert_eq!(q.due_in(t0 + 10 * MS), Some(90 * MS), "by the oldest's age");
        assert!(q.take_due(t0 + 50 * MS).is_empty());
        q.push(3, t0 + 60 * MS).unwrap();
        assert_eq!(q.due_in(t0 + 60 * MS), Some(Duration::ZERO), "a full batch");
        assert_eq!(q.take_due(t0 + 60 * MS), vec![1, 2, 3]);
        assert!(q.is_empty());
        q.push(4, t0 + 70 * MS).unwrap();
        assert!(q.take_due(t0 + 169 * MS).is_empty());
        assert_eq!(q.take_due(t0 + 170 * MS), vec![4], "the delay passed");
    }

    #[test]
    fn batches_are_at_most_the_batch_size_oldest_first() {
        let t0 = Instant::now();
        let mut q = Batcher::new(10, 2, 100 * MS);
        for i in 0..5 {
            q.push(i, t0).unwrap();
        }
        assert_eq!(q.take_due(t0), vec![0, 1]);
        assert_eq!(q.take_due(t0), vec![2, 3]);
        assert!(q.take_due(t0).is_empty(), "one left, not yet old enough");
        assert_eq!(q.take(), vec![4], "a flush takes it anyway");
        assert!(q.take().is_empty());
    }

    #[test]
    fn a_full_queue_refuses_and_never_grows() {
        let t0 = Instant::now();
        let mut q = Batcher::new(2, 8, 100 * MS);
        assert!(q.push("a", t0).is_ok());
        assert!(q.push("b", t0).is_ok());
        assert_eq!(q.push("c", t0), Err("c"));
        assert_eq!(q.len(), 2);
        assert_eq!(q.take(), vec!["a", "b"], "the refused one is not there");
        assert!(q.push("d", t0).is_ok(), "room again once taken");
        let mut none = Batcher::new(0, 1, MS);
        assert_eq!(none.push(1, t0), Err(1), "capacity 0 keeps nothing");
    }
}
