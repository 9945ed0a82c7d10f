use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::*;

struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str) -> Self {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("infergate-ledger-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir.join("ledger.sqlite"))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn settings(path: &std::path::Path, queue_rows: usize) -> LedgerSettings {
    LedgerSettings {
        backend: LedgerBackend::Sqlite(path.to_path_buf()),
        retention_days: None,
        queue_rows,
    }
}

const T0: i64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z

fn row(i: u64, tenant: &str, model: &str, end_ms: i64) -> UsageRow {
    UsageRow {
        request_id: format!("req-{i}").into(),
        start_ms: end_ms - 50,
        end_ms,
        tenant: tenant.into(),
        key_id: format!("key{}", i % 2).into(),
        model: model.into(),
        pool: "main".into(),
        worker: "http://127.0.0.1:1".into(),
        status: if i.is_multiple_of(5) { 429 } else { 200 },
        reason: if i.is_multiple_of(5) {
            "rate".into()
        } else {
            RowText::EMPTY
        },
        prompt_tokens: 100 + i,
        cached_tokens: i % 50,
        completion_tokens: 10,
        cost_nanousd: 1_000 + i,
        price_version: 1,
        queue_ms: Some(1),
        ttft_ms: Some(20),
        total_ms: 50,
        ..UsageRow::default()
    }
}

fn query(group: &[Dimension]) -> UsageQuery {
    let mut q = UsageQuery::recent(T0 + 3 * crate::utc::DAY_MS, 10);
    q.group_by = group.to_vec();
    q.limit = query::MAX_LIMIT;
    q
}

#[test]
fn rows_survive_a_restart_and_the_rollup_equals_their_sum() {
    let file = TempFile::new("restart");
    let rows: Vec<UsageRow> = (0..1_200)
        .map(|i| {
            let tenant = if i % 3 == 0 { "acme" } else { "globex" };
            let model = if i % 2 == 0 { "a" } else { "b" };
            row(
                i,
                tenant,
                model,
                T0 + (i as i64 % 3) * crate::utc::DAY_MS + 1_000,
            )
        })
        .collect();
    {
        let ledger = UsageLedger::open(&settings(&file.0, 10_000)).expect("open");
        for r in &rows {
            ledger.record(r.clone());
        }
        ledger.close();
        assert_eq!(ledger.counters.written.load(Ordering::Relaxed), 1_200);
    }
    let reader = SqliteStore::open_reader(&file.0).expect("reopen");
    let mut q = query(&[]);
    q.limit = 5_000;
    let back = reader.rows(&q).expect("rows");
    assert_eq!(back.len(), rows.len());
    let mut sorted = rows.clone();
    sorted.sort_by_key(|r| r.end_ms);
    let by_id = |v: &[UsageRow]| {
        let mut ids: Vec<(String, u64)> = v
            .iter()
            .map(|r| (r.request_id.to_string(), r.cost_nanousd))
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(by_id(&back), by_id(&sorted));
    assert!(
        back.iter().any(|r| *r == rows[7]),
        "rows come back field for field"
    );

    let dims = [
        Dimension::Day,
        Dimension::Tenant,
        Dimension::Model,
        Dimension::Key,
    ];
    let from_rows = reader.usage(&query(&dims)).expect("usage");
    let from_rollup = reader.daily(&query(&dims)).expect("daily");
    assert_eq!(from_rows.groups, from_rollup.groups);
    assert_eq!(
        from_rows.totals.cost_nanousd,
        rows.iter().map(|r| r.cost_nanousd).sum::<u64>()
    );
    assert_eq!(from_rows.totals.refused, 240);
    // Reopening for writing keeps the rows and adds to them.
    let ledger = UsageLedger::open(&settings(&file.0, 10_000)).expect("open again");
    ledger.record(row(5_000, "acme", "a", T0 + 5));
    ledger.close();
    let again = reader.usage(&query(&[Dimension::Tenant])).expect("usage");
    assert_eq!(again.totals.requests, 1_201);
}

#[test]
fn a_full_queue_drops_its_oldest_rows_and_counts_them() {
    /// A store that blocks until released, so rows pile up in the queue.
    struct Gate(Arc<(Mutex<bool>, Condvar)>, Arc<Mutex<Vec<String>>>);
    impl LedgerStore for Gate {
        fn write_batch(&mut self, rows: &[UsageRow]) -> Result<(), LedgerError> {
            let (lock, cv) = &*self.0;
            let mut open = lock.lock().map_err(|_| LedgerError("poisoned".into()))?;
            while !*open {
                open = cv.wait(open).map_err(|_| LedgerError("poisoned".into()))?;
            }
            if let Ok(mut seen) = self.1.lock() {
                seen.extend(rows.iter().map(|r| r.request_id.to_string()));
            }
            Ok(())
        }
        fn prune(&mut self, _: i64) -> Result<u64, LedgerError> {
            Ok(0)
        }
    }
    let file = TempFile::new("full");
    let reader = Arc::new(SqliteStore::open(&file.0).expect("open"));
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let ledger = UsageLedger::start(
        Box::new(Gate(gate.clone(), seen.clone())),
        reader,
        &settings(&file.0, 100),
    )
    .expect("start");
    // The first row goes to the (blocked) store within a flush interval; the rest wait in the
    // queue of 100.
    ledger.record(row(0, "acme", "a", T0));
    let deadline = Instant::now() + Duration::from_secs(10);
    while ledger.queued() > 0 {
        assert!(
            Instant::now() < deadline,
            "the writer never took the first batch"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for i in 0..250u64 {
        ledger.record(row(1_000 + i, "acme", "a", T0));
    }
    assert_eq!(ledger.queued(), 100);
    assert_eq!(ledger.counters.dropped.load(Ordering::Relaxed), 150);
    *gate.0.lock().expect("gate") = true;
    gate.1.notify_all();
    ledger.close();
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 1 + 100);
    // The newest 100 survived: 1150..1250.
    assert_eq!(seen.last().map(String::as_str), Some("req-1249"));
    assert!(seen.contains(&"req-1150".to_string()));
    assert!(!seen.contains(&"req-1149".to_string()));
    let c = &ledger.counters;
    let total = c.written.load(Ordering::Relaxed) + c.dropped.load(Ordering::Relaxed);
    assert_eq!(total, 1 + 250, "every row is written or counted as dropped");
}

#[test]
fn queries_filter_group_and_page() {
    let file = TempFile::new("query");
    let mut store = SqliteStore::open(&file.0).expect("open");
    let rows: Vec<UsageRow> = (0..30)
        .map(|i| row(i, ["t1", "t2", "t3"][i as usize % 3], "m", T0 + i as i64))
        .collect();
    store.write_batch(&rows).expect("write");
    let mut q = query(&[Dimension::Tenant]);
    q.limit = 2;
    let page = store.usage(&q).expect("page 1");
    assert_eq!(
        (page.groups.len(), page.total_groups, page.next_offset),
        (2, 3, Some(2))
    );
    // Sorted by cost, biggest first.
    assert!(page.groups[0].cost_nanousd >= page.groups[1].cost_nanousd);
    q.offset = 2;
    let last = store.usage(&q).expect("page 2");
    assert_eq!((last.groups.len(), last.next_offset), (1, None));
    let mut one = query(&[Dimension::Reason]);
    one.tenant = Some("t1".into());
    one.outcome = Outcome::Refused;
    let refused = store.usage(&one).expect("refused");
    // t1 holds i = 0, 3, ..., 27; refused when i % 5 == 0: 0, 15.
    assert_eq!(refused.totals.requests, 2);
    assert_eq!(
        refused.groups[0].group.get("reason").map(String::as_str),
        Some("rate")
    );
    let csv = render_csv(&store.usage(&query(&[Dimension::Tenant])).expect("csv"));
    assert!(csv.starts_with("tenant,requests,refused,"), "{csv}");
    assert_eq!(csv.lines().count(), 4);
    let spend = store.spend_since(T0).expect("spend");
    let total: u64 = spend.iter().map(|(_, c)| c).sum();
    assert_eq!(total, rows.iter().map(|r| r.cost_nanousd).sum::<u64>());
    assert_eq!(store.prune(T0 + 10).expect("prune"), 10);
}

#[test]
fn query_parameters_are_checked() {
    let now = T0 + 1_000;
    let p = |pairs: &[(&str, &str)]| {
        let params: Vec<(String, String)> = pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        UsageQuery::from_params(&params, now, &[Dimension::Day])
    };
    let q = p(&[
        ("from", "2026-11-01"),
        ("to", "2026-11-30"),
        ("group_by", "tenant,day"),
    ])
    .expect("valid");
    assert_eq!(q.group_by, vec![Dimension::Day, Dimension::Tenant]);
    assert_eq!(q.to_ms, T0, "a date as `to` includes that day");
    assert!(p(&[("group_by", "colour")]).is_err());
    assert!(p(&[("limit", "0")]).is_err());
    assert!(p(&[("from", "2026-12-02"), ("to", "2026-12-01")]).is_err());
    assert!(p(&[("bogus", "1")]).is_err());
}

#[test]
fn absurd_rows_are_capped_so_sums_stay_in_range() {
    let file = TempFile::new("ceiling");
    let absurd = |i: u64| UsageRow {
        cost_nanousd: u64::MAX,
        prompt_tokens: u64::MAX,
        cached_tokens: u64::MAX,
        completion_tokens: 1_000_000_000_000_000_000,
        ..row(i, "acme", "a", T0 + 1_000)
    };
    {
        let ledger = UsageLedger::open(&settings(&file.0, 100)).expect("open");
        for i in 0..20 {
            ledger.record(absurd(i));
        }
        ledger.close();
    }
    let reader = SqliteStore::open_reader(&file.0).expect("reopen");
    let dims = [Dimension::Tenant];
    let sums = reader.usage(&query(&dims)).expect("sums answer");
    assert_eq!(
        sums.totals.cost_nanousd,
        20 * super::ROW_COST_CEILING_NANOUSD
    );
    assert_eq!(
        sums.totals.completion_tokens,
        20 * super::ROW_TOKENS_CEILING
    );
    let daily = reader.daily(&query(&dims)).expect("rollup answers");
    assert_eq!(daily.totals.cost_nanousd, sums.totals.cost_nanousd);
}

/// A store that keeps what it was given, batch by batch.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Vec<String>>>>);

impl LedgerStore for Recorder {
    fn write_batch(&mut self, rows: &[UsageRow]) -> Result<(), LedgerError> {
        if let Ok(mut batches) = self.0.lock() {
            batches.push(rows.iter().map(|r| r.request_id.to_string()).collect());
        }
        Ok(())
    }
    fn prune(&mut self, _: i64) -> Result<u64, LedgerError> {
        Ok(0)
    }
}

fn ids(range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|i| format!("req-{i}")).collect()
}

#[test]
fn the_writer_wakes_once_per_batch_and_close_writes_what_was_handed_over() {
    let file = TempFile::new("wake");
    let reader = Arc::new(SqliteStore::open(&file.0).expect("open"));
    let store = Recorder::default();
    // An hour-long interval: only the early-flush mark (half of 1,000) or `close` writes.
    let ledger = UsageLedger::start_with(
        Box::new(store.clone()),
        reader,
        &settings(&file.0, 1_000),
        Duration::from_secs(3_600),
    )
    .expect("start");
    assert_eq!(early_flush_rows(1_000), 500);
    for i in 0..499 {
        ledger.record(row(i, "acme", "a", T0));
    }
    assert_eq!(ledger.queued(), 499, "below the mark the rows wait");
    ledger.record(row(499, "acme", "a", T0));
    let deadline = Instant::now() + Duration::from_secs(10);
    while ledger.counters.written.load(Ordering::Relaxed) < 500 {
        assert!(
            Instant::now() < deadline,
            "the mark did not wake the writer"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    for i in 500..510 {
        ledger.record(row(i, "acme", "a", T0));
    }
    ledger.close();
    ledger.record(row(999, "acme", "a", T0));
    let batches = store.0.lock().expect("batches").clone();
    assert_eq!(
        batches,
        vec![ids(0..500), ids(500..510)],
        "one batch per wake-up, in the order handed over, the rest written at close"
    );
    let c = &ledger.counters;
    assert_eq!(c.written.load(Ordering::Relaxed), 510);
    assert_eq!(c.flushes.load(Ordering::Relaxed), 2);
    assert_eq!(
        c.dropped.load(Ordering::Relaxed),
        1,
        "a row after close is counted, not queued"
    );
    assert_eq!(ledger.queued(), 0);
}

#[test]
fn a_batch_is_written_in_order_with_each_rows_day() {
    let file = TempFile::new("chunks");
    let mut store = SqliteStore::open(&file.0).expect("open");
    // One batch across two days.
    let n = 69;
    let rows: Vec<UsageRow> = (0..n)
        .map(|i| {
            let day = if i < 40 { 0 } else { 1 };
            row(i, "acme", "a", T0 + day * crate::utc::DAY_MS + i as i64)
        })
        .collect();
    store.write_batch(&rows).expect("write");
    let conn = rusqlite::Connection::open(&file.0).expect("conn");
    let mut stmt = conn
        .prepare("SELECT request_id, day FROM usage ORDER BY id")
        .expect("prepare");
    let back: Vec<(String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    let want: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r.request_id.to_string(), crate::utc::iso_date(r.end_ms)))
        .collect();
    assert_eq!(back, want);
    assert_eq!(back[0].1, "2026-12-01");
    assert_eq!(back[n as usize - 1].1, "2026-12-02");
    let mut q = query(&[]);
    q.limit = 1_000;
    let mut fields = store.rows(&q).expect("rows");
    fields.sort_by_key(|r| r.end_ms);
    assert_eq!(fields, rows, "every field of every row comes back");
    let dims = [Dimension::Day, Dimension::Tenant, Dimension::Key];
    assert_eq!(
        store.usage(&query(&dims)).expect("usage").groups,
        store.daily(&query(&dims)).expect("daily").groups,
        "the rollup equals the rows"
    );
}

#[test]
fn a_batch_is_one_transaction() {
    let file = TempFile::new("atomic");
    let mut store = SqliteStore::open(&file.0).expect("open");
    let conn = rusqlite::Connection::open(&file.0).expect("conn");
    conn.execute_batch(
        "CREATE TRIGGER boom BEFORE INSERT ON usage WHEN NEW.request_id = 'req-50'
         BEGIN SELECT RAISE(ABORT, 'boom'); END;",
    )
    .expect("trigger");
    let rows: Vec<UsageRow> = (0..70).map(|i| row(i, "acme", "a", T0)).collect();
    // Row 50 fails: the 50 rows before it and the rollup are rolled back too.
    assert!(store.write_batch(&rows).is_err());
    let count = |table: &str| -> i64 {
        conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
            .expect("count")
    };
    assert_eq!((count("usage"), count("usage_daily")), (0, 0));
    conn.execute_batch("DROP TRIGGER boom").expect("drop");
    store.write_batch(&rows).expect("write");
    assert_eq!((count("usage"), count("usage_daily")), (70, 2));
}

#[test]
fn a_written_buffer_is_kept_for_the_next_batch_unless_a_burst_grew_it() {
    let mut batch: VecDeque<UsageRow> = VecDeque::with_capacity(3_000);
    batch.extend((0..2_000).map(|i| row(i, "acme", "a", T0)));
    recycle(&mut batch, 2_000);
    assert!(batch.is_empty());
    assert!(
        batch.capacity() >= 3_000,
        "steady traffic reuses the buffer"
    );
    let mut burst: VecDeque<UsageRow> = VecDeque::with_capacity(60_000);
    burst.push_back(row(0, "acme", "a", T0));
    recycle(&mut burst, 1);
    assert!(burst.capacity() < 60_000, "a burst's memory is given back");
    assert!(burst.capacity() >= 1_024);
}

#[test]
fn a_lull_keeps_the_buffers_of_the_last_minutes_traffic() {
    let mut recent = RecentBatches::default();
    let mut buffer: VecDeque<UsageRow> = VecDeque::with_capacity(20_000);
    recycle(&mut buffer, recent.note(15_000));
    // A quiet flush (a pause between bursts) keeps the busy second's buffer.
    recycle(&mut buffer, recent.note(10));
    assert!(buffer.capacity() >= 20_000, "{}", buffer.capacity());
    for _ in 0..RECYCLE_WINDOW - 2 {
        recycle(&mut buffer, recent.note(10));
        assert!(buffer.capacity() >= 20_000);
    }
    // A window of quiet flushes later the memory goes back.
    recycle(&mut buffer, recent.note(10));
    assert!(buffer.capacity() < 20_000, "{}", buffer.capacity());
    assert!(buffer.capacity() >= RECYCLE_FLOOR);
}
