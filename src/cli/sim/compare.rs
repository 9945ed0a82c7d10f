//! `--compare-policies`: the headline numbers of several runs of the same workload, one column
//! per routing policy, so the effect of the policy reads across a row.

use std::fmt::Write;

use super::SimResult;
use crate::report::Report;

/// How a row of the comparison is shown.
#[derive(Clone, Copy)]
enum Unit {
    /// A whole number.
    Count,
    /// Seconds shown as milliseconds.
    Millis,
    /// A share shown as a percentage.
    Percent,
    /// A rate with one decimal.
    Rate,
}

/// A number of the simulator's `extra`, 0 when absent.
fn extra(r: &Report, key: &str) -> f64 {
    r.extra.get(key).copied().unwrap_or(0.0)
}

/// A row of the comparison: label, value, unit.
type Row = (&'static str, fn(&Report) -> f64, Unit);

/// The rows of the comparison, in order.
const ROWS: [Row; 14] = [
    ("requests", |r| r.requests as f64, Unit::Count),
    ("ok", |r| r.ok as f64, Unit::Count),
    ("429", |r| r.rate_limited as f64, Unit::Count),
    ("TTFT p50 (ms)", |r| r.ttft.p50, Unit::Millis),
    ("TTFT p99 (ms)", |r| r.ttft.p99, Unit::Millis),
    ("ITL p99 (ms)", |r| r.itl.p99, Unit::Millis),
    ("ITL max (ms)", |r| r.itl.max, Unit::Millis),
    ("E2E p99 (ms)", |r| r.e2e.p99, Unit::Millis),
    ("tokens/s out", |r| r.tokens_out_per_s, Unit::Rate),
    ("goodput", |r| r.goodput, Unit::Percent),
    (
        "prefix cache hit rate",
        |r| extra(r, "prefix_cache_hit_rate"),
        Unit::Percent,
    ),
    (
        "KV usage mean",
        |r| extra(r, "kv_usage_mean"),
        Unit::Percent,
    ),
    ("preemptions", |r| extra(r, "preemptions"), Unit::Count),
    (
        "graph-path steps",
        |r| extra(r, "steps_graph_share"),
        Unit::Percent,
    ),
];

/// The headline numbers of each policy's report in one table, a column per policy.
pub(super) fn compare_table(runs: &[(&str, SimResult)]) -> String {
    let mut cells: Vec<Vec<String>> = vec![
        std::iter::once("policy".to_owned())
            .chain(runs.iter().map(|(n, _)| (*n).to_owned()))
            .collect(),
    ];
    for (label, get, unit) in ROWS {
        let mut row = vec![label.to_owned()];
        for (_, run) in runs {
            let v = get(&run.report);
            row.push(match unit {
                Unit::Count => format!("{v:.0}"),
                Unit::Millis => format!("{:.1}", v * 1e3),
                Unit::Percent => format!("{:.1}%", v * 1e2),
                Unit::Rate => format!("{v:.1}"),
            });
        }
        cells.push(row);
    }
    let mut row = vec!["wall time (s)".to_owned()];
    row.extend(runs.iter().map(|(_, r)| format!("{:.2}", r.wall_seconds)));
    cells.push(row);
    let mut out = String::new();
    if let Some((_, first)) = runs.first() {
        let title = first
            .report
            .title
            .split(" · policy")
            .next()
            .unwrap_or_default();
        let _ = writeln!(out, "{title} · policies side by side\n");
    }
    out.push_str(&layout(&cells));
    out
}

/// Aligns cells: the first column left, the others right, two spaces apart.
fn layout(cells: &[Vec<String>]) -> String {
    let cols = cells.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            cells
                .iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in cells {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let w = widths[c];
            let _ = if c == 0 {
                write!(line, "{cell:<w$}")
            } else {
                write!(line, "  {cell:>w$}")
            };
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
