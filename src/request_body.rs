//! Accept, the body part: a request body is read within its time (`limits.body_read_timeout`),
//! its size (`limits.max_body_bytes`) and the gateway-wide budget of bodies held at once
//! (`limits.max_buffered_body_bytes`), so slow or huge uploads cannot exhaust memory.
//!
//! An oversized body is refused with 413, but only after reading (and dropping) up to
//! [`DISCARD_LIMIT`] more bytes: a client still uploading then sees the answer instead of a reset
//! connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes};
use tokio::time::Instant;

use crate::error::GatewayError;

/// Most bytes of an oversized body read and dropped before the 413 is sent.
pub const DISCARD_LIMIT: usize = 8 * 1024 * 1024;
/// Longest time spent dropping an oversized body before the 413 is sent.
const DISCARD_TIME: Duration = Duration::from_secs(2);

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

/// The bounds one body is read under.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Largest body.
    pub max_bytes: usize,
    /// Bodies held gateway-wide.
    pub budget_bytes: usize,
    /// Time for the whole body.
    pub timeout: Duration,
}

impl BodyLimits {
    /// The limits a snapshot sets (`limits.max_body_bytes`, `max_buffered_body_bytes`,
    /// `body_read_timeout`).
    pub fn of(snapshot: &crate::config::Snapshot) -> Self {
        Self {
            max_bytes: snapshot.max_body_bytes,
            budget_bytes: snapshot.max_buffered_body_bytes,
            timeout: snapshot.connections.body_read_timeout,
        }
    }

    /// Whether a body of `len` bytes is over the size limit (refused with 413). Shared with the
    /// simulator, so both draw the line at the same byte.
    pub fn too_large(&self, len: usize) -> bool {
        len > self.max_bytes
    }
}

/// Reads `body` whole under `limits`, holding its bytes in `budget`. `declared` is the
/// Content-Length header, when present: a body that declares too much is refused before a byte
/// is read (after the bounded discard), and one that fits reserves its size up front.
pub async fn read_body<B>(
    mut body: B,
    declared: Option<u64>,
    limits: BodyLimits,
    budget: &Arc<BodyBudget>,
) -> Result<(Bytes, BodyHold), GatewayError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let deadline = Instant::now() + limits.timeout;
    let mut hold = BodyHold::new(budget.clone());
    let busy = || GatewayError::BodyMemory {
        retry_after_secs: 1,
    };
    if let Some(len) = declared {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if limits.too_large(len) {
            discard(&mut body, deadline).await;
            return Err(GatewayError::PayloadTooLarge(limits.max_bytes));
        }
        if !hold.grow_to(len, limits.budget_bytes) {
            return Err(busy());
        }
    }
    let mut buf = Vec::with_capacity(hold.bytes);
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(GatewayError::BodyTimeout(limits.timeout)),
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(GatewayError::bad_request(
                    format!("could not read the request body: {e}"),
                    None,
                ));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let total = buf.len() + data.len();
        if limits.too_large(total) {
            discard(&mut body, deadline).await;
            return Err(GatewayError::PayloadTooLarge(limits.max_bytes));
        }
        if !hold.grow_to(total, limits.budget_bytes) {
            return Err(busy());
        }
        buf.extend_from_slice(&data);
    }
    Ok((Bytes::from(buf), hold))
}

/// Reads and drops up to [`DISCARD_LIMIT`] bytes (for at most [`DISCARD_TIME`], and never past
/// the body's own deadline), so a client still sending an oversized body reaches the 413.
async fn discard<B: Body<Data = Bytes> + Unpin>(body: &mut B, deadline: Instant) {
    let until = deadline.min(Instant::now() + DISCARD_TIME);
    let mut dropped = 0usize;
    while dropped < DISCARD_LIMIT {
        match tokio::time::timeout_at(until, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                dropped += frame.data_ref().map_or(0, Bytes::len);
            }
            _ => return,
        }
    }
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
