//! Child processes of the tests and benchmarks: the command every child starts from (piped
//! output, killed on drop), its output drained into bounded buffers, its start banner read under
//! a deadline, runs to completion, and the `/proc` views that shutdown tests need.

use std::ffi::OsStr;
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// Output kept per child pipe for failure messages.
pub const KEEP: usize = 64 * 1024;

/// The last [`KEEP`] bytes a child wrote to one pipe, filled as it writes.
pub type Kept = Arc<Mutex<String>>;

/// `program` with stdin closed, stdout and stderr piped, `RUST_LOG=warn` (callers override it),
/// killed when its handle is dropped.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// [`command`] for the `infergate` binary under test.
pub fn infergate() -> Command {
    command(env!("CARGO_BIN_EXE_infergate"))
}

/// Spawns `cmd` (built by [`command`]): the child, its stderr being drained, its stdout unread.
pub fn spawn(cmd: &mut Command) -> (Child, Kept, BufReader<ChildStdout>) {
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    try_spawn(cmd).unwrap_or_else(|e| panic!("spawn {program}: {e}"))
}

/// [`spawn`], handing back the error when the program cannot be started.
pub fn try_spawn(cmd: &mut Command) -> std::io::Result<(Child, Kept, BufReader<ChildStdout>)> {
    let mut child = cmd.spawn()?;
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    Ok((child, stderr, stdout))
}

/// Drains `out` into a fresh buffer (see [`drain_into`]).
pub fn drain(out: impl AsyncRead + Unpin + Send + 'static) -> Kept {
    let kept = Kept::default();
    drain_into(out, kept.clone(), KEEP);
    kept
}

/// Drains a child's output into `kept`, keeping its last `keep` bytes, so the child never blocks
/// on a full pipe.
pub fn drain_into(
    mut out: impl AsyncRead + Unpin + Send + 'static,
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

/// Reads `stdout` line by line (trimmed) until `pick` returns a value; an error names what came
/// instead (end of output, a read error, or the deadline).
pub async fn read_until<T>(
    stdout: &mut BufReader<ChildStdout>,
    deadline: Instant,
    mut pick: impl FnMut(&str) -> Option<T>,
) -> Result<T, String> {
    loop {
        let mut line = String::new();
        match tokio::time::timeout_at(deadline.into(), stdout.read_line(&mut line)).await {
            Ok(Ok(n)) if n > 0 => {
                if let Some(v) = pick(line.trim()) {
                    return Ok(v);
                }
            }
            Ok(Ok(_)) => return Err("end of output".into()),
            Ok(Err(e)) => return Err(format!("read error: {e}")),
            Err(_) => return Err("no such line before the deadline".into()),
        }
    }
}

/// Runs `cmd` to completion and collects its output; it is killed, and the test fails, when
/// `within` passes first.
pub async fn run(mut cmd: Command, within: Duration) -> Output {
    let what = format!("{:?}", cmd.as_std());
    tokio::time::timeout(within, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what} still running after {within:?}"))
        .unwrap_or_else(|e| panic!("run {what}: {e}"))
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

/// SIGKILLs the direct children of `pid`: a SIGKILLed parent cannot stop what it spawned.
pub fn kill_children(pid: u32) {
    for child in child_pids(pid) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &child.to_string()])
            .stderr(Stdio::null())
            .status();
    }
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

/// Resident memory of `pid` in KiB (`VmRSS` of `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS line")
}
