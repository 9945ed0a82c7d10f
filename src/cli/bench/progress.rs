//! The progress line on stderr: requests sent, done, in flight and failed, once a second
//! (rewritten in place on a terminal, one line per second otherwise).

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

/// Counters updated by the request tasks.
#[derive(Debug, Default)]
pub struct Progress {
    sent: AtomicU64,
    done: AtomicU64,
    errors: AtomicU64,
    /// 401/403 answers before any success.
    refused_auth: AtomicU64,
    ok: AtomicU64,
    /// Set when the target refuses the credentials: the drivers stop sending.
    stop: AtomicBool,
}

/// 401/403 answers (and no success) after which a run stops: the credentials are wrong.
const AUTH_REFUSALS_TO_STOP: u64 = 3;

impl Progress {
    /// A request was sent.
    pub fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// A request finished with `status` (0: no answer); `ok` when it answered 2xx.
    pub fn done(&self, status: u16, ok: bool) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if ok {
            self.ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        if matches!(status, 401 | 403)
            && self.ok.load(Ordering::Relaxed) == 0
            && self.refused_auth.fetch_add(1, Ordering::Relaxed) + 1 >= AUTH_REFUSALS_TO_STOP
        {
            self.stop.store(true, Ordering::Relaxed);
        }
    }

    /// True once the target refused the credentials of the first requests.
    pub fn stopped_on_auth(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// `(sent, done, errors)` now.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.done.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }

    fn line(&self, elapsed: Duration, planned: Duration) -> String {
        let (sent, done, errors) = self.counts();
        format!(
            "[{:>3.0}s/{:.0}s] sent {sent} · done {done} · in flight {} · errors {errors}",
            elapsed.as_secs_f64(),
            planned.as_secs_f64(),
            sent.saturating_sub(done)
        )
    }
}

/// The task printing the progress line; [`Ticker::finish`] prints the last one and stops it.
pub struct Ticker {
    task: Option<JoinHandle<()>>,
    progress: Arc<Progress>,
    started: Instant,
    planned: Duration,
}

impl Ticker {
    /// Starts printing every second, or stays silent when `quiet`.
    pub fn start(progress: Arc<Progress>, planned: Duration, quiet: bool) -> Ticker {
        let started = Instant::now();
        let task = (!quiet).then(|| {
            let progress = progress.clone();
            tokio::spawn(async move {
                let tty = std::io::stderr().is_terminal();
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let line = progress.line(started.elapsed(), planned);
                    let mut err = std::io::stderr().lock();
                    let _ = if tty {
                        write!(err, "\r{line}\x1b[K")
                    } else {
                        writeln!(err, "{line}")
                    };
                    let _ = err.flush();
                }
            })
        });
        Ticker {
            task,
            progress,
            started,
            planned,
        }
    }

    /// Stops the ticker and prints the final counts.
    pub fn finish(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let line = self.progress.line(self.started.elapsed(), self.planned);
            let tty = std::io::stderr().is_terminal();
            eprintln!("{}{line}", if tty { "\r" } else { "" });
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
