//! The report as text: an overview, the latency table (TTFT, ITL and e2e by percentile, with the
//! ITL tail beside TPOT mean), one table per breakdown, and the classes by path with the common
//! class's victims split.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::{Breakdown, ClassBreakdown, EngineBreakdown, Percentiles, Report, Victims};

/// Milliseconds with one decimal.
pub(super) fn ms(seconds: f64) -> String {
    format!("{:.1}", seconds * 1000.0)
}

/// A percentage with one decimal.
pub(super) fn pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// Lays out rows under a header: the first column left-aligned, the others right-aligned, each
/// as wide as its widest cell, two spaces apart.
pub(super) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let head: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&head).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            if i == 0 {
                let _ = write!(line, "{cell:<w$}");
            } else {
                let _ = write!(line, "  {cell:>w$}");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn latency_row(name: &str, p: &Percentiles) -> Vec<String> {
    let cells = [p.p50, p.p90, p.p95, p.p99, p.max, p.mean];
    std::iter::once(name.to_owned())
        .chain(cells.iter().map(|&v| ms(v)))
        .collect()
}

fn breakdown_table(title: &str, slices: &BTreeMap<String, Breakdown>) -> String {
    let header = [
        title, "requests", "ok", "TTFT p50", "TTFT p99", "ITL p99", "E2E p99", "goodput",
    ];
    let rows: Vec<Vec<String>> = slices
        .iter()
        .map(|(name, b)| {
            vec![
                name.clone(),
                b.requests.to_string(),
                b.ok.to_string(),
                ms(b.ttft_p50),
                ms(b.ttft_p99),
                ms(b.itl_p99),
                ms(b.e2e_p99),
                pct(b.goodput),
            ]
        })
        .collect();
    table(&header, &rows)
}

/// The latency cells of a class table's row.
fn class_row(name: String, b: &Breakdown) -> Vec<String> {
    vec![
        name,
        b.requests.to_string(),
        b.ok.to_string(),
        ms(b.ttft_p99),
        ms(b.itl_p99),
        ms(b.itl_max),
        ms(b.worst_gap_p99),
        ms(b.e2e_p99),
        pct(b.goodput),
    ]
}

const CLASS_HEADER: [&str; 9] = [
    "",
    "requests",
    "ok",
    "TTFT p99",
    "ITL p99",
    "ITL max",
    "worst gap p99",
    "E2E p99",
    "goodput",
];

/// One row per class, then one per path of it.
fn class_table(classes: &BTreeMap<String, ClassBreakdown>) -> String {
    let mut rows = Vec::new();
    for (name, c) in classes {
        rows.push(class_row(name.clone(), &c.all));
        for (path, b) in &c.by_path {
            rows.push(class_row(format!("  {path}"), b));
        }
    }
    let mut header = CLASS_HEADER;
    header[0] = "class / path";
    table(&header, &rows)
}

/// The common class split by whether its requests shared a step with an off-path step.
fn victims_table(v: &Victims) -> String {
    let mut header = CLASS_HEADER;
    header[0] = "common class";
    let rows = vec![
        class_row(format!("{} shared a step", v.class), &v.shared),
        class_row(format!("{} did not", v.class), &v.not_shared),
    ];
    let mut out = table(&header, &rows);
    let _ = writeln!(
        out,
        "{} of `{}`'s requests shared a step with an off-path step (another's prefill, a batch past the largest capture size); they hold {} of its gaps above its ITL p99 and {} of those above the SLO{}",
        pct(v.shared_share),
        v.class,
        pct(v.tail_share),
        pct(v.miss_share),
        if v.unknown > 0 {
            format!(
                " ({} of {} not known: no flight record reached the client)",
                v.unknown, v.requests
            )
        } else {
            String::new()
        }
    );
    out
}

/// One row per engine: busy and host shares, batch sizes, queue and preemptions.
fn engine_table(engines: &BTreeMap<String, EngineBreakdown>) -> String {
    let header = [
        "engine",
        "busy",
        "host",
        "batch mean",
        "batch p95",
        "queue mean",
        "preemptions",
        "recomputed",
    ];
    let rows: Vec<Vec<String>> = engines
        .iter()
        .map(|(name, e)| {
            vec![
                name.clone(),
                pct(e.busy_fraction),
                pct(e.host_fraction),
                format!("{:.1}", e.batch_mean),
                format!("{:.0}", e.batch_p95),
                format!("{:.1}", e.queue_mean),
                format!("{:.0}", e.preemptions),
                format!("{:.0}", e.recomputed_tokens),
            ]
        })
        .collect();
    table(&header, &rows)
}

impl Report {
    /// The report as text tables (latencies in milliseconds).
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let rate = if self.duration_s > 0.0 {
            self.requests as f64 / self.duration_s
        } else {
            0.0
        };
        let _ = writeln!(out, "{}", self.title);
        let _ = writeln!(
            out,
            "duration {:.1} s · requests {} ({rate:.1}/s) · ok {} · 429 {} · other 4xx {} · 5xx/transport {}",
            self.duration_s,
            self.requests,
            self.ok,
            self.rate_limited,
            self.client_errors,
            self.server_errors
        );
        let _ = writeln!(
            out,
            "tokens/s in {:.1} · out {:.1} · goodput {} (TTFT ≤ {} ms and every gap ≤ {} ms)\n",
            self.tokens_in_per_s,
            self.tokens_out_per_s,
            pct(self.goodput),
            ms(self.slo_ttft_s),
            ms(self.slo_itl_s)
        );
        if let Some(c) = &self.cached_tokens {
            // The gateway's explained hit rate, over the answers that carried it.
            let _ = writeln!(
                out,
                "cached prompt tokens over {} answers ({} prompt tokens): predicted {} · delivered {} · available {} (hit rate {})\n",
                c.answers,
                c.prompt_tokens,
                c.predicted,
                c.delivered,
                c.available,
                pct(if c.prompt_tokens > 0 {
                    c.delivered as f64 / c.prompt_tokens as f64
                } else {
                    0.0
                })
            );
        }
        let header = ["latency (ms)", "p50", "p90", "p95", "p99", "max", "mean"];
        let rows = vec![
            latency_row("TTFT", &self.ttft),
            latency_row("ITL", &self.itl),
            latency_row("E2E", &self.e2e),
        ];
        out.push_str(&table(&header, &rows));
        let _ = writeln!(
            out,
            "TPOT mean {} ms · ITL p99 {} ms · ITL max {} ms (a freeze mid-answer hides in the mean)",
            ms(self.tpot_mean),
            ms(self.itl.p99),
            ms(self.itl.max)
        );
        let t = &self.tpot;
        let _ = writeln!(
            out,
            "TPOT per request p50 {} · p95 {} · p99 {} · max {} ms",
            ms(t.p50),
            ms(t.p95),
            ms(t.p99),
            ms(t.max)
        );
        let sections = [
            ("tenant", &self.by_tenant),
            ("worker", &self.by_worker),
            ("path", &self.by_path),
        ];
        for (title, slices) in sections {
            if !slices.is_empty() {
                out.push('\n');
                out.push_str(&breakdown_table(title, slices));
            }
        }
        // One class (a workload without `classes`) is the whole run again: no table.
        if self.by_class.len() >= 2 {
            out.push('\n');
            out.push_str(&class_table(&self.by_class));
        }
        let v = &self.victims;
        if v.shared.requests > 0 {
            out.push('\n');
            out.push_str(&victims_table(v));
        }
        if self.by_tenant.len() >= 2 {
            let _ = writeln!(
                out,
                "Jain's index over tenants (served tokens against each one's max-min fair share): {:.3}",
                self.jain_index
            );
        }
        if !self.by_engine.is_empty() {
            out.push('\n');
            out.push_str(&engine_table(&self.by_engine));
        }
        if !self.extra.is_empty() {
            out.push('\n');
            let rows: Vec<Vec<String>> = self
                .extra
                .iter()
                .map(|(k, v)| vec![k.clone(), format!("{v:.4}")])
                .collect();
            out.push_str(&table(&["extra", "value"], &rows));
        }
        out
    }
}
