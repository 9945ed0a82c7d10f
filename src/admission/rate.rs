//! The observed completion rate behind honest `Retry-After` values.
//!
//! Refusals only happen while every slot is busy, and then permits are released at
//! `capacity / mean hold time` per second (Little's law). So the estimate is an EWMA of how long
//! permits are held, turned into releases per second for the current capacity. Unlike counting
//! releases per wall-clock second, it does not decay while the pool is idle, and it follows
//! `set_capacity` at once. Before any sample a prior of one second per request is assumed.

use std::time::Duration;

/// Assumed hold time before any permit has been released.
pub const PRIOR_HOLD: Duration = Duration::from_secs(1);
/// Weight of the newest sample in the moving average.
const ALPHA: f64 = 0.2;
/// Shortest `Retry-After` answered.
pub const MIN_RETRY: Duration = Duration::from_secs(1);
/// Longest `Retry-After` answered.
pub const MAX_RETRY: Duration = Duration::from_secs(60);

/// Moving average of permit hold times.
#[derive(Debug, Clone, Copy, Default)]
pub struct CompletionRate {
    mean_hold_s: Option<f64>,
}

impl CompletionRate {
    /// Records one permit release after holding it for `held`.
    pub fn record(&mut self, held: Duration) {
        let sample = held.as_secs_f64();
        self.mean_hold_s = Some(match self.mean_hold_s {
            Some(mean) => mean + ALPHA * (sample - mean),
            None => sample,
        });
    }

    /// Mean hold time so far (the prior before any sample).
    pub fn mean_hold(&self) -> Duration {
        self.mean_hold_s.map_or(PRIOR_HOLD, Duration::from_secs_f64)
    }

    /// Permit releases per second while all `capacity` slots are busy.
    pub fn per_second(&self, capacity: usize) -> f64 {
        let hold = self.mean_hold().as_secs_f64().max(1e-3);
        capacity.max(1) as f64 / hold
    }

    /// Expected wait for the request at `position` (0 = next): `(position + 1) / rate`, clamped
    /// to [`MIN_RETRY`, `MAX_RETRY`].
    pub fn retry_after(&self, position: usize, capacity: usize) -> Duration {
        clamp_retry(self.expected_wait(position, capacity))
    }

    /// Expected wait for the request at `position`, unclamped (what a deadline is checked
    /// against): `(position + 1) / rate`.
    pub fn expected_wait(&self, position: usize, capacity: usize) -> Duration {
        let secs = (position as f64 + 1.0) / self.per_second(capacity);
        Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
    }
}

/// `wait` as a `Retry-After`: within [`MIN_RETRY`, `MAX_RETRY`].
pub fn clamp_retry(wait: Duration) -> Duration {
    wait.clamp(MIN_RETRY, MAX_RETRY)
}

#[cfg(test)]
mod deadline_tests {
    use super::*;

    #[test]
    fn the_expected_wait_is_not_clamped() {
        let mut r = CompletionRate::default();
        r.record(Duration::from_millis(100));
        // 10 slots each freed every 100 ms: the 5th in line goes after 50 ms.
        assert_eq!(r.expected_wait(4, 10), Duration::from_millis(50));
        assert_eq!(r.retry_after(4, 10), MIN_RETRY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prior_before_any_sample() {
        let r = CompletionRate::default();
        assert_eq!(r.mean_hold(), PRIOR_HOLD);
        assert_eq!(r.per_second(4), 4.0);
        assert_eq!(r.retry_after(9, 4), Duration::from_millis(2500));
    }

    #[test]
    fn follows_observed_hold_times_and_capacity() {
        let mut r = CompletionRate::default();
        r.record(Duration::from_secs(2));
        assert_eq!(r.per_second(4), 2.0);
        assert_eq!(r.retry_after(9, 4), Duration::from_secs(5));
        assert_eq!(r.retry_after(9, 8), Duration::from_millis(2500));
        r.record(Duration::from_secs(7)); // 2 + 0.2 * 5 = 3 s
        assert_eq!(r.mean_hold(), Duration::from_secs(3));
    }

    #[test]
    fn clamped_to_one_and_sixty_seconds() {
        let mut r = CompletionRate::default();
        r.record(Duration::from_millis(10));
        assert_eq!(r.retry_after(0, 4), MIN_RETRY);
        r.record(Duration::from_secs(10_000));
        assert_eq!(r.retry_after(100, 1), MAX_RETRY);
        assert_eq!(r.retry_after(0, 0), MAX_RETRY); // no capacity counts as one slot
    }
}
