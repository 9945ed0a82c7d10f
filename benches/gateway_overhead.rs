//! Gateway overhead: the same closed-loop client against a fast in-process upstream, directly,
//! through `infergate gateway` (no tenants, no limits), through the gateway with tenant limits in
//! process, through the gateway with its usage ledger on as well (prices, one SQLite row per
//! request), through the gateway with its tenant limits in Redis (fleet mode, exact and leased, when
//! `redis-server` is installed), through the gateway with its features on (a tenant key and a
//! token budget, `prefix` routing, a 6 KB chat body whose system prompt repeats), and through
//! nginx as a plain reverse proxy, with the tiny body and with the 6 KB one, side by side in one
//! run. With `GATEWAY_OVERHEAD_BASELINE=/path/to/infergate` another build of the binary runs the
//! plain, features-on and ledger columns too, in the same run, for before/after ratios.
//! Non-streaming: throughput and p50/p99 latency. Streaming (20 chunks 5 ms apart): the gap between
//! chunks as the client sees it. Run with `cargo bench --bench gateway_overhead`.
//! `GATEWAY_OVERHEAD_BINARY=/path/to/infergate` runs every gateway column on that binary (the
//! profile-guided build of deploy/pgo/build.sh) instead of the one Cargo built. Relative paths in
//! both are from the repository root (Cargo runs the bench in `src/cli`).
//! `GATEWAY_OVERHEAD_COLUMNS="name;name"` measures only the columns named (their names as printed;
//! `direct` is always kept), and `GATEWAY_OVERHEAD_STREAMS=0` skips the streaming table: for quick
//! before/after checks while profiling.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests and benches stop at the first thing that is not as it should be"
)]
#![forbid(unsafe_code)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use common::{BoxError, Conn, CpuTimes, Proc, SseSplitter, Table, TempDir, ms, percentile, sorted};
use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::time::Sleep;

/// Client connections, each one task running requests back to back.
const CONNECTIONS: usize = 32;
/// Discarded at the start of each column (connection pools fill, caches warm).
const WARMUP: Duration = Duration::from_millis(500);
/// Measured per column and mode, in all.
const MEASURE: Duration = Duration::from_secs(10);
/// The measured time is split into this many rounds, each running every column once in turn, so
/// that a slow spell of the shared machine falls on all columns rather than on one. Short rounds
/// interleave the columns finely: this machine's speed drifts within a minute, and with three long
/// rounds two builds within 2% of each other in instructions differed by up to 8% in req/s.
const ROUNDS: u32 = 10;
/// SSE chunks per streamed answer, before `data: [DONE]`.
const CHUNKS: u32 = 20;
/// The upstream's spacing between streamed chunks.
const CHUNK_GAP: Duration = Duration::from_millis(5);

const CHAT: &[u8] =
    br#"{"model":"bench","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16}"#;
const CHAT_STREAM: &[u8] = br#"{"model":"bench","messages":[{"role":"user","content":"Say hello"}],"max_tokens":16,"stream":true}"#;
const ANSWER: &[u8] = br#"{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}"#;
const CHUNK: &[u8] = b"data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok\"},\"finish_reason\":null}]}\n\n";
const DONE: &[u8] = b"data: [DONE]\n\n";
const METRICS: &[u8] = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"bench\"} 0\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"bench\"} 0\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"bench\"} 0\n";

#[tokio::main]
async fn main() {
    // `gateway_overhead relay UPSTREAM`: the bare hyper relay column, in a process of its own so
    // that its CPU time is measured apart from the client's.
    let args: Vec<String> = std::env::args().collect();
    if let [_, mode, upstream] = args.as_slice()
        && mode == "relay"
    {
        if let Err(e) = relay(upstream).await {
            eprintln!("error: relay: {e}");
            std::process::exit(1);
        }
        return;
    }
    if let Err(e) = run().await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// What one column measured.
#[derive(Default)]
struct Samples {
    /// Whole-request latency of each successful request, seconds.
    latencies: Vec<f64>,
    /// Client-side gap before each streamed chunk after the first, seconds.
    gaps: Vec<f64>,
    /// Failed requests (and failed connects) in the measured window.
    errors: u64,
    /// The first failure, for the notes.
    first_error: Option<String>,
    /// Length of the measured window, seconds.
    window: f64,
    /// CPU time the proxy process used in the measured window (`None` for direct).
    proxy_cpu: Option<CpuTimes>,
}

impl Samples {
    fn error(&mut self, measured: bool, e: String) {
        if measured {
            self.errors += 1;
        }
        self.first_error.get_or_insert(e);
    }

    /// Adds another round of the same column: its samples, window and CPU time.
    fn add_round(&mut self, other: Samples) {
        self.window += other.window;
        self.proxy_cpu = match (self.proxy_cpu, other.proxy_cpu) {
            (Some(a), Some(b)) => Some(a + b),
            (None, b) if self.latencies.is_empty() => b,
            _ => None,
        };
        self.merge(other);
    }

    fn merge(&mut self, other: Samples) {
        self.latencies.extend(other.latencies);
        self.gaps.extend(other.gaps);
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    /// Successful requests per second.
    fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.window
    }

    /// Proxy CPU microseconds per successful request.
    fn cpu_us(&self) -> Option<f64> {
        self.cpu_us_of(CpuTimes::total)
    }

    /// The part of the proxy's CPU time that `part` picks, in microseconds per successful request.
    fn cpu_us_of(&self, part: impl Fn(CpuTimes) -> f64) -> Option<f64> {
        match self.proxy_cpu {
            Some(cpu) if !self.latencies.is_empty() => {
                Some(part(cpu) * 1e6 / self.latencies.len() as f64)
            }
            _ => None,
        }
    }

    /// [`Self::cpu_us`], or a dash.
    fn cpu_per_request(&self) -> String {
        self.cpu_us()
            .map_or_else(|| "–".into(), |us| format!("{us:.0}"))
    }

    /// Latency percentile `p`, seconds.
    fn latency(&self, p: f64) -> f64 {
        percentile(&sorted(self.latencies.clone()), p)
    }
}

/// One way to reach the upstream.
struct Target {
    name: &'static str,
    url: String,
    /// The proxy's process id, for its CPU time.
    pid: Option<u32>,
    /// What the client sends.
    load: Load,
}

/// The requests of a column.
#[derive(Clone, Copy, PartialEq)]
enum Load {
    /// The tiny chat body, no key.
    Tiny,
    /// A ~6 KB chat body (a shared 6 KB system prompt, then a question that differs per
    /// request) with the tenant's key.
    Long,
}

/// The key of the tenant of the features-on gateway.
const BENCH_KEY: &str = "ig-bench-overhead-key";

/// The shared system prompt of [`Load::Long`]: about 6 KB of prose.
fn system_prompt() -> String {
    "You are a careful assistant for a company's internal documentation. Answer from the \
     documents given, cite the section you used, and say when the documents do not cover the \
     question. Keep answers short and precise. "
        .repeat(28)
}

/// The chat body of request `n` of `load`.
fn chat_body(load: Load, stream: bool, n: u64) -> Bytes {
    match (load, stream) {
        (Load::Tiny, false) => Bytes::from_static(CHAT),
        (Load::Tiny, true) => Bytes::from_static(CHAT_STREAM),
        (Load::Long, _) => {
            let body = serde_json::json!({
                "model": "bench",
                "messages": [
                    {"role": "system", "content": system_prompt()},
                    {"role": "user", "content": format!("Question {n}: which section covers travel expenses for trip {}?", n * 7919 % 100_003)},
                ],
                "max_tokens": 16,
                "stream": stream,
            });
            Bytes::from(body.to_string())
        }
    }
}

async fn run() -> Result<(), BoxError> {
    let bin = std::env::var_os("GATEWAY_OVERHEAD_BINARY")
        .map_or_else(common::infergate_bin, common::repo_path);
    let upstream = start_upstream().await?;
    let upstream_url = format!("http://{upstream}");
    let dir = TempDir::new("overhead");

    let gateway = start_gateway(&bin, &dir, &upstream_url, Variant::Plain).await?;
    let with_limits = start_gateway(&bin, &dir, &upstream_url, Variant::Limits).await?;
    let with_ledger = start_gateway(&bin, &dir, &upstream_url, Variant::Ledger).await?;
    let mut targets = vec![
        Target {
            name: "direct",
            url: upstream_url.clone(),
            pid: None,
            load: Load::Tiny,
        },
        Target {
            name: "infergate gateway",
            url: gateway.url.clone(),
            pid: gateway.pid(),
            load: Load::Tiny,
        },
        Target {
            name: "infergate + tenant limits",
            url: with_limits.url.clone(),
            pid: with_limits.pid(),
            load: Load::Tiny,
        },
        Target {
            name: "infergate + usage ledger",
            url: with_ledger.url.clone(),
            pid: with_ledger.pid(),
            load: Load::Tiny,
        },
    ];
    // Another build of the binary (a commit before a change) as the plain gateway, measured in
    // the same run: `GATEWAY_OVERHEAD_BASELINE=/path/to/infergate`.
    // It runs the features-on and ledger columns too.
    let mut baseline = Vec::new();
    if let Some(other) = std::env::var_os("GATEWAY_OVERHEAD_BASELINE") {
        for (variant, name, load) in [
            (
                Variant::Plain,
                "infergate gateway (baseline build)",
                Load::Tiny,
            ),
            (
                Variant::Features,
                "infergate, features on (6 KB) (baseline build)",
                Load::Long,
            ),
            (
                Variant::Ledger,
                "infergate + usage ledger (baseline build)",
                Load::Tiny,
            ),
        ] {
            let gw = start_build(
                &common::repo_path(other.clone()),
                "-baseline",
                &dir,
                &upstream_url,
                variant,
            )
            .await?;
            targets.push(Target {
                name,
                url: gw.url.clone(),
                pid: gw.pid(),
                load,
            });
            baseline.push(gw);
        }
    }
    // The floor of any hyper-based proxy: the gateway's own server and pooled client with no
    // phase in between.
    let relay = Proc::start(
        &std::env::current_exe()?,
        &["relay".to_string(), upstream_url.clone()],
        Some(RELAY_BANNER),
    )
    .await?;
    targets.push(Target {
        name: "bare hyper relay",
        url: relay.url.clone(),
        pid: relay.pid(),
        load: Load::Tiny,
    });
    let mut notes = Vec::new();
    // Fleet mode: the same gateway with its tenant limits in a Redis on loopback.
    let redis = match common::find_program("redis-server") {
        Some(redis_bin) => {
            let redis = common::start_redis(&redis_bin, &dir).await?;
            let url = format!("redis://127.0.0.1:{}/", redis.1);
            let gw = start_gateway(&bin, &dir, &upstream_url, Variant::Redis(url.clone())).await?;
            targets.push(Target {
                name: "infergate + Redis limits",
                url: gw.url.clone(),
                pid: gw.pid(),
                load: Load::Tiny,
            });
            let leased =
                start_gateway(&bin, &dir, &upstream_url, Variant::RedisLeased(url)).await?;
            targets.push(Target {
                name: "infergate + Redis limits, leased",
                url: leased.url.clone(),
                pid: leased.pid(),
                load: Load::Tiny,
            });
            Some((redis.0, gw, leased))
        }
        None => {
            notes.push("redis-server not found: the Redis column is skipped".to_string());
            None
        }
    };
    // The plain gateway scoring no answer, and every answer (the plain column scores the
    // default 5%): what sampling costs per request and per stream.
    let mut quality = Vec::new();
    for (name, sub, share) in [
        (
            "infergate, quality sampling off",
            "gateway-quality-off",
            0.0,
        ),
        (
            "infergate, every answer sampled",
            "gateway-quality-all",
            1.0,
        ),
    ] {
        let gw = start_gateway(&bin, &dir, &upstream_url, Variant::Quality(sub, share)).await?;
        targets.push(Target {
            name,
            url: gw.url.clone(),
            pid: gw.pid(),
            load: Load::Tiny,
        });
        quality.push(gw);
    }
    // Features on: a tenant with its key and a token budget, `prefix` routing, a 6 KB body.
    let features = start_gateway(&bin, &dir, &upstream_url, Variant::Features).await?;
    targets.push(Target {
        name: "infergate, features on (6 KB)",
        url: features.url.clone(),
        pid: features.pid(),
        load: Load::Long,
    });
    let nginx = match find_nginx() {
        Some(nginx_bin) => {
            let (proc, url) = start_nginx(&nginx_bin, &dir, upstream).await?;
            let proc = (proc, nginx_bin);
            targets.push(Target {
                name: "nginx (proxy_pass)",
                url: url.clone(),
                pid: proc.0.pid(),
                load: Load::Tiny,
            });
            targets.push(Target {
                name: "nginx (proxy_pass, 6 KB)",
                url,
                pid: proc.0.pid(),
                load: Load::Long,
            });
            Some(proc)
        }
        None => {
            notes.push("nginx not found: its column is skipped".to_string());
            None
        }
    };
    if let Ok(names) = std::env::var("GATEWAY_OVERHEAD_COLUMNS") {
        let names: Vec<&str> = names.split(';').map(str::trim).collect();
        targets.retain(|t| t.name == "direct" || names.contains(&t.name));
    }
    let streams = std::env::var("GATEWAY_OVERHEAD_STREAMS").map_or(true, |v| v != "0");
    for t in &targets {
        smoke(&t.url, t.load)
            .await
            .map_err(|e| format!("{} at {}: {e}", t.name, t.url))?;
    }

    eprintln!(
        "{CONNECTIONS} connections, closed loop, {ROUNDS} rounds of {:.1}s warm-up + {:.1}s measured per column",
        WARMUP.as_secs_f64(),
        (MEASURE / ROUNDS).as_secs_f64()
    );
    let mut plain: Vec<Samples> = targets.iter().map(|_| Samples::default()).collect();
    let mut streamed: Vec<Samples> = targets.iter().map(|_| Samples::default()).collect();
    for (mode, runs) in [("non-streaming", &mut plain), ("streaming", &mut streamed)] {
        if mode == "streaming" && !streams {
            runs.clear();
            continue;
        }
        for round in 1..=ROUNDS {
            for (t, s) in targets.iter().zip(runs.iter_mut()) {
                eprintln!("{mode}: {} ... (round {round}/{ROUNDS})", t.name);
                s.add_round(closed_loop(t, mode == "streaming").await);
            }
        }
    }
    if let Some((p, bin)) = nginx {
        stop_nginx(&bin, &dir, p).await;
    }
    gateway.stop().await;
    with_limits.stop().await;
    with_ledger.stop().await;
    relay.stop().await;
    features.stop().await;
    for gw in quality {
        gw.stop().await;
    }
    for gw in baseline {
        gw.stop().await;
    }
    if let Some((mut redis, gw, leased)) = redis {
        gw.stop().await;
        leased.stop().await;
        let _ = redis.kill();
        let _ = redis.wait();
    }

    println!("\n{}", plain_table(&targets, &plain).render());
    if streams {
        println!("{}", stream_table(&targets, &streamed).render());
    }
    println!(
        "machine: {}; client, upstream and proxy share it",
        common::machine_note()
    );
    println!("gateway binary: {}", bin.display());
    for (t, s) in targets.iter().zip(plain.iter().chain(&streamed)) {
        if let Some(e) = &s.first_error {
            println!("note: {}: first error: {e}", t.name);
        }
    }
    for n in notes {
        println!("note: {n}");
    }
    Ok(())
}

fn plain_table(targets: &[Target], runs: &[Samples]) -> Table {
    let mut table = Table::new(&[
        "non-streaming",
        "req/s",
        "× direct",
        "p50 ms",
        "p99 ms",
        "added p50 ms",
        "added p99 ms",
        "p50 × direct",
        "p99 × direct",
        "proxy CPU µs/req",
        "of which user µs",
        "page faults /1k req",
        "req/s × nginx",
        "CPU × nginx",
        "errors",
    ]);
    let base = &runs[0];
    let (b50, b99) = (base.latency(50.0), base.latency(99.0));
    // Each proxy against nginx carrying the same body (issue 12's targets are these ratios).
    let nginx_of = |load: Load| {
        targets
            .iter()
            .zip(runs)
            .find(|(t, _)| t.name.starts_with("nginx") && t.load == load)
            .map(|(_, s)| s)
    };
    for (t, s) in targets.iter().zip(runs) {
        let (p50, p99) = (s.latency(50.0), s.latency(99.0));
        let nginx = nginx_of(t.load).filter(|_| t.pid.is_some() && !t.name.starts_with("nginx"));
        let rate_ratio =
            nginx.map_or_else(|| "–".into(), |n| format!("{:.2}", s.rate() / n.rate()));
        let cpu_ratio = nginx
            .and_then(|n| Some(s.cpu_us()? / n.cpu_us()?))
            .map_or_else(|| "–".into(), |r| format!("{r:.2}"));
        table.row(vec![
            t.name.to_string(),
            format!("{:.0}", s.rate()),
            format!("{:.2}", s.rate() / base.rate()),
            ms(p50),
            ms(p99),
            ms(p50 - b50),
            ms(p99 - b99),
            format!("{:.2}", p50 / b50),
            format!("{:.2}", p99 / b99),
            s.cpu_per_request(),
            s.cpu_us_of(|c| c.user)
                .map_or_else(|| "–".into(), |us| format!("{us:.1}")),
            // Per 1,000 requests: the counter is not time, so undo cpu_us_of's 1e6.
            s.cpu_us_of(|c| c.minor_faults / 1e3)
                .map_or_else(|| "–".into(), |f| format!("{f:.1}")),
            rate_ratio,
            cpu_ratio,
            s.errors.to_string(),
        ]);
    }
    table
}

fn stream_table(targets: &[Target], runs: &[Samples]) -> Table {
    let mut table = Table::new(&[
        "streaming (20 chunks, 5 ms apart)",
        "streams/s",
        "gap p50 ms",
        "gap p99 ms",
        "gap max ms",
        "added gap p50 ms",
        "added gap p99 ms",
        "proxy CPU µs/stream",
        "errors",
    ]);
    let base = sorted(runs[0].gaps.clone());
    let (b50, b99) = (percentile(&base, 50.0), percentile(&base, 99.0));
    for (t, s) in targets.iter().zip(runs) {
        let gaps = sorted(s.gaps.clone());
        let (p50, p99) = (percentile(&gaps, 50.0), percentile(&gaps, 99.0));
        table.row(vec![
            t.name.to_string(),
            format!("{:.0}", s.rate()),
            ms(p50),
            ms(p99),
            ms(gaps.last().copied().unwrap_or(f64::NAN)),
            ms(p50 - b50),
            ms(p99 - b99),
            s.cpu_per_request(),
            s.errors.to_string(),
        ]);
    }
    table
}

/// One request of each kind must succeed before anything is measured.
async fn smoke(url: &str, load: Load) -> Result<(), BoxError> {
    let mut conn = Conn::open(url).await?;
    let mut gaps = Vec::new();
    one_request(&mut conn, (load, 0), false, &mut gaps).await?;
    one_request(&mut conn, (load, 1), true, &mut gaps).await?;
    if gaps.len() != CHUNKS as usize {
        return Err(format!("{} gaps in a stream, expected {CHUNKS}", gaps.len()).into());
    }
    Ok(())
}

/// Runs [`CONNECTIONS`] tasks, each sending requests back to back on its own kept-alive
/// connection, for [`WARMUP`] + [`MEASURE`]; keeps what started in the measured window.
async fn closed_loop(target: &Target, stream: bool) -> Samples {
    let measure_from = Instant::now() + WARMUP;
    let end = measure_from + MEASURE / ROUNDS;
    let pid = target.pid;
    let cpu = tokio::spawn(async move {
        let pid = pid?;
        tokio::time::sleep_until(measure_from.into()).await;
        let before = common::cpu_times(pid)?;
        tokio::time::sleep_until(end.into()).await;
        Some(common::cpu_times(pid)? - before)
    });
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let url = target.url.clone();
            let load = target.load;
            tokio::spawn(async move {
                let mut n = 0u64;
                let mut s = Samples::default();
                let mut conn: Option<Conn> = None;
                let mut gaps = Vec::new();
                while Instant::now() < end {
                    let started = Instant::now();
                    let measured = started >= measure_from;
                    let c = match &mut conn {
                        Some(c) if !c.is_closed() => c,
                        _ => match Conn::open(&url).await {
                            Ok(c) => conn.insert(c),
                            Err(e) => {
                                s.error(measured, e.to_string());
                                tokio::time::sleep(Duration::from_millis(10)).await;
                                continue;
                            }
                        },
                    };
                    gaps.clear();
                    n += 1;
                    match one_request(c, (load, n), stream, &mut gaps).await {
                        Ok(()) if measured => {
                            s.latencies.push(started.elapsed().as_secs_f64());
                            s.gaps.extend_from_slice(&gaps);
                        }
                        Ok(()) => {}
                        Err(e) => {
                            s.error(measured, e.to_string());
                            conn = None;
                        }
                    }
                }
                s
            })
        })
        .collect();
    let mut all = Samples {
        window: (MEASURE / ROUNDS).as_secs_f64(),
        ..Samples::default()
    };
    for t in tasks {
        all.merge(t.await.expect("a client task panicked"));
    }
    all.proxy_cpu = cpu.await.expect("the CPU sampler panicked");
    all
}

/// One request on `conn`: the whole answer read; for streams, the gap before each chunk after the
/// first is pushed on `gaps` (in seconds).
async fn one_request(
    conn: &mut Conn,
    (load, n): (Load, u64),
    stream: bool,
    gaps: &mut Vec<f64>,
) -> Result<(), BoxError> {
    let body = chat_body(load, stream, n);
    let key = (load == Load::Long).then_some(BENCH_KEY);
    let res = conn
        .send_as(Method::POST, "/v1/chat/completions", Some(body), key)
        .await?;
    let status = res.status();
    let mut body = res.into_body();
    if status != StatusCode::OK {
        let text = body.collect().await?.to_bytes();
        return Err(format!("{status}: {}", String::from_utf8_lossy(&text)).into());
    }
    if !stream {
        body.collect().await?;
        return Ok(());
    }
    let mut sse = SseSplitter::default();
    let (mut last, mut events, mut done) = (None::<Instant>, 0u32, false);
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        let (n, end) = sse.push(&data);
        let now = Instant::now();
        for _ in 0..n {
            if let Some(prev) = last {
                gaps.push((now - prev).as_secs_f64());
            }
            last = Some(now);
        }
        events += n as u32;
        done |= end;
    }
    if !done || events != CHUNKS + 1 {
        return Err(format!("stream ended after {events} events, [DONE] seen: {done}").into());
    }
    Ok(())
}

/// Starts the fast upstream on an ephemeral loopback port; it serves until the bench exits.
async fn start_upstream() -> Result<SocketAddr, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service_fn(answer))
                    .await;
            });
        }
    });
    Ok(addr)
}

/// The upstream's answers: a fixed chat completion, a paced stream, or vLLM-style metrics.
async fn answer(req: Request<Incoming>) -> Result<Response<UpBody>, Infallible> {
    let reply = |status: StatusCode, kind: &'static str, body: UpBody| {
        let mut res = Response::new(body);
        *res.status_mut() = status;
        res.headers_mut()
            .insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(kind));
        Ok(res)
    };
    let once = |b: &'static [u8]| UpBody::Once(Some(Bytes::from_static(b)));
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => reply(StatusCode::OK, "text/plain", once(METRICS)),
        (&Method::POST, "/v1/chat/completions") => {
            let body = req.into_body().collect().await.map(|b| b.to_bytes());
            let stream = body
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v.get("stream").and_then(serde_json::Value::as_bool))
                .unwrap_or(false);
            if stream {
                let start = tokio::time::Instant::now();
                let ticker = Ticker {
                    next: 0,
                    start,
                    sleep: Box::pin(tokio::time::sleep_until(start)),
                };
                reply(StatusCode::OK, "text/event-stream", UpBody::Stream(ticker))
            } else {
                reply(StatusCode::OK, "application/json", once(ANSWER))
            }
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", once(b"not found\n")),
    }
}

/// An upstream answer body.
enum UpBody {
    /// One frame, then the end.
    Once(Option<Bytes>),
    /// [`CHUNKS`] SSE chunks [`CHUNK_GAP`] apart, then `data: [DONE]`.
    Stream(Ticker),
}

/// Chunk `k` is due at `start + k × CHUNK_GAP` (a fixed schedule, so jitter does not accumulate).
struct Ticker {
    next: u32,
    start: tokio::time::Instant,
    sleep: Pin<Box<Sleep>>,
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            UpBody::Once(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            UpBody::Stream(t) => {
                if t.next > CHUNKS {
                    return Poll::Ready(None);
                }
                ready!(t.sleep.as_mut().poll(cx));
                let chunk = if t.next == CHUNKS { DONE } else { CHUNK };
                t.next += 1;
                let due = t.start + CHUNK_GAP * t.next;
                t.sleep.as_mut().reset(due);
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(chunk)))))
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpBody::Once(Some(b)) => SizeHint::with_exact(b.len() as u64),
            UpBody::Once(None) => SizeHint::with_exact(0),
            UpBody::Stream(_) => SizeHint::default(),
        }
    }
}

/// What the relay prints before its URL.
const RELAY_BANNER: &str = "relay listening on ";

/// A reverse proxy with nothing but hyper in it: the gateway's HTTP/1.1 server settings and its
/// pooled upstream client ([`infergate::upstream::client`]), the body read whole as the gateway
/// reads it, the answer streamed back.
async fn relay(upstream: &str) -> Result<(), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("{RELAY_BANNER}http://{}", listener.local_addr()?);
    let client = infergate::upstream::client(Duration::from_secs(1));
    let upstream: std::sync::Arc<str> = upstream.into();
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let (client, upstream) = (client.clone(), upstream.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                relay_one(client.clone(), upstream.clone(), req)
            });
            let _ = http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

/// One request through the relay.
async fn relay_one(
    client: infergate::upstream::UpstreamClient,
    upstream: std::sync::Arc<str>,
    req: Request<Incoming>,
) -> Result<Response<Incoming>, BoxError> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let uri: hyper::Uri = format!("{upstream}{}", parts.uri.path()).parse()?;
    let mut out = Request::builder().method(parts.method).uri(uri);
    for (name, value) in &parts.headers {
        if name != hyper::header::HOST && name != hyper::header::CONNECTION {
            out = out.header(name, value);
        }
    }
    Ok(client
        .request(out.body(http_body_util::Full::new(body))?)
        .await?)
}

/// Starts `infergate gateway` with one pool whose only worker is the upstream.
/// Which gateway a column runs.
enum Variant {
    /// No tenants and no limits: the gateway's own cost (issue 12's plain column).
    Plain,
    /// The anonymous tenant's tier has request, token and concurrency limits, in process.
    Limits,
    /// [`Variant::Limits`] plus the usage ledger (SQLite in the temp dir) and prices.
    Ledger,
    /// Tenant limits in the Redis at this URL (fleet mode), no ledger.
    Redis(String),
    /// [`Variant::Redis`] with quota leasing (`state.redis.lease`).
    RedisLeased(String),
    /// A tenant with a key and a token budget, `prefix` routing.
    Features,
    /// [`Variant::Plain`] with `quality.sample_share` at this share (the plain column samples
    /// the default 5% of answers).
    Quality(&'static str, f64),
}

/// `infergate gateway` in front of `upstream`. Except in the plain columns, the anonymous tenant
/// has a tier with request, token and concurrency limits far above the load, so each request
/// runs the limiter.
async fn start_gateway(
    bin: &Path,
    dir: &TempDir,
    upstream: &str,
    variant: Variant,
) -> Result<Proc, BoxError> {
    start_build(bin, "", dir, upstream, variant).await
}

/// [`start_gateway`] for the build at `bin`, its files in the variant's directory with `tag`
/// appended (another build's columns, `GATEWAY_OVERHEAD_BASELINE`, get their own).
async fn start_build(
    bin: &Path,
    tag: &str,
    dir: &TempDir,
    upstream: &str,
    variant: Variant,
) -> Result<Proc, BoxError> {
    let (sub, extra) = match &variant {
        Variant::Plain => ("gateway", String::new()),
        Variant::Limits => ("gateway-limits", String::new()),
        Variant::Ledger => (
            "gateway-ledger",
            "ledger: {path: usage.sqlite}\n".to_string(),
        ),
        Variant::Redis(url) => (
            "gateway-redis",
            format!("state: {{redis: {{url: \"{url}\", key_prefix: bench, timeout: 50ms}}}}\n"),
        ),
        // Blocks sized for this bench's rate (15-20k requests a second on 2 cores), as the README
        // says to size them: about 50 ms of a replica's traffic, so a renewal (a Redis script,
        // in the background) every ~500 requests. Blocks of 100 renewed 300 times a second and
        // measured 0.92-0.96x of in-process limits (BENCHMARKS.md); the bound they allow is one
        // block per replica, 1,000 requests against the tier's 10^9 a minute.
        Variant::RedisLeased(url) => (
            "gateway-redis-leased",
            format!(
                "state: {{redis: {{url: \"{url}\", key_prefix: bench-leased, timeout: 50ms, \
                 lease: {{requests: 1000, tokens: 1000000, slots: 16}}}}}}\n"
            ),
        ),
        Variant::Features => (
            "gateway-features",
            format!(
                "tenants:\n  - {{name: acme, tier: bench, keys: [\"{}\"]}}\n",
                infergate::tenants::format_hash(&infergate::tenants::hash_key(BENCH_KEY))
            ),
        ),
        Variant::Quality(sub, share) => (*sub, format!("quality: {{sample_share: {share}}}\n")),
    };
    let sub = format!("{sub}{tag}");
    let ledger = matches!(variant, Variant::Ledger);
    let features = matches!(variant, Variant::Features);
    let ledger_line = extra.as_str();
    let config = dir.write(
        &format!("{sub}/infergate.yaml"),
        &format!(
            "listen: \"127.0.0.1:0\"\n\
             admin: {{listen: \"127.0.0.1:0\"}}\n\
             log: {{format: text, level: warn}}\n\
             policies: policies\n\
             {ledger_line}\
             models:\n  - {{name: bench, pool: bench}}\n\
             pools:\n  - name: bench\n    dialect: vllm\n    workers:\n      - url: {upstream}\n"
        ),
    );
    dir.write(
        &format!("{sub}/policies/routing.yaml"),
        if features {
            "pools:\n  bench:\n    policy: prefix\n"
        } else {
            "pools:\n  bench:\n    policy: round_robin\n"
        },
    );
    if !matches!(variant, Variant::Plain | Variant::Quality(..)) {
        dir.write(
            &format!("{sub}/policies/tenants.yaml"),
            "tiers:\n  bench: {requests_per_minute: 1000000000, tokens_per_minute: 1000000000000, max_concurrent: 100000}\ndefault_tier: bench\n",
        );
    }
    if ledger {
        dir.write(
            &format!("{sub}/policies/prices.yaml"),
            "version: 1\nmodels:\n  bench: {input: 1.0, cached_input: 0.25, output: 4.0}\n",
        );
    }
    let args: Vec<String> = [
        "gateway",
        "--config",
        &config.to_string_lossy(),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    let gw = Proc::start(bin, &args, Some("infergate gateway listening on ")).await?;
    common::wait_ok(&format!("{}/readyz", gw.url), Duration::from_secs(10))
        .await
        .map_err(|e| format!("{e}; gateway stderr:\n{}", gw.stderr()))?;
    Ok(gw)
}

/// Stops nginx through its master (`-s stop`), which takes its workers down with it (a killed
/// master leaves them running), and waits until its pid file is gone.
async fn stop_nginx(bin: &Path, dir: &TempDir, proc: Proc) {
    let root = dir.0.join("nginx");
    let _ = tokio::process::Command::new(bin)
        .arg("-p")
        .arg(&root)
        .arg("-c")
        .arg(root.join("nginx.conf"))
        .args(["-s", "stop"])
        .output()
        .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while root.join("nginx.pid").exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proc.stop().await;
}

/// nginx on `PATH` or at Debian's `/usr/sbin/nginx`.
fn find_nginx() -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    from_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// Starts nginx as a plain reverse proxy in front of `upstream`, everything under the scratch dir.
async fn start_nginx(
    bin: &Path,
    dir: &TempDir,
    upstream: SocketAddr,
) -> Result<(Proc, String), BoxError> {
    let port = common::free_port();
    let root = dir.0.join("nginx");
    let config = dir.write(
        "nginx/nginx.conf",
        &format!(
            "worker_processes auto;\n\
             pid {root}/nginx.pid;\n\
             error_log {root}/error.log warn;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n\
             \x20 access_log off;\n\
             \x20 client_body_temp_path {root}/client_body;\n\
             \x20 proxy_temp_path {root}/proxy;\n\
             \x20 fastcgi_temp_path {root}/fastcgi;\n\
             \x20 uwsgi_temp_path {root}/uwsgi;\n\
             \x20 scgi_temp_path {root}/scgi;\n\
             \x20 upstream bench {{ server {upstream}; keepalive 64; keepalive_requests 1000000; }}\n\
             \x20 server {{\n\
             \x20   listen 127.0.0.1:{port};\n\
             \x20   keepalive_requests 1000000;\n\
             \x20   location / {{\n\
             \x20     proxy_pass http://bench;\n\
             \x20     proxy_http_version 1.1;\n\
             \x20     proxy_set_header Connection \"\";\n\
             \x20     proxy_buffering off;\n\
             \x20   }}\n\
             \x20 }}\n\
             }}\n",
            root = root.display()
        ),
    );
    let args: Vec<String> = [
        "-p",
        &root.to_string_lossy(),
        "-e",
        &root.join("error.log").to_string_lossy(),
        "-c",
        &config.to_string_lossy(),
        "-g",
        "daemon off;",
    ]
    .map(String::from)
    .to_vec();
    let proc = Proc::start(bin, &args, None).await?;
    let url = format!("http://127.0.0.1:{port}");
    common::wait_ok(&format!("{url}/metrics"), Duration::from_secs(10))
        .await
        .map_err(|e| {
            let log = std::fs::read_to_string(root.join("error.log")).unwrap_or_default();
            format!("{e}; nginx stderr:\n{}\nerror.log:\n{log}", proc.stderr())
        })?;
    Ok((proc, url))
}
