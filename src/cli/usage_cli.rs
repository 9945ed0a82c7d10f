//! `infergate usage`: the usage ledger as a table (or CSV) on the terminal, read from the ledger
//! file the config names (or the one `infergate up` keeps in its cache directory).

use std::path::PathBuf;

use clap::Args;

use infergate::ledger::{
    LedgerBackend, LedgerConfig, UsageLedger, UsagePage, UsageQuery, render_csv,
};
use infergate::pricing::format_usd;

/// `infergate usage` arguments.
#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Config whose `ledger.path` to read (and whose prices value the cache savings); without
    /// it, or when it has no `ledger:`, the ledger `infergate up` keeps in its cache directory.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Read this ledger file instead.
    #[arg(long)]
    pub ledger: Option<PathBuf>,
    /// Window start: YYYY-MM-DD, YYYY-MM-DDTHH:MM:SSZ or Unix ms (default: 30 days ago).
    #[arg(long)]
    pub from: Option<String>,
    /// Window end; a date includes that day (default: now).
    #[arg(long)]
    pub to: Option<String>,
    /// Only this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only this model.
    #[arg(long)]
    pub model: Option<String>,
    /// Group by: day, tenant, model, key, version, reason (comma-separated).
    #[arg(long, default_value = "day")]
    pub by: String,
    /// Print CSV instead of a table.
    #[arg(long)]
    pub csv: bool,
    /// Most groups printed.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
}

/// Runs `infergate usage`; the text to print, or why not.
pub fn run(args: &UsageArgs) -> Result<String, String> {
    let snapshot = match &args.config {
        Some(path) => Some(
            infergate::config::load(path).map_err(|e| format!("invalid configuration:\n{e}"))?,
        ),
        None => None,
    };
    let backend = match (&args.ledger, snapshot.as_ref().map(|s| &s.ledger)) {
        (Some(p), _) => LedgerBackend::Sqlite(p.clone()),
        (None, Some(LedgerConfig::On(s))) => s.backend.clone(),
        (None, Some(LedgerConfig::Off)) => {
            return Err("the config turns the ledger off (`ledger: {enabled: false}`)".into());
        }
        (None, _) => LedgerBackend::Sqlite(
            infergate_engine::model::default_model::cache_root().join("ledger.sqlite"),
        ),
    };
    if let LedgerBackend::Sqlite(path) = &backend
        && !path.is_file()
    {
        return Err(format!("no usage ledger at {}", path.display()));
    }
    let mut params: Vec<(String, String)> = vec![
        ("group_by".into(), args.by.clone()),
        ("limit".into(), args.limit.to_string()),
    ];
    for (name, value) in [
        ("from", &args.from),
        ("to", &args.to),
        ("tenant", &args.tenant),
        ("model", &args.model),
    ] {
        if let Some(v) = value {
            params.push((name.into(), v.clone()));
        }
    }
    let q = UsageQuery::from_params(&params, infergate::utc::now_ms(), &[])?;
    let mut page = UsageLedger::reader_of(&backend)
        .and_then(|r| r.usage(&q))
        .map_err(|e| format!("usage ledger {}: {e}", backend.describe()))?;
    if let Some(s) = &snapshot {
        page.price_savings(&s.prices);
    }
    Ok(if args.csv {
        render_csv(&page)
    } else {
        table(&page)
    })
}

/// The page as an aligned text table with a total line.
fn table(page: &UsagePage) -> String {
    let mut header: Vec<String> = page.group_by.iter().map(|d| d.to_string()).collect();
    header.extend(
        [
            "requests",
            "refused",
            "prompt",
            "cached",
            "completion",
            "cost_usd",
            "saved_usd",
        ]
        .map(String::from),
    );
    let line = |g: &infergate::ledger::UsageGroup, label: Option<&str>| -> Vec<String> {
        let mut cells: Vec<String> = page
            .group_by
            .iter()
            .enumerate()
            .map(|(i, d)| match label {
                Some(l) if i == 0 => l.to_string(),
                Some(_) => String::new(),
                None => g.group.get(d).cloned().unwrap_or_default(),
            })
            .collect();
        cells.extend([
            g.requests.to_string(),
            g.refused.to_string(),
            g.prompt_tokens.to_string(),
            g.cached_tokens.to_string(),
            g.completion_tokens.to_string(),
            format_usd(g.cost_nanousd),
            format_usd(g.saved_nanousd),
        ]);
        cells
    };
    let mut rows: Vec<Vec<String>> = vec![header];
    rows.extend(page.groups.iter().map(|g| line(g, None)));
    rows.push(line(&page.totals, Some("total")));
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = format!("usage from {} to {}\n", page.from, page.to);
    for r in &rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, w))| {
                // Names left, numbers right.
                if i < page.group_by.len() {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    if page.next_offset.is_some() {
        out.push_str(&format!(
            "({} of {} groups shown; raise --limit)\n",
            page.groups.len(),
            page.total_groups
        ));
    }
    out
}
