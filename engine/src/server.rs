//! The engine worker's HTTP server: builds the engine from its flags, starts the core thread and
//! serves the OpenAI-compatible API, `/health` (liveness), `/ready` (warm-up done) and
//! `/metrics` until SIGTERM or Ctrl-C.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::args::EngineArgs;
use crate::edge::{self, BodyError, BodyLimits, InFlight, LimitedBody};
use crate::generation::{ChannelSink, EVENT_BUFFER, Generation, PromptPlan, RequestPlan};
use crate::kv_events::{KvEventHub, PREFIX_KEYS_HEADER, PrefixKeys, event_line};
use crate::launch::{Engine, build_engine};
use crate::openai::{self, ApiError, Endpoint, ParsedRequest, Prompt, ResponseFrame, ResponseMeta};
use crate::sequence::NewRequest;

/// A request as the routes get it: its body under the edge's limits.
type Req = Request<LimitedBody<Incoming>>;

/// Response body type of every route.
pub type ResBody = BoxBody<Bytes, Infallible>;

/// State shared by every connection.
pub struct ServerState {
    engine: Engine,
    next_id: AtomicU64,
    arrivals: AtomicU64,
    /// Requests in flight, against `--max-in-flight-requests`.
    in_flight: Arc<InFlight>,
}

/// Binds, prints the address, and serves until a shutdown signal; in-flight requests then finish.
pub async fn serve(args: EngineArgs) -> Result<(), String> {
    if !(args.body_read_timeout.is_finite() && args.body_read_timeout > 0.0) {
        return Err(format!(
            "--body-read-timeout must be a positive number of seconds, not {}",
            args.body_read_timeout
        ));
    }
    let engine = build_engine(&args)?;
    let body_limits = BodyLimits {
        max_bytes: engine.max_body_bytes,
        timeout: Duration::from_secs_f64(args.body_read_timeout),
    };
    if args.exit_with_stdin {
        std::thread::Builder::new()
            .name("parent-watch".into())
            .spawn(|| {
                let mut sink = Vec::new();
                // Blocks until the parent closes our stdin (or dies), then exits at once.
                let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
                // Exit before anything else: with the supervisor gone, stderr may be a broken
                // pipe, and a log write that fails there must not keep this process alive.
                std::process::exit(0);
            })
            .map_err(|e| format!("cannot start the parent watch: {e}"))?;
    }
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .map_err(|e| format!("bad --host/--port: {e}"))?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot bind {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    // The stdout line is the one "listening" line (supervisors and scripts read it); the log
    // line adds what was loaded.
    tracing::info!(
        model = %engine.served_names[0],
        kv_blocks = engine.num_blocks,
        max_model_len = engine.max_model_len,
        %local,
        "engine ready"
    );
    println!("infergate engine listening on http://{local}");
    let state = Arc::new(ServerState {
        engine,
        // Unseeded requests draw their sampling seed from the id: start from a per-process
        // value so two workers (or two runs) do not produce the same text.
        next_id: AtomicU64::new(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                ^ u64::from(std::process::id()),
        ),
        arrivals: AtomicU64::new(0),
        in_flight: Arc::new(InFlight::new(args.max_in_flight_requests)),
    });
    let graceful = edge::Drain::new();
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                let in_flight = state.in_flight.clone();
                let routes = move |req: Req| {
                    let state = state.clone();
                    edge::boxed(move || async move { Ok::<_, Infallible>(route(state, req).await) })
                };
                let svc = edge::hyper_service(routes, move || body_limits, in_flight);
                let builder = auto::Builder::new(TokioExecutor::new());
                let conn = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                    .into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!("shutting down: finishing in-flight requests");
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("grace period over; exiting with requests in flight");
    }
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

fn full(status: StatusCode, content_type: &'static str, body: String) -> Response<ResBody> {
    let mut res = Response::new(Full::new(Bytes::from(body)).boxed());
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    res
}

/// The one place an [`ApiError`] becomes an HTTP response.
fn error_response(e: &ApiError) -> Response<ResBody> {
    let mut res = full(e.status, "application/json", e.to_json());
    if let Some(secs) = e.retry_after_secs {
        res.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    res
}

/// The API routes, for the 404 message.
/// The header in which `/health` names the engine's process id: a supervisor checks that the
/// process on the port it polls is the one it started.
pub const PID_HEADER: &str = "x-infergate-pid";

/// The header on a 503 refused because the engine is still warming up: a router holds the
/// worker out of rotation until `/ready` answers 200 (an overloaded 503 carries none).
pub const NOT_READY_HEADER: &str = "x-infergate-not-ready";

const ROUTES: &str = "POST /v1/completions, POST /v1/chat/completions, POST /v1/responses, POST /v1/embeddings, GET /v1/models, GET /health, GET /ready, GET /metrics, GET /kv/events";

async fn route(state: Arc<ServerState>, req: Req) -> Response<ResBody> {
    let path = req.uri().path().to_string();
    // Until warm-up ends, generation is refused (a router retries elsewhere); reads answer.
    if req.method() == Method::POST && !state.engine.warmup.is_ready() {
        state
            .engine
            .metrics
            .rejected
            .with_label_values(&["not_ready"])
            .inc();
        let mut res = error_response(&ApiError::unavailable(
            format!(
                "the engine is not ready: {}",
                state.engine.warmup.not_ready_reason()
            ),
            1,
        ));
        res.headers_mut()
            .insert(NOT_READY_HEADER, HeaderValue::from_static("1"));
        return res;
    }
    match (req.method(), path.as_str()) {
        (&Method::POST, "/v1/completions") => generate(state, req, Api::Completions)
            .await
            .unwrap_or_else(|e| error_response(&e)),
        (&Method::POST, "/v1/chat/completions") => generate(state, req, Api::Chat)
            .await
            .unwrap_or_else(|e| error_response(&e)),
        (&Method::POST, "/v1/responses") => generate(state, req, Api::Responses)
            .await
            .unwrap_or_else(|e| error_response(&e)),
        (&Method::POST, "/v1/embeddings") => embeddings(state, req)
            .await
            .unwrap_or_else(|e| error_response(&e)),
        (&Method::GET, "/v1/models") => {
            let e = &state.engine;
            let created = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            full(
                StatusCode::OK,
                "application/json",
                openai::models_list(&e.served_names, e.max_model_len, created),
            )
        }
        (&Method::GET, "/health") => {
            let mut res = full(StatusCode::OK, "text/plain", String::new());
            res.headers_mut().insert(
                PID_HEADER,
                hyper::header::HeaderValue::from(std::process::id()),
            );
            res
        }
        // Readiness, apart from liveness: 503 until warm-up has run every capture size.
        (&Method::GET, "/ready") => {
            if state.engine.warmup.is_ready() {
                full(StatusCode::OK, "text/plain", String::new())
            } else {
                error_response(&ApiError::unavailable(
                    state.engine.warmup.not_ready_reason(),
                    1,
                ))
            }
        }
        (&Method::GET, "/kv/events") => match &state.engine.kv_events {
            Some(hub) => kv_events_stream(hub),
            None => error_response(&ApiError::not_found(
                "KV events are off on this worker (--no-kv-events or --no-prefix-caching)",
            )),
        },
        (&Method::GET, "/metrics") => full(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            state.engine.metrics.render()
                + &edge_metrics(&state.in_flight)
                + &state.engine.warmup.render(),
        ),
        (
            _,
            "/v1/completions"
            | "/v1/chat/completions"
            | "/v1/responses"
            | "/v1/embeddings"
            | "/v1/models"
            | "/health"
            | "/ready"
            | "/metrics"
            | "/kv/events",
        ) => error_response(&ApiError::method_not_allowed()),
        _ => error_response(&ApiError::not_found(format!(
            "no route for {path}; routes: {ROUTES}"
        ))),
    }
}

/// The edge's counters in Prometheus text: requests in flight (counted while
/// `--max-in-flight-requests` is set) and requests refused at that cap.
fn edge_metrics(in_flight: &InFlight) -> String {
    format!(
        "# HELP infergate_engine_requests_in_flight Requests in flight, answers still streaming included (counted while --max-in-flight-requests is set).\n\
         # TYPE infergate_engine_requests_in_flight gauge\n\
         infergate_engine_requests_in_flight {}\n\
         # HELP infergate_engine_requests_shed_total Requests refused with 503 at --max-in-flight-requests.\n\
         # TYPE infergate_engine_requests_shed_total counter\n\
         infergate_engine_requests_shed_total {}\n",
        in_flight.in_flight(),
        in_flight.shed()
    )
}

/// The generating endpoints, which share one path from parsing to the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/responses`: a chat request answered in the Responses shapes.
    Responses,
}

/// Reads a request body under the edge's limits: 413 over `--max-body-bytes`, 408 past
/// `--body-read-timeout`.
async fn read_body(req: Req) -> Result<Bytes, ApiError> {
    edge::body_limit::read_to_bytes(req.into_body())
        .await
        .map_err(|e| match e {
            BodyError::TooLarge { .. } => ApiError::payload_too_large(e.to_string()),
            BodyError::TimedOut { .. } => ApiError::request_timeout(e.to_string()),
            BodyError::Read(_) => ApiError::bad_request(e.to_string(), None),
        })
}

/// `POST /v1/embeddings` (see [`crate::embeddings`]).
async fn embeddings(state: Arc<ServerState>, req: Req) -> Result<Response<ResBody>, ApiError> {
    let body = read_body(req).await?;
    let answer = crate::embeddings::answer(&state.engine, &body).await?;
    Ok(full(StatusCode::OK, "application/json", answer))
}

/// A quiet stream sends this line this often, so a subscriber can tell a live worker from a hung one.
const KV_EVENTS_HEARTBEAT: Duration = Duration::from_secs(2);

/// `GET /kv/events`: an NDJSON snapshot of the resident router keys, then their changes.
///
/// A subscriber that falls behind the hub's buffer is cut off; it resubscribes and starts again
/// from a new snapshot, so it never misses a change silently.
fn kv_events_stream(hub: &Arc<KvEventHub>) -> Response<ResBody> {
    let (snapshot, mut events) = hub.subscribe();
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        if tx
            .send(Bytes::from(event_line("snapshot", &snapshot)))
            .await
            .is_err()
        {
            return;
        }
        let mut heartbeat = tokio::time::interval(KV_EVENTS_HEARTBEAT);
        heartbeat.tick().await;
        loop {
            let line = tokio::select! {
                batch = events.recv() => match batch {
                    Ok(b) => {
                        let mut line = String::new();
                        if !b.stored.is_empty() {
                            line.push_str(&event_line("stored", &b.stored));
                        }
                        if !b.removed.is_empty() {
                            line.push_str(&event_line("removed", &b.removed));
                        }
                        line
                    }
                    // Lagged or closed: end the stream; the subscriber starts over.
                    Err(_) => return,
                },
                _ = heartbeat.tick() => event_line("heartbeat", &[]),
            };
            if tx.send(Bytes::from(line)).await.is_err() {
                return;
            }
        }
    });
    let mut res = Response::new(BoxBody::new(ChannelBody(rx)));
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    res
}

/// A response body fed by a channel; it ends when the sender is dropped.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

/// Handles a completion or chat request: read, validate, tokenize, admit, answer.
async fn generate(
    state: Arc<ServerState>,
    req: Req,
    api: Api,
) -> Result<Response<ResBody>, ApiError> {
    let engine = &state.engine;
    let endpoint = match api {
        Api::Completions => Endpoint::Completions,
        Api::Chat | Api::Responses => Endpoint::ChatCompletions,
    };
    let arrival = state.arrivals.fetch_add(1, Ordering::Relaxed) + 1;
    if engine.faults.crash_after.is_some_and(|n| arrival >= n) {
        tracing::error!("fault injection: crashing at request {arrival}");
        std::process::exit(70);
    }
    let prefix_keys = if engine.kv_events.is_some() {
        req.headers()
            .get(PREFIX_KEYS_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(PrefixKeys::parse)
    } else {
        None
    };

    let body = read_body(req).await?;
    // Responses is a chat request plus the fields its answer echoes.
    let (parsed, responses_echo) = match api {
        Api::Completions => (openai::parse_completion(&body)?, None),
        Api::Chat => (openai::parse_chat(&body, &engine.chat_template)?, None),
        Api::Responses => {
            let (parsed, echo) = openai::parse_responses(&body, &engine.chat_template)?;
            (parsed, Some(echo))
        }
    };
    if !engine.served_names.iter().any(|n| n == &parsed.model) {
        return Err(ApiError::not_found(format!(
            "The model `{}` does not exist.",
            parsed.model
        )));
    }
    if engine.faults.should_fail(arrival) {
        return Err(ApiError::internal("injected fault (--fault-error-rate)"));
    }

    let ParsedRequest {
        prompts,
        max_tokens,
        mut sampling,
        stream,
        include_usage,
        model,
        n,
        best_of,
        echo,
        logprobs,
        features,
        ..
    } = parsed;
    let prompts = tokenize_prompts(engine, endpoint, prompts, echo).await?;
    let limit = engine.max_model_len;
    let default_max = match endpoint {
        Endpoint::Completions => 16,
        Endpoint::ChatCompletions => limit.saturating_sub(prompts.first().map_or(0, |p| p.0.len())),
    };
    let max_tokens = max_tokens.unwrap_or(default_max);
    for (tokens, _) in &prompts {
        check_prompt(engine, tokens, max_tokens)?;
    }
    sampling.max_tokens = max_tokens;
    sampling.script = engine.misbehave.script(arrival, features.response_format);
    sampling.ignore_eos |= engine.misbehave.longer_answers();
    if sampling.min_tokens > max_tokens {
        sampling.min_tokens = max_tokens;
    }
    // `best_of` ranks by cumulative logprob, so its sequences report them even unasked.
    sampling.logprobs = crate::request::sequence_logprobs(logprobs, n, best_of);
    // Echo with logprobs includes the prompt's; every sequence computes its own (as vLLM's
    // child requests do), so none waits on another.
    sampling.prompt_logprobs = logprobs.filter(|_| echo);

    let total = prompts.len() * best_of;
    // A queue of 0 refuses everything with 503 below; a request larger than a real queue could
    // never be admitted, which is the client's to fix.
    if total > engine.max_waiting && engine.max_waiting > 0 {
        let param = if prompts.len() > 1 {
            "prompt"
        } else if best_of > n {
            "best_of"
        } else {
            "n"
        };
        return Err(ApiError::bad_request(
            format!(
                "this request runs {total} sequences ({} prompts × {best_of}) but the engine queues at most {}",
                prompts.len(),
                engine.max_waiting
            ),
            Some(param),
        ));
    }
    // Bounded waiting queue: refuse quickly with an honest estimate instead of queueing forever.
    // One atomic step, so concurrent arrivals cannot overshoot the bound together.
    let admitted = engine
        .pending
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
            (p < engine.max_waiting).then_some(p + total)
        });
    if let Err(pending) = admitted {
        engine
            .metrics
            .rejected
            .with_label_values(&["queue_full"])
            .inc();
        return Err(ApiError::unavailable(
            format!("the engine's waiting queue is full ({pending} requests)"),
            engine.retry_after_secs(pending),
        ));
    }

    let (tx, rx) = mpsc::channel(EVENT_BUFFER * total);
    let first_id = state.next_id.fetch_add(total as u64, Ordering::Relaxed);
    // The router's keys describe the request's one prompt; with several they would be wrong.
    let mut prefix_keys = prefix_keys.filter(|_| prompts.len() == 1);
    let mut stops = Vec::with_capacity(total);
    let mut groups = Vec::with_capacity(prompts.len());
    let mut plans = Vec::with_capacity(prompts.len());
    for (i, (tokens, echo_text)) in prompts.into_iter().enumerate() {
        plans.push(PromptPlan {
            tokens: tokens.len(),
            first_token: tokens.first().copied().unwrap_or(0),
            echo: echo_text,
        });
        let mut group = Vec::with_capacity(best_of);
        for (j, params) in sampling.for_choices(best_of).enumerate() {
            let s = i * best_of + j;
            let stop = Arc::new(AtomicBool::new(false));
            stops.push(stop.clone());
            group.push(NewRequest {
                id: first_id.wrapping_add(s as u64),
                prompt: tokens.clone(),
                params,
                sink: Box::new(ChannelSink::new(tx.clone(), s, stop)),
                // The first sequence registers the prompt's blocks; its siblings share them.
                prefix_keys: prefix_keys.take(),
            });
        }
        groups.push(group);
    }
    drop(tx);
    let mut unsent = total;
    for group in groups {
        let len = group.len();
        if engine.submit.send(group).is_err() {
            engine.pending.fetch_sub(unsent, Ordering::AcqRel);
            return Err(ApiError::internal("the engine thread has stopped"));
        }
        unsent -= len;
    }

    let frame = responses_echo.map(|e| ResponseFrame::new(model.clone(), e));
    let meta = ResponseMeta::new(endpoint, model);
    let plan = RequestPlan {
        prompts: plans,
        n,
        best_of,
        logprobs: logprobs.is_some(),
        include_usage,
    };
    let mut generation =
        Generation::new(meta, rx, plan, &sampling, stops, engine.tokenizer.clone())
            .with_flight(engine.flight.clone(), features);
    let res = if stream {
        // Wait for the first event so that refusals are real HTTP errors, not stream errors.
        let first = generation.first_event().await?;
        let mut res = match frame {
            Some(frame) => Response::new(BoxBody::new(generation.into_responses_sse(frame, first))),
            None => Response::new(BoxBody::new(generation.into_sse(first))),
        };
        let h = res.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert("cache-control", HeaderValue::from_static("no-cache"));
        res
    } else {
        let (body, paths, flight) = match frame {
            Some(frame) => generation.collect_response(&frame).await?,
            None => generation.collect().await?,
        };
        let mut res = full(StatusCode::OK, "application/json", body);
        if let Ok(v) = HeaderValue::from_str(&paths.header_value()) {
            res.headers_mut().insert("x-infergate-exec-path", v);
        }
        if let Ok(v) = HeaderValue::from_str(&flight.to_json()) {
            res.headers_mut().insert(crate::flight::FLIGHT_HEADER, v);
        }
        res
    };
    Ok(res)
}

/// Token ids of each prompt and, with `echo`, the text its choices start with (the prompt as
/// sent, or the decoded ids). A chat template prints BOS itself; a raw completions prompt gets
/// the tokenizer's.
async fn tokenize_prompts(
    engine: &Engine,
    endpoint: Endpoint,
    prompts: Vec<Prompt>,
    echo: bool,
) -> Result<Vec<(Vec<u32>, Option<String>)>, ApiError> {
    let tokenizer = engine.tokenizer.clone();
    let add_special = matches!(endpoint, Endpoint::Completions);
    // Tokenizing a long prompt takes milliseconds: keep it off the reactor.
    tokio::task::spawn_blocking(move || {
        prompts
            .into_iter()
            .map(|p| match p {
                Prompt::Tokens(t) => {
                    let text = echo.then(|| tokenizer.decode(&t));
                    Ok((t, text))
                }
                Prompt::Text(text) => {
                    let t = tokenizer.encode(&text, add_special)?;
                    Ok((t, echo.then_some(text)))
                }
            })
            .collect::<Result<Vec<_>, String>>()
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))?
    .map_err(|e| ApiError::bad_request(e, Some("prompt")))
}

/// Refuses a prompt that is empty, names unknown tokens, or leaves no room for `max_tokens`.
fn check_prompt(engine: &Engine, tokens: &[u32], max_tokens: usize) -> Result<(), ApiError> {
    if tokens.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty", Some("prompt")));
    }
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= engine.vocab_size) {
        return Err(ApiError::bad_request(
            format!("token id {bad} is out of vocabulary"),
            Some("prompt"),
        ));
    }
    let limit = engine.max_model_len;
    let n_prompt = tokens.len();
    if !crate::request::fits_context(n_prompt, max_tokens, limit) {
        return Err(ApiError::bad_request(
            format!(
                "This model's maximum context length is {limit} tokens. However, you requested {} tokens ({n_prompt} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion.",
                n_prompt + max_tokens
            ),
            Some("max_tokens"),
        ));
    }
    Ok(())
}
