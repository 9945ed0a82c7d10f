//! Server-sent events read as they arrive: one event at a time from an open stream (each
//! stamped with its arrival time), or a whole streamed answer collected under a deadline.

use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Bytes;
use hyper::{HeaderMap, Method, StatusCode};
use infergate_engine::openai::sse;
use serde_json::Value;

use super::http::{Exchange, HTTP_DEADLINE, open_with};

/// One server-sent event block.
#[derive(Debug, Clone)]
pub struct SseEvent {
    /// When the frame completing this event arrived.
    pub at: Instant,
    /// The `data:` payload, if the block had one.
    pub data: Option<String>,
    /// Comment lines (`: ...`), without the colon.
    pub comments: Vec<String>,
}

impl SseEvent {
    /// The data payload parsed as JSON (`None` for comments and `[DONE]`).
    pub fn json(&self) -> Option<Value> {
        let data = self.data.as_deref()?;
        if sse::is_done(data.as_bytes()) {
            return None;
        }
        Some(
            serde_json::from_str(data)
                .unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {data:?}")),
        )
    }
}

/// One SSE block: its `data:` lines joined, its comment lines.
fn parse_block(block: &str, at: Instant) -> SseEvent {
    let mut data: Option<String> = None;
    let mut comments = Vec::new();
    for line in block.lines() {
        // The rules the engine writes by; what they cut off is ASCII, so the rest is still UTF-8.
        let field = sse::data_field(line.as_bytes()).and_then(|f| std::str::from_utf8(f).ok());
        if let Some(rest) = field {
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(rest);
                }
                None => data = Some(rest.to_owned()),
            }
        } else if let Some(rest) = sse::comment(line.as_bytes()) {
            comments.push(String::from_utf8_lossy(rest).trim_start().to_owned());
        }
    }
    SseEvent { at, data, comments }
}

/// A streamed response read frame by frame; dropping it closes the connection.
pub struct SseStream {
    /// HTTP status.
    pub status: StatusCode,
    /// Response headers.
    pub headers: HeaderMap,
    /// When the request was started (before connecting).
    pub started: Instant,
    ex: Exchange,
    buf: String,
}

impl SseStream {
    /// The next event, or `None` at the end of the body.
    pub async fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                return Some(parse_block(&block, Instant::now()));
            }
            let frame = tokio::time::timeout(HTTP_DEADLINE, self.ex.body.frame())
                .await
                .expect("no SSE frame within the deadline");
            match frame {
                None => {
                    assert!(
                        self.buf.trim().is_empty(),
                        "stream ended inside an event: {:?}",
                        self.buf
                    );
                    return None;
                }
                Some(Err(e)) => panic!("stream body failed: {e}"),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.push_str(&String::from_utf8_lossy(&data));
                    }
                }
            }
        }
    }

    /// The rest of the body as text (for error answers).
    pub async fn text(mut self) -> String {
        let bytes = tokio::time::timeout(HTTP_DEADLINE, (&mut self.ex.body).collect())
            .await
            .expect("body within the deadline")
            .expect("read body")
            .to_bytes();
        format!("{}{}", self.buf, String::from_utf8_lossy(&bytes))
    }
}

/// Starts a streamed `POST url` and returns once the response head arrived.
pub async fn open_stream(url: &str, body: &Value) -> SseStream {
    open_stream_with(url, &[], body).await
}

/// [`open_stream`] with extra request headers (e.g. `authorization`).
pub async fn open_stream_with(url: &str, headers: &[(&str, &str)], body: &Value) -> SseStream {
    let started = Instant::now();
    let ex = tokio::time::timeout(
        HTTP_DEADLINE,
        open_with(
            Method::POST,
            url,
            headers,
            Some(Bytes::from(body.to_string())),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("POST {url} (stream) timed out"))
    .unwrap_or_else(|e| panic!("POST {url} (stream): {e}"));
    SseStream {
        status: ex.status,
        headers: ex.headers.clone(),
        started,
        ex,
        buf: String::new(),
    }
}

/// A whole streamed answer.
#[derive(Debug)]
pub struct Streamed {
    /// HTTP status.
    pub status: StatusCode,
    /// Response headers.
    pub headers: HeaderMap,
    /// When the request was started.
    pub started: Instant,
    /// Every event in arrival order.
    pub events: Vec<SseEvent>,
}

impl Streamed {
    /// The JSON `data:` chunks (without `[DONE]`).
    pub fn chunks(&self) -> Vec<Value> {
        self.events.iter().filter_map(SseEvent::json).collect()
    }

    /// Client-side time to the first `data:` event.
    pub fn ttft(&self) -> Duration {
        let first = self
            .events
            .iter()
            .find(|e| e.data.is_some())
            .expect("no data event");
        first.at - self.started
    }

    /// The payload of the last `data:` event.
    pub fn last_data(&self) -> &str {
        self.events
            .iter()
            .rev()
            .find_map(|e| e.data.as_deref())
            .expect("no data event")
    }

    /// The value of the `x-infergate-exec-path` SSE comment, e.g. `graph=3,eager=1`.
    pub fn exec_path(&self) -> Option<String> {
        self.events.iter().find_map(|e| {
            e.comments
                .iter()
                .find_map(|c| c.strip_prefix("x-infergate-exec-path "))
                .map(str::to_owned)
        })
    }
}

/// `POST url` with `stream: true` in `body`, read to the end, event by event.
pub async fn stream(url: &str, body: &Value) -> Streamed {
    collect(open_stream(url, body).await).await
}

/// `POST url` with `body` and extra `headers`, read to the end event by event under
/// [`HTTP_DEADLINE`] in all; an error answer comes back with no events.
pub async fn stream_with(url: &str, headers: &[(&str, &str)], body: &Value) -> Streamed {
    let whole = async { collect(open_stream_with(url, headers, body).await).await };
    tokio::time::timeout(HTTP_DEADLINE, whole)
        .await
        .unwrap_or_else(|_| panic!("POST {url} (stream) timed out"))
}

/// Reads `s` to its end (nothing past the head of an error answer).
async fn collect(mut s: SseStream) -> Streamed {
    let mut events = Vec::new();
    if s.status == StatusCode::OK {
        while let Some(ev) = s.next_event().await {
            events.push(ev);
        }
    }
    Streamed {
        status: s.status,
        headers: s.headers.clone(),
        started: s.started,
        events,
    }
}

/// Parses `graph=N,eager=M` into `(N, M)`.
pub fn parse_exec_path(value: &str) -> (u64, u64) {
    let mut graph = None;
    let mut eager = None;
    for part in value.split(',') {
        match part.trim().split_once('=') {
            Some(("graph", n)) => graph = n.parse().ok(),
            Some(("eager", n)) => eager = n.parse().ok(),
            _ => {}
        }
    }
    match (graph, eager) {
        (Some(g), Some(e)) => (g, e),
        _ => panic!("malformed exec path {value:?}"),
    }
}
