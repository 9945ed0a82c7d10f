//! Validation of `quality:`: the share of answers scored for quality signals, the refusal
//! phrases, the worker's queue, and the drift windows (`drift:` size, reference, PSI threshold),
//! each error at its line.

use super::raw::RawQuality;
use super::snapshot::PoolSpec;
use crate::diagnostics::Sink;
use crate::quality::windows::Reference;
use crate::quality::{DriftConfig, QualityConfig};

/// Most jobs the quality worker's queue may hold.
const MAX_QUEUE: usize = 1 << 20;

/// Checks `quality:` (`pool_share` names pools of `pools`); absent, the defaults (5% sampled,
/// rolling drift windows of 1000).
pub(super) fn quality(
    sink: &mut Sink<'_>,
    raw: Option<&RawQuality>,
    pools: &[PoolSpec],
) -> QualityConfig {
    let mut q = QualityConfig::default();
    let Some(raw) = raw else { return q };
    if let Some(s) = &raw.sample_share {
        if (0.0..=1.0).contains(&s.value) {
            q.sample_share = s.value;
        } else {
            sink.at(
                &s.referenced,
                "quality.sample_share must be between 0 and 1",
            );
        }
    }
    for (pool, share) in raw.pool_share.iter().flatten() {
        if !pools.iter().any(|p| p.name == pool.value) {
            let msg = format!("quality.pool_share: no pool `{}` in `pools`", pool.value);
            sink.at(&pool.referenced, msg);
        } else if !(0.0..=1.0).contains(&share.value) {
            let msg = format!("quality.pool_share.{} must be between 0 and 1", pool.value);
            sink.at(&share.referenced, msg);
        } else {
            q.pool_share.insert(pool.value.clone(), share.value);
        }
    }
    if let Some(phrases) = &raw.refusal_phrases {
        q.refusal_phrases = Vec::with_capacity(phrases.len());
        for p in phrases {
            let phrase = p.value.trim().to_lowercase();
            if phrase.is_empty() {
                sink.at(&p.referenced, "quality.refusal_phrases: a phrase is empty");
            } else {
                q.refusal_phrases.push(phrase);
            }
        }
    }
    if let Some(n) = &raw.queue {
        if (1..=MAX_QUEUE).contains(&n.value) {
            q.queue = n.value;
        } else {
            sink.at(
                &n.referenced,
                format!("quality.queue must be between 1 and {MAX_QUEUE}"),
            );
        }
    }
    let Some(d) = &raw.drift else { return q };
    if d.enabled == Some(false) {
        q.drift = None;
        return q;
    }
    let mut drift = DriftConfig::default();
    let w = &mut drift.windows;
    if let Some(n) = &d.window {
        if n.value >= 10 {
            w.window = n.value;
            w.min_count = n.value / 2;
        } else {
            sink.at(
                &n.referenced,
                "quality.drift.window must be at least 10 answers",
            );
        }
    }
    if let Some(n) = &d.min_count {
        if (1..=w.window).contains(&n.value) {
            w.min_count = n.value;
        } else {
            let msg = format!(
                "quality.drift.min_count must be between 1 and the window ({})",
                w.window
            );
            sink.at(&n.referenced, msg);
        }
    }
    if let Some(r) = &d.reference {
        match r.value.as_str() {
            "rolling" => w.reference = Reference::Rolling,
            "pinned" => w.reference = Reference::Pinned,
            other => sink.at(
                &r.referenced,
                format!("quality.drift.reference: `{other}` is not `rolling` or `pinned`"),
            ),
        }
    }
    if let Some(t) = &d.psi_threshold {
        if t.value.is_finite() && t.value > 0.0 {
            drift.psi_threshold = t.value;
        } else {
            sink.at(&t.referenced, "quality.drift.psi_threshold must be above 0");
        }
    }
    q.drift = Some(drift);
    q
}

#[cfg(test)]
mod tests {
    use super::super::tests::{MINIMAL, errors, load_both};
    use super::*;

    #[test]
    fn absent_it_samples_five_percent_with_rolling_drift_windows() {
        let s = load_both(MINIMAL, None).unwrap();
        assert_eq!(*s.quality, QualityConfig::default());
        assert_eq!(s.quality.sample_share, 0.05);
        let d = s.quality.drift.unwrap();
        assert_eq!((d.windows.window, d.psi_threshold), (1000, 0.2));
    }

    #[test]
    fn every_key_is_read_and_phrases_are_lowercased() {
        let yaml = format!(
            "quality:\n  sample_share: 1.0\n  pool_share: {{p: 0.5}}\n  refusal_phrases: [\" Not Allowed \"]\n  queue: 8\n  \
             drift: {{window: 40, min_count: 7, reference: pinned, psi_threshold: 0.5}}\n{MINIMAL}"
        );
        let q = load_both(&yaml, None).unwrap().quality;
        assert_eq!(q.sample_share, 1.0);
        assert_eq!(q.share_of("p"), 0.5);
        assert_eq!(q.share_of("other"), 1.0);
        assert_eq!(q.refusal_phrases, ["not allowed"]);
        assert_eq!(q.queue, 8);
        let d = q.drift.unwrap();
        assert_eq!(
            (d.windows.window, d.windows.min_count, d.windows.reference),
            (40, 7, Reference::Pinned)
        );
        assert_eq!(d.psi_threshold, 0.5);
        let off = format!("quality: {{drift: {{enabled: false}}}}\n{MINIMAL}");
        assert_eq!(load_both(&off, None).unwrap().quality.drift, None);
    }

    #[test]
    fn every_bad_value_is_reported_at_its_line() {
        let yaml = format!(
            "quality:\n  sample_share: 2\n  pool_share: {{nope: 0.5}}\n  refusal_phrases: [\"\"]\n  queue: 0\n  drift:\n    \
             window: 5\n    min_count: 5000\n    reference: fixed\n    psi_threshold: 0\n{MINIMAL}"
        );
        let errs = errors(&yaml, None);
        let lines: Vec<Option<u64>> = errs.iter().map(|e| e.1).collect();
        assert_eq!(lines, [2, 3, 4, 5, 7, 8, 9, 10].map(Some), "{errs:?}");
        assert!(
            errs[0].2.contains("sample_share must be between 0 and 1"),
            "{errs:?}"
        );
        assert!(errs[1].2.contains("no pool `nope`"), "{errs:?}");
        assert!(
            errs[6].2.contains("`fixed` is not `rolling` or `pinned`"),
            "{errs:?}"
        );
    }
}
