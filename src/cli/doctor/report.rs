//! Doctor's output: a text report for a person on call, JSON for machines
//! (`{"findings": [...], "missing": [...], "snapshot": {...}}`, most likely first).

use std::fmt::Write;

use super::rules::Diagnosis;
use super::snapshot::Snapshot;

/// The `--json` document.
pub fn json(d: &Diagnosis, s: &Snapshot) -> String {
    let doc = serde_json::json!({
        "findings": d.findings,
        "missing": d.missing,
        "snapshot": s,
    });
    format!("{doc:#}\n")
}

/// A number as a person reads it: 3 significant digits, no exponent for everyday sizes.
fn num(v: f64) -> String {
    if v == 0.0 {
        "0".to_string()
    } else if (1e-3..1e6).contains(&v.abs()) {
        let digits = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
        format!("{v:.digits$}")
    } else {
        format!("{v:.3e}")
    }
}

/// The text report.
pub fn text(d: &Diagnosis, s: &Snapshot) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "infergate doctor: {} s window, {} worker(s)",
        num(s.window_s),
        s.workers
    );
    if d.findings.is_empty() {
        let _ = writeln!(
            out,
            "\nnothing is wrong: no symptom's signature matched (3.1–3.5)."
        );
    }
    for (i, f) in d.findings.iter().enumerate() {
        let _ = writeln!(
            out,
            "\n{}. {} {}  (score {} = impact {} / risk {} × evidence {})",
            i + 1,
            f.symptom,
            f.name,
            num(f.score),
            num(f.impact),
            num(f.risk),
            num(f.evidence)
        );
        let _ = writeln!(out, "   mechanism:  {}", f.mechanism);
        let _ = writeln!(out, "   lever:      {}", f.lever);
        let values: Vec<String> = f
            .confirming
            .iter()
            .map(|(k, v)| format!("{k} {}", v.map_or_else(|| "n/a".into(), num)))
            .collect();
        let _ = writeln!(
            out,
            "   confirming: {}: {}",
            f.measurement,
            values.join(", ")
        );
        let _ = writeln!(out, "   falsifier:  {}", f.falsifier);
    }
    if !d.missing.is_empty() {
        let _ = writeln!(out, "\nlacked:");
        for m in &d.missing {
            let _ = writeln!(out, "  - {m}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::rules::diagnose;

    #[test]
    fn healthy_says_nothing_is_wrong_and_json_has_an_empty_list() {
        let s = Snapshot::default();
        let d = diagnose(&s);
        assert!(text(&d, &s).contains("nothing is wrong"));
        let v: serde_json::Value = serde_json::from_str(&json(&d, &s)).unwrap();
        assert_eq!(v["findings"], serde_json::json!([]));
        assert!(v["missing"].as_array().unwrap().len() > 3);
    }

    #[test]
    fn a_finding_prints_its_parts_and_values() {
        let s = Snapshot {
            window_s: 30.0,
            workers: 1,
            busy_fraction: Some(0.31),
            queue_per_worker: Some(40.0),
            batch_size_mean: Some(2.0),
            max_num_seqs: Some(2.0),
            ..Snapshot::default()
        };
        let d = diagnose(&s);
        let t = text(&d, &s);
        assert!(t.contains("1. 3.2 small-batches"), "{t}");
        assert!(t.contains("busy_fraction 0.310"), "{t}");
        assert!(t.contains("falsifier:"));
        let v: serde_json::Value = serde_json::from_str(&json(&d, &s)).unwrap();
        assert_eq!(v["findings"][0]["symptom"], "3.2");
        assert_eq!(v["findings"][0]["confirming"]["max_num_seqs"], 2.0);
        assert_eq!(v["snapshot"]["busy_fraction"], 0.31);
    }

    #[test]
    fn numbers_read_plainly() {
        assert_eq!(num(0.31), "0.310");
        assert_eq!(num(40.0), "40.0");
        assert_eq!(num(1234.0), "1234");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(1e-5), "1.000e-5");
    }
}
