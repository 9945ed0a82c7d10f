//! The usage ledger's writer on SQLite: sustained rows per second through the real path (rows
//! pushed onto the bounded queue as fast as one thread can, the writer thread waking at the
//! interval or a half-full queue and writing everything queued in one transaction with the
//! daily-rollup upsert), and the time one `record` call costs the request path; then steady
//! traffic (20,000 rows/s for 3 s): batches written and the writer thread's CPU per row; then the
//! flood into PostgreSQL when `INFERGATE_BENCH_POSTGRES` names a database. Run with
//! `cargo bench --bench ledger_writer`.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use infergate::ledger::{DEFAULT_QUEUE_ROWS, LedgerBackend, LedgerSettings, UsageLedger, UsageRow};

/// Rows per run.
const ROWS: u64 = 300_000;

fn row(i: u64, now: i64) -> UsageRow {
    UsageRow {
        request_id: format!("{i:032x}").into(),
        start_ms: now - 40,
        end_ms: now,
        tenant: format!("tenant-{}", i % 20).into(),
        key_id: format!("{:012x}", i % 50).into(),
        model: ["llama-3-8b", "llama-3-70b", "infergate-tiny"][(i % 3) as usize].into(),
        version: if i.is_multiple_of(10) {
            "canary".into()
        } else {
            "stable".into()
        },
        pool: "local".into(),
        worker: "http://10.0.0.5:8000".into(),
        status: 200,
        reason: Default::default(),
        prompt_tokens: 1_000 + i % 500,
        cached_tokens: i % 700,
        completion_tokens: 64,
        cost_nanousd: 250_000 + i % 1_000,
        price_version: 1,
        queue_ms: Some(2),
        ttft_ms: Some(35),
        total_ms: 420,
    }
}

fn main() {
    let dir = std::env::temp_dir().join(format!("infergate-ledger-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    run(
        "SQLite, WAL, synchronous=FULL",
        LedgerBackend::Sqlite(dir.join("usage.sqlite")),
    );
    let size = std::fs::metadata(dir.join("usage.sqlite")).map_or(0, |m| m.len());
    println!(
        "file: {:.1} MiB ({} bytes per row)",
        size as f64 / 1_048_576.0,
        size / ROWS
    );
    paced(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    // PostgreSQL when a database is given (the rows are left in it).
    match std::env::var("INFERGATE_BENCH_POSTGRES") {
        Ok(url) if !url.is_empty() => run("PostgreSQL", LedgerBackend::Postgres(url)),
        _ => println!(
            "PostgreSQL: skipped (set INFERGATE_BENCH_POSTGRES=postgres://USER@HOST:PORT/DB)"
        ),
    }
}

fn run(label: &str, backend: LedgerBackend) {
    let settings = LedgerSettings {
        backend,
        retention_days: None,
        // Room for the whole run: this measures the writer, not the drop policy.
        queue_rows: ROWS as usize,
    };
    let ledger = match UsageLedger::open(&settings) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let now = infergate::utc::now_ms();
    let rows: Vec<UsageRow> = (0..ROWS).map(|i| row(i, now)).collect();
    let t0 = Instant::now();
    let mut push_ns = Vec::with_capacity(rows.len());
    for r in rows {
        let t = Instant::now();
        ledger.record(r);
        push_ns.push(t.elapsed().as_nanos() as u64);
    }
    let pushed = t0.elapsed();
    let deadline = Instant::now() + Duration::from_secs(600);
    while ledger.counters.written.load(Ordering::Relaxed) < ROWS {
        if Instant::now() > deadline {
            eprintln!("error: the writer did not finish in 10 minutes");
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let all = t0.elapsed();
    push_ns.sort_unstable();
    let pct = |p: f64| push_ns[((push_ns.len() - 1) as f64 * p) as usize];
    let c = &ledger.counters;
    println!(
        "ledger writer ({label}): {ROWS} rows in {:.2} s = {:.0} rows/s sustained, {} batches",
        all.as_secs_f64(),
        ROWS as f64 / all.as_secs_f64(),
        c.flushes.load(Ordering::Relaxed)
    );
    println!(
        "record() on the request path: p50 {} ns, p99 {} ns, max {} ns ({} rows pushed in {:.2} s); dropped {}",
        pct(0.5),
        pct(0.99),
        push_ns.last().copied().unwrap_or(0),
        ROWS,
        pushed.as_secs_f64(),
        c.dropped.load(Ordering::Relaxed)
    );
    ledger.close();
}

/// Rows a second of the paced run, handed over in 10 ms steps for [`PACED_SECONDS`].
const PACED_RATE: u64 = 20_000;
const PACED_SECONDS: u64 = 3;

/// A busy gateway's steady traffic (not a flood): the default queue, rows handed over at
/// [`PACED_RATE`]; reports the writer's batches and its thread's CPU time per row (Linux).
fn paced(dir: &std::path::Path) {
    let settings = LedgerSettings {
        backend: LedgerBackend::Sqlite(dir.join("paced.sqlite")),
        retention_days: None,
        queue_rows: DEFAULT_QUEUE_ROWS,
    };
    let ledger = match UsageLedger::open(&settings) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let writer = writer_tid();
    let cpu0 = writer.as_deref().and_then(thread_cpu_ns);
    let now = infergate::utc::now_ms();
    let per_step = PACED_RATE / 100;
    let steps = PACED_SECONDS * 100;
    let t0 = Instant::now();
    for step in 0..steps {
        for j in 0..per_step {
            ledger.record(row(step * per_step + j, now));
        }
        let next = t0 + Duration::from_millis(10 * (step + 1));
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let total = steps * per_step;
    let deadline = Instant::now() + Duration::from_secs(60);
    while ledger.counters.written.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let cpu = match (cpu0, writer.as_deref().and_then(thread_cpu_ns)) {
        (Some(a), Some(b)) => format!(
            "writer thread CPU {:.0} ms = {} ns per row",
            (b - a) as f64 / 1e6,
            (b - a) / total
        ),
        _ => "writer thread CPU: n/a (no /proc)".into(),
    };
    println!(
        "paced (SQLite, {PACED_RATE} rows/s for {PACED_SECONDS} s, queue {DEFAULT_QUEUE_ROWS}): {} of {total} rows written in {} batches; {cpu}",
        ledger.counters.written.load(Ordering::Relaxed),
        ledger.counters.flushes.load(Ordering::Relaxed),
    );
    ledger.close();
}

/// `/proc/self/task/TID` of the newest ledger writer thread (an earlier run's, joined, may
/// still be listed for a moment).
fn writer_tid() -> Option<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u64>().ok()?, e.path())))
        .filter(|(_, p)| {
            std::fs::read_to_string(p.join("comm")).is_ok_and(|c| c.trim() == "ledger-writer")
        })
        .max_by_key(|(tid, _)| *tid)
        .map(|(_, p)| p)
}

/// Nanoseconds the thread ran on a CPU (the first field of its `schedstat`).
fn thread_cpu_ns(task: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(task.join("schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
