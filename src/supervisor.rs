//! Supervisor for local engine workers: spawn, wait for readiness, restart with backoff, stop.
//!
//! Each worker is a child process (normally `infergate engine ...` of this same binary) started
//! with `--port P --exit-with-stdin`. With `P` 0 the worker binds a port of its own and the
//! supervisor learns it from the worker's `listening on http://ADDR` line: no other process can
//! take a port between our choosing it and the worker binding it. Restarts keep that port.
//! The worker's stdin is a pipe that we keep open, so a worker never outlives the gateway even
//! if the gateway dies without cleaning up. Stopping is SIGTERM, a grace period, then SIGKILL.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A worker that stays up this long gets its restart backoff reset to the minimum.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(30);
/// Interval between readiness polls during startup.
const READY_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Limit for one `GET /health` attempt.
const HEALTH_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// One local worker to run: the executable's args after the subcommand, and its fixed port.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSpec {
    /// Pool the worker serves.
    pub pool: String,
    /// Arguments after the executable, e.g. `["engine", "--backend", "sim"]`, without `--port`.
    pub args: Vec<String>,
    /// Loopback port the worker listens on, kept across restarts; 0 lets the worker pick it
    /// (learned from its banner before [`Supervisor::start`] returns).
    pub port: u16,
}

impl WorkerSpec {
    fn label(&self) -> String {
        format!("{}/{}", self.pool, self.port)
    }
}

/// How workers are run, waited for, restarted and stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct SupervisorConfig {
    /// Executable to run (`std::env::current_exe()` in production).
    pub exe: PathBuf,
    /// How long a worker may take to answer `GET /health` with 200 at startup.
    pub ready_timeout: Duration,
    /// How long a worker has to exit after SIGTERM before it is killed.
    pub stop_grace: Duration,
    /// First restart delay; doubles after each restart.
    pub backoff_min: Duration,
    /// Upper bound of the restart delay.
    pub backoff_max: Duration,
}

impl SupervisorConfig {
    /// Config for `exe` with the default timeouts (60 s ready, 10 s grace, 200 ms..10 s backoff).
    pub fn new(exe: PathBuf) -> Self {
        Self {
            exe,
            ready_timeout: Duration::from_secs(60),
            stop_grace: Duration::from_secs(10),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
        }
    }
}

/// Returns a loopback port that was free a moment ago (bind 127.0.0.1:0, read it, release it).
/// Another process may take it before it is used: workers are better started on port 0.
pub fn free_loopback_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// Running local workers, each watched by a task that restarts it when it exits unexpectedly.
pub struct Supervisor {
    specs: Vec<WorkerSpec>,
    pids: Vec<Arc<Mutex<Option<u32>>>>,
    restarts: Arc<AtomicU64>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Supervisor {
    /// Spawns every worker, waits until each answers `GET /health` with 200, then supervises them.
    ///
    /// Fails fast, naming the worker, if one cannot be spawned, exits (with its exit status) or is
    /// not ready within `ready_timeout`; the workers already started are then stopped.
    pub async fn start(
        mut specs: Vec<WorkerSpec>,
        cfg: SupervisorConfig,
    ) -> Result<Supervisor, String> {
        let fixed = || specs.iter().enumerate().filter(|(_, s)| s.port != 0);
        // The spec's own mistake first, whatever else holds the port at the moment.
        for (i, spec) in fixed() {
            if specs[..i].iter().any(|s| s.port == spec.port) {
                return Err(format!(
                    "worker {}: port {} is used twice",
                    spec.label(),
                    spec.port
                ));
            }
        }
        for (_, spec) in fixed() {
            // Another process on the port would answer our health checks in the worker's place.
            if let Err(e) = std::net::TcpListener::bind(("127.0.0.1", spec.port)) {
                return Err(format!(
                    "worker {}: port {} is not available: {e}",
                    spec.label(),
                    spec.port
                ));
            }
        }
        let mut running = Vec::with_capacity(specs.len());
        for spec in &specs {
            match Running::spawn(&cfg.exe, spec) {
                Ok(r) => running.push(r),
                Err(e) => {
                    stop_all(running.iter_mut(), cfg.stop_grace).await;
                    return Err(format!(
                        "worker {}: cannot spawn {}: {e}",
                        spec.label(),
                        cfg.exe.display()
                    ));
                }
            }
        }
        if let Err(e) = wait_all_ready(&mut specs, &mut running, cfg.ready_timeout).await {
            stop_all(running.iter_mut(), cfg.stop_grace).await;
            return Err(e);
        }

        let (stop, _) = watch::channel(false);
        let restarts = Arc::new(AtomicU64::new(0));
        let cfg = Arc::new(cfg);
        let mut pids = Vec::with_capacity(specs.len());
        let mut tasks = Vec::with_capacity(specs.len());
        for (spec, run) in specs.iter().zip(running) {
            let pid = Arc::new(Mutex::new(run.child.id()));
            let watcher = Watcher {
                spec: spec.clone(),
                cfg: Arc::clone(&cfg),
                pid: Arc::clone(&pid),
                restarts: Arc::clone(&restarts),
                stop: stop.subscribe(),
            };
            tasks.push(tokio::spawn(watcher.run(run)));
            pids.push(pid);
        }
        Ok(Supervisor {
            specs,
            pids,
            restarts,
            stop,
            tasks,
        })
    }

    /// URL of each worker, `http://127.0.0.1:PORT`, with its pool, in spec order.
    pub fn urls(&self) -> Vec<(String, String)> {
        self.specs
            .iter()
            .map(|s| (s.pool.clone(), format!("http://127.0.0.1:{}", s.port)))
            .collect()
    }

    /// Restarts seen so far, all workers together.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Process id of each worker in spec order; `None` while one is down or being restarted.
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.pids.iter().map(|p| read_pid(p)).collect()
    }

    /// Stops all workers (SIGTERM, up to `stop_grace`, then SIGKILL) and waits for every exit.
    /// No restart happens once this has begun.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        for task in std::mem::take(&mut self.tasks) {
            if let Err(e) = task.await {
                tracing::error!("worker supervision task failed: {e}");
            }
        }
    }
}

impl Drop for Supervisor {
    /// Without `shutdown`, the watch tasks are aborted: dropping their `Child` kills it
    /// (`kill_on_drop`) and closes its stdin, so no worker keeps running.
    fn drop(&mut self) {
        self.stop.send_replace(true);
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn read_pid(pid: &Mutex<Option<u32>>) -> Option<u32> {
    *pid.lock().unwrap_or_else(|e| e.into_inner())
}

fn set_pid(pid: &Mutex<Option<u32>>, value: Option<u32>) {
    *pid.lock().unwrap_or_else(|e| e.into_inner()) = value;
}

/// Next restart delay: double, capped at `max`.
fn next_backoff(current: Duration, max: Duration) -> Duration {
    current.saturating_mul(2).min(max)
}

/// A spawned worker process and the write end of its stdin pipe.
struct Running {
    child: Child,
    /// The port from the worker's `listening on` line, once printed.
    announced: tokio::sync::oneshot::Receiver<u16>,
    /// Held open for the worker's lifetime: `--exit-with-stdin` makes it exit when this closes.
    _stdin: Option<ChildStdin>,
}

impl Running {
    fn spawn(exe: &Path, spec: &WorkerSpec) -> std::io::Result<Running> {
        let mut child = Command::new(exe)
            .args(&spec.args)
            .arg("--port")
            .arg(spec.port.to_string())
            .arg("--exit-with-stdin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let label = spec.label();
        let (announce, announced) = tokio::sync::oneshot::channel();
        if let Some(out) = child.stdout.take() {
            tokio::spawn(forward_lines(out, label.clone(), Some(announce)));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(forward_lines(err, label.clone(), None));
        }
        tracing::info!(worker = %label, pid = child.id().unwrap_or(0), "worker spawned");
        let stdin = child.stdin.take();
        Ok(Running {
            child,
            announced,
            _stdin: stdin,
        })
    }
}

/// Copies a worker's output to our stderr, each line prefixed with `[pool/port]`; the port of
/// the first `listening on http://HOST:PORT` line goes to `announce`.
async fn forward_lines(
    stream: impl AsyncRead + Unpin,
    label: String,
    mut announce: Option<tokio::sync::oneshot::Sender<u16>>,
) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end_matches(['\n', '\r']);
                if let Some(port) = announced_port(text)
                    && let Some(tx) = announce.take()
                {
                    let _ = tx.send(port);
                }
                eprintln!("[{label}] {text}");
            }
        }
    }
}

/// The port of a `... listening on http://HOST:PORT` line.
fn announced_port(line: &str) -> Option<u16> {
    let (_, url) = line.split_once("listening on http://")?;
    let (_, port) = url.trim().rsplit_once(':')?;
    port.parse().ok()
}

/// Polls every worker until all answer `GET /health` with 200; fails on the first exit or at the
/// deadline.
async fn wait_all_ready(
    specs: &mut [WorkerSpec],
    running: &mut [Running],
    timeout: Duration,
) -> Result<(), String> {
    let client = health_client();
    let deadline = Instant::now() + timeout;
    let mut ready = vec![false; specs.len()];
    loop {
        for ((spec, run), ready) in specs
            .iter_mut()
            .zip(running.iter_mut())
            .zip(ready.iter_mut())
        {
            if *ready {
                continue;
            }
            match run.child.try_wait() {
                Ok(Some(status)) => {
                    return Err(format!(
                        "worker {} exited during startup ({status})",
                        spec.label()
                    ));
                }
                Ok(None) => {}
                Err(e) => return Err(format!("worker {}: cannot check status: {e}", spec.label())),
            }
            if spec.port == 0 {
                match run.announced.try_recv() {
                    Ok(port) => spec.port = port,
                    // Not printed yet (or its stdout closed: the exit check above reports it).
                    Err(_) => continue,
                }
            }
            // Only our own child counts: another process on the port would answer in its place.
            if health_ok(&client, spec.port, run.child.id()).await {
                tracing::info!(worker = %spec.label(), "worker ready");
                *ready = true;
            }
        }
        if ready.iter().all(|r| *r) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let waiting: Vec<String> = specs
                .iter()
                .zip(&ready)
                .filter(|(_, r)| !**r)
                .map(|(s, _)| s.label())
                .collect();
            return Err(format!(
                "worker {} did not answer GET /health with 200 within {timeout:?}",
                waiting.join(", ")
            ));
        }
        tokio::time::sleep(READY_POLL_INTERVAL).await;
    }
}

type HealthClient = Client<HttpConnector, Empty<Bytes>>;

fn health_client() -> HealthClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// True when `GET http://127.0.0.1:PORT/health` answers 200 within [`HEALTH_REQUEST_TIMEOUT`],
/// from the process `pid` when given (the engine names itself in its `PID_HEADER`), and the
/// worker is not warming up.
async fn health_ok(client: &HealthClient, port: u16, pid: Option<u32>) -> bool {
    let Ok(uri) = format!("http://127.0.0.1:{port}/health").parse::<hyper::Uri>() else {
        return false;
    };
    let healthy = match tokio::time::timeout(HEALTH_REQUEST_TIMEOUT, client.get(uri)).await {
        Ok(Ok(resp)) if resp.status() == hyper::StatusCode::OK => pid.is_none_or(|pid| {
            resp.headers()
                .get(infergate_engine::server::PID_HEADER)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v == pid.to_string())
        }),
        _ => false,
    };
    healthy && !warming(client, port).await
}

/// True while the worker's `GET /ready` answers 503 (an engine still warming its capture sizes):
/// `up` hands the gateway workers that are warm, so the first requests find them in rotation.
/// A worker without `/ready` (any other answer) is not warming.
async fn warming(client: &HealthClient, port: u16) -> bool {
    let Ok(uri) = format!("http://127.0.0.1:{port}/ready").parse::<hyper::Uri>() else {
        return false;
    };
    matches!(
        tokio::time::timeout(HEALTH_REQUEST_TIMEOUT, client.get(uri)).await,
        Ok(Ok(resp)) if resp.status() == hyper::StatusCode::SERVICE_UNAVAILABLE
    )
}

/// Sends SIGTERM to `pid`. The crate forbids `unsafe`, so there is no `libc::kill`: we run the
/// shell's `kill -TERM <pid>` (the builtin, which exists even where `/bin/kill` does not).
async fn send_sigterm(pid: u32) -> bool {
    Command::new("sh")
        .args(["-c", "kill -TERM \"$1\"", "kill"])
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// Stops workers together: SIGTERM to each, a shared grace period, then SIGKILL; waits for all.
async fn stop_all<'a>(running: impl Iterator<Item = &'a mut Running>, grace: Duration) {
    let mut live = Vec::new();
    for run in running {
        // An exited child stays a zombie until it is waited for, so its pid cannot be reused
        // between this check and the signal.
        if !matches!(run.child.try_wait(), Ok(None)) {
            continue;
        }
        let Some(pid) = run.child.id() else { continue };
        if !send_sigterm(pid).await {
            tracing::warn!(pid, "SIGTERM failed; killing the worker");
            let _ = run.child.start_kill();
        }
        live.push(run);
    }
    let deadline = Instant::now() + grace;
    for run in live {
        if tokio::time::timeout_at(deadline, run.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                pid = run.child.id().unwrap_or(0),
                "worker ignored SIGTERM for {grace:?}; killing it"
            );
            let _ = run.child.start_kill();
            let _ = run.child.wait().await;
        }
    }
}

/// Watches one worker for its whole life and restarts it when it exits unexpectedly.
struct Watcher {
    spec: WorkerSpec,
    cfg: Arc<SupervisorConfig>,
    pid: Arc<Mutex<Option<u32>>>,
    restarts: Arc<AtomicU64>,
    stop: watch::Receiver<bool>,
}

impl Watcher {
    async fn run(mut self, mut run: Running) {
        let label = self.spec.label();
        let mut backoff = self.cfg.backoff_min;
        loop {
            let started = Instant::now();
            let status = tokio::select! {
                biased;
                () = stopped(&mut self.stop) => None,
                status = run.child.wait() => Some(status),
            };
            let Some(status) = status else {
                stop_all(std::iter::once(&mut run), self.cfg.stop_grace).await;
                set_pid(&self.pid, None);
                return;
            };
            set_pid(&self.pid, None);
            match status {
                Ok(s) => tracing::warn!(worker = %label, "worker exited unexpectedly ({s})"),
                Err(e) => tracing::warn!(worker = %label, "lost track of worker: {e}"),
            }
            if started.elapsed() >= BACKOFF_RESET_AFTER {
                backoff = self.cfg.backoff_min;
            }
            run = loop {
                tracing::info!(worker = %label, "restarting worker in {backoff:?}");
                if !self.pause(backoff).await {
                    return;
                }
                backoff = next_backoff(backoff, self.cfg.backoff_max);
                match Running::spawn(&self.cfg.exe, &self.spec) {
                    Ok(r) => break r,
                    Err(e) => tracing::error!(worker = %label, "cannot restart worker: {e}"),
                }
            };
            self.restarts.fetch_add(1, Ordering::Relaxed);
            set_pid(&self.pid, run.child.id());
        }
    }

    /// Sleeps for `delay`; false when shutdown began meanwhile (or before).
    async fn pause(&mut self, delay: Duration) -> bool {
        tokio::select! {
            biased;
            () = stopped(&mut self.stop) => false,
            _ = tokio::time::sleep(delay) => !*self.stop.borrow(),
        }
    }
}

/// Resolves once shutdown has begun (or the supervisor is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The returned guard is dropped here, so it is never held across an await.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

#[cfg(test)]
#[path = "supervisor_tests.rs"]
mod tests;
