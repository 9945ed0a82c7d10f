//! Forwards a routed request to its worker: send, and before the first byte retry another worker
//! (routed again, without those tried) on a failure the error table marks retryable (a connect
//! failure, a 503, an ejection), within the retry budget. Each request is a turn on its worker
//! (one probe at a time for a worker back from an ejection), judged when it fails or its body
//! ends: passive health ([`super::passive_health`]). A whole answer is held until complete
//! ([`super::hold`]).

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{HeaderMap, Response, StatusCode};

use super::attempts::{Attempts, FailedAttempt};
use super::body::{BodyLimits, BodyReport, ClientPaced, OnEnd, ProxyBody, grace_ended};
use super::hold::{HOLD_MAX_BYTES, Held, hold};
use super::passive_health::judge;
use super::usage::UsageTap;
use crate::error::{GatewayError, ResBody};
use crate::metrics::GatewayMetrics;
use crate::routing::features::DEFAULT_BLOCK_BYTES;
use crate::routing::{Decision, Feedback, ROUTE_CACHED_HEADER, RequestFeatures};
use crate::usage_check::TokenUsage;
use crate::workers::conns::SendError;
use crate::workers::h1::{RequestHead, WorkerBody};
use crate::workers::pool::PoolRuntime;
use crate::workers::pool::Routed;
use crate::workers::state::{Attempt, KvEventsState, OutlierSettings, Warmth, WorkerState};
use infergate_engine::kv_events::{PREFIX_KEYS_HEADER, PrefixKeys};
use infergate_engine::server::NOT_READY_HEADER;

/// Timeouts and retry budget of forwarding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ForwardSettings {
    /// Time for the worker's response headers.
    pub first_byte_timeout: Duration,
    /// Longest silence between body chunks.
    pub idle_timeout: Duration,
    /// Whole-request limit.
    pub total_timeout: Duration,
    /// Extra attempts on other workers before the first byte.
    pub retries: u32,
    /// Passive health: failed requests in a row that eject a worker, and for how long.
    pub outlier: OutlierSettings,
    /// Whether answers name their pool and worker (`debug_headers`).
    pub debug_headers: bool,
    /// Time to open a connection to a worker.
    pub connect_timeout: Duration,
}

/// One request on its way upstream.
pub struct Outbound<'a> {
    /// Path and query to call on the worker, e.g. `/v1/chat/completions`.
    pub path: &'static str,
    /// The (possibly rewritten) JSON body.
    pub body: Bytes,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// The endpoint's streams end with `data: [DONE]` (chat and completions; not Responses).
    pub expects_done: bool,
    /// Route by load even in a cache-aware pool (embeddings leave no KV to reuse).
    pub by_load: bool,
    /// Routing inputs.
    pub features: &'a RequestFeatures,
    /// Request id to propagate.
    pub request_id: &'a str,
    /// `traceparent` to propagate, if the client sent one.
    pub traceparent: Option<&'a HeaderValue>,
    /// When the gateway received the request.
    pub started: Instant,
    /// Remove the usage-only SSE chunk (the gateway asked for it, the client did not).
    pub hide_usage_chunk: bool,
    /// Makes the account phase's hook when a worker answers (not before: a request no worker
    /// answered is accounted by its caller), given the attempts that led there; the hook is
    /// called once, when the body ends.
    pub on_end: &'a mut (dyn FnMut(Attempts) -> Option<OnEnd> + Send),
    /// Turns true when the drain's grace is over.
    pub grace_over: &'a tokio::sync::watch::Receiver<bool>,
    /// Collect the answer's text for the quality signals (the request is sampled).
    pub capture: bool,
}

const REQUEST_ID: &str = "x-request-id";
const FLIGHT_HEADER: HeaderName = HeaderName::from_static(infergate_engine::flight::FLIGHT_HEADER);
const TRACEPARENT: &str = "traceparent";

/// Headers that belong to one connection and are never forwarded.
const HOP_BY_HOP: [HeaderName; 7] = [
    hyper::header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    hyper::header::TRANSFER_ENCODING,
    hyper::header::TE,
    hyper::header::TRAILER,
    hyper::header::UPGRADE,
];

/// Sends `out` to `first` (the route phase's pick among `pool`'s workers) and returns its
/// response with the body streaming through.
pub async fn forward(
    pool: &PoolRuntime,
    first: Routed,
    out: Outbound<'_>,
    settings: ForwardSettings,
    metrics: &Arc<GatewayMetrics>,
) -> Result<Response<ResBody>, GatewayError> {
    let mut tried: Vec<u64> = Vec::new();
    let deadline = tokio::time::Instant::from_std(out.started) + settings.total_timeout;
    // Built only when an attempt fails: most requests never need it.
    let mut last_err: Option<GatewayError> = None;
    let no_worker = || GatewayError::NoHealthyWorker(pool.name.clone());
    let mut next = Some(first);
    // Empty (no allocation) unless an attempt fails: the trace's client spans.
    let mut attempts = Attempts::default();
    for attempt in 0..=settings.retries {
        let Some((worker, decision, turn)) =
            claim(pool, &mut next, &out, &mut tried, settings, metrics)
        else {
            return Err(last_err.unwrap_or_else(no_worker));
        };
        if attempt > 0 {
            metrics.retries.with_label_values(&[&pool.name]).inc();
        }
        let guard = worker.start_request();
        // Until its first token, this request's uncached prompt is queued work on the worker.
        let prefill = worker.start_prefill(decision.prefill);
        let precise = worker.kv_events() == KvEventsState::Live;
        let head = request_head(&worker, &out, precise);
        let began = Instant::now();
        let mut turn = Some(turn);
        let mut failed = |kind| {
            if let Some(turn) = turn.take() {
                note_failure(pool, &worker, turn, metrics, out.request_id, kind);
            }
        };
        // Pinned here and lent to the wait, so the wait's future does not hold a second copy.
        let request = std::pin::pin!(worker.conns.send(head, &out.body, settings.connect_timeout));
        let waited = wait_for_answer(request, &worker, out.grace_over, settings).await;
        // A worker silent past the first-byte timeout is left (its connection closed, which
        // cancels the request on the engine), so another may take the request, within the
        // retry budget and the total deadline: nothing reached the client yet.
        let silent = matches!(waited, Waited::TimedOut);
        let why = waited.failure();
        let sent = match waited {
            Waited::Draining => Err(GatewayError::Draining),
            Waited::Ejected => {
                metrics
                    .upstream_errors
                    .with_label_values(&[&pool.name, "ejected"])
                    .inc();
                Err(GatewayError::WorkerEjected(worker.url.clone()))
            }
            Waited::TimedOut => {
                failed("first_byte_timeout");
                Err(GatewayError::UpstreamTimeout(format!(
                    "a worker of pool `{}` sent no response within {:?}",
                    pool.name, settings.first_byte_timeout
                )))
            }
            // A refused connection, or a pooled keep-alive connection to a worker that just
            // died (reset before any response).
            Waited::Failed(e) => {
                let kind = if e.is_connect() { "connect" } else { "send" };
                failed(kind);
                Err(GatewayError::UpstreamUnavailable(format!(
                    "a worker of pool `{}` is unreachable: {e}",
                    pool.name
                )))
            }
            // The last attempt's 503, or one no other worker could take instead, goes to the
            // client as the worker sent it.
            Waited::Answered(res)
                if res.status() == StatusCode::SERVICE_UNAVAILABLE
                    && attempt < settings.retries
                    && another_worker(pool, &tried, worker.key) =>
            {
                if res.headers().contains_key(NOT_READY_HEADER) && pool.dialect.has_ready() {
                    // Restarted and warming since the last poll: out until `/ready` says 200.
                    worker.set_warmth(Warmth::Warming);
                }
                failed("status_503");
                Err(GatewayError::UpstreamUnavailable(format!(
                    "the workers of pool `{}` are overloaded",
                    pool.name
                )))
            }
            Waited::Answered(res) => Ok(res),
        };
        // Nothing reached the client yet: the error table says which failures another worker
        // may take.
        let res = match sent {
            Ok(answered) => answered,
            Err(e) if e.retryable() || silent => {
                attempts.failed.push(FailedAttempt {
                    worker: worker.url.clone(),
                    began,
                    ended: Instant::now(),
                    error: why,
                });
                tried.push(worker.key);
                last_err = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let status = res.status();
        if status.is_server_error() {
            failed("status_5xx");
        }
        let (parts, body) = res.into_parts();
        let is_stream = out.stream && status.is_success();
        let body = ProxyBody::new(
            body,
            guard,
            BodyLimits {
                idle: settings.idle_timeout,
                deadline,
            },
            BodyReport {
                metrics: metrics.clone(),
                series: pool.series.clone(),
                started: out.started,
                is_stream,
                degrade: pool.degrade.clone(),
                status: status.as_u16(),
                worker: worker.url.clone(),
                request_id: out.request_id.to_owned(),
            },
            UsageTap::new(is_stream, out.hide_usage_chunk)
                .with_flight(
                    parts.headers.get(FLIGHT_HEADER).map(HeaderValue::as_bytes),
                    !settings.debug_headers,
                )
                .with_capture(out.capture),
            Some(with_feedback(
                pool,
                out.features,
                (out.on_end)(Attempts {
                    answered: Some(began),
                    ..std::mem::take(&mut attempts)
                }),
                (worker.key, decision),
            )),
        )
        .with_prefill(prefill)
        // Anything but a 5xx is judged by how its body ends.
        .with_turn(turn)
        .expecting_done(is_stream && out.expects_done);
        if !is_stream {
            let ttft = out.started.elapsed();
            pool.series.ttft.observe(ttft.as_secs_f64());
            pool.degrade.record_ttft(ttft);
        }
        // A stream must be paced by its client (one that stops reading would pin the worker);
        // a whole answer is held until complete, so a body the worker breaks off is a 502, not
        // a truncated 200 (its end already accounted it with that status).
        let body = if is_stream {
            ClientPaced::new(
                body,
                settings.idle_timeout,
                metrics.clone(),
                out.grace_over.clone(),
            )
            .boxed()
        } else {
            match hold(body, HOLD_MAX_BYTES).await {
                Held::Ready(held) => held.boxed(),
                Held::Failed(e) => return Ok(e.into_response()),
            }
        };
        // The worker's header map, reused: hop-by-hop headers out. Not reserved ahead: the map
        // hyper parsed has room for the request id, and a reserve rehashes it every time.
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers);
        if is_stream {
            // The gateway may drop events it added or reads (the usage chunk, the flight
            // comment): a worker's length would promise the client bytes that never come.
            headers.remove(hyper::header::CONTENT_LENGTH);
        }
        if !settings.debug_headers {
            // The engine's flight record is the gateway's to read (the trace file).
            headers.remove(FLIGHT_HEADER);
        }
        let mut response = Response::new(body);
        *response.status_mut() = parts.status;
        *response.headers_mut() = headers;
        if settings.debug_headers {
            let h = response.headers_mut();
            if let Ok(v) = HeaderValue::from_str(&pool.name) {
                h.insert("x-infergate-pool", v);
            }
            if let Ok(v) = HeaderValue::from_str(&worker.url) {
                h.insert("x-infergate-worker", v);
            }
            if let Ok(v) = HeaderValue::from_str(&decision.route_cached_value()) {
                h.insert(ROUTE_CACHED_HEADER, v);
            }
        }
        return Ok(response);
    }
    Err(last_err.unwrap_or_else(no_worker))
}

/// How a wait for a worker's response headers ended.
enum Waited {
    Answered(Response<WorkerBody>),
    Failed(SendError),
    TimedOut,
    /// The worker was ejected meanwhile (hung, or dead without closing): it will not answer.
    Ejected,
    /// The drain's grace ended meanwhile.
    Draining,
}

impl Waited {
    /// Why the attempt failed, for its trace (`status_503` for an answer that is retried; an
    /// answer that is relayed never asks).
    fn failure(&self) -> &'static str {
        match self {
            Waited::Answered(_) => "status_503",
            Waited::Failed(e) if e.is_connect() => "connect",
            Waited::Failed(_) => "send",
            Waited::TimedOut => "first_byte_timeout",
            Waited::Ejected => "ejected",
            Waited::Draining => "draining",
        }
    }
}

/// A wait past this also watches for the worker's ejection and the end of the grace. Most
/// answers arrive sooner, and each watch is a waiter on a lock every request to the worker (or
/// the whole gateway) shares, taken twice: a fast request does without.
const WATCH_AFTER: Duration = Duration::from_millis(50);

/// Waits up to the first-byte timeout for `request`'s response headers: the first
/// [`WATCH_AFTER`] on the request alone, the rest also watching for `worker`'s ejection and the
/// end of the drain's grace.
async fn wait_for_answer(
    mut request: Pin<&mut impl Future<Output = Result<Response<WorkerBody>, SendError>>>,
    worker: &crate::workers::state::WorkerState,
    grace_over: &tokio::sync::watch::Receiver<bool>,
    settings: ForwardSettings,
) -> Waited {
    let answered = |sent: Result<_, SendError>| match sent {
        Ok(res) => Waited::Answered(res),
        Err(e) => Waited::Failed(e),
    };
    // Read before the request is first polled: an ejection from now on ends the wait.
    let ejections = worker.ejections();
    let quick = settings.first_byte_timeout.min(WATCH_AFTER);
    if let Ok(sent) = tokio::time::timeout(quick, &mut request).await {
        return answered(sent);
    }
    let ejected = worker.next_ejection();
    tokio::pin!(ejected);
    ejected.as_mut().enable();
    // An ejection before the watch began does not wake it; the worker's count of ejections
    // shows it (an ejection bumps the count before it notifies).
    if worker.ejections() != ejections {
        return Waited::Ejected;
    }
    let mut grace_over = grace_over.clone();
    let rest = settings.first_byte_timeout.saturating_sub(quick);
    tokio::select! {
        () = grace_ended(&mut grace_over) => Waited::Draining,
        sent = tokio::time::timeout(rest, &mut request) => match sent {
            Ok(sent) => answered(sent),
            Err(_) => Waited::TimedOut,
        },
        () = &mut ejected => Waited::Ejected,
    }
}

/// Wraps the request's end hook so that the routing policy first learns from the usage the
/// worker reported (cached tokens against the prediction), then the account phase runs.
fn with_feedback(
    pool: &PoolRuntime,
    features: &RequestFeatures,
    inner: Option<OnEnd>,
    (worker_key, decision): (u64, Decision),
) -> OnEnd {
    let policy = pool.policy().clone();
    let features = features.clone();
    let series = pool.series.clone();
    Box::new(move |end| {
        if let Some(usage) = end
            .usage
            .filter(|u| plausible_for_feedback(u, features.prompt_bytes))
        {
            match usage.cached {
                Some(actual) => {
                    series.predicted_cached.inc_by(decision.predicted_cached);
                    series.actual_cached.inc_by(actual);
                    let [predicted, delivered, available] = &series.route_cached;
                    predicted.inc_by(decision.predicted_cached);
                    delivered.inc_by(actual);
                    available.inc_by(decision.available_cached);
                }
                None => series.cached_unreported.inc(),
            }
            policy.policy.feedback(
                &features,
                worker_key,
                Feedback {
                    predicted_cached: decision.predicted_cached,
                    prompt_tokens: usage.prompt,
                    cached_tokens: usage.cached,
                },
            );
        }
        if let Some(hook) = inner {
            hook(end);
        }
    })
}

/// Prompt tokens a prompt may hold beyond one per byte of its text: chat templates, special
/// tokens, and the image or audio parts a URL of a few bytes stands for.
const UNTEXTED_PROMPT_TOKENS: u64 = 64 * 1024;

/// Whether a worker's usage may teach routing (the cached-token counters and the prefix
/// index's feedback): no more cached than prompt tokens, and no more prompt tokens than the
/// prompt's bytes can hold (BPE tokens are at least a byte each) plus [`UNTEXTED_PROMPT_TOKENS`].
/// What the tenant is billed is checked apart, against the request's own bounds
/// (`usage_check`).
fn plausible_for_feedback(usage: &TokenUsage, prompt_bytes: usize) -> bool {
    let most = (prompt_bytes as u64).saturating_add(UNTEXTED_PROMPT_TOKENS);
    usage.prompt <= most && usage.cached.is_none_or(|c| c <= usage.prompt)
}

/// Whether a healthy worker of `pool` other than `current` is still untried.
fn another_worker(pool: &PoolRuntime, tried: &[u64], current: u64) -> bool {
    pool.workers()
        .iter()
        .any(|w| w.key != current && !tried.contains(&w.key) && w.is_healthy())
}

/// The next worker that takes the request: the route phase's pick first, then the policy's,
/// without those tried; a worker that may not take it now (ejected meanwhile, or on probation
/// with its probe in flight) is passed over without spending a retry. `None` when none is left.
fn claim(
    pool: &PoolRuntime,
    next: &mut Option<Routed>,
    out: &Outbound<'_>,
    tried: &mut Vec<u64>,
    settings: ForwardSettings,
    metrics: &GatewayMetrics,
) -> Option<(Arc<WorkerState>, Decision, Attempt)> {
    loop {
        let (worker, decision) = match next.take() {
            Some(routed) => routed,
            None => pool.pick(out.features, tried, out.by_load, metrics)?,
        };
        match worker.admit(settings.outlier) {
            Some(turn) => return Some((worker, decision, turn)),
            None => tried.push(worker.key),
        }
    }
}

fn note_failure(
    pool: &PoolRuntime,
    worker: &WorkerState,
    turn: Attempt,
    metrics: &GatewayMetrics,
    request_id: &str,
    kind: &'static str,
) {
    metrics
        .upstream_errors
        .with_label_values(&[&pool.name, kind])
        .inc();
    // The worker's address goes to the log, never to the client.
    tracing::debug!(request_id, pool = %pool.name, worker = %worker.url, kind, "forward attempt failed");
    judge(turn, Some(kind), metrics, &pool.name, request_id);
}

/// The upstream request's head; `prefix_keys` adds the routing keys for a worker with KV
/// events. A header value that would not be valid (a client's request id) is left out.
fn request_head(
    worker: &crate::workers::state::WorkerState,
    out: &Outbound<'_>,
    prefix_keys: bool,
) -> RequestHead {
    let mut head = worker.conns.post_head(out.path, out.body.len());
    head.header("content-type", b"application/json");
    head.header(REQUEST_ID, out.request_id.as_bytes());
    if let Some(tp) = out.traceparent {
        head.header(TRACEPARENT, tp.as_bytes());
    }
    if prefix_keys && !out.features.prefix_hashes.is_empty() {
        let keys = PrefixKeys::header_value(
            DEFAULT_BLOCK_BYTES,
            out.features.prompt_bytes,
            &out.features.prefix_hashes,
        );
        head.header(PREFIX_KEYS_HEADER, keys.as_bytes());
    }
    head
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most answers carry none: one pass over their few names, no lookups.
    if !headers.keys().any(|k| HOP_BY_HOP.contains(k)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    for name in named {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(prompt: u64, cached: Option<u64>) -> TokenUsage {
        TokenUsage {
            prompt,
            completion: 1,
            cached,
        }
    }

    #[test]
    fn only_plausible_usage_teaches_routing() {
        assert!(plausible_for_feedback(&usage(100, Some(64)), 400));
        assert!(plausible_for_feedback(&usage(100, None), 400));
        assert!(
            plausible_for_feedback(&usage(400 + UNTEXTED_PROMPT_TOKENS, None), 400),
            "a template and an image or two past the text"
        );
        assert!(!plausible_for_feedback(
            &usage(401 + UNTEXTED_PROMPT_TOKENS, None),
            400
        ));
        assert!(!plausible_for_feedback(&usage(100, Some(101)), 400));
        assert!(!plausible_for_feedback(
            &usage(u64::MAX, Some(u64::MAX)),
            400
        ));
    }
}
