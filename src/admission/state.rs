//! The queue's shared state: slot accounting and the waiters, ordered by (priority desc,
//! arrival asc). Every change happens under one mutex, and every hand-off is a oneshot send made
//! under it, so a slot is either in a waiter's channel, held by a permit, or free — never lost.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use super::Refusal;
use super::rate::CompletionRate;

/// Orders waiters: higher priority first, then earlier arrival.
pub(super) type Key = (Reverse<u32>, u64);

/// What a waiter is told.
#[derive(Debug)]
pub(super) enum Outcome {
    /// A slot is now the waiter's (in flight was already counted for it).
    Slot,
    /// The waiter leaves the queue without a slot.
    Refused(Refusal),
}

/// Slots, waiters and the completion-rate estimate.
#[derive(Debug)]
pub(super) struct State {
    pub capacity: usize,
    pub in_flight: usize,
    pub max_queue: usize,
    pub waiters: BTreeMap<Key, oneshot::Sender<Outcome>>,
    pub next_seq: u64,
    pub closed: bool,
    pub rate: CompletionRate,
}

impl State {
    /// An empty state.
    pub fn new(capacity: usize, max_queue: usize) -> Self {
        let waiters = BTreeMap::new();
        let rate = CompletionRate::default();
        Self {
            capacity,
            in_flight: 0,
            max_queue,
            waiters,
            next_seq: 0,
            closed: false,
            rate,
        }
    }

    /// Waiters ahead of `key`.
    pub fn position(&self, key: &Key) -> usize {
        self.waiters.range(..key).count()
    }

    /// `Retry-After` for a request at `position`.
    pub fn retry_after(&self, position: usize) -> Duration {
        self.rate.retry_after(position, self.capacity)
    }

    /// Queues a waiter, or refuses at once when the queue is full. A full queue makes room for a
    /// strictly higher priority by refusing its lowest-priority, latest waiter.
    pub fn enqueue(&mut self, priority: u32) -> Result<(Key, oneshot::Receiver<Outcome>), Refusal> {
        let key = (Reverse(priority), self.next_seq);
        if self.waiters.len() >= self.max_queue {
            let evict = self
                .waiters
                .last_key_value()
                .is_some_and(|(worst, _)| *worst > key);
            let position = self.position(&key);
            if !evict {
                return Err(Refusal::QueueFull {
                    retry_after: self.retry_after(position),
                    position,
                });
            }
            let position = self.waiters.len().saturating_sub(1);
            let retry_after = self.retry_after(position);
            if let Some((_, tx)) = self.waiters.pop_last() {
                let _ = tx.send(Outcome::Refused(Refusal::QueueFull {
                    retry_after,
                    position,
                }));
            }
        }
        self.next_seq += 1;
        let (tx, rx) = oneshot::channel();
        self.waiters.insert(key, tx);
        Ok((key, rx))
    }

    /// Frees one slot (recording how long it was held, if it was used) and hands it on.
    pub fn release(&mut self, held: Option<Duration>) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(held) = held {
            self.rate.record(held);
        }
        self.dispatch();
    }

    /// Hands free slots to the best waiters. A waiter whose receiver is gone is skipped.
    pub fn dispatch(&mut self) {
        while self.in_flight < self.capacity {
            let Some((_, tx)) = self.waiters.pop_first() else {
                break;
            };
            if tx.send(Outcome::Slot).is_ok() {
                self.in_flight += 1;
            }
        }
    }

    /// Refuses every waiter with `Draining` and every later arrival.
    pub fn close(&mut self) {
        self.closed = true;
        let retry_after = self.retry_after(0);
        for (_, tx) in std::mem::take(&mut self.waiters) {
            let _ = tx.send(Outcome::Refused(Refusal::Draining { retry_after }));
        }
    }
}

/// Locks the state, ignoring poisoning (every update leaves it consistent).
pub(super) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}
