//! Validation of `quality:`: the share of answers scored for quality signals, the refusal
//! phrases, the worker's queue, and the drift windows (`drift:` size, reference, PSI threshold),
//! each error at its line.

use super::raw::RawQuality;
use crate::diagnostics::Sink;
use crate::quality::windows::Reference;
use crate::quality::{DriftConfig, QualityConfig};

/// Most jobs the quality worker's queue may hold.
const MAX_QUEUE: usize = 1 << 20;

/// Checks `quality:`; absent, the defaults (5% sampled, rolling drift windows of 1000).
pub(super) fn quality(sink: &mut Sink<'_>, raw: Option<&RawQuality>) -> QualityConfig {
    let mut q = QualityConfig::default();
    let Some(raw) = raw else { return q };
    if let Some(s) = &raw.sample_share {
        if (0.0..=1.0).contains(&s.value) {
            q.sample_share = s.value;
        } else {
            sink.at(&s.referenced, "quality.sample_share must be between 0 and 1");
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
            sink.at(&n.referenced, "quality.drift.window must be at least 10 answers");
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
