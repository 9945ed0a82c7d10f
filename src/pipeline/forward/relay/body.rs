//! The proxied response body: passes each upstream frame through the moment it arrives, measures
//! time to first byte and the gaps between chunks, enforces the idle and total timeouts, ends a
//! failed stream (a broken connection, an error event, no `[DONE]`: [`stream_end`]) with an SSE
//! error event instead of a silent truncation, holds the worker's in-flight guard until the body
//! ends or the client goes away, and then tells the worker's health how the request went.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Bytes, Frame};
use tokio::time::{Sleep, sleep_until};

use super::stream_end::{self, Fault, Tail};
use super::usage::UsageTap;
use crate::degrade::live::PoolDegradation;
use crate::error::{BoxError, GatewayError};
use crate::metrics::GatewayMetrics;
use crate::usage_check::TokenUsage;
use crate::workers::h1::WorkerBody;
use crate::workers::state::{Attempt, InFlightGuard, PrefillGuard};

/// How a proxied body ended, for the account phase.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EndReport {
    /// URL of the worker that answered.
    pub worker: String,
    /// Usage reported by the worker, when it arrived.
    pub usage: Option<TokenUsage>,
    /// Streamed content events that reached the client (fallback measure of completion
    /// tokens; a worker's error event is none).
    pub content_events: u64,
    /// True when the body ended normally (not an upstream failure or a client that left).
    pub completed: bool,
    /// HTTP status the worker answered; for a whole answer held back and failed before it was
    /// sent, the status the client got instead (502, 504).
    pub status: u16,
    /// Time from the request's arrival to the first body bytes.
    pub ttft: Option<std::time::Duration>,
    /// Longest gap between two body chunks.
    pub max_gap: Option<std::time::Duration>,
    /// The client went away before the end (not the worker's fault).
    pub client_gone: bool,
    /// The answer was a stream.
    pub stream: bool,
    /// The engine's flight record, as the tap found it.
    pub flight: crate::trace::Flight,
    /// The answer's text, when the request is in the quality sample.
    pub capture: Option<Box<crate::quality::capture::Capture>>,
}

/// Called exactly once when the body ends, fails or is dropped.
pub type OnEnd = Box<dyn FnOnce(EndReport) + Send + Sync>;

/// Timing limits of one proxied body.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BodyLimits {
    /// Longest allowed silence between chunks.
    pub idle: Duration,
    /// Deadline for the whole request, from its arrival.
    pub deadline: tokio::time::Instant,
}

/// Per-request context the body reports to when it ends.
pub struct BodyReport {
    /// Metrics to observe into.
    pub metrics: Arc<GatewayMetrics>,
    /// The pool's per-request series.
    pub series: Arc<crate::metrics::PoolSeries>,
    /// When the gateway received the request.
    pub started: Instant,
    /// True when the first byte was already observed (headers count for non-streams).
    pub is_stream: bool,
    /// The pool's degradation signals, fed with the time to first token.
    pub degrade: Arc<PoolDegradation>,
    /// HTTP status of the upstream response.
    pub status: u16,
    /// URL of the worker that answered.
    pub worker: String,
    /// The request's id, for the log line of a failure.
    pub request_id: String,
}

/// How a body ended, for the account and the worker's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Read to its end, and whole.
    Complete,
    /// The worker failed it (the `kind` of `infergate_upstream_errors_total`).
    Failed(&'static str),
    /// The client went away: says nothing about the worker.
    ClientGone,
}

/// The idle and total timers of a body that had to wait for its worker.
struct Timers {
    idle: Pin<Box<Sleep>>,
    deadline: Pin<Box<Sleep>>,
}

/// Streams an upstream body to the client.
pub struct ProxyBody {
    /// The worker's body; it holds the connection, given back to the worker once the body has
    /// been read to its end (closed otherwise).
    inner: WorkerBody,
    guard: Option<InFlightGuard>,
    /// The worker's pending-prefill count for this request, released at the first data frame.
    prefill: Option<PrefillGuard>,
    idle: Duration,
    /// When the worker's silence becomes an idle timeout (pushed back by each data frame).
    idle_until: tokio::time::Instant,
    /// The whole request's deadline.
    deadline: tokio::time::Instant,
    /// Armed only when the worker keeps the body waiting: most whole answers arrive with their
    /// headers and never touch the timer wheel.
    timers: Option<Timers>,
    report: BodyReport,
    last_chunk: Option<Instant>,
    first_chunk: Option<Instant>,
    max_gap: Option<std::time::Duration>,
    done: bool,
    tap: UsageTap,
    on_end: Option<OnEnd>,
    /// The request's turn on the worker, judged when the body ends.
    turn: Option<Attempt>,
    /// The endpoint's streams end with `data: [DONE]`: one that stops before it is cut short.
    expects_done: bool,
    /// The whole answer is held back until it is complete: a failure still becomes the
    /// client's status.
    held: bool,
}

impl ProxyBody {
    /// Wraps `inner`; `guard` is released and `on_end` called when this body ends or is dropped.
    pub fn new(
        inner: WorkerBody,
        guard: InFlightGuard,
        limits: BodyLimits,
        report: BodyReport,
        tap: UsageTap,
        on_end: Option<OnEnd>,
    ) -> Self {
        Self {
            tap,
            on_end,
            inner,
            guard: Some(guard),
            prefill: None,
            idle: limits.idle,
            idle_until: tokio::time::Instant::now() + limits.idle,
            deadline: limits.deadline,
            timers: None,
            report,
            last_chunk: None,
            first_chunk: None,
            max_gap: None,
            done: false,
            turn: None,
            expects_done: false,
            held: false,
        }
    }

    /// Judges `turn` (the worker's health) when the body ends.
    pub fn with_turn(mut self, turn: Option<Attempt>) -> Self {
        self.turn = turn;
        self
    }

    /// A stream that must end with `data: [DONE]` (OpenAI's chat and completions streams).
    pub fn expecting_done(mut self, expects_done: bool) -> Self {
        self.expects_done = expects_done;
        self
    }

    /// Marks the answer as held back until complete (see [`super::hold`]).
    pub fn held(mut self) -> Self {
        self.held = true;
        self
    }

    /// Holds `prefill` until the first data frame (or the end).
    pub fn with_prefill(mut self, prefill: PrefillGuard) -> Self {
        self.prefill = Some(prefill);
        self
    }

    fn finish(&mut self, ending: Ending) {
        if !self.done {
            self.done = true;
            let (completed, client_gone) = match ending {
                Ending::Complete => (true, false),
                Ending::Failed(_) => (false, false),
                Ending::ClientGone => (false, true),
            };
            self.judge(ending);
            let r = &self.report;
            let now = Instant::now();
            r.series
                .e2e
                .observe(now.duration_since(r.started).as_secs_f64());
            // Read to its end, the answer left the connection clean for the next request.
            if let (true, Some(guard)) = (completed, &self.guard)
                && let Some(conn) = self.inner.take_reusable()
            {
                guard.worker().conns.put(conn, now);
            }
            // The worker is free before the end hook frees the admission slot: the queue then
            // sees it free when it picks who goes next (fair share's locality view).
            self.guard = None;
            self.prefill = None;
            if let Some(on_end) = self.on_end.take() {
                on_end(EndReport {
                    worker: std::mem::take(&mut self.report.worker),
                    usage: self.tap.usage,
                    content_events: self.tap.content_events,
                    completed,
                    status: self.report.status,
                    ttft: self
                        .first_chunk
                        .map(|t| t.duration_since(self.report.started)),
                    max_gap: self.max_gap,
                    client_gone,
                    stream: self.report.is_stream,
                    flight: std::mem::take(&mut self.tap.flight),
                    capture: self.tap.capture.take(),
                });
            }
        }
    }

    /// Tells the worker's health how its request went. A client that left, or a request that
    /// ran into its own total deadline (a long answer), says nothing about the worker.
    fn judge(&mut self, ending: Ending) {
        let Some(turn) = self.turn.take() else { return };
        let failure = match ending {
            Ending::Complete => None,
            Ending::Failed(kind) if kind != "total_timeout" => Some(kind),
            Ending::Failed(_) | Ending::ClientGone => return,
        };
        let r = &self.report;
        super::passive_health::judge(turn, failure, &r.metrics, &r.series.pool, &r.request_id);
    }

    /// Records the timing of a data frame and pushes the idle deadline back.
    fn on_data(&mut self) {
        let now = Instant::now();
        let r = &self.report;
        match self.last_chunk {
            None if r.is_stream => {
                let ttft = now.duration_since(r.started);
                r.series.ttft.observe(ttft.as_secs_f64());
                r.degrade.record_ttft(ttft);
            }
            None => {}
            Some(prev) => {
                let gap = now.duration_since(prev);
                r.series.itl.observe(gap.as_secs_f64());
                self.max_gap = Some(self.max_gap.map_or(gap, |m| m.max(gap)));
            }
        }
        if self.first_chunk.is_none() {
            self.first_chunk = Some(now);
            self.prefill = None;
        }
        self.last_chunk = Some(now);
        self.idle_until = tokio::time::Instant::from_std(now) + self.idle;
    }

    /// Whether the total or the idle limit has passed while the worker keeps the body waiting;
    /// `cx` is woken when one of them does.
    fn poll_timers(&mut self, cx: &mut Context<'_>) -> Option<(GatewayError, &'static str)> {
        let (idle_until, deadline) = (self.idle_until, self.deadline);
        let timers = self.timers.get_or_insert_with(|| Timers {
            idle: Box::pin(sleep_until(idle_until)),
            deadline: Box::pin(sleep_until(deadline)),
        });
        if timers.idle.deadline() != idle_until {
            timers.idle.as_mut().reset(idle_until);
        }
        if timers.deadline.as_mut().poll(cx).is_ready() {
            return Some((
                GatewayError::UpstreamTimeout("the request exceeded its total timeout".into()),
                "total_timeout",
            ));
        }
        if timers.idle.as_mut().poll(cx).is_ready() {
            return Some((
                GatewayError::UpstreamTimeout(format!(
                    "the worker sent nothing for {:?}",
                    self.idle
                )),
                "idle_timeout",
            ));
        }
        None
    }

    /// Ends the body because of `err`: an SSE stream gets an error event, anything else an error.
    fn fail(
        &mut self,
        err: GatewayError,
        kind: &'static str,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.fail_after(Bytes::new(), err, kind)
    }

    /// Ends a stream with `sent` (what came before the failure, still the client's) and the
    /// error event of `err`; any other body with `err`.
    fn fail_after(
        &mut self,
        sent: Bytes,
        err: GatewayError,
        kind: &'static str,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let r = &self.report;
        r.metrics
            .upstream_errors
            .with_label_values(&[&r.series.pool, kind])
            .inc();
        if let Some(g) = &self.guard {
            tracing::warn!(request_id = r.request_id, worker = %g.worker().url, error = %err, "upstream failed mid-response");
        }
        let is_stream = self.report.is_stream;
        if self.held {
            self.report.status = err.status().as_u16();
        }
        self.finish(Ending::Failed(kind));
        if is_stream {
            let event = err.sse_event();
            if sent.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(event))));
            }
            let mut out = Vec::with_capacity(sent.len() + event.len());
            out.extend_from_slice(&sent);
            out.extend_from_slice(&event);
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))))
        } else {
            Poll::Ready(Some(Err(Box::new(err))))
        }
    }
}

impl ProxyBody {
    /// The bytes the tap held back at the worker's end of the body (an unterminated last
    /// event), and the stream's fault if it ended broken: an error event (then dropped) or no
    /// `[DONE]`.
    fn last_bytes(&mut self) -> (Bytes, Option<Fault>) {
        let rest = self.tap.flush();
        if !self.report.is_stream {
            return (rest, None);
        }
        let (rest, saw_error, saw_done) = match stream_end::tail(&rest) {
            Tail::Error => (Bytes::new(), true, self.tap.saw_done),
            Tail::Done => (rest, self.tap.saw_error, true),
            Tail::Other => (rest, self.tap.saw_error, self.tap.saw_done),
        };
        (
            rest,
            stream_end::at_end(self.expects_done, saw_error, saw_done),
        )
    }

    /// Ends a stream whose frame `data` holds an error event: what came before it goes to the
    /// client, then the gateway's own error event; the worker's event and the rest do not.
    fn cut_at_error(&mut self, data: Bytes) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let at = stream_end::error_event_at(&data).unwrap_or(data.len());
        let sent = data.slice(..at);
        if !sent.is_empty() {
            self.on_data();
        }
        let fault = Fault::ErrorEvent;
        self.fail_after(sent, fault.error(), fault.kind())
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let frame = match frame.into_data() {
                        Ok(data) => {
                            let mut data = this.tap.feed(data);
                            if this.tap.saw_error {
                                return this.cut_at_error(data);
                            }
                            // A body with a content-length is complete now: hyper stops
                            // polling once it has written that many bytes, so settle here.
                            let end = this.inner.is_end_stream();
                            let mut fault = None;
                            if end {
                                let (rest, f) = this.last_bytes();
                                fault = f;
                                if !rest.is_empty() {
                                    let mut joined = data.to_vec();
                                    joined.extend_from_slice(&rest);
                                    data = Bytes::from(joined);
                                }
                            }
                            // Timed before the settlement, so the account sees its first byte.
                            if !data.is_empty() {
                                this.on_data();
                            }
                            if let Some(f) = fault {
                                return this.fail_after(data, f.error(), f.kind());
                            }
                            if end {
                                this.finish(Ending::Complete);
                            }
                            if data.is_empty() {
                                continue;
                            }
                            Frame::data(data)
                        }
                        Err(other) => other,
                    };
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(Some(Err(e))) => {
                    return this.fail(
                        GatewayError::UpstreamUnavailable(format!(
                            "the worker failed mid-response: {e}"
                        )),
                        "mid_stream",
                    );
                }
                Poll::Ready(None) => {
                    let (rest, fault) = this.last_bytes();
                    if !rest.is_empty() {
                        this.on_data();
                    }
                    if let Some(f) = fault {
                        return this.fail_after(rest, f.error(), f.kind());
                    }
                    this.finish(Ending::Complete);
                    if rest.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(rest))));
                }
                Poll::Pending => {
                    if let Some((err, kind)) = this.poll_timers(cx) {
                        return this.fail(err, kind);
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// Resolves once the drain's grace is over (never, if the sender is gone without it).
pub async fn grace_ended(rx: &mut tokio::sync::watch::Receiver<bool>) {
    if rx.wait_for(|over| *over).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// How long a stream's last error event may wait for its client at the end of the grace.
const GRACE_END_WRITE: Duration = Duration::from_millis(500);

/// A response body fed by a task that polls a [`ProxyBody`], one frame ahead of the client.
///
/// hyper polls a response body only when it can write: a client that stops reading (a zero
/// HTTP/2 window, a full TCP buffer) would leave the upstream body, its worker slot and its timers
/// unpolled forever. The task notices instead: when the client has not taken a frame for `stall`,
/// it drops the upstream (releasing the worker, accounted as a client that went away) and the
/// response ends in an error, which resets the HTTP/2 stream or closes the HTTP/1 connection.
pub struct ClientPaced {
    rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
    stalled: Arc<std::sync::atomic::AtomicBool>,
}

impl ClientPaced {
    /// Starts the task that pumps `body`; `metrics` counts stalled clients.
    /// At the end of a drain's grace (`grace_over`), the client gets an SSE error event and
    /// `[DONE]` instead of a cut connection.
    pub fn new(
        body: ProxyBody,
        stall: Duration,
        metrics: Arc<GatewayMetrics>,
        mut grace_over: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stalled.clone();
        tokio::spawn(async move {
            let mut body = std::pin::pin!(body);
            loop {
                // A client that leaves while the worker is silent (a long prefill) is noticed now,
                // not at the worker's next frame.
                let frame = tokio::select! {
                    frame = http_body_util::BodyExt::frame(&mut body) => frame,
                    () = tx.closed() => return,
                    () = grace_ended(&mut grace_over) => {
                        let end = Frame::data(GatewayError::Draining.sse_event());
                        if let Ok(Ok(permit)) = tokio::time::timeout(GRACE_END_WRITE, tx.reserve()).await {
                            permit.send(Ok(end));
                        }
                        return;
                    }
                };
                let Some(frame) = frame else { return };
                match tokio::time::timeout(stall, tx.reserve()).await {
                    Ok(Ok(permit)) => permit.send(frame),
                    // The client went away: dropping the body accounts for it.
                    Ok(Err(_)) => return,
                    Err(_) => {
                        flag.store(true, std::sync::atomic::Ordering::Release);
                        metrics
                            .client_timeouts
                            .with_label_values(&["client_stalled"])
                            .inc();
                        return;
                    }
                }
            }
        });
        Self { rx, stalled }
    }
}

impl Body for ClientPaced {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(None) if self.stalled.load(std::sync::atomic::Ordering::Acquire) => {
                Poll::Ready(Some(Err("the client stopped reading the response".into())))
            }
            other => other,
        }
    }
}

impl Drop for ProxyBody {
    fn drop(&mut self) {
        // The client went away (or the response was discarded): account what happened.
        self.finish(Ending::ClientGone);
    }
}
