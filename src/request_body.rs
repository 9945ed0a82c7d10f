//! Accept, the body part: a request body is read within its time (`limits.body_read_timeout`),
//! its size (`limits.max_body_bytes`) and the gateway-wide budget of bodies held at once
//! (`limits.max_buffered_body_bytes`), so slow or huge uploads cannot exhaust memory.
//!
//! An oversized body is refused with 413, but only after reading (and dropping) up to
//! [`DISCARD_LIMIT`] more bytes: a client still uploading then sees the answer instead of a reset
//! connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes};
pub use infergate_engine::edge::BodyLimits;
use infergate_engine::edge::{BodyError, LimitedBody};

use crate::error::GatewayError;

/// Bytes of request bodies held gateway-wide; shared by every request.
#[derive(Debug, Default)]
pub struct BodyBudget {
    held: AtomicUsize,
}

impl BodyBudget {
    /// Bytes held right now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// One request's share of the [`BodyBudget`], given back when dropped.
#[derive(Debug)]
pub struct BodyHold {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl BodyHold {
    /// Holds nothing yet.
    pub fn new(budget: Arc<BodyBudget>) -> Self {
        Self { budget, bytes: 0 }
    }

    /// Grows this hold to `bytes` if the budget's total stays within `cap`; false (changing
    /// nothing) when it would not.
    fn grow_to(&mut self, bytes: usize, cap: usize) -> bool {
        let more = bytes.saturating_sub(self.bytes);
        if more == 0 {
            return true;
        }
        let taken = self
            .budget
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(more).filter(|&total| total <= cap)
            });
        if taken.is_ok() {
            self.bytes = bytes;
        }
        taken.is_ok()
    }
}

impl Drop for BodyHold {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The size and time limits of a public request's body as `snapshot` sets them
/// (`limits.max_body_bytes`, `limits.body_read_timeout`): the edge layer reads them per request,
/// and the simulator draws the size line at the same byte.
pub fn body_limits(snapshot: &crate::config::Snapshot) -> BodyLimits {
    BodyLimits {
        max_bytes: snapshot.max_body_bytes,
        timeout: snapshot.connections.body_read_timeout,
    }
}

/// Reads `body` whole (the edge bounds it in size and time), holding its bytes in `budget`
/// within `budget_bytes` gateway-wide. A body that declares its length reserves it up front,
/// one that declares too much is refused before a byte is read, and an oversized one is
/// answered only after the bounded discard.
pub async fn read_body<B>(
    mut body: LimitedBody<B>,
    budget_bytes: usize,
    budget: &Arc<BodyBudget>,
) -> Result<(Bytes, BodyHold), GatewayError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut hold = BodyHold::new(budget.clone());
    let busy = || GatewayError::BodyMemory {
        retry_after_secs: 1,
    };
    if let Some(len) = body.declared() {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        // A length over the limit fails at the first read below, with the discard.
        if !body.limits().too_large(len) && !hold.grow_to(len, budget_bytes) {
            return Err(busy());
        }
    }
    let mut buf = Vec::with_capacity(hold.bytes);
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Err(e)) => {
                if let BodyError::TooLarge { .. } = e {
                    body.discard().await;
                }
                return Err(e.into());
            }
            Some(Ok(frame)) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if !hold.grow_to(buf.len() + data.len(), budget_bytes) {
            return Err(busy());
        }
        buf.extend_from_slice(&data);
    }
    Ok((Bytes::from(buf), hold))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_share_one_budget_and_give_it_back() {
        let budget = Arc::new(BodyBudget::default());
        let mut a = BodyHold::new(budget.clone());
        let mut b = BodyHold::new(budget.clone());
        assert!(a.grow_to(60, 100));
        assert!(!b.grow_to(50, 100), "60 + 50 is over the cap");
        assert_eq!(budget.held(), 60, "a refused grow takes nothing");
        assert!(b.grow_to(40, 100));
        assert!(a.grow_to(50, 100), "shrinking requests take nothing more");
        assert_eq!(budget.held(), 100);
        drop(a);
        assert_eq!(budget.held(), 40);
        assert!(b.grow_to(100, 100));
        drop(b);
        assert_eq!(budget.held(), 0);
    }
}
