//! Gateway harness of the end-to-end tests: config files in a private temp directory, the gateway
//! (`infergate gateway` / `infergate up`) as a real child process on ephemeral ports, engines on a
//! chosen port (to restart a killed worker where it was), signals, admin status and polling helpers.
//! Every wait polls against a deadline; every child is killed when its handle is dropped.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{HeaderMap, Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdout, Command};

use super::{SseEvent, Streamed, find_metric, get};

/// The model every test config routes.
pub const MODEL: &str = "llama-3-8b";
/// The pool every test config declares.
pub const POOL: &str = "p";
/// How long the gateway may take to print its addresses and become ready.
const START_DEADLINE: Duration = Duration::from_secs(60);
/// How long one HTTP exchange of these helpers may take.
const HTTP_DEADLINE: Duration = Duration::from_secs(30);
/// Output kept per child for failure messages.
const KEEP: usize = 64 * 1024;

/// Boxed error of the raw HTTP helpers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A fresh directory under the system temp dir, removed (with its contents) on drop.
pub struct TempDir {
    /// Absolute path of the directory.
    pub path: PathBuf,
}

impl TempDir {
    /// Creates `infergate-<tag>-<pid>-<nanos>-<n>` under `std::env::temp_dir()`.
    pub fn new(tag: &str) -> TempDir {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("infergate-{tag}-{}-{nanos}-{n}", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(path.join("policies")).expect("create temp dir");
        TempDir { path }
    }

    /// `DIR/infergate.yaml`.
    pub fn config(&self) -> PathBuf {
        self.path.join("infergate.yaml")
    }

    /// `DIR/policies/routing.yaml`.
    pub fn routing(&self) -> PathBuf {
        self.path.join("policies").join("routing.yaml")
    }

    /// Writes the config file (atomically: a temp file renamed over it, as editors do).
    pub fn write_config(&self, text: &str) {
        write_atomic(&self.config(), text);
    }

    /// Writes `policies/routing.yaml` atomically.
    pub fn write_routing(&self, text: &str) {
        write_atomic(&self.routing(), text);
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Replaces `path` with `text` in one rename, so a watcher never reads a half-written file.
pub fn write_atomic(path: &Path, text: &str) {
    let name = path.file_name().expect("file name").to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).expect("write temp file");
    std::fs::rename(&tmp, path).expect("rename over the file");
}

/// Health section polling every 100 ms: ejection and re-admission within a fraction of a second.
pub const FAST_HEALTH: &str =
    "health: {poll_interval: 100ms, timeout: 1s, eject_after: 2, readmit_after: 2}\n";

/// A config routing [`MODEL`] to pool [`POOL`] over `workers` (URLs), policies in `policies/`,
/// with `extra` (more top-level sections, e.g. [`FAST_HEALTH`]) inserted verbatim before `models`.
pub fn config_yaml(workers: &[&str], extra: &str) -> String {
    let mut s = String::from(
        "# infergate test config\n\
         listen: \"127.0.0.1:0\"\n\
         admin:\n  listen: \"127.0.0.1:0\"\n\
         debug_headers: true\n\
         policies: policies\n",
    );
    s.push_str(extra);
    if !extra.is_empty() && !extra.ends_with('\n') {
        s.push('\n');
    }
    s.push_str(&format!(
        "models:\n  - name: {MODEL}\n    pool: {POOL}\npools:\n  - name: {POOL}\n    workers:\n"
    ));
    for w in workers {
        s.push_str(&format!("      - url: {w}\n"));
    }
    s
}

/// A `policies/routing.yaml` giving pool [`POOL`] the policy `policy` with `params` (YAML lines
/// such as `load_factor: 1.0`).
pub fn routing_yaml(policy: &str, params: &[&str]) -> String {
    let mut s = format!("pools:\n  {POOL}:\n    policy: {policy}\n");
    for p in params {
        s.push_str(&format!("    {p}\n"));
    }
    s
}

/// 1-based number of the first line of `text` containing `needle`.
pub fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in:\n{text}"))
        + 1
}

/// Drains a child's output into a bounded buffer (see [`super::drain_into`]).
fn drain(out: impl AsyncRead + Unpin + Send + 'static) -> Arc<Mutex<String>> {
    let kept = Arc::new(Mutex::new(String::new()));
    super::drain_into(out, kept.clone(), KEEP);
    kept
}

/// Sends `sig` (e.g. `TERM`, `HUP`, `KILL`) to `pid` with the `kill` utility.
pub fn send_signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// Direct children of `pid` (from `/proc/PID/task/*/children`).
pub fn child_pids(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// True while `pid` exists and is not a zombie.
pub fn is_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The command line of `pid`, arguments joined by spaces.
pub fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Polls `probe` every 20 ms until it yields a value, failing the test after `within`.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running gateway; the process (and, for `up`, its engine children) is killed on drop.
pub struct Gateway {
    /// `http://ADDR` (or `https://ADDR`) of the public listener.
    pub url: String,
    /// `http://ADDR` of the admin listener.
    pub admin: String,
    /// The demo API key `up` printed, if any.
    pub api_key: Option<String>,
    /// What the gateway printed on stdout at start, line by line.
    pub banner: Vec<String>,
    /// Public listener address.
    pub addr: SocketAddr,
    /// Process id.
    pub pid: u32,
    child: Child,
    _stdout: BufReader<ChildStdout>,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if is_running(self.pid) {
            // A SIGKILLed gateway cannot stop the engines it spawned: stop them first.
            for pid in child_pids(self.pid) {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
        let _ = self.child.start_kill();
    }
}

impl Gateway {
    /// `infergate up [--config CONFIG] --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0` (the
    /// embedded config without `config`).
    pub async fn up(config: Option<&Path>) -> Gateway {
        let config = config.map(|c| c.to_string_lossy().into_owned());
        let mut args = vec!["up"];
        if let Some(c) = &config {
            args.extend(["--config", c.as_str()]);
        }
        args.extend(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]);
        Self::launch(&args, &[]).await
    }

    /// `infergate gateway --config CONFIG --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0`, with
    /// `env` set on the child only.
    pub async fn start(config: &Path, env: &[(&str, &str)]) -> Gateway {
        let config = config.to_string_lossy().into_owned();
        let args = [
            "gateway",
            "--config",
            config.as_str(),
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ];
        Self::launch(&args, env).await
    }

    /// `infergate ARGS` (e.g. `up --listen ...`): reads the start banner (addresses, demo key,
    /// curl line) from stdout, then waits for `/readyz`.
    pub async fn launch(args: &[&str], env: &[(&str, &str)]) -> Gateway {
        Self::launch_in(None, args, env).await
    }

    /// `launch`, with the child's working directory set to `cwd` when given.
    pub async fn launch_in(cwd: Option<&Path>, args: &[&str], env: &[(&str, &str)]) -> Gateway {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_infergate"));
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        }
        cmd.args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn infergate");
        let pid = child.id().expect("child pid");
        let stderr = drain(child.stderr.take().expect("piped stderr"));
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let deadline = Instant::now() + START_DEADLINE;
        let (mut public, mut admin, mut api_key) = (None, None, None);
        let mut banner = Vec::new();
        // The banner ends with the `try:` line (every test config routes a model).
        while !banner.iter().any(|l: &String| l.starts_with("try:")) {
            let mut line = String::new();
            let read = tokio::time::timeout_at(deadline.into(), stdout.read_line(&mut line)).await;
            if !matches!(read, Ok(Ok(n)) if n > 0) {
                let _ = child.start_kill();
                panic!(
                    "infergate {args:?} printed no banner ({read:?}): {banner:?}; stderr:\n{}",
                    stderr.lock().unwrap()
                );
            }
            let line = line.trim().to_owned();
            if let Some(u) = line.strip_prefix("infergate gateway listening on ") {
                public = Some(u.to_owned());
            } else if let Some(u) = line.strip_prefix("admin listening on ") {
                admin = Some(u.to_owned());
            } else if let Some(k) = line.strip_prefix("demo API key (new at every start): ") {
                api_key = Some(k.to_owned());
            }
            banner.push(line);
        }
        // The curl line follows `try:`.
        let mut line = String::new();
        if let Ok(Ok(n)) =
            tokio::time::timeout_at(deadline.into(), stdout.read_line(&mut line)).await
            && n > 0
        {
            banner.push(line.trim().to_owned());
        }
        let (Some(public), Some(admin)) = (public, admin) else {
            panic!("no addresses in the banner {banner:?}");
        };
        let url = public;
        let addr: SocketAddr = url
            .split_once("://")
            .map(|(_, a)| a)
            .unwrap_or(&url)
            .parse()
            .unwrap_or_else(|e| panic!("bad gateway address {url:?}: {e}"));
        let gw = Gateway {
            url,
            admin,
            api_key,
            banner,
            addr,
            pid,
            child,
            _stdout: stdout,
            stderr,
        };
        if gw.url.starts_with("http://") {
            let ready = gw.at("/readyz");
            eventually("gateway /readyz 200", START_DEADLINE, || async {
                let res = send(Method::GET, &ready, &[], None).await;
                matches!(res, Ok((StatusCode::OK, _, _))).then_some(())
            })
            .await;
        }
        gw
    }

    /// The URL of `path` on the public listener.
    pub fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// The URL of `path` on the admin listener.
    pub fn admin_at(&self, path: &str) -> String {
        format!("{}{path}", self.admin)
    }

    /// What the gateway wrote to stderr so far (the last few KiB).
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends `sig` to the gateway process.
    pub fn signal(&self, sig: &str) {
        send_signal(self.pid, sig);
    }

    /// Waits until the process exits, failing the test after `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => status.expect("wait on the gateway"),
            Err(_) => panic!(
                "gateway still running after {within:?}; stderr:\n{}",
                self.stderr()
            ),
        }
    }

    /// The gateway's `/metrics` text.
    pub async fn metrics(&self) -> String {
        let (status, text) = get(&self.admin_at("/metrics")).await;
        assert_eq!(status, StatusCode::OK, "GET /metrics");
        text
    }

    /// Current value of a gateway metric, 0 when the series does not exist (yet).
    pub async fn metric(&self, selector: &str) -> f64 {
        find_metric(&self.metrics().await, selector).unwrap_or(0.0)
    }

    /// Polls the admin `/metrics` until `selector` satisfies `pred` (5 s at most); its value.
    pub async fn wait_metric(&self, selector: &str, pred: impl Fn(f64) -> bool) -> f64 {
        eventually(selector, Duration::from_secs(5), || async {
            let v = self.metric(selector).await;
            pred(v).then_some(v)
        })
        .await
    }

    /// `GET /admin/status` as JSON (no admin key).
    pub async fn status(&self) -> Value {
        let (status, body) = get(&self.admin_at("/admin/status")).await;
        assert_eq!(status, StatusCode::OK, "admin status: {body}");
        serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("admin status not JSON ({e}): {body}"))
    }

    /// The admin status entry of the worker at `url` in pool [`POOL`].
    pub async fn worker_status(&self, url: &str) -> Value {
        let status = self.status().await;
        pool_workers(&status, POOL)
            .into_iter()
            .find(|w| w["url"] == url)
            .unwrap_or_else(|| panic!("worker {url} not in admin status {status}"))
    }

    /// Polls until the worker at `url` has health `healthy` in both the admin status and the
    /// `infergate_worker_healthy` gauge.
    pub async fn wait_health(&self, url: &str, healthy: bool, within: Duration) {
        let gauge = format!("infergate_worker_healthy{{worker=\"{url}\"}}");
        let want = if healthy { 1.0 } else { 0.0 };
        eventually(&format!("{url} healthy={healthy}"), within, || async {
            let admin = self.worker_status(url).await["healthy"] == healthy;
            let metric = find_metric(&self.metrics().await, &gauge) == Some(want);
            (admin && metric).then_some(())
        })
        .await;
    }
}

/// The worker entries of `pool` in an admin status document.
pub fn pool_workers(status: &Value, pool: &str) -> Vec<Value> {
    status["pools"]
        .as_array()
        .and_then(|pools| pools.iter().find(|p| p["name"] == pool))
        .and_then(|p| p["workers"].as_array())
        .cloned()
        .unwrap_or_else(|| panic!("no pool {pool} in admin status {status}"))
}

/// The routing policy of pool [`POOL`] as the admin status shows it.
pub fn pool_policy(status: &Value) -> String {
    status["pools"]
        .as_array()
        .and_then(|pools| pools.iter().find(|p| p["name"] == POOL))
        .and_then(|p| p["policy"].as_str())
        .unwrap_or_else(|| panic!("no policy for {POOL} in {status}"))
        .to_owned()
}

/// An engine started on a chosen port (e.g. where a killed worker was); killed on drop.
pub struct PortEngine {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    child: Child,
    stderr: Arc<Mutex<String>>,
    _stdout: Arc<Mutex<String>>,
}

impl Drop for PortEngine {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

impl PortEngine {
    /// Spawns `infergate engine --backend sim --port PORT ARGS` and polls `/health` until 200,
    /// spawning again while the port is still held (the engine exits when it cannot bind).
    pub async fn start(port: u16, args: &[&str]) -> PortEngine {
        let deadline = Instant::now() + START_DEADLINE;
        'spawn: loop {
            let mut engine = Self::spawn(port, args);
            let health = format!("{}/health", engine.url);
            loop {
                let res = send(Method::GET, &health, &[], None).await;
                if matches!(res, Ok((StatusCode::OK, _, _))) {
                    return engine;
                }
                let exited = matches!(engine.child.try_wait(), Ok(Some(_)));
                assert!(
                    Instant::now() < deadline,
                    "engine on port {port} never became healthy; stderr:\n{}",
                    engine.stderr.lock().unwrap()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
                if exited {
                    continue 'spawn;
                }
            }
        }
    }

    fn spawn(port: u16, args: &[&str]) -> PortEngine {
        let mut child = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .arg("engine")
            .args(["--backend", "sim", "--port", &port.to_string()])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn infergate engine");
        PortEngine {
            url: format!("http://127.0.0.1:{port}"),
            stderr: drain(child.stderr.take().expect("piped stderr")),
            _stdout: drain(child.stdout.take().expect("piped stdout")),
            child,
        }
    }
}

/// The port of a `http://HOST:PORT` URL.
pub fn port_of(url: &str) -> u16 {
    url.rsplit_once(':')
        .and_then(|(_, p)| p.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"))
}

/// One request on a fresh connection with extra `headers`: status, headers and body text.
pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> Result<(StatusCode, HeaderMap, String), BoxError> {
    let exchange = async {
        let uri: Uri = url.parse()?;
        let authority = uri.authority().ok_or("URL without authority")?.clone();
        let tcp = TcpStream::connect(authority.as_str()).await?;
        tcp.set_nodelay(true)?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, authority.as_str());
        if body.is_some() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let res = sender.send_request(req).await;
        let out = match res {
            Ok(res) => {
                let (parts, body) = res.into_parts();
                let bytes = body.collect().await?.to_bytes();
                Ok((
                    parts.status,
                    parts.headers,
                    String::from_utf8_lossy(&bytes).into_owned(),
                ))
            }
            Err(e) => Err(e.into()),
        };
        conn.abort();
        out
    };
    tokio::time::timeout(HTTP_DEADLINE, exchange)
        .await
        .map_err(|_| format!("{url}: no answer within {HTTP_DEADLINE:?}"))?
}

/// `POST url` with `body` and extra `headers`, the answer read frame by frame into SSE events
/// (each stamped with its arrival time); an error answer comes back with no events.
pub async fn stream_with(url: &str, headers: &[(&str, &str)], body: &Value) -> Streamed {
    let started = Instant::now();
    let exchange = async {
        let uri: Uri = url.parse()?;
        let authority = uri.authority().ok_or("URL without authority")?.clone();
        let tcp = TcpStream::connect(authority.as_str()).await?;
        tcp.set_nodelay(true)?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(HOST, authority.as_str())
            .header(CONTENT_TYPE, "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body.to_string())))?;
        let (parts, mut incoming) = sender.send_request(req).await?.into_parts();
        let mut events = Vec::new();
        let mut buf = String::new();
        if parts.status == StatusCode::OK {
            while let Some(frame) = incoming.frame().await {
                if let Ok(data) = frame?.into_data() {
                    buf.push_str(&String::from_utf8_lossy(&data));
                }
                while let Some(end) = buf.find("\n\n") {
                    let block: String = buf.drain(..end + 2).collect();
                    events.push(sse_event(&block, Instant::now()));
                }
            }
            assert!(
                buf.trim().is_empty(),
                "stream ended inside an event: {buf:?}"
            );
        }
        conn.abort();
        Ok::<_, BoxError>(Streamed {
            status: parts.status,
            headers: parts.headers,
            started,
            events,
        })
    };
    tokio::time::timeout(HTTP_DEADLINE, exchange)
        .await
        .unwrap_or_else(|_| panic!("POST {url} (stream) timed out"))
        .unwrap_or_else(|e| panic!("POST {url} (stream): {e}"))
}

/// One SSE block: its `data:` lines joined, its comment lines.
fn sse_event(block: &str, at: Instant) -> SseEvent {
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

/// A chat request for [`MODEL`]: `system` then `user`, exactly `max_tokens` generated.
pub fn chat(system: &str, user: &str, max_tokens: u64, stream: bool) -> Value {
    json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ],
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": stream,
    })
}

/// The `x-infergate-worker` header of a gateway answer.
pub fn worker_of(headers: &HeaderMap) -> String {
    headers
        .get("x-infergate-worker")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no x-infergate-worker header in {headers:?}"))
        .to_owned()
}

/// Pseudo-random prose of about `bytes` bytes, distinct for each `seed` from its first word on.
pub fn random_text(bytes: usize, seed: u64) -> String {
    const WORDS: [&str; 32] = [
        "amber", "basil", "cedar", "delta", "ember", "fjord", "gravel", "hazel", "iris", "juniper",
        "kelp", "lumen", "maple", "nectar", "onyx", "pepper", "quartz", "raven", "saffron",
        "thistle", "umber", "violet", "willow", "xenon", "yarrow", "zephyr", "copper", "meadow",
        "lantern", "orchid", "pebble", "tundra",
    ];
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut next = || {
        // splitmix64
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut s = format!("Context {seed}:");
    while s.len() < bytes {
        s.push(' ');
        s.push_str(WORDS[(next() % WORDS.len() as u64) as usize]);
    }
    s
}
