//! JSONL traces: reading recorded traffic (one request per line) into sorted `TraceEntry`s, each
//! error naming its file and line.

use std::path::Path;
use std::time::Duration;

use super::model::{Trace, TraceEntry, TracePrompt};
use super::replay;
use super::spec::RawTraceLine;

/// Reads and checks a trace file; entries come back sorted by timestamp (stable).
pub(super) fn read(path: &Path) -> Result<Trace, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let shown = path.display();
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .collect();
    // The gateway's own trace file (`trace:`) replays as recorded; see `replay`.
    if lines
        .first()
        .is_some_and(|(_, l)| replay::is_gateway_line(l))
    {
        let (entries, _skipped) = replay::entries(&lines).map_err(|e| format!("{shown}: {e}"))?;
        return Ok(Trace {
            path: path.to_path_buf(),
            entries,
        });
    }
    let mut entries = Vec::new();
    let mut problems = Vec::new();
    for (n, line) in lines {
        match parse_line(line) {
            Ok(entry) => entries.push(entry),
            Err(e) => problems.push(format!("{shown}:{n}: {e}")),
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("\n"));
    }
    if entries.is_empty() {
        return Err(format!("{shown}: the trace has no requests"));
    }
    entries.sort_by_key(|e| e.at);
    Ok(Trace {
        path: path.to_path_buf(),
        entries,
    })
}

/// One line → one entry.
fn parse_line(line: &str) -> Result<TraceEntry, String> {
    let raw: RawTraceLine = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let at = Duration::try_from_secs_f64(raw.timestamp)
        .map_err(|_| format!("timestamp must be seconds ≥ 0, got {}", raw.timestamp))?;
    let prompt = match (raw.prompt_tokens, raw.prompt) {
        (Some(n), None) => TracePrompt::Tokens(n),
        (None, Some(text)) => TracePrompt::Text(text),
        _ => return Err("give exactly one of `prompt_tokens` and `prompt`".into()),
    };
    Ok(TraceEntry {
        at,
        tenant: raw.tenant,
        session: raw.session,
        prompt,
        output_tokens: raw.output_tokens,
        group: None,
        features: None,
        class: None,
    })
}
