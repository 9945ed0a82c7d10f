//! Questions asked of the ledger (a window, filters, the dimensions to group by, a page) and
//! their answers, with the CSV form. Parsing the admin API's query string lives here too, so the
//! CLI and the API accept the same words.

use std::collections::BTreeMap;

use crate::pricing::{Prices, format_usd};

/// Largest page of groups or rows.
pub const MAX_LIMIT: usize = 10_000;
/// Page size when none is asked for.
pub const DEFAULT_LIMIT: usize = 100;

/// What usage can be grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dimension {
    /// UTC day of the end of the request.
    Day,
    /// Tenant.
    Tenant,
    /// The client's model.
    Model,
    /// API key id.
    Key,
    /// Canary version.
    Version,
    /// Refusal (or cut-short) reason; empty for complete answers.
    Reason,
}

impl Dimension {
    /// Every dimension, in the order results list them.
    pub const ALL: [Dimension; 6] = [
        Self::Day,
        Self::Tenant,
        Self::Model,
        Self::Key,
        Self::Version,
        Self::Reason,
    ];

    /// The word in `group_by` (and the JSON key of the group).
    pub fn name(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Tenant => "tenant",
            Self::Model => "model",
            Self::Key => "key",
            Self::Version => "version",
            Self::Reason => "reason",
        }
    }

    /// The ledger column.
    pub fn column(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Tenant => "tenant",
            Self::Model => "model",
            Self::Key => "key_id",
            Self::Version => "version",
            Self::Reason => "reason",
        }
    }

    /// Whether the daily rollup holds it.
    pub fn in_rollup(self) -> bool {
        matches!(self, Self::Day | Self::Tenant | Self::Model | Self::Key)
    }

    fn parse(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == word)
    }
}

/// Which requests to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outcome {
    /// All.
    #[default]
    Any,
    /// Only refused or cut-short ones (non-empty reason).
    Refused,
}

/// A window, filters, dimensions and a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageQuery {
    /// Rows that ended at or after this, Unix ms.
    pub from_ms: i64,
    /// Rows that ended before this, Unix ms.
    pub to_ms: i64,
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only this model.
    pub model: Option<String>,
    /// Only this key id.
    pub key: Option<String>,
    /// Only refused ones.
    pub outcome: Outcome,
    /// Group by these, in [`Dimension::ALL`] order; empty means raw rows.
    pub group_by: Vec<Dimension>,
    /// Page size.
    pub limit: usize,
    /// Groups (or rows) skipped.
    pub offset: usize,
}

impl UsageQuery {
    /// The last `days` days up to `now_ms`, grouped by day.
    pub fn recent(now_ms: i64, days: i64) -> Self {
        Self {
            from_ms: crate::utc::day_start(now_ms) - (days - 1) * crate::utc::DAY_MS,
            to_ms: now_ms + 1,
            tenant: None,
            model: None,
            key: None,
            outcome: Outcome::Any,
            group_by: vec![Dimension::Day],
            limit: DEFAULT_LIMIT,
            offset: 0,
        }
    }

    /// Parses `from`, `to` (`YYYY-MM-DD`, ISO time or Unix ms; `to` as a date includes that
    /// day), `tenant`, `model`, `key`, `outcome=refused`, `group_by` (comma-separated), `limit`,
    /// `offset`. Default window: the last 30 days; default grouping `default_group`.
    pub fn from_params(
        params: &[(String, String)],
        now_ms: i64,
        default_group: &[Dimension],
    ) -> Result<Self, String> {
        let mut q = Self::recent(now_ms, 30);
        q.group_by = default_group.to_vec();
        for (name, value) in params {
            let value = value.trim();
            match name.as_str() {
                "from" => q.from_ms = time(value, false)?,
                "to" => q.to_ms = time(value, true)?,
                "tenant" if !value.is_empty() => q.tenant = Some(value.to_string()),
                "model" if !value.is_empty() => q.model = Some(value.to_string()),
                "key" if !value.is_empty() => q.key = Some(value.to_string()),
                "tenant" | "model" | "key" => {}
                "outcome" => {
                    q.outcome = match value {
                        "refused" => Outcome::Refused,
                        "" | "any" => Outcome::Any,
                        other => return Err(format!("outcome `{other}`: use `refused` or `any`")),
                    }
                }
                "group_by" | "by" => q.group_by = dimensions(value)?,
                "limit" => {
                    q.limit = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| format!("limit must be 1..={MAX_LIMIT}"))?;
                }
                "offset" => {
                    q.offset = value
                        .parse()
                        .map_err(|_| "offset must be a whole number".to_string())?;
                }
                other => return Err(format!("unknown parameter `{other}`")),
            }
        }
        if q.to_ms <= q.from_ms {
            return Err("`to` must be after `from`".into());
        }
        Ok(q)
    }
}

/// `day,tenant` → dimensions in canonical order; `none` or empty → none.
pub fn dimensions(text: &str) -> Result<Vec<Dimension>, String> {
    let mut out = Vec::new();
    for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        if word == "none" {
            continue;
        }
        let d = Dimension::parse(word).ok_or_else(|| {
            format!("group_by `{word}`: use day, tenant, model, key, version or reason")
        })?;
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out.sort();
    Ok(out)
}

fn time(value: &str, end: bool) -> Result<i64, String> {
    let ms = crate::utc::parse_time(value).ok_or_else(|| {
        format!("time `{value}`: use YYYY-MM-DD, YYYY-MM-DDTHH:MM:SSZ or Unix ms")
    })?;
    // A bare date as the end of a window includes that whole day.
    let date_only = value.len() == 10 && value.as_bytes().get(4) == Some(&b'-');
    Ok(if end && date_only {
        ms + crate::utc::DAY_MS
    } else {
        ms
    })
}

/// One group of requests.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct UsageGroup {
    /// Dimension name → value.
    pub group: BTreeMap<&'static str, String>,
    /// Requests.
    pub requests: u64,
    /// Of which refused or cut short.
    pub refused: u64,
    /// Prompt tokens (cached included).
    pub prompt_tokens: u64,
    /// Cached prompt tokens.
    pub cached_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Cost, nano-USD.
    pub cost_nanousd: u64,
    /// Cost as a USD decimal.
    pub cost_usd: String,
    /// What prefix caching saved at the current prices, nano-USD.
    pub saved_nanousd: u64,
    /// Cached tokens per model (to price the saving).
    #[serde(skip)]
    pub cached_by_model: Vec<(String, u64)>,
}

impl UsageGroup {
    /// Adds one (dimension values, model) aggregate.
    pub fn add(&mut self, model: &str, part: &UsageGroup) {
        self.requests += part.requests;
        self.refused += part.refused;
        self.prompt_tokens += part.prompt_tokens;
        self.cached_tokens += part.cached_tokens;
        self.completion_tokens += part.completion_tokens;
        self.cost_nanousd += part.cost_nanousd;
        self.cost_usd = format_usd(self.cost_nanousd);
        if part.cached_tokens > 0 {
            self.cached_by_model
                .push((model.to_string(), part.cached_tokens));
        }
    }
}

/// One page of an answer.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct UsagePage {
    /// Window start, ISO time.
    pub from: String,
    /// Window end (exclusive), ISO time.
    pub to: String,
    /// Dimensions grouped by.
    pub group_by: Vec<&'static str>,
    /// The groups of this page.
    pub groups: Vec<UsageGroup>,
    /// Sum over every group of the window (not only this page).
    pub totals: UsageGroup,
    /// Groups in the whole answer.
    pub total_groups: usize,
    /// Offset of the next page; `None` on the last.
    pub next_offset: Option<usize>,
}

impl UsagePage {
    /// Builds a page from (group values, model, aggregate) parts: merges per group, sorts (by
    /// day then cost when grouped by day, else by cost), and cuts `q`'s page.
    pub fn assemble(q: &UsageQuery, parts: Vec<(Vec<String>, String, UsageGroup)>) -> Self {
        let mut merged: BTreeMap<Vec<String>, UsageGroup> = BTreeMap::new();
        let mut totals = UsageGroup::default();
        for (values, model, part) in parts {
            totals.add(&model, &part);
            let g = merged.entry(values.clone()).or_insert_with(|| UsageGroup {
                group: q.group_by.iter().map(|d| d.name()).zip(values).collect(),
                ..UsageGroup::default()
            });
            g.add(&model, &part);
        }
        let mut groups: Vec<UsageGroup> = merged.into_values().collect();
        if q.group_by.first() != Some(&Dimension::Day) {
            groups.sort_by_key(|g| std::cmp::Reverse(g.cost_nanousd));
        }
        let total_groups = groups.len();
        let page: Vec<UsageGroup> = groups.into_iter().skip(q.offset).take(q.limit).collect();
        let next = q.offset + page.len();
        Self {
            from: crate::utc::iso_time(q.from_ms),
            to: crate::utc::iso_time(q.to_ms),
            group_by: q.group_by.iter().map(|d| d.name()).collect(),
            groups: page,
            totals,
            total_groups,
            next_offset: (next < total_groups).then_some(next),
        }
    }

    /// Fills in what caching saved, at `prices`.
    pub fn price_savings(&mut self, prices: &Prices) {
        let saving = |g: &mut UsageGroup| {
            g.saved_nanousd = g
                .cached_by_model
                .iter()
                .filter_map(|(m, n)| prices.price_of(m, m).map(|p| p.cache_saving(*n)))
                .sum();
        };
        self.groups.iter_mut().for_each(saving);
        saving(&mut self.totals);
    }
}

/// The page as CSV: one line per group (dimensions first), or nothing but the header.
pub fn render_csv(page: &UsagePage) -> String {
    let mut out = String::new();
    for d in &page.group_by {
        out.push_str(d);
        out.push(',');
    }
    out.push_str(
        "requests,refused,prompt_tokens,cached_tokens,completion_tokens,cost_usd,saved_usd\n",
    );
    for g in &page.groups {
        for d in &page.group_by {
            out.push_str(&csv_field(g.group.get(d).map_or("", String::as_str)));
            out.push(',');
        }
        out.push_str(&format!(
            "{},{},{},{},{},{},{}\n",
            g.requests,
            g.refused,
            g.prompt_tokens,
            g.cached_tokens,
            g.completion_tokens,
            format_usd(g.cost_nanousd),
            format_usd(g.saved_nanousd)
        ));
    }
    out
}

/// The CSV header of raw rows.
pub const ROWS_CSV_HEADER: &str = "request_id,start,end,tenant,key_id,model,version,pool,worker,status,reason,prompt_tokens,cached_tokens,completion_tokens,cost_usd,price_version,queue_ms,ttft_ms,total_ms\n";

/// Raw rows as CSV.
pub fn render_rows_csv(rows: &[super::UsageRow]) -> String {
    let mut out = String::from(ROWS_CSV_HEADER);
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
    for r in rows {
        let fields = [
            csv_field(&r.request_id),
            crate::utc::iso_time(r.start_ms),
            crate::utc::iso_time(r.end_ms),
            csv_field(&r.tenant),
            csv_field(&r.key_id),
            csv_field(&r.model),
            csv_field(&r.version),
            csv_field(&r.pool),
            csv_field(&r.worker),
            r.status.to_string(),
            csv_field(&r.reason),
            r.prompt_tokens.to_string(),
            r.cached_tokens.to_string(),
            r.completion_tokens.to_string(),
            format_usd(r.cost_nanousd),
            r.price_version.to_string(),
            opt(r.queue_ms),
            opt(r.ttft_ms),
            r.total_ms.to_string(),
        ];
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

/// A CSV field, quoted when it holds a comma, quote or line break; a leading `=`, `+`, `-` or
/// `@` is prefixed with `'` so spreadsheets do not run it as a formula.
fn csv_field(v: &str) -> String {
    let v = if v.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{v}")
    } else {
        v.to_string()
    };
    if v.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v
    }
}

/// A parameter of a ledger query, bound by each backend in its own types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlValue {
    /// An integer (times in Unix ms).
    Int(i64),
    /// Text (names, days).
    Text(String),
}

/// The `WHERE` clause of `q`'s window and filters with `$1`, `$2`... placeholders (both
/// PostgreSQL and SQLite read them), and its values in order. On the rollup the window is whole
/// UTC days: a window ending mid-day still includes that day's row.
pub fn where_clause(q: &UsageQuery, rollup: bool) -> (String, Vec<SqlValue>) {
    let mut sql = String::new();
    let mut args = Vec::new();
    if rollup {
        sql.push_str(" WHERE day >= $1 AND day < $2");
        args.push(SqlValue::Text(crate::utc::iso_date(q.from_ms)));
        args.push(SqlValue::Text(crate::utc::iso_date(
            q.to_ms - 1 + crate::utc::DAY_MS,
        )));
    } else {
        sql.push_str(" WHERE end_ms >= $1 AND end_ms < $2");
        args.push(SqlValue::Int(q.from_ms));
        args.push(SqlValue::Int(q.to_ms));
    }
    for (column, value) in [
        ("tenant", &q.tenant),
        ("model", &q.model),
        ("key_id", &q.key),
    ] {
        if let Some(v) = value {
            args.push(SqlValue::Text(v.clone()));
            sql.push_str(&format!(" AND {column} = ${}", args.len()));
        }
    }
    if q.outcome == Outcome::Refused {
        sql.push_str(if rollup {
            " AND refused > 0"
        } else {
            " AND reason <> ''"
        });
    }
    (sql, args)
}

/// Groups more than this in one answer are refused (narrow the window or the grouping).
pub const MAX_GROUPS: usize = 200_000;

/// The grouped query of `q` (on the rows, or the rollup), portable SQL: its text, values, and
/// how many dimension columns lead each result row (then `model`, then six sums as BIGINT:
/// requests, refused, prompt, cached, completion, cost).
pub fn grouped_sql(q: &UsageQuery, rollup: bool) -> (String, Vec<SqlValue>, usize) {
    let dims: Vec<Dimension> = q
        .group_by
        .iter()
        .copied()
        .filter(|d| !rollup || d.in_rollup())
        .collect();
    let mut select: Vec<&str> = dims.iter().map(|d| d.column()).collect();
    select.push("model");
    let cols = select.join(", ");
    let (table, sums): (&str, [&str; 6]) = if rollup {
        (
            "usage_daily",
            [
                "requests",
                "refused",
                "prompt_tokens",
                "cached_tokens",
                "completion_tokens",
                "cost_nanousd",
            ],
        )
    } else {
        (
            "usage",
            [
                "1",
                "CASE WHEN reason <> '' THEN 1 ELSE 0 END",
                "prompt_tokens",
                "cached_tokens",
                "completion_tokens",
                "cost_nanousd",
            ],
        )
    };
    let sums: Vec<String> = sums
        .iter()
        .map(|e| format!("CAST(SUM({e}) AS BIGINT)"))
        .collect();
    let (where_sql, args) = where_clause(q, rollup);
    let sql = format!(
        "SELECT {cols}, {} FROM {table}{where_sql} GROUP BY {cols} LIMIT {}",
        sums.join(", "),
        MAX_GROUPS + 1
    );
    (sql, args, dims.len())
}

/// The rows query of `q`: every column in [`super::UsageRow`] order, oldest first, one page.
pub fn rows_sql(q: &UsageQuery) -> (String, Vec<SqlValue>) {
    let (where_sql, args) = where_clause(q, false);
    let sql = format!(
        "SELECT {ROW_COLUMNS} FROM usage{where_sql} ORDER BY end_ms, id LIMIT {} OFFSET {}",
        q.limit, q.offset
    );
    (sql, args)
}

/// The columns of a row, in the order both backends insert and read them.
pub const ROW_COLUMNS: &str = "request_id, start_ms, end_ms, day, tenant, key_id, model, version, pool, worker, status, reason, prompt_tokens, cached_tokens, completion_tokens, cost_nanousd, price_version, queue_ms, ttft_ms, total_ms";

/// The error for an answer with more than [`MAX_GROUPS`] groups.
pub fn too_many_groups() -> super::LedgerError {
    super::LedgerError(format!(
        "more than {MAX_GROUPS} groups: narrow the window, add a filter or group by less"
    ))
}
