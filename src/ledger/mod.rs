//! The usage ledger: one row per finished or refused request (who, which model and version,
//! where it ran, how it ended, tokens by class, cost, latencies; never prompts or answers) and a
//! daily rollup per (day, tenant, key id, model). The request path only pushes a row onto a
//! bounded in-memory queue (a move into a buffer the writer recycles: no allocation beyond the
//! row itself, and a wake-up only for the row that reaches the early-flush mark). One writer
//! thread wakes once per flush interval (1 s), or early when the queue is half full, and writes
//! everything queued in one transaction (one prepared INSERT, one rollup upsert per group). A full
//! queue drops its oldest rows (counted). A crash loses the rows queued since the last flush: one
//! flush interval (1 s) of traffic, more only when the writer fell behind.
//!
//! Durability stays SQLite's `synchronous=FULL` (WAL): every committed batch is on disk before
//! the next starts. With one commit per interval instead of one per row, that fsync costs the
//! writer about one disk flush a second, not a share of each request, so the cheaper modes
//! (`NORMAL`, which may lose committed batches on power loss) would buy almost nothing. The
//! storage sits behind [`LedgerStore`] and [`LedgerReader`] (SQLite here; the fleet mode adds
//! PostgreSQL).

pub mod postgres;
mod query;
mod sqlite;
#[cfg(test)]
mod tests;
mod text;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use query::{
    DEFAULT_LIMIT, Dimension, MAX_LIMIT, Outcome, UsageGroup, UsagePage, UsageQuery, dimensions,
    render_csv, render_rows_csv,
};
pub use sqlite::SqliteStore;
pub use text::RowText;

/// Longest a row waits in the queue before it is written.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// How often rows older than the retention are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// One request as the ledger keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageRow {
    /// `x-request-id`.
    pub request_id: RowText,
    /// Arrival, Unix ms.
    pub start_ms: i64,
    /// End of the answer (or the refusal), Unix ms; its UTC day is the rollup's day.
    pub end_ms: i64,
    /// Tenant.
    pub tenant: RowText,
    /// Short id of the API key: the first 12 hex digits of its SHA-256 (as in the config's
    /// `sha256:` entry); empty for the anonymous tenant.
    pub key_id: RowText,
    /// The model the client asked for.
    pub model: RowText,
    /// The version (canary arm) that served it; empty without a split.
    pub version: RowText,
    /// Pool.
    pub pool: RowText,
    /// Worker URL; empty when none answered.
    pub worker: RowText,
    /// HTTP status the client got.
    pub status: u16,
    /// Why it was refused or cut short (`rate`, `budget`, `queue_full`, `client_gone`, ...);
    /// empty for a complete answer.
    pub reason: RowText,
    /// Prompt tokens (cached ones included).
    pub prompt_tokens: u64,
    /// Prompt tokens served from the worker's prefix cache.
    pub cached_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Cost, nano-USD.
    pub cost_nanousd: u64,
    /// Version of the prices it was priced at.
    pub price_version: u32,
    /// Time in the admission queue, ms.
    pub queue_ms: Option<u64>,
    /// Time to the first body byte, ms.
    pub ttft_ms: Option<u64>,
    /// Arrival to end, ms.
    pub total_ms: u64,
}

/// Most cost one ledger row records: $1,000 (a request past it is a worker's bad number, already
/// refused by the usage check). At this ceiling `SUM(cost_nanousd)` of 9 million rows still fits
/// an `i64`.
pub const ROW_COST_CEILING_NANOUSD: u64 = 1_000_000_000_000;
/// Most tokens of one kind one ledger row records (a billion).
pub const ROW_TOKENS_CEILING: u64 = 1_000_000_000;

/// A storage failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerError(pub String);

impl std::fmt::Display for LedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LedgerError {}

/// Where the writer puts rows.
pub trait LedgerStore: Send {
    /// Inserts `rows` and adds them to the daily rollup, in one transaction.
    fn write_batch(&mut self, rows: &[UsageRow]) -> Result<(), LedgerError>;
    /// Deletes rows that ended before `before_ms` (the rollup is kept); returns how many.
    fn prune(&mut self, before_ms: i64) -> Result<u64, LedgerError>;
}

/// Where the admin API, the dashboard and the CLI read from.
pub trait LedgerReader: Send + Sync {
    /// Rows matching `q`, grouped by its dimensions, one page.
    fn usage(&self, q: &UsageQuery) -> Result<UsagePage, LedgerError>;
    /// The daily rollup matching `q`'s filters (its dimensions are ignored), one page.
    fn daily(&self, q: &UsageQuery) -> Result<UsagePage, LedgerError>;
    /// Raw rows matching `q`'s filters, oldest first, one page.
    fn rows(&self, q: &UsageQuery) -> Result<Vec<UsageRow>, LedgerError>;
    /// Cost per tenant since the start of the UTC day holding `since_ms` (from the rollup).
    fn spend_since(&self, since_ms: i64) -> Result<Vec<(String, u64)>, LedgerError>;
}

/// Counters the writer keeps (read into the gateway's metrics).
#[derive(Debug, Default)]
pub struct LedgerCounters {
    /// Rows written.
    pub written: AtomicU64,
    /// Rows dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Rows lost to a failed write.
    pub failed: AtomicU64,
    /// Batches written.
    pub flushes: AtomicU64,
}

struct Queue {
    rows: Mutex<QueueState>,
    ready: Condvar,
    /// Queued rows that wake the writer before the interval ends.
    wake_rows: usize,
    /// Longest the writer sleeps between flushes.
    interval: Duration,
}

/// Rows that wake the writer early: half the queue, so it wakes once per flush interval unless
/// traffic would fill the queue before the interval ends (each wake-up costs a commit and its
/// fsync, so fewer, bigger batches cost the process less CPU per row).
pub fn early_flush_rows(queue_rows: usize) -> usize {
    (queue_rows / 2).max(1)
}

#[derive(Default)]
struct QueueState {
    rows: VecDeque<UsageRow>,
    closing: bool,
}

/// The ledger as the request path sees it: `record` never blocks on the database.
pub struct UsageLedger {
    queue: Arc<Queue>,
    capacity: usize,
    /// Writer counters.
    pub counters: Arc<LedgerCounters>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    reader: Arc<dyn LedgerReader>,
    /// Where the rows go.
    pub backend: LedgerBackend,
}

/// The `ledger:` section as configured.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LedgerConfig {
    /// No `ledger:` section: `infergate gateway` keeps no ledger; `infergate up` keeps one in
    /// its cache directory.
    #[default]
    Unset,
    /// `ledger: {enabled: false}`.
    Off,
    /// A ledger at these settings.
    On(LedgerSettings),
}

/// Days of rows kept when `retention_days` is not given.
pub const DEFAULT_RETENTION_DAYS: u32 = 90;
/// Queue size when `queue_rows` is not given.
pub const DEFAULT_QUEUE_ROWS: usize = 65_536;

impl LedgerSettings {
    /// Default settings for a ledger file at `path`.
    pub fn at(path: PathBuf) -> Self {
        Self {
            backend: LedgerBackend::Sqlite(path),
            retention_days: Some(DEFAULT_RETENTION_DAYS),
            queue_rows: DEFAULT_QUEUE_ROWS,
        }
    }
}

/// Where the rows are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerBackend {
    /// A SQLite file (one replica).
    Sqlite(PathBuf),
    /// A PostgreSQL database shared by the fleet (`postgres://...`).
    Postgres(String),
}

impl LedgerBackend {
    /// For logs: the file, or the URL without its password.
    pub fn describe(&self) -> String {
        match self {
            Self::Sqlite(p) => p.display().to_string(),
            Self::Postgres(url) => redact_password(url),
        }
    }
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`.
fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((user, host)) if user.contains(':') => {
            let name = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{name}:***@{host}")
        }
        _ => url.to_string(),
    }
}

/// `ledger:` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerSettings {
    /// SQLite file (created on first start) or PostgreSQL database.
    pub backend: LedgerBackend,
    /// Rows older than this many days are deleted (the rollup is kept); `None` keeps all.
    pub retention_days: Option<u32>,
    /// Rows the queue holds before it drops the oldest.
    pub queue_rows: usize,
}

impl UsageLedger {
    /// Opens (creating or migrating) the ledger `settings` names and starts its writer thread.
    pub fn open(settings: &LedgerSettings) -> Result<Arc<Self>, LedgerError> {
        match &settings.backend {
            LedgerBackend::Sqlite(path) => {
                let store = SqliteStore::open(path)?;
                let reader = SqliteStore::open_reader(path)?;
                Self::start(Box::new(store), Arc::new(reader), settings)
            }
            LedgerBackend::Postgres(url) => {
                postgres::migrate(url)?;
                let store = postgres::PgWriter::new(url);
                let reader = postgres::PgReader::new(url);
                Self::start(Box::new(store), Arc::new(reader), settings)
            }
        }
    }

    /// A reader of the ledger `backend` names, without a writer (the CLI's).
    pub fn reader_of(backend: &LedgerBackend) -> Result<Arc<dyn LedgerReader>, LedgerError> {
        Ok(match backend {
            LedgerBackend::Sqlite(path) => Arc::new(SqliteStore::open_reader(path)?),
            LedgerBackend::Postgres(url) => Arc::new(postgres::PgReader::new(url)),
        })
    }

    /// Starts the writer over `store`.
    pub fn start(
        store: Box<dyn LedgerStore>,
        reader: Arc<dyn LedgerReader>,
        settings: &LedgerSettings,
    ) -> Result<Arc<Self>, LedgerError> {
        Self::start_with(store, reader, settings, FLUSH_INTERVAL)
    }

    /// [`Self::start`] with another flush interval (tests use a long one, so that only the
    /// early-flush mark or `close` can start a write).
    fn start_with(
        store: Box<dyn LedgerStore>,
        reader: Arc<dyn LedgerReader>,
        settings: &LedgerSettings,
        interval: Duration,
    ) -> Result<Arc<Self>, LedgerError> {
        let capacity = settings.queue_rows.max(1);
        let queue = Arc::new(Queue {
            rows: Mutex::new(QueueState::default()),
            ready: Condvar::new(),
            wake_rows: early_flush_rows(capacity),
            interval,
        });
        let counters = Arc::new(LedgerCounters::default());
        let retention = settings
            .retention_days
            .map(|d| i64::from(d) * crate::utc::DAY_MS);
        let writer = {
            let (queue, counters) = (queue.clone(), counters.clone());
            std::thread::Builder::new()
                .name("ledger-writer".into())
                .spawn(move || write_loop(store, &queue, &counters, retention))
                .map_err(|e| LedgerError(format!("cannot start the ledger writer: {e}")))?
        };
        Ok(Arc::new(Self {
            queue,
            capacity,
            counters,
            writer: Mutex::new(Some(writer)),
            reader,
            backend: settings.backend.clone(),
        }))
    }

    /// Checks and records which price table `version` names (see [`SqliteStore::note_prices`]).
    pub fn note_prices(&self, prices: &crate::pricing::Prices) -> Result<(), LedgerError> {
        if prices.version == 0 {
            return Ok(());
        }
        match &self.backend {
            LedgerBackend::Sqlite(path) => {
                SqliteStore::open(path)?.note_prices(prices.version, &prices.fingerprint())
            }
            LedgerBackend::Postgres(url) => {
                postgres::note_prices(url, prices.version, &prices.fingerprint())
            }
        }
    }

    /// Queues `row`; when the queue is full the oldest row is dropped (and counted). Never
    /// blocks on the database and allocates nothing: the row moves into a buffer the writer
    /// hands back after each flush.
    pub fn record(&self, mut row: UsageRow) {
        // Whatever a worker reported, one row stays small enough that sums over millions of
        // rows fit the stores' signed 64-bit integers.
        row.cost_nanousd = row.cost_nanousd.min(ROW_COST_CEILING_NANOUSD);
        for tokens in [
            &mut row.prompt_tokens,
            &mut row.cached_tokens,
            &mut row.completion_tokens,
        ] {
            *tokens = (*tokens).min(ROW_TOKENS_CEILING);
        }
        let Ok(mut q) = self.queue.rows.lock() else {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if q.closing {
            // The writer has stopped (shutdown): the row cannot be written.
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if q.rows.len() >= self.capacity {
            q.rows.pop_front();
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
        q.rows.push_back(row);
        // Only the row that reaches the mark wakes the writer (a notify is a futex syscall even
        // with no waiter); a writer busy writing then finds the queue past the mark itself.
        if q.rows.len() == self.queue.wake_rows {
            self.queue.ready.notify_one();
        }
    }

    /// Rows waiting to be written.
    pub fn queued(&self) -> usize {
        self.queue.rows.lock().map_or(0, |q| q.rows.len())
    }

    /// The reader of what was written.
    pub fn reader(&self) -> &Arc<dyn LedgerReader> {
        &self.reader
    }

    /// Writes every queued row and stops the writer (at shutdown). Blocks up to the write time.
    pub fn close(&self) {
        if let Ok(mut q) = self.queue.rows.lock() {
            q.closing = true;
        }
        self.queue.ready.notify_one();
        let handle = self.writer.lock().ok().and_then(|mut w| w.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl Drop for UsageLedger {
    fn drop(&mut self) {
        self.close();
    }
}

/// The writer thread: waits for the interval (or the early-flush mark, or `close`), writes
/// everything queued, prunes now and then.
fn write_loop(
    mut store: Box<dyn LedgerStore>,
    queue: &Queue,
    counters: &LedgerCounters,
    retention_ms: Option<i64>,
) {
    let mut last_prune: Option<Instant> = None;
    // The buffer swapped with the request side's at each flush: its capacity (kept across
    // flushes) is what the request side pushes into next, so a push never reallocates.
    let mut batch: VecDeque<UsageRow> = VecDeque::new();
    let mut recent = RecentBatches::default();
    loop {
        let closing = {
            let Ok(mut q) = queue.rows.lock() else {
                return;
            };
            let deadline = Instant::now() + queue.interval;
            while q.rows.len() < queue.wake_rows && !q.closing {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                q = match queue.ready.wait_timeout(q, left) {
                    Ok((q, _)) => q,
                    Err(_) => return,
                };
            }
            // Swapped, not copied: the request path never waits on a long batch.
            std::mem::swap(&mut q.rows, &mut batch);
            q.closing
        };
        let n = batch.len();
        if n > 0 {
            match store.write_batch(batch.make_contiguous()) {
                Ok(()) => {
                    counters.written.fetch_add(n as u64, Ordering::Relaxed);
                    counters.flushes.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    counters.failed.fetch_add(n as u64, Ordering::Relaxed);
                    tracing::error!(rows = n, error = %e, "usage ledger write failed; rows lost");
                }
            }
        }
        recycle(&mut batch, recent.note(n));
        if let Some(keep) = retention_ms
            && last_prune.is_none_or(|t| t.elapsed() >= PRUNE_EVERY)
        {
            last_prune = Some(Instant::now());
            match store.prune(crate::utc::now_ms() - keep) {
                Ok(0) => {}
                Ok(n) => tracing::info!(rows = n, "usage ledger: rows past retention deleted"),
                Err(e) => tracing::warn!(error = %e, "usage ledger retention failed"),
            }
        }
        if closing {
            return;
        }
    }
}

/// Slots a recycled buffer keeps at least (about 400 KiB).
const RECYCLE_FLOOR: usize = 1_024;

/// Flushes whose largest batch sizes the recycled buffers (about a minute at one a second).
const RECYCLE_WINDOW: usize = 64;

/// The sizes of the last [`RECYCLE_WINDOW`] batches. Sizing the buffers by the last batch alone
/// shrank them at every lull (a quiet second, a pause between bursts) and the next busy second
/// grew them again: a reallocation of megabytes on the request path, into fresh pages faulted
/// in one by one (`perf record -e page-faults`: nine in ten of the gateway's page faults in the
/// usage-ledger column of `gateway_overhead` were that growth).
struct RecentBatches {
    sizes: [usize; RECYCLE_WINDOW],
    next: usize,
}

impl Default for RecentBatches {
    fn default() -> Self {
        Self {
            sizes: [0; RECYCLE_WINDOW],
            next: 0,
        }
    }
}

impl RecentBatches {
    /// Notes a batch of `n` rows; returns the largest of the window.
    fn note(&mut self, n: usize) -> usize {
        self.sizes[self.next % RECYCLE_WINDOW] = n;
        self.next = self.next.wrapping_add(1);
        self.sizes.iter().copied().max().unwrap_or(n)
    }
}

/// Empties a written batch (its rows are dropped here, on the writer thread) and keeps its
/// capacity for the next swap, unless it is far bigger than the largest recent batch (`peak`):
/// then it shrinks to twice that, so a burst's memory is not held for good.
fn recycle(batch: &mut VecDeque<UsageRow>, peak: usize) {
    batch.clear();
    let keep = peak.saturating_mul(2).max(RECYCLE_FLOOR);
    if batch.capacity() > keep.saturating_mul(2) {
        batch.shrink_to(keep);
    }
}
