//! The queue's shared state: slot accounting and the waiters, ordered by (priority desc,
//! arrival asc). Every change happens under one mutex, and every hand-off is a oneshot send made
//! under it, so a slot is either in a waiter's channel, held by a permit, or free — never lost.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use super::Refusal;
use super::rate::CompletionRate;
pub(super) use super::waitlist::Key;
use super::waitlist::{Push, Ticket, Waitlist};

/// What a waiter is told.
#[derive(Debug)]
pub(super) enum Outcome {
    /// A slot is now the waiter's (in flight was already counted for it).
    Slot,
    /// The waiter leaves the queue without a slot.
    Refused(Refusal),
}

/// A queued request: where its slot is sent, and its prefix hashes (kept only when locality
/// may use them).
#[derive(Debug)]
pub(super) struct Waiter {
    pub tx: oneshot::Sender<Outcome>,
    prefix: Vec<u64>,
    /// Its tenant, with fair share (whose slots are counted for borrowing).
    tenant: Option<Arc<str>>,
}

/// Whether a worker with a free slot holds a prefix, by the router's own view.
pub type Warmth = Arc<dyn Fn(&[u64]) -> bool + Send + Sync>;

/// Fair share's locality: the window (weighted tokens) and the router's view, once the pool
/// has told it.
#[derive(Default)]
pub(super) struct Locality {
    pub window: f64,
    pub warm: Option<Warmth>,
}

impl fmt::Debug for Locality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locality")
            .field("window", &self.window)
            .field("warm", &self.warm.is_some())
            .finish()
    }
}

/// Slots, waiters and the completion-rate estimate.
#[derive(Debug)]
pub(super) struct State {
    pub capacity: usize,
    /// Slots past `capacity` a tenant under its equal share may borrow (fair share only).
    pub borrow: usize,
    pub in_flight: usize,
    pub waiters: Waitlist<Waiter>,
    pub closed: bool,
    pub rate: CompletionRate,
    pub locality: Locality,
}

impl State {
    /// An empty state; with `fair` (Some(locality window)) tenants take turns.
    pub fn new(capacity: usize, max_queue: usize, fair: Option<f64>, borrow: usize) -> Self {
        let waiters = if fair.is_some() {
            Waitlist::fair(Some(max_queue))
        } else {
            Waitlist::new(Some(max_queue))
        };
        let rate = CompletionRate::default();
        Self {
            capacity,
            borrow: if fair.is_some() { borrow } else { 0 },
            in_flight: 0,
            waiters,
            closed: false,
            rate,
            locality: Locality {
                window: fair.unwrap_or(0.0),
                warm: None,
            },
        }
    }

    /// Waiters ahead of `key`.
    pub fn position(&self, key: &Key) -> usize {
        self.waiters.position(key)
    }

    /// The wait the drain rate predicts for a request at `position`, unclamped.
    pub fn expected_wait(&self, position: usize) -> Duration {
        self.rate.expected_wait(position, self.capacity)
    }

    /// `Retry-After` for a request at `position`.
    pub fn retry_after(&self, position: usize) -> Duration {
        self.rate.retry_after(position, self.capacity)
    }

    /// Queues a waiter, or refuses at once when the queue is full. A full queue makes room for a
    /// strictly higher priority by refusing its lowest-priority, latest waiter.
    pub fn enqueue(
        &mut self,
        ticket: Ticket<'_>,
    ) -> Result<(Key, oneshot::Receiver<Outcome>), Refusal> {
        let (tx, rx) = oneshot::channel();
        let local = self.locality.window > 0.0 && self.locality.warm.is_some();
        let prefix = if local {
            ticket.prefix.to_vec()
        } else {
            Vec::new()
        };
        let tenant = self.waiters.is_fair().then(|| Arc::from(ticket.tenant));
        match self
            .waiters
            .push_ticket(ticket, Waiter { tx, prefix, tenant })
        {
            Push::Full { position, .. } => Err(Refusal::QueueFull {
                retry_after: self.retry_after(position),
                position,
            }),
            Push::Queued { key, evicted } => {
                if let Some((position, evicted)) = evicted {
                    let _ = evicted.tx.send(Outcome::Refused(Refusal::QueueFull {
                        retry_after: self.retry_after(position),
                        position,
                    }));
                }
                Ok((key, rx))
            }
        }
    }

    /// Frees one slot (recording how long it was held, if it was used) and hands it on.
    pub fn release(&mut self, held: Option<Duration>) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(held) = held {
            self.rate.record(held);
        }
        self.dispatch();
    }

    /// Hands free slots to the best waiters, then up to `borrow` slots past the capacity to
    /// waiters whose tenant holds less than its equal share. A waiter whose receiver is gone is
    /// skipped.
    pub fn dispatch(&mut self) {
        loop {
            let waiter = if self.in_flight < self.capacity {
                self.pop_next()
            } else if self.in_flight < self.capacity.saturating_add(self.borrow) {
                self.waiters.pop_borrower(self.capacity)
            } else {
                None
            };
            let Some(waiter) = waiter else {
                break;
            };
            if waiter.tx.send(Outcome::Slot).is_ok() {
                self.in_flight += 1;
                if let Some(tenant) = &waiter.tenant {
                    self.waiters.took_slot(tenant);
                }
            }
        }
    }

    /// Whether a request of `tenant` arriving now may borrow a slot past the capacity.
    pub fn may_borrow(&self, tenant: &str) -> bool {
        self.borrow > 0
            && self.in_flight >= self.capacity
            && self.in_flight < self.capacity.saturating_add(self.borrow)
            && self.waiters.under_share(tenant, self.capacity)
    }

    /// The waiter that goes next: with fair share and the router's view, one whose prefix a
    /// free worker holds may go before a less served tenant within the window.
    fn pop_next(&mut self) -> Option<Waiter> {
        let Some(warm) = self.locality.warm.clone() else {
            return self.waiters.pop_best();
        };
        let window = self.locality.window;
        self.waiters
            .pop_near(window, |w| !w.prefix.is_empty() && warm(&w.prefix))
    }

    /// Refuses every waiter with `Draining` and every later arrival.
    pub fn close(&mut self) {
        self.closed = true;
        let retry_after = self.retry_after(0);
        for waiter in self.waiters.drain() {
            let _ = waiter
                .tx
                .send(Outcome::Refused(Refusal::Draining { retry_after }));
        }
    }
}

/// Locks the state, ignoring poisoning (every update leaves it consistent).
pub(super) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}
