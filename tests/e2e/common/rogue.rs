//! A worker that misbehaves on purpose, on loopback: it reads each HTTP/1.1 request itself and
//! answers with raw bytes a script gives (a usage that lies, a stream that errors after its 200,
//! a body shorter than its Content-Length, a hang, a 50 MB `/metrics`), so the tests can put a
//! broken or lying upstream beside a healthy engine and check the gateway's bounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyper::body::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request as the rogue read it.
#[derive(Debug, Clone)]
pub struct RogueRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path with its query.
    pub path: String,
    /// The body (empty for none).
    pub body: Bytes,
}

impl RogueRequest {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// One step of an answer, done in order on the connection.
#[derive(Debug, Clone)]
pub enum Step {
    /// Write these bytes.
    Send(Bytes),
    /// Wait this long (a slow worker).
    Pause(Duration),
    /// Keep the connection open and never write again (a hung worker).
    Hang,
    /// Close the connection now.
    Close,
}

/// A full answer: status line, headers with a Content-Length, the body.
pub fn answer(status: u16, content_type: &str, body: impl Into<Bytes>) -> Vec<Step> {
    let body = body.into();
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    vec![Step::Send(Bytes::from(head)), Step::Send(body)]
}

/// A 200 JSON answer.
pub fn json_answer(body: &serde_json::Value) -> Vec<Step> {
    answer(200, "application/json", body.to_string())
}

/// The head of a 200 SSE stream that ends when the connection closes (no length, no chunking).
pub fn sse_head() -> Step {
    Step::Send(Bytes::from_static(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
    ))
}

/// One SSE `data:` event.
pub fn sse_data(payload: &str) -> Step {
    Step::Send(Bytes::from(format!("data: {payload}\n\n")))
}

/// Idle vLLM gauges for `GET /metrics`.
pub const IDLE_VLLM_METRICS: &str =
    "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n";

/// A chat completion chunk carrying `text`, in OpenAI's stream shape.
pub fn chat_chunk(model: &str, text: &str) -> String {
    serde_json::json!({
        "id": "chatcmpl-rogue", "object": "chat.completion.chunk", "created": 0, "model": model,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]
    })
    .to_string()
}

/// A whole chat completion answering `text` with the given usage.
pub fn chat_completion(model: &str, text: &str, usage: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "id": "chatcmpl-rogue", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": usage,
    })
}

/// The running rogue worker; it serves until the test's runtime ends.
pub struct Rogue {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    metrics: AtomicU64,
    other: AtomicU64,
}

impl Rogue {
    /// Starts a rogue whose every request is answered by `script`. `GET /metrics` goes to the
    /// script too: return [`IDLE_VLLM_METRICS`] there to look healthy to the poller. `GET /ready`
    /// (the gateway's warm-up check) is answered 200 here, neither scripted nor counted: a rogue
    /// misbehaves once it is in rotation.
    pub async fn start<F>(script: F) -> Rogue
    where
        F: Fn(&RogueRequest) -> Vec<Step> + Send + Sync + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("local address"));
        let script = Arc::new(script);
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (script, counts) = (script.clone(), c.clone());
                tokio::spawn(async move { serve(tcp, &*script, &counts).await });
            }
        });
        Rogue { url, counts }
    }

    /// `GET /metrics` requests it has read.
    pub fn metrics_polls(&self) -> u64 {
        self.counts.metrics.load(Ordering::Relaxed)
    }

    /// Requests other than `GET /metrics` it has read.
    pub fn requests(&self) -> u64 {
        self.counts.other.load(Ordering::Relaxed)
    }
}

/// Serves one connection: requests in turn until a script closes or hangs it.
async fn serve<F>(mut tcp: TcpStream, script: &F, counts: &Counts)
where
    F: Fn(&RogueRequest) -> Vec<Step>,
{
    let mut buf = Vec::new();
    loop {
        let Some(req) = read_request(&mut tcp, &mut buf).await else {
            return;
        };
        if req.method == "GET" && req.path == "/ready" {
            let ready = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
            if tcp.write_all(ready).await.is_err() {
                return;
            }
            continue;
        }
        if req.method == "GET" && req.path.starts_with("/metrics") {
            counts.metrics.fetch_add(1, Ordering::Relaxed);
        } else {
            counts.other.fetch_add(1, Ordering::Relaxed);
        }
        for step in script(&req) {
            match step {
                Step::Send(bytes) => {
                    if tcp.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
                Step::Pause(d) => tokio::time::sleep(d).await,
                Step::Hang => {
                    // Hold the socket until the peer closes it.
                    let mut sink = [0u8; 1024];
                    while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
                    return;
                }
                Step::Close => return,
            }
        }
    }
}

/// Reads one request (head, then a Content-Length or chunked body); `None` at EOF or on junk.
async fn read_request(tcp: &mut TcpStream, buf: &mut Vec<u8>) -> Option<RogueRequest> {
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        fill(tcp, buf).await?;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end);
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_string(), first.next()?.to_string());
    let header = |name: &str| {
        head.split("\r\n").find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let body = if let Some(len) = header("content-length") {
        let len: usize = len.parse().ok()?;
        while buf.len() < len {
            fill(tcp, buf).await?;
        }
        buf.drain(..len).collect::<Vec<u8>>()
    } else if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = find(buf, b"\r\n") {
                    break i;
                }
                fill(tcp, buf).await?;
            };
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&buf[..line_end])
                    .split(';')
                    .next()?
                    .trim(),
                16,
            )
            .ok()?;
            buf.drain(..line_end + 2);
            while buf.len() < size + 2 {
                fill(tcp, buf).await?;
            }
            body.extend(buf.drain(..size));
            buf.drain(..2);
            if size == 0 {
                break body;
            }
        }
    } else {
        Vec::new()
    };
    Some(RogueRequest {
        method,
        path,
        body: Bytes::from(body),
    })
}

async fn fill(tcp: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 16 * 1024];
    let n = tcp.read(&mut chunk).await.ok()?;
    if n == 0 {
        return None;
    }
    buf.extend_from_slice(&chunk[..n]);
    Some(())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
