//! What the relay knows about a request's attempts on its workers: each attempt that failed
//! before any answer (which worker, when, why) and when the answering attempt began. The forward
//! loop notes them (a failed attempt only: a request answered at once allocates nothing) and
//! hands them to the account phase with the answer, where they become the trace line's
//! `attempts` and the OTLP export's client spans.

use std::time::Instant;

use crate::trace::{AttemptLine, millis};

/// An attempt that ended before any answer reached the client.
#[derive(Debug, Clone)]
pub struct FailedAttempt {
    /// The worker's URL.
    pub worker: String,
    /// When it was sent.
    pub began: Instant,
    /// When it was given up.
    pub ended: Instant,
    /// Why: `connect`, `send`, `first_byte_timeout`, `status_503` or `ejected`.
    pub error: &'static str,
}

/// The attempts of a request that a worker answered.
#[derive(Debug, Clone, Default)]
pub struct Attempts {
    /// Those that failed first, in order (each was retried on another worker).
    pub failed: Vec<FailedAttempt>,
    /// When the answering attempt was sent.
    pub answered: Option<Instant>,
}

impl Attempts {
    /// The attempts as trace-line entries, times from `started` (the request's arrival): the
    /// failed ones, then the answering one on `worker` with `status`, lasting until `ended`.
    pub fn lines(
        &self,
        started: Instant,
        (worker, status): (&str, u16),
        ended: Instant,
    ) -> Vec<AttemptLine> {
        let since = |t: Instant| millis(t.saturating_duration_since(started));
        let mut lines: Vec<AttemptLine> = self
            .failed
            .iter()
            .map(|a| AttemptLine {
                worker: a.worker.clone(),
                start_ms: since(a.began),
                ms: millis(a.ended.saturating_duration_since(a.began)),
                status: (a.error == "status_503").then_some(503),
                error: Some(a.error),
                retried: true,
            })
            .collect();
        if let Some(began) = self.answered {
            lines.push(AttemptLine {
                worker: worker.to_owned(),
                start_ms: since(began),
                ms: millis(ended.saturating_duration_since(began)),
                status: Some(status),
                error: None,
                retried: false,
            });
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn failed_attempts_come_first_then_the_answering_one() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let attempts = Attempts {
            failed: vec![
                FailedAttempt {
                    worker: "http://a".into(),
                    began: t0 + ms(1),
                    ended: t0 + ms(3),
                    error: "connect",
                },
                FailedAttempt {
                    worker: "http://b".into(),
                    began: t0 + ms(3),
                    ended: t0 + ms(4),
                    error: "status_503",
                },
            ],
            answered: Some(t0 + ms(4)),
        };
        let lines = attempts.lines(t0, ("http://c", 200), t0 + ms(10));
        assert_eq!(lines.len(), 3);
        assert_eq!(
            (lines[0].worker.as_str(), lines[0].start_ms, lines[0].ms),
            ("http://a", 1.0, 2.0)
        );
        assert_eq!((lines[0].status, lines[0].error), (None, Some("connect")));
        assert!(lines[0].retried && lines[1].retried && !lines[2].retried);
        assert_eq!(lines[1].status, Some(503));
        assert_eq!(
            (lines[2].worker.as_str(), lines[2].status, lines[2].ms),
            ("http://c", Some(200), 6.0)
        );
        assert!(
            Attempts::default().lines(t0, ("w", 200), t0).is_empty(),
            "nothing known: no attempts"
        );
    }
}
