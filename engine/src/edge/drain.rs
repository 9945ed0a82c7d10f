//! Graceful shutdown of a listener's connections: [`Drain::shutdown`] asks every watched
//! connection to finish (hyper's graceful shutdown: no new requests, those in progress end) and
//! resolves once all of them have.
//!
//! hyper-util's `GracefulShutdown` does the same through a watch channel whose change future is
//! polled, under its lock, on every wake of every connection (about 650 instructions a request
//! through the gateway). Here a wake costs one atomic load and a waker comparison: a connection's
//! waker is filed once, and again only if its task's waker changes.
//!
//! hyper's graceful shutdown keeps an HTTP/1.1 connection whose first request head is partly
//! read until its header timer fires (it only closes a connection that has read nothing, or one
//! idle between requests). [`Watcher::watch_begun`] drops such a connection when the drain
//! starts instead, so a client that never finished a head does not hold the exit.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

pub use hyper_util::server::graceful::GracefulConnection;

/// The connections of one or more listeners, drained together.
#[derive(Debug, Default)]
pub struct Drain {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Set once, by [`Drain::shutdown`].
    draining: AtomicBool,
    /// Connections watched and not yet ended.
    open: AtomicUsize,
    /// Names each watched connection's waker slot.
    next_id: AtomicU64,
    /// The wakers of the connections that are waiting, woken when draining starts.
    wakers: Mutex<HashMap<u64, Waker>>,
    /// Woken when the last connection ends while draining.
    all_ended: tokio::sync::Notify,
}

/// Whether a connection's first request has begun (its head was parsed and handed to the
/// service), or the drain dropped the connection before it did: see [`Watcher::watch_begun`].
/// Clones share the state.
#[derive(Debug, Clone, Default)]
pub struct Begun(Arc<AtomicU8>);

/// [`Begun`]'s states.
const NOT_BEGUN: u8 = 0;
const BEGUN: u8 = 1;
const DROPPED: u8 = 2;

impl Begun {
    /// Not begun yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes that the first request began (unless the drain dropped the connection first).
    pub fn set(&self) {
        let _ = self
            .0
            .compare_exchange(NOT_BEGUN, BEGUN, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Whether the first request began.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire) == BEGUN
    }

    /// Whether the drain dropped the connection before its first request began.
    pub fn dropped_unbegun(&self) -> bool {
        self.0.load(Ordering::Acquire) == DROPPED
    }

    /// Marks the connection dropped, if its first request has not begun: one or the other.
    fn drop_unbegun(&self) -> bool {
        self.0
            .compare_exchange(NOT_BEGUN, DROPPED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// A handle that watches connections of a [`Drain`] without being able to start it (tasks on
/// other threads hold these; `shutdown` takes the drain itself).
#[derive(Debug, Clone)]
pub struct Watcher {
    shared: Arc<Shared>,
}

impl Drain {
    /// A drain with no connections yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A handle for watching connections.
    pub fn watcher(&self) -> Watcher {
        Watcher {
            shared: self.shared.clone(),
        }
    }

    /// `conn`, shut down gracefully when the drain starts.
    pub fn watch<C: GracefulConnection>(&self, conn: C) -> Watched<C> {
        self.watcher().watch(conn)
    }

    /// Asks every watched connection (those watched later too) to finish, and resolves when all
    /// have ended.
    pub async fn shutdown(self) {
        let shared = self.shared;
        shared.draining.store(true, Ordering::SeqCst);
        let wakers: Vec<Waker> = lock(&shared.wakers).drain().map(|(_, w)| w).collect();
        for waker in wakers {
            waker.wake();
        }
        loop {
            let ended = shared.all_ended.notified();
            tokio::pin!(ended);
            // Registered before the count is read, so a last end in between is not missed.
            ended.as_mut().enable();
            if shared.open.load(Ordering::SeqCst) == 0 {
                return;
            }
            ended.await;
        }
    }
}

impl Watcher {
    /// `conn`, shut down gracefully when the drain starts.
    pub fn watch<C: GracefulConnection>(self, conn: C) -> Watched<C> {
        self.shared.open.fetch_add(1, Ordering::SeqCst);
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        Watched {
            conn: Box::pin(conn),
            shared: self.shared,
            id,
            filed: None,
            shutting_down: false,
            unbegun: None,
        }
    }

    /// `conn`, as [`watch`](Self::watch); but if the drain starts before `begun` is set, the
    /// connection is dropped at once, resolving to `Ok(())` with `begun` saying
    /// [`dropped_unbegun`](Begun::dropped_unbegun) (its caller may still answer on the socket,
    /// e.g. a 408 for a head that was partly sent).
    pub fn watch_begun<C: GracefulConnection>(self, conn: C, begun: Begun) -> Watched<C> {
        let mut watched = self.watch(conn);
        watched.unbegun = Some(begun);
        watched
    }
}

/// A connection watched by a [`Drain`]: resolves to the connection's own output.
pub struct Watched<C> {
    conn: Pin<Box<C>>,
    shared: Arc<Shared>,
    id: u64,
    /// The waker last filed for this connection.
    filed: Option<Waker>,
    shutting_down: bool,
    /// With [`Watcher::watch_begun`]: whether its first request began.
    unbegun: Option<Begun>,
}

impl<C> std::fmt::Debug for Watched<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("id", &self.id)
            .field("shutting_down", &self.shutting_down)
            .finish()
    }
}

impl<C: GracefulConnection> Future for Watched<C> {
    type Output = C::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let this = &mut *self;
        if !this.shutting_down {
            if !this.filed.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                let waker = cx.waker().clone();
                lock(&this.shared.wakers).insert(this.id, waker.clone());
                this.filed = Some(waker);
            }
            // Read after filing: a drain that started before the waker was filed is seen here,
            // one that starts after it wakes the waker.
            if this.shared.draining.load(Ordering::SeqCst) {
                this.shutting_down = true;
                if this.unbegun.as_ref().is_some_and(Begun::drop_unbegun) {
                    return Poll::Ready(Ok(()));
                }
                this.conn.as_mut().graceful_shutdown();
            }
        }
        this.conn.as_mut().poll(cx)
    }
}

impl<C> Drop for Watched<C> {
    fn drop(&mut self) {
        if self.filed.is_some() {
            lock(&self.shared.wakers).remove(&self.id);
        }
        if self.shared.open.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shared.all_ended.notify_waiters();
        }
    }
}

/// The waker table, whatever a panicking holder left in it (wakers only).
fn lock(m: &Mutex<HashMap<u64, Waker>>) -> std::sync::MutexGuard<'_, HashMap<u64, Waker>> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use http_body_util::{BodyExt, Empty, Full};
    use hyper::body::{Bytes, Incoming};
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper::{Request, Response};
    use hyper_util::rt::TokioIo;
    use tokio::io::DuplexStream;
    use tokio::sync::{mpsc, oneshot};

    use super::*;

    /// A served HTTP/1.1 connection over an in-memory pipe, watched by `drain`, whose one route
    /// answers when the test says so (it reports each request it gets on `arrived`).
    fn serve(
        drain: &Drain,
        arrived: mpsc::UnboundedSender<oneshot::Sender<()>>,
    ) -> (DuplexStream, tokio::task::JoinHandle<()>) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let svc = service_fn(move |_req: Request<Incoming>| {
            let arrived = arrived.clone();
            async move {
                let (tx, rx) = oneshot::channel();
                let _ = arrived.send(tx);
                let _ = rx.await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
            }
        });
        let conn = http1::Builder::new().serve_connection(TokioIo::new(server), svc);
        let watched = drain.watch(conn);
        (
            client,
            tokio::spawn(async move {
                let _ = watched.await;
            }),
        )
    }

    /// Sends one request on `io`: while the service holds it (its release comes on `arrived`)
    /// the drain does not end; once released, the answer arrives and the drain ends.
    async fn drain_waits_for_the_request_in_progress(
        drain: Drain,
        io: DuplexStream,
        arrived: &mut mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    ) {
        let mut send = client(io).await;
        let answer = tokio::spawn(async move {
            let res = send.send_request(Request::new(Empty::new())).await.unwrap();
            res.into_body().collect().await.unwrap().to_bytes()
        });
        let release = arrived.recv().await.unwrap();
        let mut shutdown = tokio::spawn(drain.shutdown());
        assert!(
            tokio::time::timeout(Duration::from_millis(100), &mut shutdown)
                .await
                .is_err(),
            "the drain ended with a request still in progress"
        );
        release.send(()).unwrap();
        assert_eq!(answer.await.unwrap(), Bytes::from_static(b"done"));
        tokio::time::timeout(Duration::from_secs(10), shutdown)
            .await
            .expect("the drain did not end after the answer")
            .unwrap();
    }

    async fn client(io: DuplexStream) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .unwrap();
        tokio::spawn(conn);
        send
    }

    #[tokio::test]
    async fn drains_once_the_request_in_progress_has_its_answer() {
        let drain = Drain::new();
        let (arrived_tx, mut arrived) = mpsc::unbounded_channel();
        let (io, served) = serve(&drain, arrived_tx);
        drain_waits_for_the_request_in_progress(drain, io, &mut arrived).await;
        served.await.unwrap();
    }

    #[tokio::test]
    async fn an_idle_connection_closes_and_one_watched_late_is_shut_down_too() {
        let drain = Drain::new();
        let (arrived_tx, _arrived) = mpsc::unbounded_channel();
        // One connection that has served nothing (its task has filed its waker and waits).
        let (_io, idle) = serve(&drain, arrived_tx.clone());
        tokio::task::yield_now().await;
        let watcher = drain.watcher();
        tokio::time::timeout(Duration::from_secs(10), drain.shutdown())
            .await
            .expect("an idle connection held the drain");
        idle.await.unwrap();
        // A connection accepted while draining is shut down at its first poll.
        let (_client, server) = tokio::io::duplex(1024);
        let svc = service_fn(|_req: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        });
        let late = watcher.watch(http1::Builder::new().serve_connection(TokioIo::new(server), svc));
        tokio::time::timeout(Duration::from_secs(10), late)
            .await
            .expect("a connection watched after the drain started stayed open")
            .unwrap();
    }

    /// A connection that sent part of its first head, watched with `watch_begun`; its task
    /// says whether it ended dropped unbegun.
    async fn half_head(drain: &Drain) -> (DuplexStream, tokio::task::JoinHandle<bool>) {
        use hyper_util::server::conn::auto;
        use tokio::io::AsyncWriteExt;
        let (mut client, server) = tokio::io::duplex(1024);
        let begun = Begun::new();
        let svc_begun = begun.clone();
        let svc = service_fn(move |_req: Request<Incoming>| {
            svc_begun.set();
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done")))) }
        });
        let conn = auto::Builder::new(hyper_util::rt::TokioExecutor::new())
            .http1_only()
            .serve_connection(TokioIo::new(server), svc)
            .into_owned();
        let watched = drain.watcher().watch_begun(conn, begun.clone());
        let served = tokio::spawn(async move { watched.await.is_ok() && begun.dropped_unbegun() });
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        (client, served)
    }

    #[tokio::test]
    async fn a_connection_whose_first_head_is_unfinished_is_dropped_when_the_drain_starts() {
        let drain = Drain::new();
        let (_client, served) = half_head(&drain).await;
        // Let hyper read the half head (one turn of its task is enough; more do no harm).
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        tokio::time::timeout(Duration::from_secs(5), drain.shutdown())
            .await
            .expect("a half-sent head held the drain");
        assert!(
            served.await.unwrap(),
            "the connection was not dropped unbegun"
        );
    }

    #[tokio::test]
    async fn watch_begun_leaves_a_begun_request_its_grace() {
        use hyper_util::server::conn::auto;
        let drain = Drain::new();
        let (arrived_tx, mut arrived) = mpsc::unbounded_channel::<oneshot::Sender<()>>();
        let (io, server) = tokio::io::duplex(64 * 1024);
        let begun = Begun::new();
        let svc_begun = begun.clone();
        let svc = service_fn(move |_req: Request<Incoming>| {
            svc_begun.set();
            let arrived = arrived_tx.clone();
            async move {
                let (tx, rx) = oneshot::channel();
                let _ = arrived.send(tx);
                let _ = rx.await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
            }
        });
        let conn = auto::Builder::new(hyper_util::rt::TokioExecutor::new())
            .http1_only()
            .serve_connection(TokioIo::new(server), svc)
            .into_owned();
        let watched = drain.watcher().watch_begun(conn, begun.clone());
        let served = tokio::spawn(async move { watched.await.is_ok() && begun.is_set() });
        drain_waits_for_the_request_in_progress(drain, io, &mut arrived).await;
        assert!(served.await.unwrap());
    }
}
