//! Gateway harness of the end-to-end tests: config files for one routed model, the gateway
//! (`infergate gateway` / `infergate up`) as a real child process on ephemeral ports, signals,
//! admin status, metrics and polling helpers. Every wait polls against a deadline; every child
//! is killed when its handle is dropped.

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use hyper::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use tokio::process::Child;

use super::process::{self, Kept};
use super::{HTTP_DEADLINE, METRIC_POLL, find_metric, get, settle, wait_ok};

// The toolbox the gateway tests import from here along with the gateway.
pub use super::engine::port_of;
pub use super::process::{child_pids, cmdline, is_running, send_signal};
pub use super::{BoxError, TempDir, eventually, random_text, send, stream_with, write_atomic};

/// The model every test config routes.
pub const MODEL: &str = "llama-3-8b";
/// The pool every test config declares.
pub const POOL: &str = "p";
/// How long the gateway may take to print its addresses and become ready.
const START_DEADLINE: Duration = Duration::from_secs(60);

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
    stdout: Kept,
    stderr: Kept,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if is_running(self.pid) {
            // A SIGKILLed gateway cannot stop the engines it spawned: stop them first.
            process::kill_children(self.pid);
        }
        let _ = self.child.start_kill();
    }
}

impl Gateway {
    /// `infergate up [--config CONFIG] --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0` (the
    /// embedded config without `config`).
    pub async fn up(config: Option<&Path>) -> Gateway {
        Self::up_with(config, &[]).await
    }

    /// [`up`](Self::up) with `env` set on the child only.
    pub async fn up_with(config: Option<&Path>, env: &[(&str, &str)]) -> Gateway {
        let config = config.map(|c| c.to_string_lossy().into_owned());
        let mut args = vec!["up"];
        if let Some(c) = &config {
            args.extend(["--config", c.as_str()]);
        }
        args.extend(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]);
        Self::launch(&args, env).await
    }

    /// `infergate gateway --config CONFIG --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0`, with
    /// `env` set on the child only.
    pub async fn start(config: &Path, env: &[(&str, &str)]) -> Gateway {
        Self::start_in(None, config, env).await
    }

    /// [`start`](Self::start) with the child's working directory set to `cwd` when given.
    pub async fn start_in(cwd: Option<&Path>, config: &Path, env: &[(&str, &str)]) -> Gateway {
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
        Self::launch_in(cwd, &args, env).await
    }

    /// `infergate ARGS` (e.g. `up --listen ...`): reads the start banner (addresses, demo key,
    /// curl line) from stdout, then waits for `/readyz`.
    pub async fn launch(args: &[&str], env: &[(&str, &str)]) -> Gateway {
        Self::launch_in(None, args, env).await
    }

    /// `launch`, with the child's working directory set to `cwd` when given.
    pub async fn launch_in(cwd: Option<&Path>, args: &[&str], env: &[(&str, &str)]) -> Gateway {
        let mut cmd = process::infergate();
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        }
        cmd.args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied());
        let (mut child, stderr, mut stdout) = process::spawn(&mut cmd);
        let pid = child.id().expect("child pid");
        let deadline = Instant::now() + START_DEADLINE;
        let (mut public, mut admin, mut api_key) = (None, None, None);
        let mut banner = Vec::new();
        // The banner ends with the `try:` line (every test config routes a model).
        let read = process::read_until(&mut stdout, deadline, |line| {
            if let Some(u) = line.strip_prefix("infergate gateway listening on ") {
                public = Some(u.to_owned());
            } else if let Some(u) = line.strip_prefix("admin listening on ") {
                admin = Some(u.to_owned());
            } else if let Some(k) = line.strip_prefix("demo API key (new at every start): ") {
                api_key = Some(k.to_owned());
            }
            banner.push(line.to_owned());
            line.starts_with("try:").then_some(())
        })
        .await;
        if let Err(e) = read {
            let _ = child.start_kill();
            panic!(
                "infergate {args:?} printed no banner ({e}): {banner:?}; stderr:\n{}",
                stderr.lock().unwrap()
            );
        }
        // The curl line follows `try:`.
        if let Ok(line) = process::read_until(&mut stdout, deadline, |l| Some(l.to_owned())).await {
            banner.push(line);
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
            // Drained so a gateway that keeps printing never blocks on a full pipe.
            stdout: process::drain(stdout.into_inner()),
            stderr,
        };
        // Readiness (a worker polled healthy and warm) over plain HTTP: the public listener's,
        // else, behind TLS, the admin listener's, so no request races the first poll.
        let ready = if gw.url.starts_with("http://") {
            Some(gw.at("/readyz"))
        } else {
            gw.admin
                .starts_with("http://")
                .then(|| gw.admin_at("/readyz"))
        };
        if let Some(ready) = ready {
            let within = deadline.saturating_duration_since(Instant::now());
            if let Err(e) = wait_ok(&ready, within).await {
                panic!("gateway never became ready ({e}); stderr:\n{}", gw.stderr());
            }
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

    /// Everything the gateway wrote so far (the last few KiB of stderr, then of stdout after the
    /// banner).
    pub fn output(&self) -> String {
        format!("{}{}", self.stderr(), self.stdout.lock().unwrap())
    }

    /// Process ids of the gateway's direct children (the workers `up` spawned).
    pub fn children(&self) -> Vec<u32> {
        child_pids(self.pid)
    }

    /// Resident memory of the gateway process in KiB.
    pub fn rss_kib(&self) -> u64 {
        process::rss_kib(self.pid)
    }

    /// SIGKILLs the gateway alone, as a crash would, and reaps it; its children are left be.
    pub async fn crash(&mut self) {
        self.child.start_kill().expect("kill the gateway");
        let _ = tokio::time::timeout(HTTP_DEADLINE, self.child.wait()).await;
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

    /// Polls `selector` until `pred` holds or `within` passes; returns the last value read (the
    /// caller asserts on it, so a failure shows the expected value too).
    pub async fn settle_metric(
        &self,
        selector: &str,
        within: Duration,
        pred: impl Fn(f64) -> bool,
    ) -> f64 {
        settle(within, METRIC_POLL, || self.metric(selector), |v| pred(*v)).await
    }

    /// Polls `selector` until it equals `want`, failing after `within`.
    pub async fn expect_metric(&self, selector: &str, want: f64, within: Duration) {
        let v = self.settle_metric(selector, within, |v| v == want).await;
        assert_eq!(v, want, "{selector} after {within:?}");
    }

    /// `GET path` on the admin listener (no admin key), expected 200, as JSON.
    pub async fn admin_json(&self, path: &str) -> Value {
        let (status, text) = get(&self.admin_at(path)).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: {e}: {text}"))
    }

    /// `GET /admin/status` as JSON (no admin key).
    pub async fn status(&self) -> Value {
        self.admin_json("/admin/status").await
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
