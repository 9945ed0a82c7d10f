//! Precise mode: subscribes to a worker's `GET /kv/events` stream and feeds the residency it
//! reports into the pool's routing policy (protocol in `engine/README.md`).
//!
//! A worker that answers 404 has no events and keeps the approximate index; it is asked again
//! after a while. A stream that ends, errs or stays silent past the heartbeat timeout is marked
//! lost (what was learned stays, as a guess) and reopened on a later poll with a new snapshot.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper::body::Bytes;
use serde::Deserialize;

use crate::routing::Residency;
use crate::upstream::UpstreamClient;
use crate::workers::pool::PolicyHolder;
use crate::workers::state::{KvEventsState, WorkerState};

/// Longest line accepted (a snapshot of ~800k keys); a longer one ends the stream.
const MAX_LINE_BYTES: usize = 16 << 20;

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

/// Runs one subscription to `worker` until it ends, applying each event to the policy that
/// `current_policy` returns (the pool's policy of the live config), then sets the worker's state.
pub async fn subscribe(
    client: UpstreamClient,
    worker: Arc<WorkerState>,
    current_policy: impl Fn() -> Option<Arc<PolicyHolder>>,
    open_timeout: Duration,
    silence_timeout: Duration,
) -> Ended {
    let ended = run(
        &client,
        &worker,
        &current_policy,
        open_timeout,
        silence_timeout,
    )
    .await;
    match &ended {
        Ended::Unsupported => {
            tracing::info!(worker = %worker.url, "worker has no KV events: routing keeps its approximate index");
            worker.set_kv_events(KvEventsState::Unsupported);
        }
        Ended::Lost(why) => {
            if worker.kv_events() == KvEventsState::Live {
                tracing::warn!(worker = %worker.url, reason = %why, "KV event stream lost; reopening on a later poll");
            }
            if let Some(policy) = current_policy() {
                policy.policy.residency(worker.key, Residency::Lost);
            }
            worker.set_kv_events(KvEventsState::Idle);
        }
        Ended::PolicyReplaced => worker.set_kv_events(KvEventsState::Idle),
    }
    ended
}

async fn run(
    client: &UpstreamClient,
    worker: &WorkerState,
    current_policy: &impl Fn() -> Option<Arc<PolicyHolder>>,
    open_timeout: Duration,
    silence_timeout: Duration,
) -> Ended {
    let uri: hyper::Uri = match format!("{}/kv/events", worker.url).parse() {
        Ok(u) => u,
        Err(e) => return Ended::Lost(format!("bad worker URL: {e}")),
    };
    let req = match hyper::Request::get(uri).body(Full::new(Bytes::new())) {
        Ok(r) => r,
        Err(e) => return Ended::Lost(e.to_string()),
    };
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
    let mut buf: Vec<u8> = Vec::new();
    let mut snapshot_seen = false;
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
        buf.extend_from_slice(&data);
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let update = match parse_line(&line[..end]) {
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
        if buf.len() > MAX_LINE_BYTES {
            return Ended::Lost(format!("a line exceeds {MAX_LINE_BYTES} bytes"));
        }
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
}
