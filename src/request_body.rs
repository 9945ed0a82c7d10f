//! Accept, the body part: a request body is read within its time (`limits.body_read_timeout`),
//! its size (`limits.max_body_bytes`) and the gateway-wide budget of bodies held at once
//! (`limits.max_buffered_body_bytes`), so slow or huge uploads cannot exhaust memory.
//!
//! The budget counts the memory a body occupies, not the bytes received: the buffer's allocated
//! capacity, rounded up to the pages a large buffer holds resident ([`occupied`]), reserved
//! before it is allocated (a declared `Content-Length` reserves its length up front; a body of
//! unknown length grows in counted steps, see [`next_capacity`]). hyper's frames are slices of
//! its connection read buffer, so each is copied out and dropped at once: holding them would
//! hold that buffer. When a drain starts the budget closes ([`BodyBudget::close`]): a body still
//! arriving is answered 503 with `connection: close`, so an unfinished upload does not hold the
//! exit.
//!
//! An oversized body is refused with 413, but only after reading (and dropping) up to
//! [`DISCARD_LIMIT`] more bytes: a client still uploading then sees the answer instead of a reset
//! connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes};
pub use infergate_engine::edge::BodyLimits;
use infergate_engine::edge::{BodyError, LimitedBody};

use crate::error::GatewayError;

/// Bytes of request bodies held gateway-wide (buffer capacity); shared by every request.
#[derive(Debug, Default)]
pub struct BodyBudget {
    held: AtomicUsize,
    /// Set by [`close`](Self::close): bodies still arriving end with 503.
    closed: AtomicBool,
    /// Wakes the readers of bodies still arriving when the budget closes.
    closing: tokio::sync::Notify,
}

impl BodyBudget {
    /// Bytes held right now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Ends every body still arriving, and any that would wait for bytes from now on, with
    /// [`GatewayError::Draining`] (at the start of a drain: those clients never finished a
    /// request, so they get no grace).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.closing.notify_waiters();
    }

    /// Resolves once the budget is closed.
    async fn closed(&self) {
        let notified = self.closing.notified();
        tokio::pin!(notified);
        // Registered before the flag is read, so a close in between is not missed.
        notified.as_mut().enable();
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        notified.await;
    }
}

/// The smallest step a body of unknown length grows by (a few frames).
const MIN_STEP: usize = 16 * 1024;

/// The capacity to grow a body buffer of `capacity` to, so that `needed` bytes fit: double (so
/// copies stay linear), at least [`MIN_STEP`], never past `ceiling` (the largest body allowed)
/// unless `needed` is (that body fails its size limit anyway).
pub fn next_capacity(capacity: usize, needed: usize, ceiling: usize) -> usize {
    if needed <= capacity {
        return capacity;
    }
    capacity
        .saturating_mul(2)
        .max(MIN_STEP)
        .min(ceiling)
        .max(needed)
}

/// Blocks larger than this get allocator pages of their own (mimalloc's largest size class is
/// 512 KiB); smaller ones share pages with other blocks.
const OWN_PAGES_ABOVE: usize = 512 * 1024;
/// The transparent huge page: mimalloc backs its arenas with them (`MADV_HUGEPAGE`), so a block
/// with pages of its own holds whole 2 MiB pages resident.
const HUGE_PAGE: usize = 2 * 1024 * 1024;

/// The memory a buffer of `bytes` capacity occupies, and so the capacity worth allocating for
/// it: its size, or for a block with pages of its own that size rounded up to whole huge pages
/// (measured: a 6.25 MiB body raised the gateway's RSS by 8 MiB). Never more than `budget`
/// (the whole bound) unless `bytes` itself is: a body the bound can hold is never refused for
/// the rounding.
pub fn occupied(bytes: usize, budget: usize) -> usize {
    if bytes <= OWN_PAGES_ABOVE {
        return bytes;
    }
    bytes
        .div_ceil(HUGE_PAGE)
        .saturating_mul(HUGE_PAGE)
        .min(budget)
        .max(bytes)
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

/// Reads `body` whole (the edge bounds it in size and time), holding the memory its buffer
/// occupies ([`occupied`]) in `budget` within `budget_bytes` gateway-wide. A body that declares
/// its length reserves it up front, one that declares too much is refused before a byte is read,
/// one of unknown length reserves each step of its buffer's growth before the step is
/// allocated, and an oversized one is answered only after the bounded discard. A body still
/// arriving when the budget closes ends with [`GatewayError::Draining`].
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
    let ceiling = body.limits().max_bytes;
    let mut buf = Vec::new();
    if let Some(len) = body.declared() {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        // A length over the limit fails at the first read below, with the discard.
        if !body.limits().too_large(len) {
            let capacity = occupied(len, budget_bytes);
            if !hold.grow_to(capacity, budget_bytes) {
                return Err(busy());
            }
            buf.reserve_exact(capacity);
        }
    }
    let closed = budget.closed();
    tokio::pin!(closed);
    loop {
        // The body first: one that has arrived is read whatever happens to the budget.
        let frame = tokio::select! {
            biased;
            frame = body.frame() => frame,
            () = &mut closed => return Err(GatewayError::Draining),
        };
        let frame = match frame {
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
        let needed = buf.len().saturating_add(data.len());
        if needed > buf.capacity() {
            let capacity = occupied(next_capacity(buf.capacity(), needed, ceiling), budget_bytes);
            if !hold.grow_to(capacity, budget_bytes) {
                return Err(busy());
            }
            buf.reserve_exact(capacity - buf.len());
        }
        buf.extend_from_slice(&data);
        // `data` (a slice of hyper's read buffer) drops here, so that buffer is reused.
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

    #[test]
    fn a_large_buffer_occupies_whole_huge_pages_within_the_bound() {
        const MIB: usize = 1 << 20;
        // Small and medium blocks share pages: their size.
        assert_eq!(occupied(100, 64 * MIB), 100);
        assert_eq!(occupied(512 * 1024, 64 * MIB), 512 * 1024);
        // Past 512 KiB, whole 2 MiB pages.
        assert_eq!(occupied(512 * 1024 + 1, 64 * MIB), 2 * MIB);
        assert_eq!(occupied(6_553_600, 64 * MIB), 8 * MIB);
        assert_eq!(occupied(8 * MIB, 64 * MIB), 8 * MIB);
        // Never past the whole bound for the rounding, never below the size itself.
        assert_eq!(occupied(7 * MIB, 7 * MIB), 7 * MIB);
        assert_eq!(occupied(9 * MIB, 8 * MIB), 9 * MIB);
        assert_eq!(occupied(usize::MAX, usize::MAX), usize::MAX);
    }

    #[test]
    fn a_buffer_grows_by_doubling_within_the_largest_body() {
        // Small first steps are rounded up, so a trickle does not reallocate per frame.
        assert_eq!(next_capacity(0, 10, 1 << 20), MIN_STEP);
        assert_eq!(next_capacity(MIN_STEP, MIN_STEP + 1, 1 << 20), 2 * MIN_STEP);
        // A big frame takes what it needs at once.
        assert_eq!(next_capacity(MIN_STEP, 5 * MIN_STEP, 1 << 20), 5 * MIN_STEP);
        // Doubling stops at the largest body allowed ...
        assert_eq!(next_capacity(768 << 10, (768 << 10) + 1, 1 << 20), 1 << 20);
        // ... unless the body is already past it (it fails its size limit anyway).
        assert_eq!(
            next_capacity(1 << 20, (1 << 20) + 1, 1 << 20),
            (1 << 20) + 1
        );
        // Room left: no growth.
        assert_eq!(next_capacity(100, 100, 1 << 20), 100);
        assert_eq!(
            next_capacity(usize::MAX, usize::MAX, usize::MAX),
            usize::MAX
        );
    }

    /// A test body fed frame by frame through a channel (it ends when the sender drops).
    struct Fed(tokio::sync::mpsc::Receiver<Bytes>);

    impl Body for Fed {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
            self.0
                .poll_recv(cx)
                .map(|b| b.map(|b| Ok(hyper::body::Frame::data(b))))
        }
    }

    fn limits() -> BodyLimits {
        BodyLimits {
            max_bytes: 1 << 20,
            timeout: std::time::Duration::from_secs(30),
        }
    }

    #[tokio::test]
    async fn a_body_of_unknown_length_holds_its_buffers_capacity() {
        let budget = Arc::new(BodyBudget::default());
        // 100 frames of 1,000 bytes: the buffer doubles 16 KiB -> 128 KiB.
        let (tx, rx) = tokio::sync::mpsc::channel(100);
        for _ in 0..100 {
            tx.send(Bytes::from(vec![b'x'; 1000])).await.unwrap();
        }
        drop(tx);
        let body = LimitedBody::new(Fed(rx), None, limits());
        let (bytes, hold) = read_body(body, 1 << 20, &budget).await.unwrap();
        assert_eq!(bytes.len(), 100_000);
        assert_eq!(
            budget.held(),
            128 * 1024,
            "the capacity is held, not the length"
        );
        drop(hold);
        assert_eq!(budget.held(), 0);
        // The same body under a budget smaller than the buffer's last step is refused.
        let (tx, rx) = tokio::sync::mpsc::channel(100);
        for _ in 0..100 {
            tx.send(Bytes::from(vec![b'x'; 1000])).await.unwrap();
        }
        drop(tx);
        let body = LimitedBody::new(Fed(rx), None, limits());
        let refused = read_body(body, 100 * 1024, &budget).await;
        assert!(matches!(refused, Err(GatewayError::BodyMemory { .. })));
        assert_eq!(budget.held(), 0, "a refused body gives back what it held");
    }

    #[tokio::test]
    async fn a_declared_body_holds_its_length_and_a_closed_budget_ends_a_waiting_one() {
        let budget = Arc::new(BodyBudget::default());
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let body = LimitedBody::new(Fed(rx), Some(5000), limits());
        let reader = {
            let budget = budget.clone();
            tokio::spawn(async move { read_body(body, 1 << 20, &budget).await.map(|_| ()) })
        };
        tx.send(Bytes::from(vec![b'x'; 100])).await.unwrap();
        // The reader has the frame once the channel has room again; it reserved 5,000 first.
        let _ = tx.reserve().await.unwrap();
        assert_eq!(budget.held(), 5000, "a declared length is held up front");
        budget.close();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), reader)
            .await
            .expect("a waiting body did not end when the budget closed")
            .unwrap();
        assert!(matches!(ended, Err(GatewayError::Draining)), "{ended:?}");
        assert_eq!(budget.held(), 0);
        // A body that arrived whole is still read after the close.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(Bytes::from_static(b"{}")).await.unwrap();
        drop(tx);
        let body = LimitedBody::new(Fed(rx), Some(2), limits());
        let (bytes, _hold) = read_body(body, 1 << 20, &budget).await.unwrap();
        assert_eq!(&bytes[..], b"{}");
    }
}
