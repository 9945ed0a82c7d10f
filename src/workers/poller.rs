//! Polls one worker's `/metrics`: the load feeds routing, failures eject.
//!
//! What a worker sends here is read for the gateway itself, so it is bounded: the scrape stops at
//! `health.max_scrape_bytes` (a larger answer is never buffered whole) and within
//! `health.timeout`, and its values are checked by [`parse_load`]. Each failure is counted by
//! reason in `infergate_worker_poll_failures_total` and counts towards ejection.
//!
//! Engines that speak vLLM's names (vLLM and ours) also give their triage metrics (busy time,
//! batch size, preemptions, ITL…, see [`parse_triage`]), checked the same way and exported
//! again per pool and worker, so `infergate doctor` reads one `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;

use crate::metrics::GatewayMetrics;
use crate::upstream::UpstreamClient;
use crate::workers::engine_triage::{EngineTriage, parse_triage};
use crate::workers::load_metrics::{Dialect, EngineLoad, PollError, PollFailure, parse_load};
use crate::workers::pool::PoolRuntime;
use crate::workers::state::{HealthChange, Warmth, WorkerState};
use crate::workers::triage_export::TriageExport;

/// Health settings applied by a poll.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PollSettings {
    /// Time allowed for one scrape.
    pub timeout: Duration,
    /// Consecutive failures that eject.
    pub eject_after: u32,
    /// Consecutive successes that re-admit.
    pub readmit_after: u32,
    /// Largest scrape read, bytes.
    pub max_scrape_bytes: usize,
}

impl PollSettings {}

/// Scrapes one worker once and updates its state. A restart (new start time or KV size) or a
/// re-admission voids what routing learned about the worker's cache.
pub async fn poll_worker(
    client: &UpstreamClient,
    worker: &Arc<WorkerState>,
    pool_rt: &PoolRuntime,
    settings: PollSettings,
    (metrics, triage_export): (&GatewayMetrics, &TriageExport),
) {
    let pool = pool_rt.name.as_str();
    // Between polls is as good a time as any to close connections nobody used for a while.
    worker.conns.evict_idle(std::time::Instant::now());
    metrics
        .worker_polls
        .with_label_values(&[pool, worker.url.as_str()])
        .inc();
    if pool_rt.dialect.has_ready() {
        let ready = tokio::time::timeout(settings.timeout, ready(client, &worker.url)).await;
        match ready {
            Ok(Ok(false)) => {
                // Alive but warming up (or restarted and warming again): held out of routing,
                // neither a failure nor a success of the health machine.
                if worker.set_warmth(Warmth::Warming) {
                    tracing::info!(pool, worker = %worker.url, "worker warming up: no traffic until /ready");
                }
                metrics.observe_worker(pool, &worker.url, &worker.view());
                return;
            }
            Ok(Ok(true)) => {
                if worker.set_warmth(Warmth::Warm) {
                    tracing::info!(pool, worker = %worker.url, "worker warm: in rotation");
                }
            }
            // Down, slow, or an odd answer: the metrics poll below judges it, and ejection
            // (not warm-up) takes it out; when it comes back, this check runs first.
            Ok(Err(_)) | Err(_) => {}
        }
    }
    let outcome = poll_once(client, &worker.url, pool_rt, settings).await;
    let change = match outcome {
        Ok((load, triage)) => {
            if let Some(triage) = triage {
                triage_export.record(pool, &worker.url, triage);
            }
            if worker.record_load(load) {
                tracing::info!(pool, worker = %worker.url, "worker restarted: its prefix index entries are dropped");
                pool_rt.forget_worker(worker.key);
            }
            metrics.observe_worker(pool, &worker.url, &worker.view());
            worker.record_success(settings.readmit_after)
        }
        Err(e) => {
            metrics
                .poll_failures
                .with_label_values(&[pool, e.reason.as_str()])
                .inc();
            // A worker that answers but lies is worth a line at warn; one that is down says so
            // through its ejection.
            match e.reason {
                PollFailure::InvalidValue | PollFailure::TooLarge | PollFailure::NoMetrics => {
                    tracing::warn!(pool, worker = %worker.url, error = %e, "metrics poll rejected");
                }
                _ => tracing::debug!(pool, worker = %worker.url, error = %e, "metrics poll failed"),
            }
            worker.poll_failed_unpolled();
            worker.record_failure(settings.eject_after)
        }
    };
    match change {
        HealthChange::Ejected => {
            metrics.ejections.with_label_values(&[pool]).inc();
            tracing::warn!(pool, worker = %worker.url, "worker ejected after failed polls");
        }
        HealthChange::Readmitted => {
            tracing::info!(pool, worker = %worker.url, "worker re-admitted");
            pool_rt.forget_worker(worker.key);
        }
        HealthChange::None => {}
    }
    metrics.observe_worker(pool, &worker.url, &worker.view());
}

/// One bounded scrape, parsed and checked: the load, and the triage metrics of engines that
/// speak vLLM's names.
async fn poll_once(
    client: &UpstreamClient,
    base: &str,
    pool_rt: &PoolRuntime,
    settings: PollSettings,
) -> Result<(EngineLoad, Option<EngineTriage>), PollError> {
    let text = tokio::time::timeout(
        settings.timeout,
        scrape(client, base, settings.max_scrape_bytes),
    )
    .await
    .map_err(|_| {
        PollError::new(
            PollFailure::Timeout,
            format!("no full answer within {:?}", settings.timeout),
        )
    })??;
    let load = parse_load(&text, pool_rt.dialect)?;
    let triage = match pool_rt.dialect {
        Dialect::Vllm | Dialect::Infergate => Some(parse_triage(&text)?),
        Dialect::Sglang | Dialect::Tgi => None,
    };
    Ok((load, triage))
}

/// `GET {base}/ready` of our engine: false while it warms up (503), else true (200, or any
/// answer of a server without the endpoint).
async fn ready(client: &UpstreamClient, base: &str) -> Result<bool, PollError> {
    let connect = |e: String| PollError::new(PollFailure::Connect, e);
    let uri: hyper::Uri = format!("{base}/ready")
        .parse()
        .map_err(|e| connect(format!("bad worker URL {base}: {e}")))?;
    let req = hyper::Request::get(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|e| connect(e.to_string()))?;
    let res = client
        .request(req)
        .await
        .map_err(|e| connect(e.to_string()))?;
    // Only a 503 holds a worker out: a server without the endpoint (404, 405) is not ours,
    // and its health is the metrics poll's business.
    Ok(res.status() != hyper::StatusCode::SERVICE_UNAVAILABLE)
}

/// `GET {base}/metrics`, reading at most `max_bytes` of body: a declared or read length past it
/// stops there (the connection is dropped, not drained).
async fn scrape(
    client: &UpstreamClient,
    base: &str,
    max_bytes: usize,
) -> Result<String, PollError> {
    let connect = |e: String| PollError::new(PollFailure::Connect, e);
    let uri: hyper::Uri = format!("{base}/metrics")
        .parse()
        .map_err(|e| connect(format!("bad worker URL {base}: {e}")))?;
    let req = hyper::Request::get(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|e| connect(e.to_string()))?;
    let res = client
        .request(req)
        .await
        .map_err(|e| connect(e.to_string()))?;
    if !res.status().is_success() {
        return Err(PollError::new(
            PollFailure::Status,
            format!("/metrics answered {}", res.status()),
        ));
    }
    let declared = res
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = declared.filter(|&len| len > max_bytes as u64) {
        return Err(too_large(len, max_bytes));
    }
    let mut body = res.into_body();
    let mut buf: Vec<u8> = Vec::with_capacity(declared.map_or(0, |len| len as usize));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| PollError::new(PollFailure::Read, e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let len = buf.len() + data.len();
        if len > max_bytes {
            return Err(too_large(len as u64, max_bytes));
        }
        buf.extend_from_slice(&data);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn too_large(len: u64, max_bytes: usize) -> PollError {
    PollError::new(
        PollFailure::TooLarge,
        format!("scrape of {len}+ bytes passes health.max_scrape_bytes ({max_bytes})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-connection server answering `head` then `body_len` bytes of `#`, then closing.
    async fn serve_once(head: String, body_len: usize) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut req = [0u8; 1024];
            let _ = tcp.read(&mut req).await;
            let _ = tcp.write_all(head.as_bytes()).await;
            let chunk = vec![b'#'; 64 << 10];
            let mut left = body_len;
            while left > 0 {
                let n = left.min(chunk.len());
                if tcp.write_all(&chunk[..n]).await.is_err() {
                    return;
                }
                left -= n;
            }
        });
        url
    }

    fn client() -> UpstreamClient {
        crate::upstream::client(Duration::from_secs(1))
    }

    #[tokio::test]
    async fn a_scrape_within_the_cap_is_read_whole() {
        let url = serve_once(
            "HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n".into(),
            1000,
        )
        .await;
        assert_eq!(
            scrape(&client(), &url, 1000).await.map(|t| t.len()),
            Ok(1000)
        );
    }

    #[tokio::test]
    async fn a_declared_length_past_the_cap_is_refused_unread() {
        let url = serve_once(
            "HTTP/1.1 200 OK\r\ncontent-length: 50000000\r\n\r\n".into(),
            0,
        )
        .await;
        let err = scrape(&client(), &url, 1 << 20).await.unwrap_err();
        assert_eq!(err.reason, PollFailure::TooLarge);
    }

    #[tokio::test]
    async fn an_undeclared_body_past_the_cap_stops_being_read() {
        let url = serve_once(
            "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".into(),
            8 << 20,
        )
        .await;
        let err = scrape(&client(), &url, 1 << 20).await.unwrap_err();
        assert_eq!(err.reason, PollFailure::TooLarge);
        assert!(err.detail.contains("1048576"), "{err}");
    }

    #[tokio::test]
    async fn only_a_503_from_ready_means_warming() {
        for (head, warm) in [
            ("HTTP/1.1 503 X\r\ncontent-length: 0\r\n\r\n", false),
            ("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", true),
            ("HTTP/1.1 404 X\r\ncontent-length: 0\r\n\r\n", true),
        ] {
            let url = serve_once(head.into(), 0).await;
            assert_eq!(ready(&client(), &url).await, Ok(warm), "{head}");
        }
    }

    #[tokio::test]
    async fn a_bad_status_and_a_refused_connection_have_their_reasons() {
        let url = serve_once("HTTP/1.1 500 X\r\ncontent-length: 0\r\n\r\n".into(), 0).await;
        let err = scrape(&client(), &url, 1 << 20).await.unwrap_err();
        assert_eq!(err.reason, PollFailure::Status);
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let err = scrape(&client(), &closed, 1 << 20).await.unwrap_err();
        assert_eq!(err.reason, PollFailure::Connect);
    }
}
