//! Harness of the tenant tests: a config with tenants and tiers in a private temp directory, the
//! gateway (`infergate gateway` / `infergate up`) as a real child process on ephemeral ports,
//! keep-alive HTTP/1.1 connections that send an `Authorization: Bearer` key, metric polling and
//! the gateway's resident memory. Every wait polls against a deadline; children die on drop.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{HeaderMap, Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

/// The model every config here routes (the engine's default model).
pub const MODEL: &str = "llama-3-8b";
/// The pool every config here declares.
pub const POOL: &str = "main";
/// How long a gateway may take to print its address and become ready.
const START_DEADLINE: Duration = Duration::from_secs(60);
/// How long one HTTP exchange may take before the test fails.
pub const HTTP_DEADLINE: Duration = Duration::from_secs(30);
/// Output kept per child for failure messages.
const KEEP: usize = 32 * 1024;

/// The plain API key the tests give `tenant` (its hash goes into the config).
pub fn key_of(tenant: &str) -> String {
    format!("ig-test-{tenant}-k3y")
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir {
    /// Absolute path.
    pub path: PathBuf,
}

impl TempDir {
    /// Creates `infergate-tenants-<tag>-<pid>-<n>` with a `policies/` subdirectory.
    pub fn new(tag: &str) -> TempDir {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("infergate-tenants-{tag}-{}-{nanos}-{n}", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(path.join("policies")).expect("create temp dir");
        TempDir { path }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// What a test gateway is configured with; `..Setup::default()` leaves out what a test does not
/// set (no admission, context limit, aliases, extra sections, tenants or tiers).
#[derive(Default)]
pub struct Setup<'a> {
    /// Worker URLs of the one pool.
    pub workers: &'a [&'a str],
    /// The pool's `admission:` as a YAML flow mapping, e.g. `{max_queue: 10}`.
    pub admission: Option<&'a str>,
    /// `max_context` of [`MODEL`].
    pub max_context: Option<usize>,
    /// More models routed to the same pool (served upstream as [`MODEL`]).
    pub aliases: &'a [&'a str],
    /// More top-level sections, verbatim (e.g. `limits: {max_body_bytes: 4096}`).
    pub extra: &'a str,
    /// `(name, tier)` of every tenant; each gets the key [`key_of`] its name, stored hashed.
    pub tenants: &'a [(&'a str, &'a str)],
    /// The whole `policies/tenants.yaml`.
    pub tiers: &'a str,
}

impl Setup<'_> {
    /// The `infergate.yaml` text.
    pub fn config_yaml(&self) -> String {
        let mut s = String::from(
            "listen: \"127.0.0.1:0\"\nadmin: {listen: \"127.0.0.1:0\"}\npolicies: policies\n\
             health: {poll_interval: 100ms, timeout: 1s, eject_after: 3, readmit_after: 1}\n",
        );
        s.push_str(self.extra);
        if !s.ends_with('\n') {
            s.push('\n');
        }
        s.push_str(&format!("models:\n  - name: {MODEL}\n    pool: {POOL}\n"));
        if let Some(n) = self.max_context {
            s.push_str(&format!("    max_context: {n}\n"));
        }
        for alias in self.aliases {
            s.push_str(&format!(
                "  - name: {alias}\n    pool: {POOL}\n    upstream_model: {MODEL}\n"
            ));
        }
        s.push_str(&format!("pools:\n  - name: {POOL}\n    workers:\n"));
        for w in self.workers {
            s.push_str(&format!("      - url: {w}\n"));
        }
        if let Some(a) = self.admission {
            s.push_str(&format!("    admission: {a}\n"));
        }
        s.push_str("tenants:\n");
        for (name, tier) in self.tenants {
            let hash =
                infergate::tenants::format_hash(&infergate::tenants::hash_key(&key_of(name)));
            s.push_str(&format!(
                "  - {{name: {name}, tier: {tier}, keys: [\"{hash}\"]}}\n"
            ));
        }
        s
    }

    /// Writes the config and tiers into `dir`; returns the config path.
    pub fn write(&self, dir: &TempDir) -> PathBuf {
        let config = dir.path.join("infergate.yaml");
        std::fs::write(&config, self.config_yaml()).expect("write config");
        let tiers = dir.path.join("policies").join("tenants.yaml");
        std::fs::write(tiers, self.tiers).expect("write tenants.yaml");
        let routing = format!("pools:\n  {POOL}:\n    policy: least_load\n");
        let routing_path = dir.path.join("policies").join("routing.yaml");
        std::fs::write(routing_path, routing).expect("write routing.yaml");
        config
    }
}

/// Drains a child's output into `kept` (see [`crate::common::process::drain_into`]).
fn drain(out: impl AsyncRead + Unpin + Send + 'static, kept: Arc<Mutex<String>>) {
    crate::common::process::drain_into(out, kept, KEEP);
}

/// A running gateway; the process is killed on drop, after the workers `up` spawned (their
/// `--exit-with-stdin` watch does not fire once their stderr pipe is gone: see the report).
pub struct Gw {
    /// `http://ADDR` of the public listener.
    pub url: String,
    /// `http://ADDR` of the admin listener (where `/metrics` is).
    pub admin: String,
    /// Process id (for `/proc/PID/status`).
    pub pid: u32,
    /// The demo key `infergate up` printed, if any.
    pub demo_key: Option<String>,
    child: Child,
    output: Arc<Mutex<String>>,
    _dir: Option<TempDir>,
}

impl Drop for Gw {
    fn drop(&mut self) {
        for pid in child_pids(self.pid) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        let _ = self.child.start_kill();
    }
}

/// True while `pid` exists and is not a zombie.
pub fn is_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// Direct children of `pid` (from `/proc/PID/task/*/children`).
fn child_pids(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out: Vec<u32> = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

impl Gw {
    /// Writes `setup` into a fresh directory and runs `infergate gateway` on it until ready.
    pub async fn start(setup: &Setup<'_>) -> Gw {
        let dir = TempDir::new("gw");
        let config = setup.write(&dir).to_string_lossy().into_owned();
        let mut gw = Self::launch(&["gateway", "--config", &config]).await;
        gw._dir = Some(dir);
        gw
    }

    /// `infergate ARGS --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0`: reads the address (and
    /// a demo key) from stdout, then polls `/readyz` until the gateway has a healthy worker.
    pub async fn launch(args: &[&str]) -> Gw {
        let mut child = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn infergate");
        let pid = child.id().expect("child pid");
        let output = Arc::new(Mutex::new(String::new()));
        drain(child.stderr.take().expect("piped stderr"), output.clone());
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let deadline = Instant::now() + START_DEADLINE;
        let (mut url, mut admin, mut demo_key) = (None, None, None);
        // The banner ends with the `try:` line.
        loop {
            let mut line = String::new();
            let read = tokio::time::timeout_at(deadline.into(), stdout.read_line(&mut line)).await;
            if !matches!(read, Ok(Ok(n)) if n > 0) {
                let _ = child.start_kill();
                panic!(
                    "infergate {args:?} printed no banner ({read:?}); output:\n{}",
                    output.lock().unwrap()
                );
            }
            let line = line.trim();
            if let Some(u) = line.strip_prefix("infergate gateway listening on ") {
                url = Some(u.to_owned());
            } else if let Some(u) = line.strip_prefix("admin listening on ") {
                admin = Some(u.to_owned());
            } else if let Some(k) = line.strip_prefix("demo API key (new at every start): ") {
                demo_key = Some(k.to_owned());
            } else if line.starts_with("try:") {
                break;
            }
        }
        drain(stdout, output.clone());
        let gw = Gw {
            url: url.expect("no `listening on` line before `try:`"),
            admin: admin.expect("no `admin listening on` line before `try:`"),
            pid,
            demo_key,
            child,
            output,
            _dir: None,
        };
        let readyz = gw.at("/readyz");
        loop {
            let ready = tokio::time::timeout(Duration::from_secs(2), get_status(&readyz));
            if let Ok(Some(StatusCode::OK)) = ready.await {
                return gw;
            }
            assert!(
                Instant::now() < deadline,
                "gateway never became ready; output:\n{}",
                gw.output()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Process ids of the gateway's direct children (the workers `up` spawned).
    pub fn children(&self) -> Vec<u32> {
        child_pids(self.pid)
    }

    /// SIGKILLs the gateway alone, as a crash would, and reaps it; its children are left be.
    pub async fn crash(&mut self) {
        self.child.start_kill().expect("kill the gateway");
        let _ = tokio::time::timeout(HTTP_DEADLINE, self.child.wait()).await;
    }

    /// The URL of `path` on the public listener.
    pub fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// What the gateway wrote so far (the last few KiB).
    pub fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// The gateway's `/metrics` text (from the admin listener).
    pub async fn metrics(&self) -> String {
        let (status, text) = crate::common::get(&format!("{}/metrics", self.admin)).await;
        assert_eq!(status, StatusCode::OK, "GET /metrics");
        text
    }

    /// The value of `selector` (see `common::find_metric`), 0 when the series does not exist.
    pub async fn metric(&self, selector: &str) -> f64 {
        crate::common::find_metric(&self.metrics().await, selector).unwrap_or(0.0)
    }

    /// Polls `selector` until `pred` holds or `within` passes; returns the last value read (the
    /// caller asserts on it, so a failure shows the expected value too).
    pub async fn settle_metric(
        &self,
        selector: &str,
        within: Duration,
        pred: impl Fn(f64) -> bool,
    ) -> f64 {
        let deadline = Instant::now() + within;
        loop {
            let v = self.metric(selector).await;
            if pred(v) || Instant::now() >= deadline {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Polls `selector` until it equals `want`, failing after `within`.
    pub async fn expect_metric(&self, selector: &str, want: f64, within: Duration) {
        let v = self.settle_metric(selector, within, |v| v == want).await;
        assert_eq!(v, want, "{selector} after {within:?}");
    }

    /// Resident memory of the gateway process in KiB (`VmRSS` of `/proc/PID/status`).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .expect("read /proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS line")
    }
}

/// Status of `GET url`, or `None` when the connection failed.
async fn get_status(url: &str) -> Option<StatusCode> {
    let mut conn = Conn::open(url).await.ok()?;
    conn.send(Method::GET, url_path(url), None, Bytes::new())
        .await
        .ok()
        .map(|r| r.status)
}

/// The path (and query) of `url`.
fn url_path(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.find('/').map_or("/", |i| &rest[i..])
}

/// A whole answer.
#[derive(Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: StatusCode,
    /// Response headers.
    pub headers: HeaderMap,
    /// The body as text.
    pub text: String,
    /// From sending the request to the end of the body.
    pub elapsed: Duration,
    /// When the end of the body arrived.
    pub at: Instant,
}

impl Reply {
    /// The body parsed as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("{} answer is not JSON ({e}): {:?}", self.status, self.text))
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A header as a whole number (panics when absent or not a number).
    pub fn header_u64(&self, name: &str) -> u64 {
        let v = self
            .header(name)
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers));
        v.parse()
            .unwrap_or_else(|_| panic!("{name}: {v:?} is not a number"))
    }
}

/// Aborts the connection task on drop, which closes the socket.
struct ConnTask(JoinHandle<()>);

impl Drop for ConnTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One keep-alive HTTP/1.1 connection; dropping it closes the socket.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    authority: String,
    _task: ConnTask,
}

/// Boxed error of the raw HTTP helpers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Conn {
    /// Connects to the host of `url` (`http://HOST:PORT...`).
    pub async fn open(url: &str) -> Result<Conn, BoxError> {
        let rest = url.strip_prefix("http://").ok_or("not an http:// URL")?;
        let authority = rest.split('/').next().unwrap_or(rest).to_owned();
        let tcp = TcpStream::connect(authority.as_str()).await?;
        tcp.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        let task = ConnTask(tokio::spawn(async move {
            let _ = conn.await;
        }));
        Ok(Conn {
            sender,
            authority,
            _task: task,
        })
    }

    /// Sends one request and returns once the response head arrived; the body is left unread.
    pub async fn start(
        &mut self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Bytes,
    ) -> Result<(StatusCode, HeaderMap, Incoming), BoxError> {
        self.sender.ready().await?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.authority.as_str());
        if !body.is_empty() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        if let Some(key) = key {
            req = req.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        let res = self.sender.send_request(req.body(Full::new(body))?).await?;
        let (parts, body) = res.into_parts();
        Ok((parts.status, parts.headers, body))
    }

    /// One whole exchange on this connection.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Bytes,
    ) -> Result<Reply, BoxError> {
        let t0 = Instant::now();
        let (status, headers, body) = self.start(method, path, key, body).await?;
        let bytes = body.collect().await?.to_bytes();
        Ok(Reply {
            status,
            headers,
            text: String::from_utf8_lossy(&bytes).into_owned(),
            elapsed: t0.elapsed(),
            at: Instant::now(),
        })
    }
}

/// `POST url` with `key` and a raw body, on a fresh connection.
pub async fn post_raw(url: &str, key: Option<&str>, body: impl Into<Bytes>) -> Reply {
    let body = body.into();
    let exchange = async {
        let mut conn = Conn::open(url).await?;
        conn.send(Method::POST, url_path(url), key, body).await
    };
    tokio::time::timeout(HTTP_DEADLINE, exchange)
        .await
        .unwrap_or_else(|_| panic!("POST {url} timed out"))
        .unwrap_or_else(|e| panic!("POST {url}: {e}"))
}

/// `POST url` with `key` and a JSON body, on a fresh connection.
pub async fn post(url: &str, key: Option<&str>, body: &Value) -> Reply {
    post_raw(url, key, body.to_string()).await
}

/// A `/v1/completions` body for [`MODEL`]: exactly `max_tokens` completion tokens.
pub fn completion(prompt: &str, max_tokens: u64) -> Value {
    serde_json::json!({
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true,
    })
}

/// Exact prompt tokens of `text` as the gateway estimates them for [`MODEL`] (cl100k).
pub fn prompt_tokens(text: &str) -> u64 {
    infergate::tokens::Estimator::Cl100k.count(text)
}
