//! Reading the gateway's trace files (`trace:` in its config, one JSON line per request, see
//! `infergate::trace::TraceLine`) into what `shapes` needs of each request. A line that is not
//! a trace line, or whose engine record fails the gateway's own checks (the file may have been
//! edited, or come from elsewhere), is counted as bad and skipped, never fatal.

use std::io::BufRead;
use std::path::Path;

use infergate::trace::Flight;
use infergate::trace::record;
use infergate_engine::flight::{BatchHist, Features};
use serde::Deserialize;
use serde_json::value::RawValue;

/// What `shapes` keeps of one traced request with an engine record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Request {
    /// Arrival, Unix ms.
    pub start_ms: i64,
    /// Prompt tokens.
    pub prompt: u64,
    /// Generated tokens (every sequence's).
    pub output: u64,
    /// Prompt tokens read from the prefix cache.
    pub cached: u64,
    /// Features that change the path.
    pub features: Features,
    /// Sequence-steps on the graph path.
    pub graph_steps: u64,
    /// Sequence-steps on the eager path.
    pub eager_steps: u64,
    /// Its steps by batch size.
    pub hist: BatchHist,
    /// The largest capture size of the engine that served it (0: every step eager).
    pub largest_capture: u32,
}

/// Every request of one or more trace files, and what could not be used.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// Requests with a valid engine record, by arrival (ties keep file order).
    pub requests: Vec<Request>,
    /// Lines read (blank lines not counted).
    pub lines: u64,
    /// Lines that are not trace lines or carry a record failing the checks.
    pub bad_lines: u64,
    /// Trace lines without an engine record (another worker, an error answer).
    pub without_record: u64,
    /// Capture-size sets seen, each with its request count, most requests first.
    pub captures: Vec<(Vec<u32>, u64)>,
    /// Requests whose engine ran piecewise graphs for steps with prefill.
    pub piecewise: u64,
}

/// The members of a trace line `shapes` reads.
#[derive(Deserialize)]
struct Line<'a> {
    start_ms: i64,
    #[serde(borrow, default)]
    flight: Option<&'a RawValue>,
}

/// What one line holds.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    /// A request with a valid record, the capture sizes of its engine and whether it ran
    /// piecewise graphs.
    Request(Box<Request>, Vec<u32>, bool),
    /// A trace line without a record.
    NoRecord,
    /// Not a trace line, or a record that fails the checks.
    Bad,
}

/// Parses one line of a trace file.
pub fn parse_line(line: &str) -> Parsed {
    let Ok(l) = serde_json::from_str::<Line>(line) else {
        return Parsed::Bad;
    };
    let raw = match l.flight {
        Some(raw) if raw.get() != "null" => raw.get(),
        _ => return Parsed::NoRecord,
    };
    let Flight::Valid(r) = record::parse(raw.as_bytes()) else {
        return Parsed::Bad;
    };
    let request = Request {
        start_ms: l.start_ms,
        prompt: r.tokens.prompt,
        output: r.tokens.decode,
        cached: r.tokens.cached,
        features: r.features,
        graph_steps: r.steps.graph.into(),
        eager_steps: r.steps.eager.into(),
        hist: r.batch_hist,
        largest_capture: r.capture.last().copied().unwrap_or(0),
    };
    Parsed::Request(Box::new(request), r.capture, r.piecewise)
}

impl Trace {
    /// Reads every line of `reader` into the trace.
    pub fn read_from(&mut self, reader: impl BufRead) -> std::io::Result<()> {
        for line in reader.lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            self.lines += 1;
            match parse_line(&line) {
                Parsed::Request(r, capture, piecewise) => {
                    self.note_capture(capture);
                    self.piecewise += u64::from(piecewise);
                    self.requests.push(*r);
                }
                Parsed::NoRecord => self.without_record += 1,
                Parsed::Bad => self.bad_lines += 1,
            }
        }
        Ok(())
    }

    fn note_capture(&mut self, capture: Vec<u32>) {
        match self.captures.iter_mut().find(|(c, _)| *c == capture) {
            Some((_, n)) => *n += 1,
            None => self.captures.push((capture, 1)),
        }
    }

    /// Orders requests by arrival and capture sets by use.
    pub fn finish(mut self) -> Self {
        self.requests.sort_by_key(|r| r.start_ms);
        self.captures.sort_by_key(|c| std::cmp::Reverse(c.1));
        self
    }

    /// The capture sizes most requests were served with (empty when none).
    pub fn usual_capture(&self) -> &[u32] {
        self.captures.first().map_or(&[], |(c, _)| c.as_slice())
    }
}

/// Reads the trace files at `paths` (a rotated file and its successors may be given together).
pub fn read(paths: &[impl AsRef<Path>]) -> Result<Trace, String> {
    let mut trace = Trace::default();
    for path in paths {
        let path = path.as_ref();
        let file = std::fs::File::open(path)
            .map_err(|e| format!("cannot open the trace {}: {e}", path.display()))?;
        trace
            .read_from(std::io::BufReader::new(file))
            .map_err(|e| format!("cannot read the trace {}: {e}", path.display()))?;
    }
    Ok(trace.finish())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A trace line of a request that arrived at `start_ms` with a record whose decode steps
    /// had `decode` sequences and whose one prefill step had `prefill`.
    pub(crate) fn line(start_ms: i64, prefill: u32, decode: &[u32], capture: &[u32]) -> String {
        let mut hist = BatchHist::default();
        hist.add(prefill, false);
        let largest = capture.last().copied().unwrap_or(0);
        let mut graph = 0;
        for &b in decode {
            hist.add(b, true);
            graph += u32::from(b <= largest);
        }
        let sizes: Vec<u32> = std::iter::once(prefill)
            .chain(decode.iter().copied())
            .collect();
        let steps = sizes.len() as u32;
        let mean = f64::from(sizes.iter().sum::<u32>()) / f64::from(steps);
        let record = serde_json::json!({
            "v": 2, "engine": "0.1.0", "backend": "sim", "capture": capture,
            "steps": {"graph": graph, "eager": steps - graph},
            "batch": {"min": sizes.iter().min(), "max": sizes.iter().max(),
                      "mean": (mean * 1000.0).round() / 1000.0},
            "batch_hist": hist,
            "tokens": {"prompt": 100, "decode": decode.len() + 1, "cached": 50},
            "features": {"prompts": 1, "n": 1, "best_of": 1, "stream": true},
        });
        serde_json::json!({"request_id": format!("r{start_ms}"), "start_ms": start_ms,
            "status": 200, "flight_status": "ok", "flight": record})
        .to_string()
    }

    #[test]
    fn lines_are_read_and_bad_ones_counted() {
        let text = [
            line(20, 1, &[2, 2], &[1, 2]),
            "not json".to_owned(),
            String::new(),
            r#"{"start_ms": 5, "flight": null, "flight_status": "absent"}"#.to_owned(),
            // A record that fails the gateway's checks: more cached than prompt tokens.
            line(7, 1, &[1], &[1]).replace(r#""cached":50"#, r#""cached":500"#),
            line(10, 3, &[3], &[1, 2]),
        ]
        .join("\n");
        let mut t = Trace::default();
        t.read_from(text.as_bytes()).unwrap();
        let t = t.finish();
        assert_eq!((t.lines, t.bad_lines, t.without_record), (5, 2, 1));
        assert_eq!(t.requests.len(), 2);
        assert_eq!(t.requests[0].start_ms, 10, "by arrival");
        assert_eq!(t.requests[0].largest_capture, 2);
        assert_eq!(t.requests[0].eager_steps, 2);
        assert_eq!(t.requests[1].graph_steps, 2);
        assert_eq!(t.requests[1].hist.decode.bins(), &[(2, 2)]);
        assert_eq!(t.usual_capture(), &[1, 2]);
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let e = read(&["/nonexistent/trace.jsonl"]).unwrap_err();
        assert!(e.contains("/nonexistent/trace.jsonl"), "{e}");
    }
}
