//! Time source of the engine: the real clock when serving, a virtual one in the offline simulator.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Seconds since the clock's epoch, and a way to wait until a later time.
pub trait Clock: Send + Sync {
    /// Current time in seconds since this clock started.
    fn now(&self) -> f64;
    /// Returns once `now() >= t`: sleeps on the real clock, jumps on a virtual one.
    fn sleep_until(&self, t: f64);
}

/// Wall-clock time; `sleep_until` blocks the calling thread (the engine's own, never the reactor).
#[derive(Debug)]
pub struct RealClock {
    start: Instant,
    /// Wall seconds per clock second: 1 serves in real time; 10 runs a sim engine ten times
    /// slower, so a small machine can carry its token rate live (`--sim-slowdown`).
    slowdown: f64,
}

impl RealClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        Self::slowed(1.0)
    }

    /// A clock whose seconds each last `slowdown` wall seconds (finite and > 0, else 1).
    pub fn slowed(slowdown: f64) -> Self {
        Self {
            start: Instant::now(),
            slowdown: if slowdown.is_finite() && slowdown > 0.0 {
                slowdown
            } else {
                1.0
            },
        }
    }
}

impl Default for RealClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for RealClock {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64() / self.slowdown
    }

    fn sleep_until(&self, t: f64) {
        let now = self.now();
        if t > now {
            std::thread::sleep(Duration::from_secs_f64((t - now) * self.slowdown));
        }
    }
}

/// Simulated time that only moves when told to; steps cost no wall time.
#[derive(Debug, Default)]
pub struct VirtualClock {
    now: Mutex<f64>,
}

impl VirtualClock {
    /// A virtual clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward to `t` (never backwards).
    pub fn advance_to(&self, t: f64) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        if t > *now {
            *now = t;
        }
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> f64 {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sleep_until(&self, t: f64) {
        self.advance_to(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_jumps_and_never_goes_back() {
        let c = VirtualClock::new();
        assert_eq!(c.now(), 0.0);
        c.sleep_until(2.5);
        assert_eq!(c.now(), 2.5);
        c.advance_to(1.0);
        assert_eq!(c.now(), 2.5);
    }

    #[test]
    fn real_clock_sleeps_at_least_until_target() {
        let c = RealClock::new();
        let target = c.now() + 0.002;
        c.sleep_until(target);
        assert!(c.now() >= target);
    }

    #[test]
    fn a_slowed_clock_counts_a_second_per_slowdown_wall_seconds() {
        let c = RealClock::slowed(20.0);
        let wall = Instant::now();
        c.sleep_until(c.now() + 0.001);
        // One clock millisecond is at least twenty wall milliseconds.
        assert!(wall.elapsed() >= Duration::from_millis(20));
        assert!(c.now() < wall.elapsed().as_secs_f64());
        assert_eq!(RealClock::slowed(f64::NAN).slowdown, 1.0);
        assert_eq!(RealClock::slowed(0.0).slowdown, 1.0);
    }
}
