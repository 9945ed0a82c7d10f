//! Precise mode: subscribes to a worker's `GET /kv/events` stream and feeds the residency it
//! reports into the pool's routing policy (protocol in `engine/README.md`).
//!
//! A worker that answers 404 has no events and keeps the approximate index; it is asked again
//! after a while. A stream that ends, errs, sends a line past `health.max_kv_event_line_bytes`
//! or stays silent past the heartbeat timeout is marked lost (what was learned stays, as a
//! guess) and reopened by the same task after a wait that starts at the poll interval and
//! doubles per failure in a row up to `health.kv_events_max_backoff`; the task ends when the
//! worker is ejected or leaves the pool. Each byte of the stream is scanned once for `\n`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper::body::Bytes;
use serde::Deserialize;

use crate::routing::Residency;
use crate::upstream::UpstreamClient;
use crate::workers::pool::PolicyHolder;
use crate::workers::state::{KvEventsState, WorkerState};

/// One NDJSON line of the stream.
#[derive(Debug, Deserialize)]
struct EventLine {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    keys: Vec<String>,
}

/// How a subscription ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The worker has no `/kv/events`.
    Unsupported,
    /// It could not be opened, or the stream ended or went silent.
    Lost(String),
    /// The pool's policy was replaced by a reload: reopen for the new one.
    PolicyReplaced,
}

/// Bounds and timings of a subscription.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamSettings {
    /// Time allowed to open the stream.
    pub open_timeout: Duration,
    /// Silence (no line, no heartbeat) after which the stream counts as lost.
    pub silence_timeout: Duration,
    /// Longest line accepted, bytes; a longer one drops the stream.
    pub max_line_bytes: usize,
    /// Wait before the first reopen of a lost stream.
    pub first_backoff: Duration,
    /// Ceiling of that wait as failures in a row double it.
    pub max_backoff: Duration,
}

/// The wait before reopening after `failures` lost streams in a row (1 for the first):
/// `first × 2^(failures−1)`, at most `max`.
pub fn reconnect_delay(first: Duration, max: Duration, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(31);
    first.saturating_mul(1 << doublings).min(max.max(first))
}

/// The wait between a lost event stream and its reopening, shared by our engines' `/kv/events`
/// and vLLM's ZMQ publisher: doubling while streams keep failing fast.
#[derive(Debug, Default)]
pub struct Reopen {
    failures: u32,
}

impl Reopen {
    /// After a stream opened at `opened` was lost (`why`): routing forgets what it knew of the
    /// worker's cache, the worker is marked reconnecting and the backoff waited. False when the
    /// worker was ejected or its pool's policy went away meanwhile (the worker is then idle).
    pub async fn after_loss(
        &mut self,
        worker: &WorkerState,
        current_policy: &impl Fn() -> Option<Arc<PolicyHolder>>,
        settings: StreamSettings,
        (opened, why, stream): (Instant, &str, &str),
    ) -> bool {
        if let Some(policy) = current_policy() {
            policy.policy.residency(worker.key, Residency::Lost);
        }
        // A stream that lived longer than the longest wait starts the count afresh; one that
        // keeps failing fast backs off.
        if opened.elapsed() >= settings.max_backoff {
            self.failures = 0;
        }
        self.failures = self.failures.saturating_add(1);
        let delay = reconnect_delay(settings.first_backoff, settings.max_backoff, self.failures);
        if worker.kv_events() == KvEventsState::Live {
            tracing::warn!(worker = %worker.url, %stream, reason = %why, ?delay, "KV events lost; routing falls back to its approximate index until they reopen");
        } else {
            tracing::debug!(worker = %worker.url, %stream, reason = %why, ?delay, "KV events unavailable; reopening");
        }
        // Still this task's to reopen: the poll loop opens no second one meanwhile.
        worker.set_kv_events(KvEventsState::Connecting);
        tokio::time::sleep(delay).await;
        if !worker.is_healthy() || current_policy().is_none() {
            worker.set_kv_events(KvEventsState::Idle);
            return false;
        }
        true
    }
}

/// Runs subscriptions to `worker`, reopening lost ones with backoff, applying each event to the
/// policy that `current_policy` returns (the pool's policy of the live config; `None` once the
/// pool or the worker is gone), and keeps the worker's subscription state. Returns when the
/// worker has no events, the policy was replaced, or a lost stream's worker was ejected or
/// removed.
pub async fn subscribe(
    client: UpstreamClient,
    worker: Arc<WorkerState>,
    current_policy: impl Fn() -> Option<Arc<PolicyHolder>>,
    settings: StreamSettings,
) -> Ended {
    let mut reopen = Reopen::default();
    loop {
        let opened = Instant::now();
        let ended = run(&client, &worker, &current_policy, settings).await;
        match &ended {
            Ended::Unsupported => {
                tracing::info!(worker = %worker.url, "worker has no KV events: routing keeps its approximate index");
                worker.set_kv_events(KvEventsState::Unsupported);
                return ended;
            }
            Ended::PolicyReplaced => {
                worker.set_kv_events(KvEventsState::Idle);
                return ended;
            }
            Ended::Lost(why) => {
                let stream = "/kv/events";
                if !reopen
                    .after_loss(&worker, &current_policy, settings, (opened, why, stream))
                    .await
                {
                    return ended;
                }
            }
        }
    }
}

async fn run(
    client: &UpstreamClient,
    worker: &WorkerState,
    current_policy: &impl Fn() -> Option<Arc<PolicyHolder>>,
    settings: StreamSettings,
) -> Ended {
    let uri: hyper::Uri = match format!("{}/kv/events", worker.url).parse() {
        Ok(u) => u,
        Err(e) => return Ended::Lost(format!("bad worker URL: {e}")),
    };
    let req = match hyper::Request::get(uri).body(Full::new(Bytes::new())) {
        Ok(r) => r,
        Err(e) => return Ended::Lost(e.to_string()),
    };
    let open_timeout = settings.open_timeout;
    let res = match tokio::time::timeout(open_timeout, client.request(req)).await {
        Ok(Ok(res)) => res,
        Ok(Err(e)) => return Ended::Lost(e.to_string()),
        Err(_) => return Ended::Lost(format!("no answer within {open_timeout:?}")),
    };
    match res.status() {
        s if s.is_success() => {}
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_IMPLEMENTED => {
            return Ended::Unsupported;
        }
        s => return Ended::Lost(format!("answered {s}")),
    }
    let Some(policy) = current_policy() else {
        return Ended::PolicyReplaced;
    };
    let mut body = res.into_body();
    let mut lines = Lines::new(settings.max_line_bytes);
    let mut snapshot_seen = false;
    let silence_timeout = settings.silence_timeout;
    loop {
        let frame = match tokio::time::timeout(silence_timeout, body.frame()).await {
            Err(_) => return Ended::Lost(format!("silent for {silence_timeout:?}")),
            Ok(None) => return Ended::Lost("stream ended".into()),
            Ok(Some(Err(e))) => return Ended::Lost(e.to_string()),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        lines.push(&data);
        loop {
            let line = match lines.next_line() {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(e) => return Ended::Lost(e),
            };
            let update = match parse_line(line) {
                Ok(u) => u,
                Err(e) => return Ended::Lost(e),
            };
            let Some((kind, keys)) = update else {
                continue;
            };
            if !current_policy().is_some_and(|p| Arc::ptr_eq(&p, &policy)) {
                return Ended::PolicyReplaced;
            }
            let residency = match kind {
                Kind::Snapshot => {
                    snapshot_seen = true;
                    Residency::Snapshot(&keys)
                }
                _ if !snapshot_seen => return Ended::Lost("events before the snapshot".into()),
                Kind::Stored => Residency::Stored(&keys),
                Kind::Removed => Residency::Removed(&keys),
            };
            policy.policy.residency(worker.key, residency);
            if kind == Kind::Snapshot {
                worker.set_kv_events(KvEventsState::Live);
                tracing::info!(worker = %worker.url, keys = keys.len(), "KV events live: routing on the worker's real residency");
            }
        }
    }
}

/// Splits a byte stream into lines with a cap on one line. Each byte is scanned for `\n` once,
/// however it arrives in frames; consumed lines are dropped from the buffer once per push.
#[derive(Debug)]
struct Lines {
    buf: Vec<u8>,
    /// Start of the line being read.
    start: usize,
    /// Bytes before this index (from `start`) hold no `\n`.
    scanned: usize,
    max_line: usize,
    /// Bytes scanned in all (for the scan-once test).
    examined: u64,
}

impl Lines {
    fn new(max_line: usize) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            max_line,
            examined: 0,
        }
    }

    /// Appends a frame's bytes.
    fn push(&mut self, data: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.scanned -= self.start;
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next whole line without its `\n`; `None` until more bytes come; an error once the
    /// line being read is longer than the cap.
    fn next_line(&mut self) -> Result<Option<&[u8]>, String> {
        let unseen = &self.buf[self.scanned..];
        let found = unseen.iter().position(|&b| b == b'\n');
        self.examined += found.map_or(unseen.len(), |i| i + 1) as u64;
        match found {
            Some(i) => {
                let end = self.scanned + i;
                if end - self.start > self.max_line {
                    return Err(self.too_long());
                }
                let start = self.start;
                self.start = end + 1;
                self.scanned = end + 1;
                Ok(Some(&self.buf[start..end]))
            }
            None => {
                self.scanned = self.buf.len();
                if self.buf.len() - self.start > self.max_line {
                    return Err(self.too_long());
                }
                Ok(None)
            }
        }
    }

    fn too_long(&self) -> String {
        format!(
            "a line exceeds health.max_kv_event_line_bytes ({})",
            self.max_line
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Snapshot,
    Stored,
    Removed,
}

/// One line: `Ok(None)` for a heartbeat, a blank line or an event type added later.
fn parse_line(line: &[u8]) -> Result<Option<(Kind, Vec<u64>)>, String> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let ev: EventLine =
        serde_json::from_slice(line).map_err(|e| format!("bad KV event line: {e}"))?;
    let kind = match ev.kind.as_str() {
        "snapshot" => Kind::Snapshot,
        "stored" => Kind::Stored,
        "removed" => Kind::Removed,
        _ => return Ok(None),
    };
    let keys = ev
        .keys
        .iter()
        .map(|k| u64::from_str_radix(k, 16).map_err(|e| format!("bad KV event key {k:?}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some((kind, keys)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_unknown_types_are_skipped() {
        assert_eq!(
            parse_line(br#"{"type":"stored","keys":["00000000000000ff","1"]}"#),
            Ok(Some((Kind::Stored, vec![255, 1])))
        );
        assert_eq!(parse_line(br#"{"type":"heartbeat","keys":[]}"#), Ok(None));
        assert_eq!(parse_line(b"  "), Ok(None));
        assert!(parse_line(b"{not json").is_err());
        assert!(parse_line(br#"{"type":"removed","keys":["xyz"]}"#).is_err());
    }

    fn collect(lines: &mut Lines) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        while let Some(l) = lines.next_line()? {
            out.push(String::from_utf8_lossy(l).into_owned());
        }
        Ok(out)
    }

    #[test]
    fn lines_split_across_frames() {
        let mut lines = Lines::new(64);
        lines.push(b"ab");
        assert_eq!(collect(&mut lines), Ok(vec![]));
        lines.push(b"c\nde\n\nf");
        assert_eq!(
            collect(&mut lines),
            Ok(vec!["abc".into(), "de".into(), "".into()])
        );
        lines.push(b"g\n");
        assert_eq!(collect(&mut lines), Ok(vec!["fg".into()]));
        assert_eq!(lines.buf.len() - lines.start, 0);
    }

    #[test]
    fn a_line_past_the_cap_is_an_error_whether_it_ends_or_not() {
        let mut lines = Lines::new(8);
        lines.push(b"12345678\n");
        assert_eq!(collect(&mut lines), Ok(vec!["12345678".into()]));
        lines.push(b"123456789\n");
        assert!(collect(&mut lines).is_err(), "a whole line past the cap");
        let mut endless = Lines::new(8);
        endless.push(b"12345");
        assert_eq!(collect(&mut endless), Ok(vec![]));
        endless.push(b"6789");
        assert!(
            collect(&mut endless).is_err(),
            "an unfinished line past the cap"
        );
    }

    #[test]
    fn each_byte_is_scanned_once_however_it_arrives() {
        let max = 1 << 20;
        let mut lines = Lines::new(max);
        // A line arriving one byte per frame: a rescan of the buffer per frame would examine
        // n²/2 bytes.
        let n = 100_000;
        for _ in 0..n {
            lines.push(b"x");
            assert_eq!(lines.next_line(), Ok(None));
        }
        lines.push(b"\n");
        assert_eq!(lines.next_line().map(|l| l.map(<[u8]>::len)), Ok(Some(n)));
        assert_eq!(lines.examined, n as u64 + 1);
    }

    #[test]
    fn reopening_backs_off_exponentially_to_a_ceiling() {
        let (first, max) = (Duration::from_millis(250), Duration::from_secs(30));
        let waits: Vec<u64> = (1..=10)
            .map(|n| reconnect_delay(first, max, n).as_millis() as u64)
            .collect();
        assert_eq!(
            waits,
            [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(reconnect_delay(first, max, u32::MAX), max);
        assert_eq!(reconnect_delay(first, max, 0), first);
        // A ceiling below the first wait does not make it shorter.
        assert_eq!(reconnect_delay(first, Duration::ZERO, 3), first);
    }
}
