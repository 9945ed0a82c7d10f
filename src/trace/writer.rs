//! The trace writer: the request path only serializes its line and pushes it onto a bounded
//! queue; one thread appends the queue to the [`RotatingFile`]. A full queue drops the line
//! (counted), so a slow disk never holds a request up.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use prometheus::IntCounterVec;

use super::TraceConfig;
use super::file::RotatingFile;

/// Lines the queue holds before it drops.
pub const QUEUE_LINES: usize = 16_384;

/// What the request path and the writer thread share.
struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

#[derive(Default)]
struct Queue {
    lines: VecDeque<String>,
    closed: bool,
}

/// The sampled, bounded, non-blocking writer of the trace file.
pub struct TraceWriter {
    shared: Arc<Shared>,
    sample: f64,
    capacity: usize,
    /// `infergate_trace_lines_total{result}`: written, dropped, failed, unsampled.
    lines: IntCounterVec,
}

impl TraceWriter {
    /// Opens `config.path` (an error names it) and starts the writer thread; `lines` counts
    /// what became of each line.
    pub fn start(config: &TraceConfig, lines: IntCounterVec) -> Result<Arc<Self>, String> {
        Self::with_capacity(config, lines, QUEUE_LINES)
    }

    fn with_capacity(
        config: &TraceConfig,
        lines: IntCounterVec,
        capacity: usize,
    ) -> Result<Arc<Self>, String> {
        let file = RotatingFile::open(&config.path, config.max_bytes, config.keep)
            .map_err(|e| format!("trace: cannot open {}: {e}", config.path.display()))?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        let thread_shared = shared.clone();
        let counts = lines.clone();
        std::thread::Builder::new()
            .name("trace-writer".into())
            .spawn(move || run(&thread_shared, file, &counts))
            .map_err(|e| format!("trace: cannot start the writer thread: {e}"))?;
        Ok(Arc::new(Self {
            shared,
            sample: config.sample,
            capacity,
            lines,
        }))
    }

    /// True when the request `request_id` is in the sampled share (the same id always is).
    pub fn sampled(&self, request_id: &str) -> bool {
        sampled(request_id, self.sample)
    }

    /// Queues `line` (one JSON object, no newline) without waiting; dropped when the queue is
    /// full.
    pub fn push(&self, line: String) {
        let Ok(mut q) = self.shared.queue.lock() else {
            self.lines.with_label_values(&["dropped"]).inc();
            return;
        };
        if q.lines.len() >= self.capacity {
            drop(q);
            self.lines.with_label_values(&["dropped"]).inc();
            return;
        }
        q.lines.push_back(line);
        drop(q);
        self.shared.wake.notify_one();
    }

    /// Counts a line left out by sampling.
    pub fn unsampled(&self) {
        self.lines.with_label_values(&["unsampled"]).inc();
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        if let Ok(mut q) = self.shared.queue.lock() {
            q.closed = true;
        }
        self.shared.wake.notify_one();
    }
}

/// True for the share `sample` (0 to 1) of request ids: a hash of the id, so a sampled request
/// stays sampled wherever it is decided.
pub fn sampled(request_id: &str, sample: f64) -> bool {
    if sample >= 1.0 {
        return true;
    }
    if sample <= 0.0 || sample.is_nan() {
        return false;
    }
    // FNV-1a, then the top 53 bits as a fraction in [0, 1).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in request_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 29;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 32;
    ((h >> 11) as f64 / (1u64 << 53) as f64) < sample
}

/// The writer thread: takes whatever is queued, appends it, flushes; ends when closed and
/// drained.
fn run(shared: &Shared, mut file: RotatingFile, lines: &IntCounterVec) {
    loop {
        let (batch, closed) = {
            let Ok(mut q) = shared.queue.lock() else {
                return;
            };
            while q.lines.is_empty() && !q.closed {
                q = match shared.wake.wait_timeout(q, Duration::from_secs(1)) {
                    Ok((q, _)) => q,
                    Err(_) => return,
                };
            }
            (std::mem::take(&mut q.lines), q.closed)
        };
        for line in &batch {
            let result = match file.write_line(line) {
                Ok(()) => "written",
                Err(e) => {
                    tracing::warn!("trace: cannot write a line: {e}");
                    "failed"
                }
            };
            lines.with_label_values(&[result]).inc();
        }
        if let Err(e) = file.flush() {
            tracing::warn!("trace: cannot flush: {e}");
        }
        if closed {
            return;
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

    #[test]
    fn sampling_keeps_about_the_share_and_the_same_ids() {
        let kept = (0..10_000)
            .filter(|i| sampled(&format!("req-{i}"), 0.25))
            .count();
        assert!((2_200..2_800).contains(&kept), "{kept} of 10000 at 0.25");
        assert!((0..100).all(|i| sampled(&format!("r{i}"), 1.0)));
        assert!((0..100).all(|i| !sampled(&format!("r{i}"), 0.0)));
        assert_eq!(sampled("abc", 0.5), sampled("abc", 0.5));
    }

    #[test]
    fn lines_are_written_and_a_full_queue_drops() {
        let dir = super::super::file::tests::scratch("writer");
        let config = TraceConfig {
            path: dir.join("trace.jsonl"),
            sample: 1.0,
            max_bytes: 1 << 20,
            keep: 1,
        };
        let lines = counter();
        let w = TraceWriter::with_capacity(&config, lines.clone(), 0).unwrap();
        w.push("{}".into());
        assert_eq!(lines.with_label_values(&["dropped"]).get(), 1);
        drop(w);
        let w = TraceWriter::with_capacity(&config, lines.clone(), 8).unwrap();
        w.push("{\"a\":1}".into());
        w.push("{\"a\":2}".into());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while lines.with_label_values(&["written"]).get() < 2 {
            assert!(std::time::Instant::now() < deadline, "lines not written");
            std::thread::sleep(Duration::from_millis(5));
        }
        let text = std::fs::read_to_string(&config.path).unwrap();
        assert_eq!(text, "{\"a\":1}\n{\"a\":2}\n");
    }

    #[test]
    fn an_unopenable_path_is_an_error_naming_it() {
        let dir = super::super::file::tests::scratch("unopenable");
        let config = TraceConfig {
            path: dir.clone(),
            sample: 1.0,
            max_bytes: 10,
            keep: 0,
        };
        let e = TraceWriter::start(&config, counter()).err().unwrap();
        assert!(e.contains("cannot open"), "{e}");
    }
}
