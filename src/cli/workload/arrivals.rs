//! Open-loop arrival times: every arrival kind becomes a piecewise-constant rate schedule, sampled
//! as a non-homogeneous Poisson process (exponential gaps, restarted at each rate change, which
//! is exact because the process is memoryless).

use std::time::Duration;

use super::model::{Arrival, Trace};
use super::rng::Rng;

/// Rate changes over time: (start in seconds, requests/s), sorted; the last holds forever.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Schedule {
    segments: Vec<(f64, f64)>,
}

impl Schedule {
    /// The schedule of an open-loop arrival with an optional new mean rate; `None` for closed
    /// loops and traces, which have no rate schedule.
    pub(super) fn of(arrival: &Arrival, rate: Option<f64>) -> Option<Schedule> {
        let segments = match arrival {
            Arrival::Poisson { rate: r } => vec![(0.0, rate.unwrap_or(*r))],
            Arrival::Burst {
                rate: r,
                factor,
                start,
                length,
            } => {
                let base = rate.unwrap_or(*r);
                let from = start.as_secs_f64();
                vec![
                    (0.0, base),
                    (from, base * factor),
                    (from + length.as_secs_f64(), base),
                ]
            }
            Arrival::Stages(stages) => {
                let scale = rate.map_or(1.0, |r| r / mean_rate(stages).max(f64::MIN_POSITIVE));
                let mut at = 0.0;
                let mut out = Vec::new();
                for (r, d) in stages {
                    out.push((at, r * scale));
                    at += d.as_secs_f64();
                }
                out
            }
            Arrival::Closed { .. } | Arrival::Trace(_) => return None,
        };
        Some(Schedule { segments })
    }

    /// Arrival times in [0, end), from `rng`.
    pub(super) fn times(self, end: Duration, rng: Rng) -> Times {
        Times {
            schedule: self,
            segment: 0,
            t: 0.0,
            end: end.as_secs_f64(),
            rng,
        }
    }
}

/// The time-weighted mean rate of stages (0 when they last no time).
fn mean_rate(stages: &[(f64, Duration)]) -> f64 {
    let total: f64 = stages.iter().map(|(_, d)| d.as_secs_f64()).sum();
    let weighted: f64 = stages.iter().map(|(r, d)| r * d.as_secs_f64()).sum();
    if total > 0.0 { weighted / total } else { 0.0 }
}

/// How much to speed a trace up so it averages `rate` requests/s (1 when no rate is given).
pub(super) fn trace_speedup(trace: &Trace, rate: Option<f64>) -> f64 {
    let Some(rate) = rate else { return 1.0 };
    let span = trace.entries.last().map_or(0.0, |e| e.at.as_secs_f64());
    let recorded = trace.entries.len() as f64 / span.max(1e-3);
    rate / recorded
}

/// The arrival times of one schedule, in order.
#[derive(Debug, Clone)]
pub(super) struct Times {
    schedule: Schedule,
    segment: usize,
    t: f64,
    end: f64,
    rng: Rng,
}

impl Iterator for Times {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        loop {
            let (_, rate) = *self.schedule.segments.get(self.segment)?;
            let boundary = self
                .schedule
                .segments
                .get(self.segment + 1)
                .map_or(f64::INFINITY, |s| s.0);
            let next = if rate > 0.0 {
                self.t + self.rng.exponential(rate)
            } else {
                f64::INFINITY
            };
            if next >= boundary {
                // Restart at the rate change; an infinite boundary ends the loop below.
                self.t = boundary;
                self.segment += 1;
            } else {
                self.t = next;
            }
            if self.t >= self.end {
                self.segment = self.schedule.segments.len();
                return None;
            }
            if next < boundary {
                return Some(Duration::from_secs_f64(self.t));
            }
        }
    }
}
