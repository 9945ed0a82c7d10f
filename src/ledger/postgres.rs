//! The fleet's ledger: one PostgreSQL database that every gateway replica writes its own
//! batches into (`ledger: {postgres: {url}}`). Each batch is one transaction: a multi-row insert
//! of the rows and one upsert of the batch's per-(day, tenant, key, model) deltas into the daily
//! rollup. Tables are created (migrated) at start. The writer keeps one connection and
//! reconnects after a failure; a batch that fails is lost and counted (`failed`), so a
//! PostgreSQL restart costs at most the flush it interrupted and the ones while it was down.
//!
//! tokio-postgres is async and the ledger's writer and readers are plain threads, so each runs
//! its calls on a small runtime of its own (readers on a scoped thread, so they may be called
//! from inside the gateway's runtime).

use std::collections::HashMap;
use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls};

use super::query::{
    MAX_GROUPS, ROW_COLUMNS, SqlValue, UsageGroup, UsagePage, UsageQuery, grouped_sql, rows_sql,
    too_many_groups,
};
use super::{LedgerError, LedgerReader, LedgerStore, UsageRow};

/// The schema this code writes.
const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS ledger_schema (version BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS usage (
    id BIGSERIAL PRIMARY KEY,
    request_id TEXT NOT NULL,
    start_ms BIGINT NOT NULL,
    end_ms BIGINT NOT NULL,
    day TEXT NOT NULL,
    tenant TEXT NOT NULL,
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    pool TEXT NOT NULL,
    worker TEXT NOT NULL,
    status INTEGER NOT NULL,
    reason TEXT NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    cached_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    cost_nanousd BIGINT NOT NULL,
    price_version BIGINT NOT NULL,
    queue_ms BIGINT,
    ttft_ms BIGINT,
    total_ms BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_tenant_time ON usage (tenant, end_ms);
CREATE INDEX IF NOT EXISTS usage_key_time ON usage (key_id, end_ms);
CREATE INDEX IF NOT EXISTS usage_time ON usage (end_ms);
CREATE TABLE IF NOT EXISTS usage_daily (
    day TEXT NOT NULL,
    tenant TEXT NOT NULL,
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,
    requests BIGINT NOT NULL,
    refused BIGINT NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    cached_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    cost_nanousd BIGINT NOT NULL,
    PRIMARY KEY (day, tenant, key_id, model)
);
CREATE TABLE IF NOT EXISTS price_versions (
    version BIGINT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    first_used_ms BIGINT NOT NULL
);
";

/// Rows per INSERT statement (20 parameters each, under PostgreSQL's 65,535).
const ROWS_PER_STATEMENT: usize = 1_000;
/// Longest a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn uint(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The error with the server's own message (tokio-postgres's Display says only "db error").
fn pg(context: &str) -> impl Fn(tokio_postgres::Error) -> LedgerError + '_ {
    move |e| match e.as_db_error() {
        Some(db) => LedgerError(format!(
            "{context}: {} (SQLSTATE {})",
            db.message(),
            db.code().code()
        )),
        None => LedgerError(format!("{context}: {e}")),
    }
}

/// Key of the advisory lock that serializes migrations of replicas starting together.
const MIGRATION_LOCK: i64 = 0x1f6a_7e00_1ed6;

fn runtime() -> Result<tokio::runtime::Runtime, LedgerError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| LedgerError(format!("cannot start the ledger's runtime: {e}")))
}

/// Connects; the connection's task runs on `rt` (it makes progress while `rt` runs a call).
async fn connect(url: &str) -> Result<Client, LedgerError> {
    let (client, conn) = tokio::time::timeout(CONNECT_TIMEOUT, tokio_postgres::connect(url, NoTls))
        .await
        .map_err(|_| LedgerError("connecting to PostgreSQL timed out".into()))?
        .map_err(pg("connecting to PostgreSQL"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "ledger PostgreSQL connection ended");
        }
    });
    Ok(client)
}

/// Runs `f` with a fresh connection on a fresh runtime, on a thread of its own (so callers
/// inside the gateway's runtime may call it).
fn with_connection<T: Send>(
    url: &str,
    f: impl for<'c> FnOnce(
        &'c Client,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<T, LedgerError>> + 'c>,
    > + Send,
) -> Result<T, LedgerError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = runtime()?;
            rt.block_on(async {
                let client = connect(url).await?;
                f(&client).await
            })
        })
        .join()
        .map_err(|_| LedgerError("ledger query thread panicked".into()))?
    })
}

/// The migrations: tables, indexes, the schema version.
pub fn migrate(url: &str) -> Result<(), LedgerError> {
    with_connection(url, |c| {
        Box::pin(async move {
            // One transaction holding an advisory lock: replicas starting at the same moment
            // migrate one after the other (concurrent CREATE ... IF NOT EXISTS can collide).
            c.batch_execute("BEGIN")
                .await
                .map_err(pg("begin migration"))?;
            c.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                .await
                .map_err(pg("migration lock"))?;
            c.batch_execute(SCHEMA)
                .await
                .map_err(pg("creating the schema"))?;
            let row = c
                .query_one("SELECT MAX(version) FROM ledger_schema", &[])
                .await
                .map_err(pg("reading the schema version"))?;
            match row.get::<_, Option<i64>>(0) {
                None => {
                    c.execute(
                        "INSERT INTO ledger_schema (version) VALUES ($1)",
                        &[&SCHEMA_VERSION],
                    )
                    .await
                    .map_err(pg("recording the schema version"))?;
                }
                Some(v) if v > SCHEMA_VERSION => {
                    return Err(LedgerError(format!(
                        "the PostgreSQL ledger has schema version {v}, newer than this build's {SCHEMA_VERSION}"
                    )));
                }
                Some(_) => {}
            }
            c.batch_execute("COMMIT")
                .await
                .map_err(pg("commit migration"))
        })
    })
}

/// Records which price table `version` names (see `SqliteStore::note_prices`).
pub fn note_prices(url: &str, version: u32, fingerprint: &str) -> Result<(), LedgerError> {
    let fingerprint = fingerprint.to_string();
    with_connection(url, move |c| {
        Box::pin(async move {
            let v = i64::from(version);
            let now = crate::utc::now_ms();
            c.execute(
                "INSERT INTO price_versions (version, fingerprint, first_used_ms) VALUES ($1, $2, $3) ON CONFLICT (version) DO NOTHING",
                &[&v, &fingerprint, &now],
            )
            .await
            .map_err(pg("price versions"))?;
            let row = c
                .query_one(
                    "SELECT fingerprint FROM price_versions WHERE version = $1",
                    &[&v],
                )
                .await
                .map_err(pg("price versions"))?;
            if row.get::<_, String>(0) == fingerprint {
                Ok(())
            } else {
                Err(LedgerError(format!(
                    "prices.yaml version {version} already priced requests with different prices: raise `version`"
                )))
            }
        })
    })
}

/// The writer's side: one connection kept across batches, on the writer thread's runtime.
pub struct PgWriter {
    url: String,
    rt: Option<tokio::runtime::Runtime>,
    client: Option<Client>,
}

impl PgWriter {
    /// A writer for `url` (connects on the first batch).
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_string(),
            rt: None,
            client: None,
        }
    }
}

impl LedgerStore for PgWriter {
    fn write_batch(&mut self, rows: &[UsageRow]) -> Result<(), LedgerError> {
        if self.rt.is_none() {
            self.rt = Some(runtime()?);
        }
        let Some(rt) = &self.rt else {
            return Err(LedgerError("no runtime".into()));
        };
        let url = self.url.clone();
        let client = self.client.take();
        let result = rt.block_on(async move {
            let mut client = match client {
                Some(c) if !c.is_closed() => c,
                _ => connect(&url).await?,
            };
            match write(&mut client, rows).await {
                Ok(()) => Ok(client),
                // A connection that died while idle (a PostgreSQL restart) fails at BEGIN,
                // before anything was sent: one fresh connection, one retry, no duplicate.
                Err(Failure::BeforeWrite(_)) => {
                    let mut fresh = connect(&url).await?;
                    write(&mut fresh, rows)
                        .await
                        .map(|()| fresh)
                        .map_err(Failure::into_error)
                }
                Err(f) => Err(f.into_error()),
            }
        });
        // A failed batch drops the connection: the next one reconnects.
        match result {
            Ok(c) => {
                self.client = Some(c);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn prune(&mut self, before_ms: i64) -> Result<u64, LedgerError> {
        let Some(rt) = &self.rt else {
            return Ok(0);
        };
        let Some(client) = &self.client else {
            return Ok(0);
        };
        rt.block_on(client.execute("DELETE FROM usage WHERE end_ms < $1", &[&before_ms]))
            .map_err(pg("retention"))
    }
}

/// How a batch failed.
enum Failure {
    /// Before any statement reached the server (safe to retry).
    BeforeWrite(LedgerError),
    /// After: the transaction may or may not have committed.
    During(LedgerError),
}

impl Failure {
    fn into_error(self) -> LedgerError {
        match self {
            Self::BeforeWrite(e) | Self::During(e) => e,
        }
    }
}

impl From<LedgerError> for Failure {
    fn from(e: LedgerError) -> Self {
        Self::During(e)
    }
}

/// One batch in one transaction: the rows, then the rollup deltas.
async fn write(client: &mut Client, rows: &[UsageRow]) -> Result<(), Failure> {
    let tx = client
        .transaction()
        .await
        .map_err(|e| Failure::BeforeWrite(pg("begin")(e)))?;
    let mut deltas: HashMap<(String, &str, &str, &str), [i64; 6]> = HashMap::new();
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let days: Vec<String> = chunk
            .iter()
            .map(|r| crate::utc::iso_date(r.end_ms))
            .collect();
        let nums: Vec<[i64; 6]> = chunk
            .iter()
            .map(|r| {
                [
                    int(r.prompt_tokens),
                    int(r.cached_tokens),
                    int(r.completion_tokens),
                    int(r.cost_nanousd),
                    i64::from(r.price_version),
                    int(r.total_ms),
                ]
            })
            .collect();
        let statuses: Vec<i32> = chunk.iter().map(|r| i32::from(r.status)).collect();
        let opt: Vec<(Option<i64>, Option<i64>)> = chunk
            .iter()
            .map(|r| (r.queue_ms.map(int), r.ttft_ms.map(int)))
            .collect();
        let mut sql = format!("INSERT INTO usage ({ROW_COLUMNS}) VALUES ");
        let texts: Vec<[&str; 8]> = chunk
            .iter()
            .map(|r| {
                [
                    r.request_id.as_str(),
                    r.tenant.as_str(),
                    r.key_id.as_str(),
                    r.model.as_str(),
                    r.version.as_str(),
                    r.pool.as_str(),
                    r.worker.as_str(),
                    r.reason.as_str(),
                ]
            })
            .collect();
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(chunk.len() * 20);
        for (i, r) in chunk.iter().enumerate() {
            if i > 0 {
                sql.push(',');
            }
            let base = i * 20;
            let marks: Vec<String> = (1..=20).map(|k| format!("${}", base + k)).collect();
            sql.push_str(&format!("({})", marks.join(",")));
            params.extend_from_slice(&[
                &texts[i][0],
                &r.start_ms,
                &r.end_ms,
                &days[i],
                &texts[i][1],
                &texts[i][2],
                &texts[i][3],
                &texts[i][4],
                &texts[i][5],
                &texts[i][6],
                &statuses[i],
                &texts[i][7],
                &nums[i][0],
                &nums[i][1],
                &nums[i][2],
                &nums[i][3],
                &nums[i][4],
                &opt[i].0,
                &opt[i].1,
                &nums[i][5],
            ]);
        }
        tx.execute(sql.as_str(), &params)
            .await
            .map_err(pg("insert"))?;
        for (i, r) in chunk.iter().enumerate() {
            let d = deltas
                .entry((days[i].clone(), &r.tenant, &r.key_id, &r.model))
                .or_default();
            let add = [
                1,
                i64::from(!r.reason.is_empty()),
                nums[i][0],
                nums[i][1],
                nums[i][2],
                nums[i][3],
            ];
            for (sum, v) in d.iter_mut().zip(add) {
                *sum = sum.saturating_add(v);
            }
        }
    }
    let entries: Vec<_> = deltas.into_iter().collect();
    for chunk in entries.chunks(ROWS_PER_STATEMENT) {
        let mut sql = String::from(
            "INSERT INTO usage_daily (day, tenant, key_id, model, requests, refused, prompt_tokens, cached_tokens, completion_tokens, cost_nanousd) VALUES ",
        );
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(chunk.len() * 10);
        for (i, ((day, tenant, key, model), d)) in chunk.iter().enumerate() {
            if i > 0 {
                sql.push(',');
            }
            let marks: Vec<String> = (1..=10).map(|k| format!("${}", i * 10 + k)).collect();
            sql.push_str(&format!("({})", marks.join(",")));
            params.extend_from_slice(&[
                day, tenant, key, model, &d[0], &d[1], &d[2], &d[3], &d[4], &d[5],
            ]);
        }
        sql.push_str(
            " ON CONFLICT (day, tenant, key_id, model) DO UPDATE SET requests = usage_daily.requests + EXCLUDED.requests, refused = usage_daily.refused + EXCLUDED.refused, prompt_tokens = usage_daily.prompt_tokens + EXCLUDED.prompt_tokens, cached_tokens = usage_daily.cached_tokens + EXCLUDED.cached_tokens, completion_tokens = usage_daily.completion_tokens + EXCLUDED.completion_tokens, cost_nanousd = usage_daily.cost_nanousd + EXCLUDED.cost_nanousd",
        );
        tx.execute(sql.as_str(), &params)
            .await
            .map_err(pg("rollup upsert"))?;
    }
    Ok(tx.commit().await.map_err(pg("commit"))?)
}

/// The readers' side: each call opens its own short connection.
pub struct PgReader {
    url: String,
}

impl PgReader {
    /// A reader of the ledger at `url`.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_string(),
        }
    }
}

impl SqlValue {
    fn as_sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Self::Int(v) => v,
            Self::Text(v) => v,
        }
    }
}

async fn group_parts(
    c: &Client,
    q: &UsageQuery,
    rollup: bool,
) -> Result<Vec<(Vec<String>, String, UsageGroup)>, LedgerError> {
    let (sql, args, n) = grouped_sql(q, rollup);
    let params: Vec<&(dyn ToSql + Sync)> = args.iter().map(SqlValue::as_sql).collect();
    let rows = c
        .query(sql.as_str(), &params)
        .await
        .map_err(pg("usage query"))?;
    if rows.len() > MAX_GROUPS {
        return Err(too_many_groups());
    }
    rows.iter()
        .map(|r| {
            let sum = |i: usize| -> Result<u64, LedgerError> {
                r.try_get::<_, Option<i64>>(n + i)
                    .map(|v| uint(v.unwrap_or(0)))
                    .map_err(pg("usage row"))
            };
            let mut values = Vec::with_capacity(n);
            for i in 0..n {
                values.push(r.try_get::<_, String>(i).map_err(pg("usage row"))?);
            }
            let model: String = r.try_get(n).map_err(pg("usage row"))?;
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
        .collect()
}

impl LedgerReader for PgReader {
    fn usage(&self, q: &UsageQuery) -> Result<UsagePage, LedgerError> {
        let q = q.clone();
        with_connection(&self.url, move |c| {
            Box::pin(async move { Ok(UsagePage::assemble(&q, group_parts(c, &q, false).await?)) })
        })
    }

    fn daily(&self, q: &UsageQuery) -> Result<UsagePage, LedgerError> {
        let mut q = q.clone();
        q.group_by.retain(|d| d.in_rollup());
        with_connection(&self.url, move |c| {
            Box::pin(async move { Ok(UsagePage::assemble(&q, group_parts(c, &q, true).await?)) })
        })
    }

    fn rows(&self, q: &UsageQuery) -> Result<Vec<UsageRow>, LedgerError> {
        let q = q.clone();
        with_connection(&self.url, move |c| {
            Box::pin(async move {
                let (sql, args) = rows_sql(&q);
                let params: Vec<&(dyn ToSql + Sync)> = args.iter().map(SqlValue::as_sql).collect();
                let rows = c
                    .query(sql.as_str(), &params)
                    .await
                    .map_err(pg("rows query"))?;
                rows.iter()
                    .map(|r| {
                        let e = pg("row");
                        Ok(UsageRow {
                            request_id: r.try_get(0).map_err(&e)?,
                            start_ms: r.try_get(1).map_err(&e)?,
                            end_ms: r.try_get(2).map_err(&e)?,
                            tenant: r.try_get(4).map_err(&e)?,
                            key_id: r.try_get(5).map_err(&e)?,
                            model: r.try_get(6).map_err(&e)?,
                            version: r.try_get(7).map_err(&e)?,
                            pool: r.try_get(8).map_err(&e)?,
                            worker: r.try_get(9).map_err(&e)?,
                            status: u16::try_from(r.try_get::<_, i32>(10).map_err(&e)?)
                                .unwrap_or(0),
                            reason: r.try_get(11).map_err(&e)?,
                            prompt_tokens: uint(r.try_get(12).map_err(&e)?),
                            cached_tokens: uint(r.try_get(13).map_err(&e)?),
                            completion_tokens: uint(r.try_get(14).map_err(&e)?),
                            cost_nanousd: uint(r.try_get(15).map_err(&e)?),
                            price_version: u32::try_from(r.try_get::<_, i64>(16).map_err(&e)?)
                                .unwrap_or(0),
                            queue_ms: r.try_get::<_, Option<i64>>(17).map_err(&e)?.map(uint),
                            ttft_ms: r.try_get::<_, Option<i64>>(18).map_err(&e)?.map(uint),
                            total_ms: uint(r.try_get(19).map_err(&e)?),
                        })
                    })
                    .collect()
            })
        })
    }

    fn spend_since(&self, since_ms: i64) -> Result<Vec<(String, u64)>, LedgerError> {
        let day = crate::utc::iso_date(since_ms);
        with_connection(&self.url, move |c| {
            Box::pin(async move {
                let rows = c
                    .query(
                        "SELECT tenant, SUM(cost_nanousd)::BIGINT FROM usage_daily WHERE day >= $1 GROUP BY tenant",
                        &[&day],
                    )
                    .await
                    .map_err(pg("spend query"))?;
                rows.iter()
                    .map(|r| {
                        let tenant: String = r.try_get(0).map_err(pg("spend row"))?;
                        let spent: Option<i64> = r.try_get(1).map_err(pg("spend row"))?;
                        Ok((tenant, uint(spent.unwrap_or(0))))
                    })
                    .collect()
            })
        })
    }
}
