//! The embedded ledger: one SQLite file (WAL, so the admin API reads while the writer writes).
//! The schema is created on first open and versioned for later migrations. A batch is written
//! with one prepared INSERT (parameters bound in place, the day's name formatted once per day)
//! and one rollup upsert per (day, tenant, key, model), in one transaction committed with
//! `synchronous=FULL` (see the module above for why that durability stays). Multi-row INSERTs
//! of 32 rows were tried and measured no cheaper per row in `benches/ledger_writer.rs` (issue 47).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OpenFlags, Statement, params, params_from_iter};

use super::query::{
    MAX_GROUPS, SqlValue, UsageGroup, UsagePage, UsageQuery, grouped_sql, rows_sql, too_many_groups,
};
use super::{LedgerError, LedgerReader, LedgerStore, UsageRow};

/// The schema this code writes.
const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY,
    request_id TEXT NOT NULL,
    start_ms INTEGER NOT NULL,
    end_ms INTEGER NOT NULL,
    day TEXT NOT NULL,
    tenant TEXT NOT NULL,
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    pool TEXT NOT NULL,
    worker TEXT NOT NULL,
    status INTEGER NOT NULL,
    reason TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_nanousd INTEGER NOT NULL,
    price_version INTEGER NOT NULL,
    queue_ms INTEGER,
    ttft_ms INTEGER,
    total_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_tenant_time ON usage (tenant, end_ms);
CREATE INDEX IF NOT EXISTS usage_key_time ON usage (key_id, end_ms);
CREATE INDEX IF NOT EXISTS usage_time ON usage (end_ms);
CREATE TABLE IF NOT EXISTS usage_daily (
    day TEXT NOT NULL,
    tenant TEXT NOT NULL,
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,
    requests INTEGER NOT NULL,
    refused INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_nanousd INTEGER NOT NULL,
    PRIMARY KEY (day, tenant, key_id, model)
);
CREATE TABLE IF NOT EXISTS ledger_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS price_versions (
    version INTEGER PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    first_used_ms INTEGER NOT NULL
);
";

const INSERT_ROW: &str = "INSERT INTO usage (request_id, start_ms, end_ms, day, tenant, key_id, model, version, pool, worker, status, reason, prompt_tokens, cached_tokens, completion_tokens, cost_nanousd, price_version, queue_ms, ttft_ms, total_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)";

const UPSERT_DAILY: &str = "INSERT INTO usage_daily (day, tenant, key_id, model, requests, refused, prompt_tokens, cached_tokens, completion_tokens, cost_nanousd) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT (day, tenant, key_id, model) DO UPDATE SET requests = requests + excluded.requests, refused = refused + excluded.refused, prompt_tokens = prompt_tokens + excluded.prompt_tokens, cached_tokens = cached_tokens + excluded.cached_tokens, completion_tokens = completion_tokens + excluded.completion_tokens, cost_nanousd = cost_nanousd + excluded.cost_nanousd";

fn err(context: &str) -> impl Fn(rusqlite::Error) -> LedgerError + '_ {
    move |e| LedgerError(format!("{context}: {e}"))
}

/// u64 counts into SQLite's i64 (saturating: $9.2 billion in nano-USD is the ceiling).
fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn uint(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A SQLite ledger file.
pub struct SqliteStore {
    conn: Mutex<Connection>,
}

impl SqliteStore {
    /// Opens `path` for writing, creating the file, its directory and the schema.
    pub fn open(path: &Path) -> Result<Self, LedgerError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                LedgerError(format!(
                    "cannot create the ledger directory {}: {e}",
                    dir.display()
                ))
            })?;
        }
        let conn = Connection::open(path)
            .map_err(|e| LedgerError(format!("cannot open the ledger {}: {e}", path.display())))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err("busy timeout"))?;
        // WAL: readers never block the writer. FULL: each batch's commit is on disk before the
        // next one starts (one fsync a second), so a power cut loses no committed batch.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err("journal mode"))?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err("synchronous"))?;
        conn.execute_batch(SCHEMA)
            .map_err(err("creating the schema"))?;
        let version: Option<i64> = conn
            .query_row("SELECT MAX(version) FROM ledger_schema", [], |r| r.get(0))
            .map_err(err("reading the schema version"))?;
        match version {
            None => {
                conn.execute(
                    "INSERT INTO ledger_schema (version) VALUES (?1)",
                    [SCHEMA_VERSION],
                )
                .map_err(err("recording the schema version"))?;
            }
            Some(v) if v > SCHEMA_VERSION => {
                return Err(LedgerError(format!(
                    "the ledger {} has schema version {v}, newer than this build's {SCHEMA_VERSION}",
                    path.display()
                )));
            }
            Some(_) => {}
        }
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    /// Records that price `version` means the table with `fingerprint`; refuses when the ledger
    /// already holds that version for a different table (prices edited without a new version
    /// while the gateway was stopped), so one version never names two price tables.
    pub fn note_prices(&self, version: u32, fingerprint: &str) -> Result<(), LedgerError> {
        self.with(|c| {
            let known: Option<String> = c
                .query_row(
                    "SELECT fingerprint FROM price_versions WHERE version = ?1",
                    [version],
                    |r| r.get(0),
                )
                .map(Some)
                .or_else(|e| match e {
                    rusqlite::Error::QueryReturnedNoRows => Ok(None),
                    e => Err(e),
                })
                .map_err(err("price versions"))?;
            match known {
                Some(f) if f == fingerprint => Ok(()),
                Some(_) => Err(LedgerError(format!(
                    "prices.yaml version {version} already priced requests with different prices: raise `version`"
                ))),
                None => c
                    .execute(
                        "INSERT INTO price_versions (version, fingerprint, first_used_ms) VALUES (?1, ?2, ?3)",
                        params![version, fingerprint, crate::utc::now_ms()],
                    )
                    .map(|_| ())
                    .map_err(err("price versions")),
            }
        })
    }

    /// Opens an existing ledger read-only (the admin API's and the CLI's connection).
    pub fn open_reader(path: &Path) -> Result<Self, LedgerError> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| LedgerError(format!("cannot open the ledger {}: {e}", path.display())))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err("busy timeout"))?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        let conn = self
            .conn
            .lock()
            .map_err(|_| LedgerError("ledger connection poisoned".into()))?;
        f(&conn)
    }
}

/// A query's values as SQLite binds them.
fn bind(args: Vec<SqlValue>) -> Vec<rusqlite::types::Value> {
    use rusqlite::types::Value;
    args.into_iter()
        .map(|v| match v {
            SqlValue::Int(i) => Value::Integer(i),
            SqlValue::Text(t) => Value::Text(t),
        })
        .collect()
}

fn group_parts(
    conn: &Connection,
    q: &UsageQuery,
    rollup: bool,
) -> Result<Vec<(Vec<String>, String, UsageGroup)>, LedgerError> {
    let (sql, args, n) = grouped_sql(q, rollup);
    let mut stmt = conn.prepare(&sql).map_err(err("usage query"))?;
    let rows = stmt
        .query_map(params_from_iter(bind(args)), |r| {
            let mut values = Vec::with_capacity(n);
            for i in 0..n {
                values.push(r.get::<_, String>(i)?);
            }
            let model: String = r.get(n)?;
            let sum = |i: usize| r.get::<_, Option<i64>>(n + i).map(|v| uint(v.unwrap_or(0)));
            let part = UsageGroup {
                requests: sum(1)?,
                refused: sum(2)?,
                prompt_tokens: sum(3)?,
                cached_tokens: sum(4)?,
                completion_tokens: sum(5)?,
                cost_nanousd: sum(6)?,
                ..UsageGroup::default()
            };
            Ok((values, model, part))
        })
        .map_err(err("usage query"))?;
    let parts: Vec<_> = rows.collect::<Result<_, _>>().map_err(err("usage row"))?;
    if parts.len() > MAX_GROUPS {
        return Err(too_many_groups());
    }
    Ok(parts)
}

/// Binds `r` as the row starting after parameter `base` (1-based parameters: `base + 1`...).
fn bind_row(
    stmt: &mut Statement<'_>,
    base: usize,
    r: &UsageRow,
    day: &str,
) -> rusqlite::Result<()> {
    stmt.raw_bind_parameter(base + 1, &r.request_id)?;
    stmt.raw_bind_parameter(base + 2, r.start_ms)?;
    stmt.raw_bind_parameter(base + 3, r.end_ms)?;
    stmt.raw_bind_parameter(base + 4, day)?;
    stmt.raw_bind_parameter(base + 5, &r.tenant)?;
    stmt.raw_bind_parameter(base + 6, &r.key_id)?;
    stmt.raw_bind_parameter(base + 7, &r.model)?;
    stmt.raw_bind_parameter(base + 8, &r.version)?;
    stmt.raw_bind_parameter(base + 9, &r.pool)?;
    stmt.raw_bind_parameter(base + 10, &r.worker)?;
    stmt.raw_bind_parameter(base + 11, r.status)?;
    stmt.raw_bind_parameter(base + 12, &r.reason)?;
    stmt.raw_bind_parameter(base + 13, int(r.prompt_tokens))?;
    stmt.raw_bind_parameter(base + 14, int(r.cached_tokens))?;
    stmt.raw_bind_parameter(base + 15, int(r.completion_tokens))?;
    stmt.raw_bind_parameter(base + 16, int(r.cost_nanousd))?;
    stmt.raw_bind_parameter(base + 17, r.price_version)?;
    stmt.raw_bind_parameter(base + 18, r.queue_ms.map(int))?;
    stmt.raw_bind_parameter(base + 19, r.ttft_ms.map(int))?;
    stmt.raw_bind_parameter(base + 20, int(r.total_ms))
}

/// The UTC day of the rows being written, formatted once per day rather than once per row
/// (a batch almost always holds one day, two around midnight).
#[derive(Default)]
struct DayName {
    day: Option<i64>,
    name: String,
}

impl DayName {
    /// `YYYY-MM-DD` of `end_ms`.
    fn of(&mut self, end_ms: i64) -> &str {
        let day = end_ms.div_euclid(crate::utc::DAY_MS);
        if self.day != Some(day) {
            self.day = Some(day);
            self.name = crate::utc::iso_date(end_ms);
        }
        &self.name
    }
}

/// Inserts `rows` in order through the one prepared statement.
fn insert_rows(tx: &rusqlite::Transaction<'_>, rows: &[UsageRow]) -> Result<(), LedgerError> {
    let mut day = DayName::default();
    let mut insert = tx
        .prepare_cached(INSERT_ROW)
        .map_err(err("prepare insert"))?;
    for r in rows {
        bind_row(&mut insert, 0, r, day.of(r.end_ms)).map_err(err("bind"))?;
        insert.raw_execute().map_err(err("insert"))?;
    }
    Ok(())
}

/// A batch's rollup deltas: per (day number, tenant, key, model), requests, refused, prompt,
/// cached, completion tokens and cost.
fn rollup(rows: &[UsageRow]) -> HashMap<(i64, &str, &str, &str), [u64; 6]> {
    let mut deltas: HashMap<(i64, &str, &str, &str), [u64; 6]> = HashMap::new();
    for r in rows {
        let day = r.end_ms.div_euclid(crate::utc::DAY_MS);
        let d = deltas
            .entry((day, &r.tenant, &r.key_id, &r.model))
            .or_default();
        let add = [
            1,
            u64::from(!r.reason.is_empty()),
            r.prompt_tokens,
            r.cached_tokens,
            r.completion_tokens,
            r.cost_nanousd,
        ];
        for (sum, v) in d.iter_mut().zip(add) {
            *sum = sum.saturating_add(v);
        }
    }
    deltas
}

impl LedgerStore for SqliteStore {
    fn write_batch(&mut self, rows: &[UsageRow]) -> Result<(), LedgerError> {
        let conn = self
            .conn
            .get_mut()
            .map_err(|_| LedgerError("ledger connection poisoned".into()))?;
        let tx = conn.transaction().map_err(err("begin"))?;
        insert_rows(&tx, rows)?;
        {
            // The rollup gets one upsert per (day, tenant, key, model) of the batch.
            let mut upsert = tx
                .prepare_cached(UPSERT_DAILY)
                .map_err(err("prepare upsert"))?;
            let mut name = DayName::default();
            for ((day, tenant, key, model), d) in rollup(rows) {
                let day = name.of(day * crate::utc::DAY_MS);
                upsert
                    .execute(params![
                        day,
                        tenant,
                        key,
                        model,
                        int(d[0]),
                        int(d[1]),
                        int(d[2]),
                        int(d[3]),
                        int(d[4]),
                        int(d[5]),
                    ])
                    .map_err(err("rollup upsert"))?;
            }
        }
        tx.commit().map_err(err("commit"))
    }

    fn prune(&mut self, before_ms: i64) -> Result<u64, LedgerError> {
        let conn = self
            .conn
            .get_mut()
            .map_err(|_| LedgerError("ledger connection poisoned".into()))?;
        let n = conn
            .execute("DELETE FROM usage WHERE end_ms < ?1", [before_ms])
            .map_err(err("retention"))?;
        Ok(n as u64)
    }
}

impl LedgerReader for SqliteStore {
    fn usage(&self, q: &UsageQuery) -> Result<UsagePage, LedgerError> {
        self.with(|c| Ok(UsagePage::assemble(q, group_parts(c, q, false)?)))
    }

    fn daily(&self, q: &UsageQuery) -> Result<UsagePage, LedgerError> {
        let mut rollup_q = q.clone();
        rollup_q.group_by.retain(|d| d.in_rollup());
        self.with(|c| {
            Ok(UsagePage::assemble(
                &rollup_q,
                group_parts(c, &rollup_q, true)?,
            ))
        })
    }

    fn rows(&self, q: &UsageQuery) -> Result<Vec<UsageRow>, LedgerError> {
        self.with(|c| {
            let (sql, args) = rows_sql(q);
            let mut stmt = c.prepare(&sql).map_err(err("rows query"))?;
            let rows = stmt
                .query_map(params_from_iter(bind(args)), |r| {
                    // Column 3 is the row's day (derived from end_ms).
                    Ok(UsageRow {
                        request_id: r.get(0)?,
                        start_ms: r.get(1)?,
                        end_ms: r.get(2)?,
                        tenant: r.get(4)?,
                        key_id: r.get(5)?,
                        model: r.get(6)?,
                        version: r.get(7)?,
                        pool: r.get(8)?,
                        worker: r.get(9)?,
                        status: r.get(10)?,
                        reason: r.get(11)?,
                        prompt_tokens: uint(r.get(12)?),
                        cached_tokens: uint(r.get(13)?),
                        completion_tokens: uint(r.get(14)?),
                        cost_nanousd: uint(r.get(15)?),
                        price_version: r.get(16)?,
                        queue_ms: r.get::<_, Option<i64>>(17)?.map(uint),
                        ttft_ms: r.get::<_, Option<i64>>(18)?.map(uint),
                        total_ms: uint(r.get(19)?),
                    })
                })
                .map_err(err("rows query"))?;
            rows.collect::<Result<_, _>>().map_err(err("row"))
        })
    }

    fn spend_since(&self, since_ms: i64) -> Result<Vec<(String, u64)>, LedgerError> {
        self.with(|c| {
            let mut stmt = c
                .prepare("SELECT tenant, SUM(cost_nanousd) FROM usage_daily WHERE day >= ?1 GROUP BY tenant")
                .map_err(err("spend query"))?;
            // The rollup outlives the rows' retention, and budget periods start on UTC days.
            let day = crate::utc::iso_date(since_ms);
            let rows = stmt
                .query_map([day], |r| Ok((r.get::<_, String>(0)?, uint(r.get(1)?))))
                .map_err(err("spend query"))?;
            rows.collect::<Result<_, _>>().map_err(err("spend row"))
        })
    }
}
