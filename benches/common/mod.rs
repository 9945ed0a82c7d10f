//! Shared harness of the end-to-end benchmarks: find the `infergate` binary, run it (or nginx) as
//! a child process on ephemeral loopback ports, talk HTTP/1.1 over kept-alive connections, read SSE
//! events as they arrive, scrape Prometheus text, and summarize samples into markdown tables.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

/// Any error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a child process may take to print its address and become ready.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// Stderr kept per child for failure messages.
const STDERR_KEEP: usize = 16 * 1024;

/// The `infergate` binary: the one Cargo built for this bench, else `target/release/infergate`.
pub fn infergate_bin() -> PathBuf {
    if let Some(path) = option_env!("CARGO_BIN_EXE_infergate") {
        return PathBuf::from(path);
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/infergate");
    if !path.exists() {
        eprintln!(
            "error: {} is missing; run `cargo build --release` first",
            path.display()
        );
        std::process::exit(2);
    }
    path
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates `$TMPDIR/infergate-bench-<tag>-<pid>-<nanos>`.
    pub fn new(tag: &str) -> TempDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "infergate-bench-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("create the scratch directory");
        TempDir(dir)
    }

    /// Writes `text` to `name` inside the directory and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create a scratch subdirectory");
        }
        std::fs::write(&path, text).expect("write a scratch file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process, killed when dropped (or by [`Proc::stop`]).
pub struct Proc {
    /// `http://IP:PORT` as the process printed it (empty for processes that print none).
    pub url: String,
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Proc {
    /// Starts `program args` with piped output. When `banner` is given, waits for a stdout line
    /// starting with it and takes the rest of that line as the URL.
    pub async fn start(
        program: &Path,
        args: &[String],
        banner: Option<&str>,
    ) -> Result<Proc, String> {
        let mut child = Command::new(program)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        let stderr = drain(child.stderr.take().expect("piped stderr"));
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut url = String::new();
        if let Some(banner) = banner {
            let deadline = Instant::now() + START_DEADLINE;
            loop {
                let mut line = String::new();
                let read =
                    tokio::time::timeout_at(deadline.into(), stdout.read_line(&mut line)).await;
                match read {
                    Ok(Ok(n)) if n > 0 => {
                        if let Some(rest) = line.trim().strip_prefix(banner) {
                            url = rest.to_owned();
                            break;
                        }
                    }
                    other => {
                        let _ = child.start_kill();
                        return Err(format!(
                            "{} {args:?} printed no `{banner}` line ({other:?}); stderr:\n{}",
                            program.display(),
                            stderr.lock().unwrap()
                        ));
                    }
                }
            }
        }
        drain(stdout.into_inner());
        Ok(Proc { url, child, stderr })
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

/// Reads `pipe` to its end into a bounded buffer, so the child never blocks on a full pipe.
fn drain(mut pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static) -> Arc<Mutex<String>> {
    let kept = Arc::new(Mutex::new(String::new()));
    let sink = kept.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let mut s = sink.lock().unwrap();
            s.push_str(&String::from_utf8_lossy(&buf[..n]));
            if s.len() > STDERR_KEEP {
                let mut cut = s.len() - STDERR_KEEP;
                while !s.is_char_boundary(cut) {
                    cut += 1;
                }
                s.drain(..cut);
            }
        }
    });
    kept
}

/// CPU time (user + system, seconds) used so far by process `pid` and its direct children (nginx
/// workers), from `/proc`; `None` where `/proc` is unreadable.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    /// Clock ticks per second of `/proc/*/stat` (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
    const TICKS: f64 = 100.0;
    // Fields after the `(comm)`: state ppid ... utime (12th) stime (13th).
    let read = |path: &Path| -> Option<(u32, f64)> {
        let text = std::fs::read_to_string(path).ok()?;
        let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
        let ppid = fields.get(1)?.parse().ok()?;
        let utime: f64 = fields.get(11)?.parse().ok()?;
        let stime: f64 = fields.get(12)?.parse().ok()?;
        Some((ppid, (utime + stime) / TICKS))
    };
    let (_, own) = read(&PathBuf::from(format!("/proc/{pid}/stat")))?;
    let children: f64 = std::fs::read_dir("/proc")
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
        .map(|(_, cpu)| cpu)
        .sum();
    Some(own + children)
}

/// A free loopback port (bound, then released: for programs that cannot take port 0).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// One kept-alive HTTP/1.1 client connection; its driver task ends when this is dropped.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    authority: String,
    driver: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Conn {
    /// Connects to `base` (`http://IP:PORT`), with `TCP_NODELAY`.
    pub async fn open(base: &str) -> Result<Conn, BoxError> {
        let authority = base
            .strip_prefix("http://")
            .ok_or("only http:// URLs")?
            .trim_end_matches('/')
            .to_owned();
        let tcp = TcpStream::connect(authority.as_str()).await?;
        tcp.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn {
            sender,
            authority,
            driver,
        })
    }

    /// True when the server closed the connection (or it failed).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Sends one request (a JSON body when given) and returns once the response head arrived.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Response<Incoming>, BoxError> {
        self.send_as(method, path, body, None).await
    }

    /// [`send`](Self::send) with `Authorization: Bearer KEY` when `key` is given.
    pub async fn send_as(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        key: Option<&str>,
    ) -> Result<Response<Incoming>, BoxError> {
        self.sender.ready().await?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.authority.as_str());
        if let Some(key) = key {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        if body.is_some() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        let req = req.body(Full::new(body.unwrap_or_default()))?;
        Ok(self.sender.send_request(req).await?)
    }
}

/// `GET url` on a fresh connection → status and body text.
pub async fn get(url: &str) -> Result<(StatusCode, String), BoxError> {
    let (base, path) = split_url(url)?;
    let mut conn = Conn::open(base).await?;
    let res =
        tokio::time::timeout(Duration::from_secs(10), conn.send(Method::GET, path, None)).await??;
    let status = res.status();
    let body = res.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Splits `http://host:port/path` into the base URL and the path.
fn split_url(url: &str) -> Result<(&str, &str), BoxError> {
    let rest = url.strip_prefix("http://").ok_or("only http:// URLs")?;
    let cut = rest.find('/').map_or(url.len(), |i| i + "http://".len());
    Ok((&url[..cut], if cut < url.len() { &url[cut..] } else { "/" }))
}

/// Polls `GET url` until it answers 200, failing after `within`.
pub async fn wait_ok(url: &str, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        match get(url).await {
            Ok((StatusCode::OK, _)) => return Ok(()),
            other if Instant::now() >= deadline => {
                return Err(format!(
                    "{url} never answered 200 within {within:?}: {other:?}"
                ));
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
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

/// A deterministic pseudo-random generator (splitmix64) for seeded workloads.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
