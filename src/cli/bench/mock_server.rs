//! A test double of a streaming OpenAI server on 127.0.0.1:0: every answer opens with a role-only
//! chunk, then `max_tokens` content chunks (the first after `first_delay`, then one per `gap`),
//! the usage chunk, the exec-path comment and `[DONE]`. The key `limited` gets a 429.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use infergate_engine::openai::sse;
use serde_json::Value;
use tokio::net::TcpSocket;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};

/// What one request looked like on arrival.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The `Authorization` header.
    pub auth: Option<String>,
    /// The `x-session-id` header.
    pub session: Option<String>,
    /// The JSON body.
    pub body: Value,
}

/// Shared between the server and the test.
#[derive(Default)]
pub struct Shared {
    /// Every request, in arrival order.
    pub seen: Mutex<Vec<Seen>>,
    streams: AtomicUsize,
    /// Most answers streaming at once.
    pub peak: AtomicUsize,
}

/// The running server; stops when dropped.
pub struct MockServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// What it saw.
    pub shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The exec-path counts the double reports for an answer of `n` tokens.
pub fn paths_for(n: u64) -> (u64, u64) {
    match n {
        1 => (0, 1),
        5 => (2, 3),
        _ => (n - 1, 1),
    }
}

/// A scripted body: queued head frames, `remaining` timed content chunks, then the tail.
struct Script {
    head: VecDeque<Bytes>,
    content: Bytes,
    remaining: u64,
    gap: Duration,
    sleep: Pin<Box<Sleep>>,
    tail: VecDeque<Bytes>,
    shared: Arc<Shared>,
}

impl Drop for Script {
    fn drop(&mut self) {
        self.shared.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Body for Script {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(b) = self.head.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        if self.remaining > 0 {
            ready!(self.sleep.as_mut().poll(cx));
            self.remaining -= 1;
            let next = Instant::now() + self.gap;
            self.sleep.as_mut().reset(next);
            return Poll::Ready(Some(Ok(Frame::data(self.content.clone()))));
        }
        Poll::Ready(self.tail.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

async fn answer(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    first_delay: Duration,
    gap: Duration,
) -> Result<Response<Script>, Infallible> {
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (auth, session) = (header("authorization"), header("x-session-id"));
    let chat = req.uri().path().ends_with("/chat/completions");
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let n = body["max_tokens"].as_u64().unwrap_or(1);
    let limited = auth.as_deref() == Some("Bearer limited");
    shared.seen.lock().unwrap().push(Seen {
        auth,
        session,
        body,
    });
    let now = shared.streams.fetch_add(1, Ordering::Relaxed) + 1;
    shared.peak.fetch_max(now, Ordering::Relaxed);
    let mut script = Script {
        head: VecDeque::new(),
        content: Bytes::new(),
        remaining: 0,
        gap,
        sleep: Box::pin(tokio::time::sleep(first_delay)),
        tail: VecDeque::new(),
        shared,
    };
    if limited {
        let err =
            r#"{"error":{"message":"slow down","type":"rate_limit","param":null,"code":429}}"#;
        script.tail.push_back(Bytes::from_static(err.as_bytes()));
        let mut res = Response::new(script);
        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        return Ok(res);
    }
    let chunk = |text: &str| {
        let choice = if chat {
            format!(r#"{{"index":0,"delta":{{"content":"{text}"}}}}"#)
        } else {
            format!(r#"{{"index":0,"text":"{text}"}}"#)
        };
        Bytes::from(sse::data_event(format_args!(r#"{{"choices":[{choice}]}}"#)))
    };
    script.head.push_back(chunk(""));
    script.content = chunk("tok");
    script.remaining = n;
    let (graph, eager) = paths_for(n);
    let usage = sse::data_event(format_args!(
        r#"{{"choices":[],"usage":{{"prompt_tokens":7,"completion_tokens":{n}}}}}"#
    ));
    script.tail.push_back(Bytes::from(usage));
    let comment = format!(": x-infergate-exec-path graph={graph},eager={eager}\n\n");
    script.tail.push_back(Bytes::from(comment));
    script
        .tail
        .push_back(Bytes::from_static(sse::DONE.as_bytes()));
    let mut res = Response::new(script);
    res.headers_mut()
        .insert("x-infergate-worker", "w-mock".parse().unwrap());
    res.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    Ok(res)
}

impl MockServer {
    /// Starts the double on an ephemeral loopback port with a deep accept backlog.
    pub fn start(first_delay: Duration, gap: Duration) -> MockServer {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(8192).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared::default());
        let state = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let _ = tcp.set_nodelay(true);
                let state = state.clone();
                tokio::spawn(async move {
                    let svc = service_fn(|req| answer(req, state.clone(), first_delay, gap));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        MockServer { url, shared, task }
    }
}
