//! One export: POST the batch's JSON to the collector, the whole exchange (connect, send, read
//! the answer) bounded by the configured timeout. Only a 429 or a 503 is retried (OTLP/HTTP's
//! retryable answers), after the collector's `Retry-After` when it gives one in seconds, else
//! after an exponential backoff, at most [`MAX_RETRIES`] times; anything else is a failure and
//! the batch is dropped (counted), so a broken collector costs a bounded amount of work. A
//! collector that takes the batch but rejects some spans says so in its answer's
//! `partialSuccess.rejectedSpans`: those count as failed.

use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use hyper::{Request, StatusCode};

use super::OtlpConfig;
use crate::upstream::UpstreamClient;

/// Retries of one batch after a 429 or 503.
pub const MAX_RETRIES: u32 = 3;
/// First backoff; doubled each retry.
const BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait before a retry, whatever `Retry-After` asks.
const MAX_DELAY: Duration = Duration::from_secs(30);
/// Most bytes of a collector's answer read (OTLP answers are small; the rest is discarded).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// How an export ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// The collector took the batch, rejecting `rejected` of its spans.
    Exported {
        /// Spans the collector's `partialSuccess` says it rejected.
        rejected: u64,
    },
    /// Given up: the reason, for the log.
    Failed(String),
}

/// The wait before retry `tries + 1` of an answer with `status` (and its `Retry-After`), or
/// `None` when it is not retried.
pub fn retry_delay(status: u16, retry_after: Option<&str>, tries: u32) -> Option<Duration> {
    if !matches!(status, 429 | 503) || tries >= MAX_RETRIES {
        return None;
    }
    let asked = retry_after.and_then(|v| v.trim().parse::<u64>().ok());
    let wait = match asked {
        Some(secs) => Duration::from_secs(secs),
        None => BACKOFF.saturating_mul(1 << tries.min(16)),
    };
    Some(wait.min(MAX_DELAY))
}

/// Sends `body` (an `ExportTraceServiceRequest` in JSON) to the collector, retrying as above.
pub async fn export(client: &UpstreamClient, config: &OtlpConfig, body: Bytes) -> Sent {
    let mut tries = 0;
    loop {
        let answer = tokio::time::timeout(config.timeout, post(client, config, body.clone())).await;
        let (status, retry_after, body) = match answer {
            Err(_) => return Sent::Failed(format!("no answer within {:?}", config.timeout)),
            Ok(Err(e)) => return Sent::Failed(e),
            Ok(Ok(answer)) => answer,
        };
        if status.is_success() {
            return Sent::Exported {
                rejected: rejected_spans(&body),
            };
        }
        match retry_delay(status.as_u16(), retry_after.as_deref(), tries) {
            Some(wait) => {
                tokio::time::sleep(wait).await;
                tries += 1;
            }
            None => return Sent::Failed(format!("the collector answered {status}")),
        }
    }
}

/// The spans an OTLP answer says were rejected (`partialSuccess.rejectedSpans`, an int64 that
/// proto3 JSON may write as a string); 0 for an empty or unreadable answer.
pub fn rejected_spans(answer: &[u8]) -> u64 {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(answer) else {
        return 0;
    };
    let n = &v["partialSuccess"]["rejectedSpans"];
    n.as_u64()
        .or_else(|| n.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(0)
}

/// One POST: the answer's status, `Retry-After` and body (read bounded, which also frees the
/// connection for the next export).
async fn post(
    client: &UpstreamClient,
    config: &OtlpConfig,
    body: Bytes,
) -> Result<(StatusCode, Option<String>, Bytes), String> {
    let mut req = Request::post(config.endpoint.as_str())
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    for (name, value) in &config.headers {
        // Both were checked when the config was read.
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            req.headers_mut().insert(n, v);
        }
    }
    let res = client.request(req).await.map_err(|e| e.to_string())?;
    let status = res.status();
    let retry_after = res
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // A failure to read the answer changes nothing about the status.
    let answer = Limited::new(res.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Ok((status, retry_after, answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_429_and_503_are_retried_honouring_retry_after() {
        assert_eq!(retry_delay(429, None, 0), Some(BACKOFF));
        assert_eq!(retry_delay(503, None, 2), Some(BACKOFF * 4));
        assert_eq!(retry_delay(429, Some("2"), 0), Some(Duration::from_secs(2)));
        assert_eq!(retry_delay(503, Some(" 0 "), 1), Some(Duration::ZERO));
        assert_eq!(
            retry_delay(429, Some("86400"), 0),
            Some(MAX_DELAY),
            "capped"
        );
        assert_eq!(
            retry_delay(429, Some("Wed, 21 Oct 2026 07:28:00 GMT"), 1),
            Some(BACKOFF * 2),
            "a date: the backoff"
        );
        assert_eq!(retry_delay(429, Some("1"), MAX_RETRIES), None, "given up");
        for status in [400, 401, 404, 413, 500, 502, 504] {
            assert_eq!(retry_delay(status, Some("1"), 0), None, "{status}");
        }
    }

    #[test]
    fn a_partial_success_names_the_rejected_spans() {
        assert_eq!(rejected_spans(b"{}"), 0);
        assert_eq!(rejected_spans(b""), 0);
        assert_eq!(
            rejected_spans(br#"{"partialSuccess":{"rejectedSpans":"3","errorMessage":"x"}}"#),
            3
        );
        assert_eq!(
            rejected_spans(br#"{"partialSuccess":{"rejectedSpans":2}}"#),
            2
        );
        assert_eq!(rejected_spans(br#"{"partialSuccess":{}}"#), 0);
    }
}
