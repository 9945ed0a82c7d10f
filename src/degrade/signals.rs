//! The load signals degradation decides on, kept as a sliding window of timestamped samples:
//! queue depth, queue wait, mean KV-cache usage of the pool's workers, and TTFT at the gateway.
//! Memory is bounded: samples older than the retention are dropped as new ones arrive, and each
//! series keeps at most `MAX_SAMPLES` (the oldest go first).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Most samples kept per series; past it the oldest are dropped, shortening the window.
pub const MAX_SAMPLES: usize = 4096;

/// The signals over one window, computed each tick. `None`: no sample in the window, which
/// never enters a level and counts as below every exit threshold.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Signals {
    /// Largest queue depth sampled, in requests.
    pub queue_depth: Option<u64>,
    /// 95th percentile (nearest rank) of time spent queued.
    pub queue_wait_p95: Option<Duration>,
    /// Mean of the sampled pool-mean KV-cache usages, 0..=1.
    pub kv_usage: Option<f64>,
    /// 95th percentile (nearest rank) of time to first token.
    pub ttft_p95: Option<Duration>,
    /// Samples of all four series in the window together.
    pub samples: usize,
}

/// Recent samples of the four signals of one pool.
#[derive(Debug, Clone)]
pub struct SignalWindow {
    retain: Duration,
    queue: Series<u64>,
    queue_wait: Series<Duration>,
    kv: Series<f64>,
    ttft: Series<Duration>,
}

impl SignalWindow {
    /// An empty window keeping samples for `retain` (the policy's `window`).
    pub fn new(retain: Duration) -> Self {
        SignalWindow {
            retain,
            queue: Series::default(),
            queue_wait: Series::default(),
            kv: Series::default(),
            ttft: Series::default(),
        }
    }

    /// Changes how long samples are kept (after a policy reload).
    pub fn set_retain(&mut self, retain: Duration) {
        self.retain = retain;
    }

    /// Records the pool's queue depth (requests waiting) at `at`.
    pub fn record_queue(&mut self, depth: u64, at: Instant) {
        self.queue.push(at, depth, self.retain);
    }

    /// Records how long one request waited in the queue, at the time it left it.
    pub fn record_queue_wait(&mut self, wait: Duration, at: Instant) {
        self.queue_wait.push(at, wait, self.retain);
    }

    /// Records the mean KV-cache usage (0..=1) of the pool's workers at `at`.
    pub fn record_kv(&mut self, usage_mean: f64, at: Instant) {
        if usage_mean.is_finite() {
            self.kv.push(at, usage_mean.clamp(0.0, 1.0), self.retain);
        }
    }

    /// Records one request's time to first token, at the time the first token arrived.
    pub fn record_ttft(&mut self, ttft: Duration, at: Instant) {
        self.ttft.push(at, ttft, self.retain);
    }

    /// The signals over the samples no older than `window` at `now`.
    pub fn snapshot(&self, now: Instant, window: Duration) -> Signals {
        let depths: Vec<u64> = self.queue.within(now, window).collect();
        let waits: Vec<Duration> = self.queue_wait.within(now, window).collect();
        let kv: Vec<f64> = self.kv.within(now, window).collect();
        let ttfts: Vec<Duration> = self.ttft.within(now, window).collect();
        let samples = depths.len() + waits.len() + kv.len() + ttfts.len();
        let kv_usage = (!kv.is_empty()).then(|| kv.iter().sum::<f64>() / kv.len() as f64);
        Signals {
            queue_depth: depths.iter().copied().max(),
            queue_wait_p95: p95(waits),
            kv_usage,
            ttft_p95: p95(ttfts),
            samples,
        }
    }
}

/// One series of timestamped samples, oldest first.
#[derive(Debug, Clone)]
struct Series<T> {
    samples: VecDeque<(Instant, T)>,
}

impl<T> Default for Series<T> {
    fn default() -> Self {
        Series {
            samples: VecDeque::new(),
        }
    }
}

impl<T: Copy> Series<T> {
    /// Appends a sample, dropping those older than `retain` at `at` and any past the cap.
    fn push(&mut self, at: Instant, value: T, retain: Duration) {
        while let Some((oldest, _)) = self.samples.front()
            && at.saturating_duration_since(*oldest) > retain
        {
            self.samples.pop_front();
        }
        if self.samples.len() >= MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back((at, value));
    }

    /// Values of the samples at most `window` old at `now` (later ones included).
    fn within(&self, now: Instant, window: Duration) -> impl Iterator<Item = T> + '_ {
        self.samples
            .iter()
            .filter(move |(at, _)| now.saturating_duration_since(*at) <= window)
            .map(|(_, v)| *v)
    }
}

/// Nearest-rank 95th percentile: the smallest value with at least 95% of samples at or below it.
fn p95(mut values: Vec<Duration>) -> Option<Duration> {
    values.sort_unstable();
    let rank = (values.len() * 95).div_ceil(100);
    values.get(rank.checked_sub(1)?).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn p95_is_nearest_rank_on_a_hand_computed_set() {
        // 1..=20 ms: rank ceil(0.95 × 20) = 19 → 19 ms.
        let twenty: Vec<Duration> = (1..=20).rev().map(ms).collect();
        assert_eq!(p95(twenty), Some(ms(19)));
        // 1..=10 ms: rank ceil(9.5) = 10 → the maximum.
        assert_eq!(p95((1..=10).map(ms).collect()), Some(ms(10)));
        // 100 samples: rank 95.
        assert_eq!(p95((1..=100).map(ms).collect()), Some(ms(95)));
        assert_eq!(p95(vec![ms(7)]), Some(ms(7)));
        assert_eq!(p95(Vec::new()), None);
    }

    #[test]
    fn snapshot_summarises_each_series() {
        let t0 = Instant::now();
        let mut w = SignalWindow::new(Duration::from_secs(10));
        for (i, depth) in [3, 9, 4].into_iter().enumerate() {
            w.record_queue(depth, t0 + Duration::from_secs(i as u64));
        }
        w.record_kv(0.5, t0);
        w.record_kv(0.7, t0 + Duration::from_secs(1));
        for i in 1..=20 {
            w.record_queue_wait(ms(i * 100), t0 + Duration::from_secs(2));
            w.record_ttft(ms(i * 10), t0 + Duration::from_secs(2));
        }
        let s = w.snapshot(t0 + Duration::from_secs(3), Duration::from_secs(10));
        assert_eq!(s.queue_depth, Some(9));
        assert_eq!(s.queue_wait_p95, Some(ms(1900)));
        assert_eq!(s.ttft_p95, Some(ms(190)));
        let kv = s.kv_usage.unwrap_or_default();
        assert!((kv - 0.6).abs() < 1e-9, "{kv}");
        assert_eq!(s.samples, 3 + 2 + 20 + 20);
    }

    #[test]
    fn old_samples_leave_the_window_and_memory() {
        let t0 = Instant::now();
        let window = Duration::from_secs(10);
        let mut w = SignalWindow::new(window);
        w.record_queue(100, t0);
        w.record_ttft(ms(5000), t0);
        w.record_queue(2, t0 + Duration::from_secs(8));
        // At t0 + 11s the first depth is older than the window: only the later one counts.
        let s = w.snapshot(t0 + Duration::from_secs(11), window);
        assert_eq!(s.queue_depth, Some(2));
        assert_eq!(s.ttft_p95, None);
        assert_eq!(s.samples, 1);
        // A later sample drops the expired one from memory.
        w.record_queue(1, t0 + Duration::from_secs(12));
        assert_eq!(w.queue.samples.len(), 2);
        // Nothing in the window at all: every signal is absent.
        let empty = w.snapshot(t0 + Duration::from_secs(60), window);
        assert_eq!(empty, Signals::default());
    }

    #[test]
    fn each_series_is_capped() {
        let t0 = Instant::now();
        let mut w = SignalWindow::new(Duration::from_secs(3600));
        for i in 0..(MAX_SAMPLES as u64 + 10) {
            w.record_queue_wait(ms(i), t0);
        }
        assert_eq!(w.queue_wait.samples.len(), MAX_SAMPLES);
        assert_eq!(w.queue_wait.samples.front().map(|s| s.1), Some(ms(10)));
    }
}
