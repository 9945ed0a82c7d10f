//! Harness of the end-to-end benchmarks: the tests' kit (`tests/e2e/common`: child processes,
//! kept-alive HTTP/1.1 connections, readiness polling, scratch directories, seeded generators)
//! plus what only the benchmarks need: the release binary, other programs (nginx) as children,
//! CPU time from `/proc`, SSE event counting, Prometheus sums, and markdown tables of samples.
#![allow(dead_code, unused_imports)]

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};

#[path = "../../tests/e2e/common/mod.rs"]
mod kit;

use kit::process::{self, Kept};
pub use kit::{BoxError, Conn, Rng, wait_ok};

/// How long a child process may take to print its address.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// The `infergate` binary: the one Cargo built for this bench, else `target/release/infergate`.
pub fn infergate_bin() -> PathBuf {
    if let Some(path) = option_env!("CARGO_BIN_EXE_infergate") {
        return PathBuf::from(path);
    }
    let path = Path::new(kit::REPO).join("target/release/infergate");
    if !path.exists() {
        eprintln!(
            "error: {} is missing; run `cargo build --release` first",
            path.display()
        );
        std::process::exit(2);
    }
    path
}

/// `path` as given, or under the repository root when relative (Cargo runs benches in their
/// package's directory, not where the command was typed).
pub fn repo_path(path: std::ffi::OsString) -> PathBuf {
    Path::new(kit::REPO).join(path)
}

/// A scratch directory (the kit's, removed on drop); `.0` is its path.
pub struct TempDir(pub PathBuf, kit::TempDir);

impl TempDir {
    /// Creates `$TMPDIR/infergate-bench-<tag>-...`.
    pub fn new(tag: &str) -> TempDir {
        let dir = kit::TempDir::new(&format!("bench-{tag}"));
        TempDir(dir.path.clone(), dir)
    }
}

impl Deref for TempDir {
    type Target = kit::TempDir;
    fn deref(&self) -> &kit::TempDir {
        &self.1
    }
}

/// A child process, killed when dropped (or by [`Proc::stop`]).
pub struct Proc {
    /// `http://IP:PORT` as the process printed it (empty for processes that print none).
    pub url: String,
    child: tokio::process::Child,
    stderr: Kept,
    _stdout: Kept,
}

impl Proc {
    /// Starts `program args` with piped output. When `banner` is given, waits for a stdout line
    /// starting with it and takes the rest of that line as the URL.
    pub async fn start(
        program: &Path,
        args: &[String],
        banner: Option<&str>,
    ) -> Result<Proc, String> {
        let mut cmd = process::command(program);
        cmd.args(args);
        let (mut child, stderr, mut stdout) = process::try_spawn(&mut cmd)
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        let mut url = String::new();
        if let Some(banner) = banner {
            let deadline = Instant::now() + START_DEADLINE;
            let read = process::read_until(&mut stdout, deadline, |line| {
                line.strip_prefix(banner).map(str::to_owned)
            });
            match read.await {
                Ok(rest) => url = rest,
                Err(e) => {
                    let _ = child.start_kill();
                    return Err(format!(
                        "{} {args:?} printed no `{banner}` line ({e}); stderr:\n{}",
                        program.display(),
                        stderr.lock().unwrap()
                    ));
                }
            }
        }
        let _stdout = process::drain(stdout.into_inner());
        Ok(Proc {
            url,
            child,
            stderr,
            _stdout,
        })
    }

    /// What the process wrote to stderr so far (the last few KiB).
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills the process and waits until it is gone.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// CPU seconds a process spent in user space and in the kernel, and the page faults it took.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTimes {
    /// User-space seconds.
    pub user: f64,
    /// Kernel seconds (system calls, and the loopback network stack they run).
    pub system: f64,
    /// Minor page faults (fresh pages touched: memory the allocator gave back and took again).
    pub minor_faults: f64,
}

impl CpuTimes {
    /// User plus system seconds.
    pub fn total(self) -> f64 {
        self.user + self.system
    }
}

impl std::ops::Add for CpuTimes {
    type Output = CpuTimes;
    fn add(self, o: CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user + o.user,
            system: self.system + o.system,
            minor_faults: self.minor_faults + o.minor_faults,
        }
    }
}

impl std::ops::Sub for CpuTimes {
    type Output = CpuTimes;
    fn sub(self, o: CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user - o.user,
            system: self.system - o.system,
            minor_faults: self.minor_faults - o.minor_faults,
        }
    }
}

/// CPU time used (and minor faults taken) so far by process `pid` and its direct children (nginx
/// workers), from `/proc`;
/// `None` where `/proc` is unreadable.
pub fn cpu_times(pid: u32) -> Option<CpuTimes> {
    /// Clock ticks per second of `/proc/*/stat` (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
    const TICKS: f64 = 100.0;
    // Fields after the `(comm)`: state ppid ... minflt (8th) ... utime (12th) stime (13th).
    let read = |path: &Path| -> Option<(u32, CpuTimes)> {
        let text = std::fs::read_to_string(path).ok()?;
        let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
        let ppid = fields.get(1)?.parse().ok()?;
        let minflt: f64 = fields.get(7)?.parse().ok()?;
        let utime: f64 = fields.get(11)?.parse().ok()?;
        let stime: f64 = fields.get(12)?.parse().ok()?;
        Some((
            ppid,
            CpuTimes {
                user: utime / TICKS,
                system: stime / TICKS,
                minor_faults: minflt,
            },
        ))
    };
    let (_, own) = read(&PathBuf::from(format!("/proc/{pid}/stat")))?;
    let children = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| read(&e.path().join("stat")))
        .filter(|(ppid, _)| *ppid == pid)
        .fold(CpuTimes::default(), |sum, (_, cpu)| sum + cpu);
    Some(own + children)
}

/// A free loopback port (bound, then released: for programs that cannot take port 0).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// `GET url` on a fresh connection → status and body text.
pub async fn get(url: &str) -> Result<(StatusCode, String), BoxError> {
    let (status, _, body) = kit::send(Method::GET, url, &[], None).await?;
    Ok((status, body))
}

/// Splits an SSE byte stream into events; call [`SseSplitter::push`] with each body frame.
#[derive(Default)]
pub struct SseSplitter {
    buf: Vec<u8>,
}

impl SseSplitter {
    /// Appends `frame` and returns how many complete `data:` events it finished, and whether one
    /// of them was `data: [DONE]`.
    pub fn push(&mut self, frame: &[u8]) -> (usize, bool) {
        self.buf.extend_from_slice(frame);
        let (mut events, mut done, mut start) = (0, false, 0);
        while let Some(end) = find(&self.buf[start..], b"\n\n") {
            let block = &self.buf[start..start + end];
            if block.starts_with(b"data:") {
                events += 1;
                done |= block.ends_with(b"[DONE]");
            }
            start += end + 2;
        }
        self.buf.drain(..start);
        (events, done)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Sum over every series of metric `name` in Prometheus text (0 when absent).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let end = line.find(['{', ' '])?;
            if &line[..end] != name {
                return None;
            }
            let rest = match line[end..].rfind('}') {
                Some(i) => &line[end + i + 1..],
                None => &line[end..],
            };
            rest.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

/// Value of metric `name` per value of its label `label` (e.g. decisions by `reason`).
pub fn metric_by_label(text: &str, name: &str, label: &str) -> Vec<(String, f64)> {
    let key = format!("{label}=\"");
    let mut out: Vec<(String, f64)> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(name)) {
        let Some(labels_start) = line.find('{') else {
            continue;
        };
        if &line[..labels_start] != name {
            continue;
        }
        let Some(at) = line.find(&key) else { continue };
        let tail = &line[at + key.len()..];
        let Some(close) = tail.find('"') else {
            continue;
        };
        let value = line
            .rsplit_once('}')
            .and_then(|(_, v)| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        let label_value = tail[..close].to_owned();
        match out.iter_mut().find(|(l, _)| *l == label_value) {
            Some((_, v)) => *v += value,
            None => out.push((label_value, value)),
        }
    }
    out
}

/// Nearest-rank percentile `p` (0..=100) of `sorted`; NaN when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Sorts samples for [`percentile`].
pub fn sorted(mut samples: Vec<f64>) -> Vec<f64> {
    samples.sort_by(f64::total_cmp);
    samples
}

/// A markdown table built row by row.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (as many cells as columns).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as GitHub markdown.
    pub fn render(&self) -> String {
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        let mut out = line(&self.header);
        out.push_str(&line(
            &self
                .header
                .iter()
                .map(|_| "---".to_string())
                .collect::<Vec<_>>(),
        ));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// Milliseconds with two decimals.
pub fn ms(seconds: f64) -> String {
    if seconds.is_nan() {
        return "n/a".into();
    }
    format!("{:.2}", seconds * 1e3)
}

/// A short description of the machine: CPU count and model.
pub fn machine_note() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} CPU core(s), {model}")
}

/// `name` on `PATH` or in `/usr/sbin` / `/usr/bin`.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    from_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `redis-server` on a free loopback port without persistence; waits until it accepts.
pub async fn start_redis(
    bin: &Path,
    dir: &TempDir,
) -> Result<(std::process::Child, u16), BoxError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let data = dir.write("redis/.keep", "");
    let child = std::process::Command::new(bin)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(data.parent().unwrap_or(Path::new(".")))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            return Err("redis-server did not start".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((child, port))
}
