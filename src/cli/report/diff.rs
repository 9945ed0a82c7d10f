//! Two reports side by side: every headline number of run A and run B and the ratio B/A.

use super::Report;
use super::render::{ms, pct, table};

/// How a headline number is shown.
#[derive(Clone, Copy)]
enum Unit {
    /// A count or a rate, one decimal at most.
    Plain,
    /// Seconds, shown as milliseconds.
    Millis,
    /// A share, shown as a percentage.
    Share,
}

fn show(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Plain if v.fract() == 0.0 && v.abs() < 1e15 => format!("{v:.0}"),
        Unit::Plain => format!("{v:.1}"),
        Unit::Millis => ms(v),
        Unit::Share => pct(v),
    }
}

/// `b / a` with three decimals; `-` when `a` is 0 (unless both are).
fn ratio(a: f64, b: f64) -> String {
    if a == 0.0 {
        if b == 0.0 { "1.000".into() } else { "-".into() }
    } else {
        format!("{:.3}", b / a)
    }
}

/// The headline numbers of a report, named, in display order.
fn headlines(r: &Report) -> Vec<(String, f64, Unit)> {
    let mut out = vec![
        ("duration s".to_owned(), r.duration_s, Unit::Plain),
        ("requests".to_owned(), r.requests as f64, Unit::Plain),
        ("ok".to_owned(), r.ok as f64, Unit::Plain),
        ("429".to_owned(), r.rate_limited as f64, Unit::Plain),
        ("other 4xx".to_owned(), r.client_errors as f64, Unit::Plain),
        (
            "5xx/transport".to_owned(),
            r.server_errors as f64,
            Unit::Plain,
        ),
    ];
    for (name, p) in [("TTFT", &r.ttft), ("ITL", &r.itl), ("E2E", &r.e2e)] {
        let cells = [
            ("p50", p.p50),
            ("p90", p.p90),
            ("p95", p.p95),
            ("p99", p.p99),
            ("max", p.max),
            ("mean", p.mean),
        ];
        for (q, v) in cells {
            out.push((format!("{name} {q} ms"), v, Unit::Millis));
        }
    }
    out.push(("TPOT mean ms".to_owned(), r.tpot_mean, Unit::Millis));
    out.push(("TPOT p95 ms".to_owned(), r.tpot.p95, Unit::Millis));
    out.push(("tokens/s in".to_owned(), r.tokens_in_per_s, Unit::Plain));
    out.push(("tokens/s out".to_owned(), r.tokens_out_per_s, Unit::Plain));
    out.push(("goodput".to_owned(), r.goodput, Unit::Share));
    for (k, v) in &r.extra {
        out.push((k.clone(), *v, Unit::Plain));
    }
    out
}

/// A side-by-side table of `a` and `b` with the ratio B/A for every headline number (extras
/// present in only one report show `-` on the other side).
pub fn diff(a: &Report, b: &Report) -> String {
    let mut rows = Vec::new();
    let hb = headlines(b);
    for (name, va, unit) in headlines(a) {
        match hb.iter().find(|(n, _, _)| *n == name) {
            Some((_, vb, _)) => {
                rows.push(vec![name, show(va, unit), show(*vb, unit), ratio(va, *vb)])
            }
            None => rows.push(vec![name, show(va, unit), "-".into(), "-".into()]),
        }
    }
    for (name, vb, unit) in hb {
        if !b.extra.contains_key(&name) || a.extra.contains_key(&name) {
            continue;
        }
        rows.push(vec![name, "-".into(), show(vb, unit), "-".into()]);
    }
    let mut out = format!("A: {}\nB: {}\n\n", a.title, b.title);
    out.push_str(&table(&["metric", "A", "B", "B/A"], &rows));
    out
}
