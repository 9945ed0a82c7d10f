//! Admission: a bounded priority queue per pool in front of the workers.
//!
//! `capacity` slots (the sum of the workers' in-flight limits) are handed out at once while free;
//! beyond that, up to `max_queue` requests wait, best priority first and then by arrival, for at
//! most `max_wait`. Everything past the bound is refused at once, without being buffered, with a
//! `Retry-After` derived from the observed completion rate and the queue position.
//!
//! With `fair_share` on, tenants within a priority take turns by least weighted service instead
//! of arrival ([`fair`]): each admitted request charges its tenant its estimated weighted tokens,
//! corrected by [`Permit::settle`] once the real usage is known. A tenant's own requests go
//! earliest deadline first. Given the router's view ([`AdmissionQueue::set_warmth`]), a tenant
//! within the locality window of the least served goes first when a worker with a free slot
//! holds its request's prefix.
//!
//! A [`Permit`] frees its slot on drop and hands it to the best waiter; tie it to the response
//! body so cancellation and completion release it the same way. A waiter whose future is dropped
//! (client gone) leaves the queue at once; a slot already handed to it moves on to the next.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod fair;
pub mod jain;
pub mod rate;
mod state;
pub mod waitlist;

pub use fair::FairWeights;
pub use rate::CompletionRate;
pub use state::Warmth;
use state::{Key, Outcome, State, lock};
use tokio::sync::oneshot;
pub use waitlist::Ticket;

/// A pool's admission bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionSpec {
    /// Requests the gateway sends to one worker at once; the rest wait in the queue. Default 256
    /// (vLLM's default `max_num_seqs`).
    pub max_in_flight_per_worker: usize,
    /// Requests allowed to wait; beyond it new ones get 429 at once. Default 1024.
    pub max_queue: usize,
    /// Longest wait in the queue before a 429. Default 30s.
    pub max_wait: Duration,
    /// Token-weighted fair share among tenants within a priority; `None`: first come.
    pub fair_share: Option<FairWeights>,
}

impl Default for AdmissionSpec {
    fn default() -> Self {
        Self {
            max_in_flight_per_worker: 256,
            max_queue: 1024,
            max_wait: Duration::from_secs(30),
            fair_share: None,
        }
    }
}

/// Sizes of one pool's queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueConfig {
    /// Requests in flight at once: the sum of the workers' per-worker limits.
    pub capacity: usize,
    /// Requests allowed to wait; beyond this they are refused at once.
    pub max_queue: usize,
    /// Longest a request waits before it is refused.
    pub max_wait: Duration,
    /// Tenants take turns by weighted service (the weights price each request's ticket).
    pub fair_share: Option<FairWeights>,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The queue was full (429); `position` is where the request would have stood.
    QueueFull {
        retry_after: Duration,
        position: usize,
    },
    /// The request waited `max_wait` without a slot (429).
    Timeout { retry_after: Duration },
    /// The pool is draining (503).
    Draining { retry_after: Duration },
    /// The wait the queue predicts (`predicted`, from its drain rate) is past the request's
    /// deadline (429 at once); `retry_after` is when the queue ahead will have drained enough.
    Deadline {
        retry_after: Duration,
        predicted: Duration,
        deadline: Duration,
    },
}

impl Refusal {
    /// Suggested wait before retrying (from completion rate and position, within 1–60 s).
    pub fn retry_after(&self) -> Duration {
        match self {
            Self::QueueFull { retry_after, .. }
            | Self::Timeout { retry_after }
            | Self::Draining { retry_after }
            | Self::Deadline { retry_after, .. } => *retry_after,
        }
    }

    /// Metric label: "queue_full", "queue_timeout", "draining" or "deadline".
    pub fn reason(&self) -> &'static str {
        match self {
            Self::QueueFull { .. } => "queue_full",
            Self::Timeout { .. } => "queue_timeout",
            Self::Draining { .. } => "draining",
            Self::Deadline { .. } => "deadline",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::QueueFull { position, .. } => {
                write!(f, "server busy: admission queue full (position {position})")
            }
            Self::Timeout { .. } => {
                f.write_str("server busy: timed out waiting in the admission queue")
            }
            Self::Draining { .. } => f.write_str("server is draining; retry on another replica"),
            Self::Deadline {
                predicted,
                deadline,
                ..
            } => write!(
                f,
                "server busy: the predicted wait in the admission queue ({} ms) is past the request's deadline ({} ms)",
                predicted.as_millis(),
                deadline.as_millis()
            ),
        }
    }
}

impl std::error::Error for Refusal {}

/// What queue, permits and waiters share.
#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    max_wait: Duration,
    /// The fair-share weights; `None`: first come.
    fair: Option<FairWeights>,
    /// Origin of the waiters' due times (ms since it), which order a tenant's own requests.
    epoch: Instant,
}

/// One pool's admission queue; clones share the queue.
#[derive(Debug, Clone)]
pub struct AdmissionQueue {
    shared: Arc<Shared>,
}

impl AdmissionQueue {
    /// An open queue with `cfg.capacity` free slots.
    pub fn new(cfg: QueueConfig) -> Self {
        let state = Mutex::new(State::new(
            cfg.capacity,
            cfg.max_queue,
            cfg.fair_share.map(|f| f.locality_window),
            cfg.fair_share.map_or(0, |f| f.borrow_slots),
        ));
        Self {
            shared: Arc::new(Shared {
                state,
                max_wait: cfg.max_wait,
                fair: cfg.fair_share,
                epoch: Instant::now(),
            }),
        }
    }

    /// Gives fair share the router's view for locality: `warm(prefix)` is true when a worker
    /// with a free slot already holds that prefix. Called under the queue's lock, so it must
    /// not call back into the queue. Replaces the previous view (the pool was rebuilt).
    pub fn set_warmth(&self, warm: Warmth) {
        lock(&self.shared.state).locality.warm = Some(warm);
    }

    /// Changes the number of slots (workers joined, left or advertised new limits). Extra slots
    /// go to waiters at once; with fewer, permits above the new capacity simply are not replaced.
    pub fn set_capacity(&self, n: usize) {
        let mut st = lock(&self.shared.state);
        st.capacity = n;
        st.dispatch();
    }

    /// Waits for a slot, best priority (higher first) and then earliest arrival first (or least
    /// served tenant with fair share). `now` is the request's arrival; it waits until
    /// `now + max_wait`, or its own `deadline` if sooner, and is refused at once when the
    /// predicted wait is already past that deadline. Cancel safe: dropping the future leaves the
    /// queue.
    pub async fn admit(
        &self,
        ticket: Ticket<'_>,
        deadline: Option<Duration>,
        now: Instant,
    ) -> Result<Permit, Refusal> {
        // With fair share a tenant's own waiters go earliest deadline first (the caller's
        // `due` is replaced: the queue owns the clock it is measured on).
        let due = deadline.map(|d| {
            let at = (now + d).saturating_duration_since(self.shared.epoch);
            u64::try_from(at.as_millis()).unwrap_or(u64::MAX)
        });
        let ticket = Ticket { due, ..ticket };
        let (key, rx) = {
            let mut st = lock(&self.shared.state);
            if st.closed {
                return Err(Refusal::Draining {
                    retry_after: st.retry_after(0),
                });
            }
            let free = st.waiters.is_empty() && st.in_flight < st.capacity;
            if free || st.may_borrow(ticket.tenant) {
                st.in_flight += 1;
                st.waiters.start_at_once(ticket.tenant, ticket.cost);
                return Ok(self.permit(Duration::ZERO, now, ticket));
            }
            if let Some(deadline) = deadline {
                // Told now, not after waiting in vain: the wait the drain rate predicts for
                // where the request would stand.
                let predicted = st.expected_wait(st.waiters.position_of_new(ticket));
                if predicted > deadline {
                    return Err(Refusal::Deadline {
                        retry_after: rate::clamp_retry(predicted - deadline),
                        predicted,
                        deadline,
                    });
                }
            }
            st.enqueue(ticket)?
        };
        let mut waiting = Waiting {
            shared: Arc::clone(&self.shared),
            key,
            rx,
            settled: false,
            holder: self.shared.fair.is_some().then(|| Arc::from(ticket.tenant)),
        };
        // On tokio's clock, which the timer runs on (and a test can pause): what is left of
        // `max_wait` (or of the request's deadline, if sooner) since the arrival.
        let most = deadline.map_or(self.shared.max_wait, |d| d.min(self.shared.max_wait));
        let left = most.saturating_sub(now.elapsed());
        let deadline = tokio::time::Instant::now() + left;
        let outcome = match tokio::time::timeout_at(deadline, &mut waiting.rx).await {
            Ok(received) => {
                waiting.settled = true;
                // The sender lives in the queue until it sends, so an error cannot happen here.
                let draining = || {
                    Outcome::Refused(Refusal::Draining {
                        retry_after: Duration::ZERO,
                    })
                };
                received.unwrap_or_else(|_| draining())
            }
            Err(_elapsed) => waiting.expire(),
        };
        match outcome {
            Outcome::Slot => {
                let granted = Instant::now();
                Ok(self.permit(granted.saturating_duration_since(now), granted, ticket))
            }
            Outcome::Refused(refusal) => Err(refusal),
        }
    }

    /// Refuses all waiters and later arrivals with `Draining`; permits held finish normally.
    pub fn close(&self) {
        lock(&self.shared.state).close();
    }

    /// Requests waiting now.
    pub fn depth(&self) -> usize {
        lock(&self.shared.state).waiters.len()
    }

    /// Slots held now (including ones handed to a waiter that has not woken yet).
    pub fn in_flight(&self) -> usize {
        lock(&self.shared.state).in_flight
    }

    /// With fair share, each backlogged tenant with its weighted service so far and its
    /// requests waiting, least served first (`None`: first come). For `/admin/status`.
    pub fn fair_backlog(&self) -> Option<Vec<(Arc<str>, f64, usize)>> {
        lock(&self.shared.state).waiters.fair_backlog()
    }

    /// Jain's index of the service given to the tenants backlogged whole windows.
    pub fn jain(&self) -> jain::JainSummary {
        lock(&self.shared.state).waiters.jain()
    }

    /// The fair-share weights, when tenants take turns.
    pub fn fair_share(&self) -> Option<FairWeights> {
        self.shared.fair
    }

    /// `Retry-After` the queue would answer now for a request at `position`.
    pub fn retry_after(&self, position: usize) -> Duration {
        lock(&self.shared.state).retry_after(position)
    }

    fn permit(&self, waited: Duration, granted: Instant, ticket: Ticket<'_>) -> Permit {
        let shared = Arc::clone(&self.shared);
        let tenant: Arc<str> = Arc::from(ticket.tenant);
        let holder = shared.fair.is_some().then(|| Arc::clone(&tenant));
        Permit {
            shared,
            waited,
            granted,
            charge: Some((tenant, ticket.cost)),
            holder,
        }
    }
}

/// One admitted request's slot; dropping it frees the slot for the best waiter.
#[derive(Debug)]
pub struct Permit {
    shared: Arc<Shared>,
    waited: Duration,
    granted: Instant,
    /// The tenant and the estimate it was charged (fair share's turn, the fairness measure),
    /// corrected by [`Permit::settle`] or refunded on drop.
    charge: Option<(Arc<str>, f64)>,
    /// With fair share: the tenant holding the slot (counted for borrowing).
    holder: Option<Arc<str>>,
}

impl Permit {
    /// The request's real tokens, weighted, replace the estimate its tenant was charged. A
    /// permit dropped without it refunds the estimate: a request that got no answer was given
    /// no service.
    pub fn settle(&mut self, input_tokens: u64, output_tokens: u64) {
        let Some((tenant, charged)) = self.charge.take() else {
            return;
        };
        let weights = self.shared.fair.unwrap_or_default();
        let service = weights.cost(input_tokens, output_tokens);
        lock(&self.shared.state)
            .waiters
            .settle(&tenant, service - charged);
    }

    /// Time spent queued before admission (zero when a slot was free), for the wait histogram.
    pub fn waited(&self) -> Duration {
        self.waited
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut st = lock(&self.shared.state);
        if let Some((tenant, charged)) = self.charge.take() {
            st.waiters.settle(&tenant, -charged);
        }
        if let Some(tenant) = &self.holder {
            st.waiters.gave_slot(tenant);
        }
        st.release(Some(self.granted.elapsed()));
    }
}

/// A queued waiter; dropping it before it settles takes it out of the queue.
struct Waiting {
    shared: Arc<Shared>,
    key: Key,
    rx: oneshot::Receiver<Outcome>,
    settled: bool,
    /// With fair share, its tenant: a slot handed over as it leaves is given back in its name.
    holder: Option<Arc<str>>,
}

impl Waiting {
    /// At the deadline: leave the queue, or take what was handed over just before.
    fn expire(&mut self) -> Outcome {
        self.settled = true;
        let mut st = lock(&self.shared.state);
        let position = st.position(&self.key);
        let timeout = Outcome::Refused(Refusal::Timeout {
            retry_after: st.retry_after(position),
        });
        if st.waiters.remove(&self.key).is_some() {
            return timeout;
        }
        self.rx.try_recv().unwrap_or(timeout)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut st = lock(&self.shared.state);
        if st.waiters.remove(&self.key).is_none()
            && let Ok(Outcome::Slot) = self.rx.try_recv()
        {
            if let Some(tenant) = &self.holder {
                st.waiters.gave_slot(tenant);
            }
            st.release(None); // handed to us as we left: pass it on
        }
    }
}

#[cfg(test)]
mod tests;
