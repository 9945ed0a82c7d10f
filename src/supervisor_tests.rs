//! Supervisor tests against real child processes: a tiny Python HTTP worker stands in for
//! `infergate engine` (same `--port P --exit-with-stdin` contract).

use super::*;
use std::sync::OnceLock;

/// Stand-in worker. Extra args: `--ignore-term`, `--pid-file PATH`, `--term-file PATH`.
const WORKER_PY: &str = r#"
import os, signal, sys, threading
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1] if name in args else None
port = int(opt("--port"))
if opt("--pid-file"):
    with open(opt("--pid-file"), "w") as f:
        f.write(str(os.getpid()))
def on_term(signum, frame):
    if opt("--term-file"):
        with open(opt("--term-file"), "w") as f:
            f.write("term")
    os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if "--ignore-term" in args else on_term)
if "--exit-with-stdin" in args:
    def watch_stdin():
        sys.stdin.buffer.read()
        os._exit(0)
    threading.Thread(target=watch_stdin, daemon=True).start()
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("x-infergate-pid", str(os.getpid()))
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
server = HTTPServer(("127.0.0.1", port), H)
print(f"test worker listening on http://127.0.0.1:{server.server_port}", flush=True)
server.serve_forever()
"#;

/// The real interpreter behind `python3` (skips the pyenv shim's startup cost).
fn python() -> PathBuf {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| PathBuf::from(s.trim()))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("python3"))
    })
    .clone()
}

fn sh() -> PathBuf {
    PathBuf::from("/bin/sh")
}

fn cfg(exe: PathBuf) -> SupervisorConfig {
    SupervisorConfig {
        exe,
        ready_timeout: Duration::from_secs(20),
        stop_grace: Duration::from_secs(5),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
    }
}

/// A Python worker run through `sh` (`exec`, so the pid is the interpreter's), on a port of its
/// own choosing (as `infergate up` starts engines).
fn py_spec(pool: &str, extra: &[&str]) -> WorkerSpec {
    let mut script = format!(
        "exec {} -c '{}' \"$@\"",
        python().display(),
        WORKER_PY.replace('\'', "'\\''")
    );
    for arg in extra {
        script.push_str(&format!(" '{arg}'"));
    }
    WorkerSpec {
        port: 0,
        ..sh_spec(pool, &script)
    }
}

fn sh_spec(pool: &str, script: &str) -> WorkerSpec {
    WorkerSpec {
        pool: pool.into(),
        args: vec!["-c".into(), script.into(), "worker".into()],
        port: free_loopback_port().unwrap(),
    }
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("infergate-sup-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// True while `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Polls `cond` every 20 ms until it holds; panics with `what` after `limit`.
async fn eventually<F: AsyncFnMut() -> bool>(what: &str, limit: Duration, mut cond: F) {
    let deadline = Instant::now() + limit;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn healthy(port: u16) -> bool {
    health_ok(&health_client(), port, None).await
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    let max = Duration::from_secs(10);
    let mut d = Duration::from_millis(200);
    let mut seen = vec![d];
    for _ in 0..8 {
        d = next_backoff(d, max);
        seen.push(d);
    }
    assert_eq!(seen[1], Duration::from_millis(400));
    assert_eq!(seen[5], Duration::from_millis(6400));
    assert_eq!(seen[6], max);
    assert_eq!(seen[8], max);
}

#[test]
fn free_port_is_bindable() {
    let port = free_loopback_port().unwrap();
    assert_ne!(port, 0);
    std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
}

#[test]
fn the_port_comes_from_the_listening_line() {
    assert_eq!(
        announced_port("infergate engine listening on http://127.0.0.1:41234"),
        Some(41234)
    );
    assert_eq!(announced_port("listening on http://[::1]:9"), Some(9));
    assert_eq!(announced_port("loading the model"), None);
    assert_eq!(announced_port("listening on http://127.0.0.1:x"), None);
}

/// The race this guards against: a port chosen ahead goes to another process, which answers
/// `/health` in the worker's place. Its answer names another pid, so it does not count.
#[tokio::test]
async fn health_from_another_process_does_not_count() {
    let mut spec = py_spec("other", &[]);
    spec.port = free_loopback_port().unwrap();
    let mut other = Running::spawn(&sh(), &spec).unwrap();
    let pid = other.child.id().unwrap();
    eventually(
        "the other process serves",
        Duration::from_secs(20),
        async || healthy(spec.port).await,
    )
    .await;
    let client = health_client();
    assert!(health_ok(&client, spec.port, Some(pid)).await);
    assert!(!health_ok(&client, spec.port, Some(pid + 1)).await);
    let _ = other.child.kill().await;
}

#[test]
fn default_config_values() {
    let c = SupervisorConfig::new(PathBuf::from("/bin/true"));
    assert_eq!(c.ready_timeout, Duration::from_secs(60));
    assert_eq!(c.stop_grace, Duration::from_secs(10));
    assert_eq!(c.backoff_min, Duration::from_millis(200));
    assert_eq!(c.backoff_max, Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_workers_restarts_a_killed_one_and_shuts_down_with_sigterm() {
    let dir = scratch("restart");
    let term0 = dir.join("term0");
    let term1 = dir.join("term1");
    let specs = vec![
        py_spec("a", &["--term-file", term0.to_str().unwrap()]),
        py_spec("b", &["--term-file", term1.to_str().unwrap()]),
    ];
    let sup = Supervisor::start(specs.clone(), cfg(sh())).await.unwrap();
    let urls = sup.urls();
    // Each worker picked its own port, learned from its `listening on` line.
    let pools: Vec<&str> = urls.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(pools, ["a", "b"]);
    assert!(urls.iter().all(|(_, u)| port_of(u) != 0), "{urls:?}");
    for (_, url) in &urls {
        assert!(healthy(port_of(url)).await, "{url} not healthy after start");
    }
    assert_eq!(sup.restarts(), 0);
    let pids: Vec<u32> = sup.pids().into_iter().map(Option::unwrap).collect();

    let killed = std::process::Command::new("kill")
        .args(["-9", &pids[1].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // The restart keeps the port the gateway knows.
    let port = port_of(&urls[1].1);
    eventually(
        "worker b restarted and healthy",
        Duration::from_secs(20),
        async || {
            sup.restarts() == 1
                && sup.pids()[1].is_some_and(|p| p != pids[1])
                && healthy(port).await
        },
    )
    .await;
    assert_eq!(sup.pids()[0], Some(pids[0]), "worker a must be untouched");
    assert_eq!(sup.restarts(), 1);

    let final_pids: Vec<u32> = sup.pids().into_iter().map(Option::unwrap).collect();
    sup.shutdown().await;
    for pid in final_pids {
        assert!(!alive(pid), "worker {pid} still running after shutdown");
    }
    // Both exited through their SIGTERM handler, not a kill.
    assert!(term0.exists() && term1.exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn start_fails_fast_with_the_exit_status() {
    let good = py_spec("ok", &[]);
    let bad = sh_spec("broken", "exit 3");
    let began = Instant::now();
    let err = match Supervisor::start(vec![good, bad.clone()], cfg(sh())).await {
        Ok(_) => panic!("start must fail"),
        Err(e) => e,
    };
    assert!(err.contains(&format!("broken/{}", bad.port)), "{err}");
    assert!(err.contains("exit status: 3"), "{err}");
    assert!(began.elapsed() < Duration::from_secs(10), "not fast: {err}");
}

#[tokio::test]
async fn failed_start_stops_the_workers_already_started() {
    let dir = scratch("failstop");
    let pid_file = dir.join("pid");
    let pid_path = pid_file.to_str().unwrap().to_string();
    // The bad worker exits once the good one is up.
    let good = py_spec("ok", &["--pid-file", &pid_path]);
    let bad = sh_spec(
        "broken",
        &format!("while [ ! -s {pid_path} ]; do sleep 0.02; done; exit 7"),
    );
    let err = match Supervisor::start(vec![good, bad], cfg(sh())).await {
        Ok(_) => panic!("start must fail"),
        Err(e) => e,
    };
    assert!(err.contains("exit status: 7"), "{err}");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!alive(pid), "started worker {pid} left running");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn start_times_out_naming_the_silent_worker() {
    let mut c = cfg(sh());
    c.ready_timeout = Duration::from_millis(300);
    c.stop_grace = Duration::from_millis(300);
    let silent = sh_spec("mute", "exec sleep 30");
    let err = match Supervisor::start(vec![silent.clone()], c).await {
        Ok(_) => panic!("start must fail"),
        Err(e) => e,
    };
    assert!(err.contains(&format!("mute/{}", silent.port)), "{err}");
    assert!(err.contains("within"), "{err}");
}

#[tokio::test]
async fn missing_executable_is_a_clear_error() {
    let spec = sh_spec("x", "true");
    let err = match Supervisor::start(vec![spec], cfg("/nonexistent/infergate".into())).await {
        Ok(_) => panic!("start must fail"),
        Err(e) => e,
    };
    assert!(err.contains("cannot spawn /nonexistent/infergate"), "{err}");
}

#[tokio::test]
async fn duplicate_ports_are_rejected() {
    let a = sh_spec("a", "true");
    let mut b = sh_spec("b", "true");
    b.port = a.port;
    let err = match Supervisor::start(vec![a, b], cfg(sh())).await {
        Ok(_) => panic!("start must fail"),
        Err(e) => e,
    };
    assert!(err.contains("used twice"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_ignoring_sigterm_is_killed_after_the_grace() {
    let mut c = cfg(sh());
    c.stop_grace = Duration::from_millis(400);
    let sup = Supervisor::start(vec![py_spec("stubborn", &["--ignore-term"])], c)
        .await
        .unwrap();
    let pid = sup.pids()[0].unwrap();
    let began = Instant::now();
    sup.shutdown().await;
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(400),
        "killed before the grace: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "shutdown hung: {took:?}");
    assert!(!alive(pid), "worker {pid} survived shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_supervisor_kills_its_workers() {
    let sup = Supervisor::start(vec![py_spec("d", &["--ignore-term"])], cfg(sh()))
        .await
        .unwrap();
    let pid = sup.pids()[0].unwrap();
    drop(sup);
    eventually("dropped worker gone", Duration::from_secs(10), async || {
        !alive(pid)
    })
    .await;
}

#[tokio::test]
async fn port_already_in_use_is_rejected() {
    let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let mut spec = sh_spec("busy", "true");
    spec.port = taken.local_addr().unwrap().port();
    let err = match Supervisor::start(vec![spec], cfg(sh())).await {
        Ok(_) => panic!("start must fail"),
        Err(e) => e,
    };
    assert!(err.contains("not available"), "{err}");
}
