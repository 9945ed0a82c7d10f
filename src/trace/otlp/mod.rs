//! OpenTelemetry export of the flight records (`trace.otlp` in the config): each relayed
//! request's [`TraceLine`] becomes a SERVER span with a CLIENT span per attempt ([`span`]),
//! posted to an OTLP/HTTP collector in OTLP's JSON encoding (no protobuf code needed).
//!
//! The request path only pushes its line onto a bounded queue ([`queue::Batcher`]) and goes on;
//! a full queue drops the line (counted). One thread of its own, with its own small runtime,
//! takes batches off the queue (by size, or by age), maps them to spans and exports them with a
//! timeout per export ([`export`]), so a dead or hung collector never slows a request: at worst
//! the queue fills and spans are dropped. `infergate_otlp_spans_total{result}` counts spans
//! exported, dropped (queue full) and failed (the collector refused them, did not answer in
//! time, or rejected them in a partial success).

mod export;
pub mod queue;
pub mod span;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use prometheus::IntCounterVec;

use super::TraceLine;
use queue::Batcher;

/// Default time allowed for one export (the OpenTelemetry SDKs' default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default records queued before new ones are dropped (the SDKs' `maxQueueSize`).
pub const DEFAULT_MAX_QUEUE: usize = 2048;
/// Default records per export (the SDKs' `maxExportBatchSize`).
pub const DEFAULT_BATCH: usize = 512;
/// Default longest wait of a record before a partial batch goes (the SDKs' `scheduledDelay`).
pub const DEFAULT_BATCH_DELAY: Duration = Duration::from_secs(5);

/// `trace.otlp` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpConfig {
    /// The collector's traces URL, e.g. `http://127.0.0.1:4318/v1/traces` (plain HTTP).
    pub endpoint: String,
    /// Extra request headers (e.g. a collector's auth), names lower-case.
    pub headers: Vec<(String, String)>,
    /// Share of requests exported, 0 to 1 (by a hash of the request id, as the file's).
    pub sample: f64,
    /// Time allowed for one export, connect to answer.
    pub timeout: Duration,
    /// Records (requests) queued at most.
    pub max_queue: usize,
    /// Records per export at most.
    pub batch: usize,
    /// Longest wait of a queued record before a partial batch goes.
    pub batch_delay: Duration,
}

/// What the request path and the export thread share.
struct Shared {
    queue: Mutex<Batcher<TraceLine>>,
    wake: tokio::sync::Notify,
    closed: AtomicBool,
    batch: usize,
}

/// The sampled, bounded, non-blocking OTLP exporter.
pub struct OtlpExporter {
    shared: Arc<Shared>,
    sample: f64,
    /// `infergate_otlp_spans_total{result}`.
    spans: IntCounterVec,
}

impl OtlpExporter {
    /// Starts the export thread for `config`; `spans` counts what became of each span.
    pub fn start(config: &OtlpConfig, spans: IntCounterVec) -> Result<Arc<Self>, String> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Batcher::new(
                config.max_queue,
                config.batch,
                config.batch_delay,
            )),
            wake: tokio::sync::Notify::new(),
            closed: AtomicBool::new(false),
            batch: config.batch.max(1),
        });
        // A runtime of its own: a hung collector holds none of the gateway's threads.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp-export")
            .enable_all()
            .build()
            .map_err(|e| format!("trace.otlp: cannot start the exporter: {e}"))?;
        let (thread_shared, thread_config, counts) =
            (shared.clone(), config.clone(), spans.clone());
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || runtime.block_on(run(&thread_shared, &thread_config, &counts)))
            .map_err(|e| format!("trace.otlp: cannot start the exporter thread: {e}"))?;
        Ok(Arc::new(Self {
            shared,
            sample: config.sample,
            spans,
        }))
    }

    /// True when the request `request_id` is in the exported share.
    pub fn sampled(&self, request_id: &str) -> bool {
        super::sampled(request_id, self.sample)
    }

    /// Queues `line` without waiting; dropped (its spans counted) when the queue is full.
    pub fn push(&self, line: TraceLine) {
        let count = span::span_count(&line);
        let len = match self.shared.queue.lock() {
            Ok(mut q) => match q.push(line, Instant::now()) {
                Ok(()) => q.len(),
                Err(_) => 0,
            },
            Err(_) => 0,
        };
        if len == 0 {
            self.spans.with_label_values(&["dropped"]).inc_by(count);
            return;
        }
        // The exporter needs waking only to start a batch's delay or when a batch is full.
        if len == 1 || len >= self.shared.batch {
            self.shared.wake.notify_one();
        }
    }
}

impl Drop for OtlpExporter {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

/// The export loop: waits for a due batch, exports it, counts it; on close, flushes what is
/// queued and ends.
async fn run(shared: &Shared, config: &OtlpConfig, spans: &IntCounterVec) {
    let client = crate::upstream::client(config.timeout);
    let mut ids = span::Ids::default();
    // Failures are logged when they begin and when they end, not once per batch.
    let mut failing = false;
    loop {
        let closed = shared.closed.load(Ordering::Acquire);
        let (batch, wait) = {
            let Ok(mut q) = shared.queue.lock() else {
                return;
            };
            let now = Instant::now();
            let batch = if closed { q.take() } else { q.take_due(now) };
            (batch, q.due_in(now))
        };
        if batch.is_empty() {
            if closed {
                return;
            }
            match wait {
                Some(wait) => {
                    tokio::select! {
                        () = shared.wake.notified() => {}
                        () = tokio::time::sleep(wait) => {}
                    }
                }
                None => shared.wake.notified().await,
            }
            continue;
        }
        let count: u64 = batch.iter().map(span::span_count).sum();
        let body = span::export_request(&batch, &mut ids);
        drop(batch);
        let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        match export::export(&client, config, body).await {
            export::Sent::Exported { rejected } => {
                let rejected = rejected.min(count);
                spans
                    .with_label_values(&["exported"])
                    .inc_by(count - rejected);
                if rejected > 0 {
                    spans.with_label_values(&["failed"]).inc_by(rejected);
                }
                if failing {
                    tracing::info!("trace.otlp: exporting to {} again", config.endpoint);
                    failing = false;
                }
            }
            export::Sent::Failed(why) => {
                spans.with_label_values(&["failed"]).inc_by(count);
                if !failing {
                    tracing::warn!(
                        "trace.otlp: export to {} failed ({why}); spans are dropped until it works",
                        config.endpoint
                    );
                    failing = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Opts;

    fn counter() -> IntCounterVec {
        IntCounterVec::new(Opts::new("t", "t"), &["result"]).unwrap()
    }

    fn config(endpoint: String) -> OtlpConfig {
        OtlpConfig {
            endpoint,
            headers: vec![("x-key".into(), "k".into())],
            sample: 1.0,
            timeout: Duration::from_millis(200),
            max_queue: 2,
            batch: 1,
            batch_delay: Duration::from_millis(10),
        }
    }

    fn line(attempts: usize) -> TraceLine {
        TraceLine {
            request_id: "r".into(),
            attempts: vec![super::super::AttemptLine::default(); attempts],
            ..TraceLine::default()
        }
    }

    /// A collector that accepts connections and never answers.
    fn hung() -> (std::net::TcpListener, String) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/traces", l.local_addr().unwrap());
        (l, url)
    }

    #[test]
    fn a_hung_collector_fails_exports_and_a_full_queue_drops_without_waiting() {
        let (_listener, url) = hung();
        let spans = counter();
        let exporter = OtlpExporter::start(&config(url), spans.clone()).unwrap();
        let began = Instant::now();
        for _ in 0..50 {
            exporter.push(line(1));
        }
        assert!(
            began.elapsed() < Duration::from_millis(100),
            "pushes never wait: {:?}",
            began.elapsed()
        );
        let dropped = spans.with_label_values(&["dropped"]).get();
        // At most one record in the export and two queued are kept: the rest dropped, two
        // spans each.
        assert!(dropped >= 2 * 47, "{dropped}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while spans.with_label_values(&["failed"]).get() == 0 {
            assert!(Instant::now() < deadline, "the export never timed out");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(spans.with_label_values(&["exported"]).get(), 0);
    }

    #[test]
    fn sampling_follows_the_share() {
        let mut c = config("http://127.0.0.1:9/v1/traces".into());
        c.sample = 0.0;
        let e = OtlpExporter::start(&c, counter()).unwrap();
        assert!(!e.sampled("any"));
    }
}
