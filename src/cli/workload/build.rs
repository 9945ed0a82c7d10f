//! One validation pass from the raw schema to the checked model. Every problem is collected with
//! the line of its section, so a file with three mistakes reports all three at once.

use std::path::Path;
use std::time::Duration;

use serde_saphyr::Spanned;

use super::build_mix::mix;
use super::model::{Arrival, Slo, Workload};
use super::spec::{RawArrival, RawWorkload, parse_duration};
use super::trace;

/// Problems found so far: (1-based line when known, message).
pub(super) type Problems = Vec<(Option<u64>, String)>;

/// The line of a spanned value, when the parser knew it.
pub(super) fn line<T>(spanned: &Spanned<T>) -> Option<u64> {
    Some(spanned.referenced.line()).filter(|&l| l > 0)
}

/// Checks `raw` and builds the workload; `stem` names it by default, `dir` anchors a relative
/// trace path.
pub(super) fn build(
    raw: RawWorkload,
    stem: &str,
    dir: Option<&Path>,
) -> Result<Workload, Problems> {
    let mut p = Problems::new();
    let duration = raw.duration.as_ref().and_then(|d| {
        parse_duration(&d.value)
            .map_err(|e| p.push((line(d), format!("duration: {e}"))))
            .ok()
    });
    let slo = raw.slo.as_ref().map_or(Slo::default(), |s| {
        let mut slo = Slo::default();
        let mut set = |text: &Option<String>, key: &str, out: &mut Duration| {
            if let Some(t) = text {
                match parse_duration(t) {
                    Ok(d) => *out = d,
                    Err(e) => p.push((line(s), format!("slo.{key}: {e}"))),
                }
            }
        };
        set(&s.value.ttft, "ttft", &mut slo.ttft);
        set(&s.value.itl, "itl", &mut slo.itl);
        slo
    });
    let (arrival, mix) = match &raw.trace {
        Some(path) => {
            for (present, key) in [
                (raw.arrival.is_some(), "arrival"),
                (raw.prompt_tokens.is_some(), "prompt_tokens"),
                (raw.output_tokens.is_some(), "output_tokens"),
                (raw.correlation.is_some(), "correlation"),
                (raw.classes.is_some(), "classes"),
                (raw.prefix_groups.is_some(), "prefix_groups"),
                (raw.sessions.is_some(), "sessions"),
                (raw.tenants.is_some(), "tenants"),
            ] {
                if present {
                    p.push((line(path), format!("`{key}` does not apply with `trace`")));
                }
            }
            let arrival = trace::read(&resolve(&path.value, dir))
                .map_err(|e| p.push((line(path), format!("trace: {e}"))))
                .ok()
                .map(Arrival::Trace);
            (arrival, None)
        }
        None => (arrival(&raw.arrival, &mut p), mix(&raw, &mut p)),
    };
    let duration = duration.or_else(|| default_duration(arrival.as_ref()?));
    if let Some(Arrival::Closed { .. }) = arrival
        && raw.duration.is_none()
        && raw.requests.is_none()
    {
        p.push((None, "a closed loop needs `duration` or `requests`".into()));
    }
    match arrival {
        Some(arrival) if p.is_empty() => Ok(Workload {
            name: raw.name.unwrap_or_else(|| stem.to_string()),
            seed: raw.seed.unwrap_or(0),
            duration: duration.unwrap_or(Duration::from_secs(60)),
            arrival,
            slo,
            mix,
            requests: raw.requests,
        }),
        _ => Err(p),
    }
}

/// A trace path as written, or relative to the workload file's directory when it exists there.
fn resolve(path: &str, dir: Option<&Path>) -> std::path::PathBuf {
    match dir.map(|d| d.join(path)) {
        Some(joined) if joined.exists() => joined,
        _ => Path::new(path).to_path_buf(),
    }
}

/// Run length when the file gives none: the stages' total or the trace's span, else 60s.
fn default_duration(arrival: &Arrival) -> Option<Duration> {
    match arrival {
        Arrival::Stages(stages) => Some(stages.iter().map(|s| s.1).sum()),
        Arrival::Trace(t) => t.entries.last().map(|e| e.at + Duration::from_millis(1)),
        _ => None,
    }
}

/// Checks `arrival:`; exactly one kind, rates finite and ≥ 0.
fn arrival(raw: &Option<Spanned<RawArrival>>, p: &mut Problems) -> Option<Arrival> {
    let Some(spanned) = raw else {
        p.push((None, "`arrival` is required (or give a `trace`)".into()));
        return None;
    };
    let at = line(spanned);
    let a = &spanned.value;
    let kinds = [
        a.poisson.is_some(),
        a.burst.is_some(),
        a.stages.is_some(),
        a.closed.is_some(),
    ];
    if kinds.iter().filter(|k| **k).count() != 1 {
        let msg = "arrival: give exactly one of poisson, burst, stages, closed";
        p.push((at, msg.into()));
        return None;
    }
    let before = p.len();
    let rate = |r: f64, what: &str, p: &mut Problems| {
        if !(r.is_finite() && r >= 0.0) {
            p.push((at, format!("arrival: {what} must be a number ≥ 0, got {r}")));
        }
        r
    };
    let result = if let Some(x) = &a.poisson {
        Arrival::Poisson {
            rate: rate(x.rate, "poisson.rate", p),
        }
    } else if let Some(b) = &a.burst {
        let (rate, factor) = (
            rate(b.rate, "burst.rate", p),
            rate(b.factor, "burst.factor", p),
        );
        let mut time = |t: &str, key: &str| {
            parse_duration(t)
                .map_err(|e| p.push((at, format!("arrival: burst.{key}: {e}"))))
                .unwrap_or_default()
        };
        let (start, length) = (time(&b.start, "start"), time(&b.length, "length"));
        Arrival::Burst {
            rate,
            factor,
            start,
            length,
        }
    } else if let Some(stages) = &a.stages {
        let mut out = Vec::new();
        for (i, s) in stages.iter().enumerate() {
            let r = rate(s.rate, &format!("stages[{i}].rate"), p);
            match parse_duration(&s.duration) {
                Ok(d) => out.push((r, d)),
                Err(e) => p.push((at, format!("arrival: stages[{i}].duration: {e}"))),
            }
        }
        if stages.is_empty() {
            p.push((at, "arrival: stages needs at least one stage".into()));
        }
        Arrival::Stages(out)
    } else {
        let concurrency = a.closed.as_ref().map_or(0, |c| c.concurrency);
        if concurrency == 0 {
            p.push((at, "arrival: closed.concurrency must be ≥ 1".into()));
        }
        Arrival::Closed { concurrency }
    };
    (p.len() == before).then_some(result)
}
