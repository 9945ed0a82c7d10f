//! A worker's health as a pure state machine (time passed in), fed by two independent sources:
//! its `/metrics` polls and the real requests sent to it (passive health, Envoy's outlier
//! detection). Each source keeps its own count of failures in a row, so a worker that answers
//! its polls but fails (or hangs on) every request is still ejected. An ejected worker comes
//! back on probation: one probe request at a time until one succeeds; a failed probe ejects it
//! again, for longer each time in a row.

use std::time::{Duration, Instant};

/// Passive health settings (`outlier:` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierSettings {
    /// Failed requests in a row that eject a worker.
    pub eject_after: u32,
    /// How long a first ejection lasts; the n-th in a row lasts n times as long.
    pub base_ejection: Duration,
    /// Longest one ejection lasts.
    pub max_ejection: Duration,
}

impl Default for OutlierSettings {
    fn default() -> Self {
        Self {
            eject_after: 5,
            base_ejection: Duration::from_secs(10),
            max_ejection: Duration::from_secs(300),
        }
    }
}

/// What a health event did to a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    /// Nothing changed.
    None,
    /// The worker was ejected just now.
    Ejected,
    /// The worker is back in service: on probation after a poll recovery (one probe request
    /// first), or with its full share after a probe succeeded.
    Readmitted,
}

/// Where a worker stands for routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Full share of the traffic.
    InService,
    /// Back from an ejection: one probe request at a time until one succeeds.
    Probation,
    /// No traffic.
    Ejected,
}

/// One worker's health.
#[derive(Debug, Default)]
pub struct Outlier {
    /// Failed requests in a row (reset only by a successful request).
    failures: u32,
    /// Failed polls in a row (reset only by a good poll).
    poll_failures: u32,
    /// Good polls in a row while the polls say it is down.
    poll_successes: u32,
    /// The polls say the worker is down: it stays ejected until enough good polls.
    poll_down: bool,
    /// Ejected: no traffic until `until` has passed (a passive ejection) and the polls are good.
    ejected: bool,
    until: Option<Instant>,
    /// Serving probes after an ejection.
    probation: bool,
    probe_in_flight: bool,
    /// Ejections in a row: the multiplier of the next ejection's length.
    streak: u32,
    /// When the last probe succeeded; a worker in service for `max_ejection` since starts its
    /// streak over.
    readmitted_at: Option<Instant>,
}

impl Outlier {
    /// The phase at `now` (an ejection whose time is up turns into probation here).
    pub fn phase(&mut self, now: Instant) -> Phase {
        if self.ejected {
            if self.poll_down || self.until.is_some_and(|t| now < t) {
                return Phase::Ejected;
            }
            self.ejected = false;
            self.until = None;
            self.probation = true;
            self.probe_in_flight = false;
        }
        if self.probation {
            Phase::Probation
        } else {
            Phase::InService
        }
    }

    /// Whether routing may pick the worker at `now`: in service, or on probation with no probe
    /// in flight.
    pub fn routable(&mut self, now: Instant) -> bool {
        match self.phase(now) {
            Phase::InService => true,
            Phase::Probation => !self.probe_in_flight,
            Phase::Ejected => false,
        }
    }

    /// Whether the worker is in service at full share with no failure pending (the state the
    /// hot path can skip the lock in).
    pub fn clean(&self) -> bool {
        !self.ejected && !self.probation && self.failures == 0
    }

    /// A request wants the worker at `now`: `Some(false)` for an ordinary request, `Some(true)`
    /// for the probe (the one allowed in flight on probation), `None` when it may not go.
    pub fn admit(&mut self, now: Instant) -> Option<bool> {
        match self.phase(now) {
            Phase::InService => Some(false),
            Phase::Probation if !self.probe_in_flight => {
                self.probe_in_flight = true;
                Some(true)
            }
            Phase::Probation | Phase::Ejected => None,
        }
    }

    /// A request (`probe` or not) succeeded at `now`.
    pub fn request_succeeded(&mut self, probe: bool, now: Instant) -> HealthChange {
        self.failures = 0;
        if !probe {
            return HealthChange::None;
        }
        self.probe_in_flight = false;
        if !self.probation {
            return HealthChange::None;
        }
        self.probation = false;
        self.readmitted_at = Some(now);
        HealthChange::Readmitted
    }

    /// A request (`probe` or not) failed at `now`: a failed probe ejects at once, other
    /// failures after `s.eject_after` in a row.
    pub fn request_failed(
        &mut self,
        probe: bool,
        now: Instant,
        s: &OutlierSettings,
    ) -> HealthChange {
        if probe {
            self.probe_in_flight = false;
            if self.probation {
                self.eject(now, Some(s));
                return HealthChange::Ejected;
            }
            return HealthChange::None;
        }
        self.failures = self.failures.saturating_add(1);
        // Requests sent before an ejection that end after it say nothing new.
        if self.phase(now) == Phase::InService && self.failures >= s.eject_after.max(1) {
            self.eject(now, Some(s));
            return HealthChange::Ejected;
        }
        HealthChange::None
    }

    /// The probe ended without a verdict (its client went away): the next request probes.
    pub fn probe_abandoned(&mut self) {
        self.probe_in_flight = false;
    }

    /// A poll failed: ejects after `eject_after` in a row, until `readmit_after` good polls.
    pub fn poll_failed(&mut self, eject_after: u32, now: Instant) -> HealthChange {
        self.poll_successes = 0;
        self.poll_failures = self.poll_failures.saturating_add(1);
        if self.poll_down || self.poll_failures < eject_after.max(1) {
            return HealthChange::None;
        }
        self.poll_down = true;
        if self.phase(now) == Phase::Ejected {
            return HealthChange::None;
        }
        self.eject(now, None);
        HealthChange::Ejected
    }

    /// A poll succeeded: after `readmit_after` in a row the polls no longer hold the worker out;
    /// `Readmitted` when that puts it on probation now.
    pub fn poll_succeeded(&mut self, readmit_after: u32, now: Instant) -> HealthChange {
        self.poll_failures = 0;
        if !self.poll_down {
            return HealthChange::None;
        }
        self.poll_successes = self.poll_successes.saturating_add(1);
        if self.poll_successes < readmit_after.max(1) {
            return HealthChange::None;
        }
        self.poll_down = false;
        self.poll_successes = 0;
        match self.phase(now) {
            Phase::Probation => HealthChange::Readmitted,
            Phase::InService | Phase::Ejected => HealthChange::None,
        }
    }

    /// Ejects at `now`: for the streak's length when `timed` (passive), else until the polls
    /// recover.
    fn eject(&mut self, now: Instant, timed: Option<&OutlierSettings>) {
        if let (Some(s), Some(back)) = (timed, self.readmitted_at)
            && now.saturating_duration_since(back) >= s.max_ejection
        {
            self.streak = 0;
        }
        self.streak = self.streak.saturating_add(1);
        self.ejected = true;
        self.probation = false;
        self.probe_in_flight = false;
        self.failures = 0;
        self.until = timed.map(|s| now + ejection_time(s, self.streak));
    }
}

/// The length of the `streak`-th ejection in a row: base × streak, capped.
pub fn ejection_time(s: &OutlierSettings, streak: u32) -> Duration {
    s.base_ejection
        .checked_mul(streak.max(1))
        .map_or(s.max_ejection, |d| d.min(s.max_ejection))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: OutlierSettings = OutlierSettings {
        eject_after: 3,
        base_ejection: Duration::from_secs(10),
        max_ejection: Duration::from_secs(25),
    };

    fn secs(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    #[test]
    fn failed_requests_eject_and_good_polls_do_not_reset_them() {
        let t0 = Instant::now();
        let mut o = Outlier::default();
        assert_eq!(o.request_failed(false, t0, &S), HealthChange::None);
        assert_eq!(o.poll_succeeded(2, t0), HealthChange::None);
        assert_eq!(o.request_failed(false, t0, &S), HealthChange::None);
        assert_eq!(o.poll_succeeded(2, t0), HealthChange::None);
        assert_eq!(o.request_failed(false, t0, &S), HealthChange::Ejected);
        assert!(!o.routable(t0));
        assert_eq!(o.admit(secs(t0, 9)), None);
        // Late failures of requests sent before the ejection change nothing.
        assert_eq!(o.request_failed(false, t0, &S), HealthChange::None);
    }

    #[test]
    fn a_successful_request_resets_the_count() {
        let t0 = Instant::now();
        let mut o = Outlier::default();
        o.request_failed(false, t0, &S);
        o.request_failed(false, t0, &S);
        assert!(!o.clean());
        o.request_succeeded(false, t0);
        assert!(o.clean());
        o.request_failed(false, t0, &S);
        assert_eq!(o.request_failed(false, t0, &S), HealthChange::None);
        assert_eq!(o.phase(t0), Phase::InService);
    }

    #[test]
    fn readmission_is_one_probe_then_the_full_share() {
        let t0 = Instant::now();
        let mut o = Outlier::default();
        for _ in 0..3 {
            o.request_failed(false, t0, &S);
        }
        let t = secs(t0, 10);
        assert_eq!(o.phase(t), Phase::Probation);
        assert!(o.routable(t));
        assert_eq!(o.admit(t), Some(true), "the first request is the probe");
        assert!(!o.routable(t), "only one probe in flight");
        assert_eq!(o.admit(t), None);
        assert_eq!(o.request_succeeded(true, t), HealthChange::Readmitted);
        assert_eq!(o.phase(t), Phase::InService);
        assert_eq!(o.admit(t), Some(false));
        assert_eq!(o.admit(t), Some(false));
    }

    #[test]
    fn an_abandoned_probe_frees_the_slot() {
        let t0 = Instant::now();
        let mut o = Outlier::default();
        for _ in 0..3 {
            o.request_failed(false, t0, &S);
        }
        let t = secs(t0, 10);
        assert_eq!(o.admit(t), Some(true));
        o.probe_abandoned();
        assert_eq!(o.admit(t), Some(true));
    }

    #[test]
    fn a_failed_probe_ejects_again_for_longer_up_to_the_cap() {
        let t0 = Instant::now();
        let mut o = Outlier::default();
        for _ in 0..3 {
            o.request_failed(false, t0, &S);
        }
        // 10 s, then 20 s, then capped at 25 s.
        let t1 = secs(t0, 10);
        assert_eq!(o.admit(t1), Some(true));
        assert_eq!(o.request_failed(true, t1, &S), HealthChange::Ejected);
        assert_eq!(o.phase(secs(t1, 19)), Phase::Ejected);
        let t2 = secs(t1, 20);
        assert_eq!(o.admit(t2), Some(true));
        assert_eq!(o.request_failed(true, t2, &S), HealthChange::Ejected);
        assert_eq!(o.phase(secs(t2, 24)), Phase::Ejected);
        let t3 = secs(t2, 25);
        assert_eq!(o.phase(t3), Phase::Probation);
        assert_eq!(o.admit(t3), Some(true));
        assert_eq!(o.request_succeeded(true, t3), HealthChange::Readmitted);
        // In service for the cap's length: the next ejection starts from the base again.
        let t4 = secs(t3, 25);
        for _ in 0..3 {
            o.request_failed(false, t4, &S);
        }
        assert_eq!(o.phase(secs(t4, 9)), Phase::Ejected);
        assert_eq!(o.phase(secs(t4, 10)), Phase::Probation);
    }

    #[test]
    fn poll_ejection_lasts_until_the_polls_recover_then_probes() {
        let t0 = Instant::now();
        let mut o = Outlier::default();
        assert_eq!(o.poll_failed(2, t0), HealthChange::None);
        assert_eq!(o.poll_failed(2, t0), HealthChange::Ejected);
        assert_eq!(o.poll_failed(2, t0), HealthChange::None);
        // No timer: an hour later it is still out while the polls say so.
        let later = secs(t0, 3600);
        assert_eq!(o.phase(later), Phase::Ejected);
        assert_eq!(o.poll_succeeded(2, later), HealthChange::None);
        assert_eq!(o.poll_succeeded(2, later), HealthChange::Readmitted);
        assert_eq!(o.phase(later), Phase::Probation);
        assert_eq!(o.admit(later), Some(true));
        assert_eq!(o.request_succeeded(true, later), HealthChange::Readmitted);
        assert_eq!(o.phase(later), Phase::InService);
    }

    #[test]
    fn a_passive_ejection_is_not_ended_by_good_polls() {
        let t0 = Instant::now();
        let mut o = Outlier::default();
        for _ in 0..3 {
            o.request_failed(false, t0, &S);
        }
        for _ in 0..10 {
            assert_eq!(o.poll_succeeded(2, secs(t0, 1)), HealthChange::None);
        }
        assert_eq!(o.phase(secs(t0, 9)), Phase::Ejected);
        // Nor does a worker whose polls fail come back when its time is up.
        o.poll_failed(1, secs(t0, 5));
        assert_eq!(o.phase(secs(t0, 60)), Phase::Ejected);
        assert_eq!(o.poll_succeeded(1, secs(t0, 61)), HealthChange::Readmitted);
    }

    #[test]
    fn ejection_time_grows_and_is_capped() {
        assert_eq!(ejection_time(&S, 1), Duration::from_secs(10));
        assert_eq!(ejection_time(&S, 2), Duration::from_secs(20));
        assert_eq!(ejection_time(&S, 3), Duration::from_secs(25));
        assert_eq!(ejection_time(&S, u32::MAX), Duration::from_secs(25));
    }
}
