//! One analysis window's samples of one version: request and error counts, and bounded
//! reservoirs of time to first token and of each request's largest inter-token gap, from which
//! the p99s are read. Memory per version is bounded whatever the traffic.

use std::time::Duration;

use crate::quality::signals::{SIGNAL_NAMES, Signals};

/// Most latencies kept per metric and window; beyond it, reservoir sampling keeps a uniform
/// sample, enough for a p99 (about 80 values above it).
pub const RESERVOIR: usize = 8192;

/// One version's samples in the current window.
#[derive(Debug, Clone, Default)]
pub struct VersionWindow {
    /// Requests finished in the window.
    pub requests: u64,
    /// Of those, the ones that failed.
    pub errors: u64,
    /// Time to first token of the requests that report one.
    ttft: Reservoir,
    /// Largest inter-token gap of the requests that report one.
    itl: Reservoir,
    /// Answers scored for quality signals (a sample of the requests).
    pub quality_sampled: u64,
    /// Of those, how many raised each signal, in `quality::signals::SIGNAL_NAMES` order.
    pub quality_raised: [u64; SIGNAL_NAMES.len()],
}

impl VersionWindow {
    /// Adds one finished request.
    pub fn record(&mut self, ok: bool, ttft: Option<Duration>, max_itl: Option<Duration>) {
        self.requests += 1;
        if !ok {
            self.errors += 1;
        }
        if let Some(t) = ttft {
            self.ttft.push(t);
        }
        if let Some(t) = max_itl {
            self.itl.push(t);
        }
    }

    /// Adds one answer scored for quality signals.
    pub fn record_quality(&mut self, raised: &Signals) {
        self.quality_sampled += 1;
        for name in raised.names() {
            if let Some(i) = SIGNAL_NAMES.iter().position(|n| *n == name) {
                self.quality_raised[i] += 1;
            }
        }
    }

    /// Scored answers that raised `signal`, and scored answers.
    pub fn quality(&self, signal: &str) -> (u64, u64) {
        let raised = SIGNAL_NAMES
            .iter()
            .position(|n| *n == signal)
            .map_or(0, |i| self.quality_raised[i]);
        (raised, self.quality_sampled)
    }

    /// Failed share of the requests, 0..=1; 0 without requests.
    pub fn error_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.errors as f64 / self.requests as f64
        }
    }

    /// TTFT p99 and the number of TTFT samples it was taken over.
    pub fn ttft_p99(&self) -> (Option<Duration>, u64) {
        (self.ttft.p99(), self.ttft.seen)
    }

    /// Inter-token p99 and the number of samples it was taken over.
    pub fn itl_p99(&self) -> (Option<Duration>, u64) {
        (self.itl.p99(), self.itl.seen)
    }
}

/// A uniform sample of at most `RESERVOIR` values (Algorithm R with a fixed-seed generator, so
/// the same inputs give the same sample).
#[derive(Debug, Clone, Default)]
struct Reservoir {
    /// The kept values.
    values: Vec<Duration>,
    /// Values offered so far.
    seen: u64,
    /// SplitMix64 state.
    rng: u64,
}

impl Reservoir {
    /// Offers one value.
    fn push(&mut self, value: Duration) {
        self.seen += 1;
        if self.values.len() < RESERVOIR {
            self.values.push(value);
            return;
        }
        let slot = self.next() % self.seen;
        if let Some(kept) = usize::try_from(slot)
            .ok()
            .and_then(|i| self.values.get_mut(i))
        {
            *kept = value;
        }
    }

    /// Next SplitMix64 output.
    fn next(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Nearest-rank 99th percentile: the smallest kept value with at least 99% at or below it.
    fn p99(&self) -> Option<Duration> {
        let mut sorted = self.values.clone();
        sorted.sort_unstable();
        let rank = (sorted.len() * 99).div_ceil(100);
        sorted.get(rank.checked_sub(1)?).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn counts_and_error_rate() {
        let mut w = VersionWindow::default();
        assert_eq!(w.error_rate(), 0.0);
        for i in 0..200 {
            w.record(i % 10 != 0, Some(ms(10)), None);
        }
        assert_eq!((w.requests, w.errors), (200, 20));
        assert!((w.error_rate() - 0.1).abs() < 1e-12);
        assert_eq!(w.itl_p99(), (None, 0));
    }

    #[test]
    fn p99_is_nearest_rank() {
        let mut w = VersionWindow::default();
        for n in (1..=200).rev() {
            w.record(true, Some(ms(n)), Some(ms(n * 2)));
        }
        // 99% of 200 is 198: the 198th smallest value.
        assert_eq!(w.ttft_p99(), (Some(ms(198)), 200));
        assert_eq!(w.itl_p99(), (Some(ms(396)), 200));
        let mut one = VersionWindow::default();
        one.record(true, Some(ms(7)), None);
        assert_eq!(one.ttft_p99(), (Some(ms(7)), 1));
    }

    #[test]
    fn the_reservoir_stays_bounded_and_representative() {
        let mut w = VersionWindow::default();
        let n = RESERVOIR as u64 * 10;
        for i in 0..n {
            // 2% of requests are slow (1s), the rest fast (10ms): the p99 is a slow one.
            let t = if i % 50 == 0 { ms(1000) } else { ms(10) };
            w.record(true, Some(t), None);
        }
        assert_eq!(w.ttft.values.len(), RESERVOIR);
        assert_eq!(w.ttft_p99(), (Some(ms(1000)), n));
    }
}
