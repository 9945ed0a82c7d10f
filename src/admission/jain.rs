//! Jain's fairness index of a queue's tenants, measured where the queue decides: over the
//! weighted service given, in windows of [`WINDOW_STARTS`] started requests, among the tenants
//! backlogged for the whole window. A tenant that waited only part of the window got what it
//! asked for, not what the queue chose to give it, so it is left out; a window with fewer than
//! two such tenants has nothing to compare. 1 when the backlogged tenants got equal service,
//! towards 1/n as one takes the others' turns. First come and fair share are measured alike.
//!
//! A window opens at the first start after the queue was empty, so a flood is measured from
//! its beginning. Pure bookkeeping fed by the [`super::waitlist::Waitlist`]; the clock is the
//! count of requests started, so the simulator and the gateway measure the same thing the same
//! way.

use crate::fast_maps::NamesMap;
use std::collections::HashMap;
use std::sync::Arc;

/// Requests started per window: a few seconds of a saturated pool, enough turns for each of a
/// handful of backlogged tenants to have had several.
pub const WINDOW_STARTS: u64 = 64;

/// One closed window's figure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowIndex {
    /// Jain's index over the counted tenants' service.
    pub index: f64,
    /// Tenants backlogged for the whole window (the index counts them).
    pub tenants: usize,
}

/// What the meter has seen since it started.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct JainSummary {
    /// The last window that had two or more backlogged tenants.
    pub last: Option<WindowIndex>,
    /// Windows with two or more backlogged tenants.
    pub windows: u64,
    /// Mean index over those windows (1 when there were none).
    pub mean: f64,
    /// Least index over those windows (1 when there were none).
    pub min: f64,
}

/// A tenant with waiters: how many, and the start count when it became backlogged.
#[derive(Debug, Clone, Copy)]
struct Backlogged {
    waiters: usize,
    since: u64,
}

/// Windowed Jain's index over backlogged tenants; memory bounded by the tenants waiting and the
/// tenants served in one window.
#[derive(Debug, Default)]
pub struct JainMeter {
    /// Requests started so far (the meter's clock).
    starts: u64,
    /// `starts` when the current window opened.
    opened: u64,
    backlog: HashMap<Arc<str>, Backlogged>,
    /// Service given per tenant in the current window.
    served: NamesMap<Arc<str>, f64>,
    summary: JainSummary,
    sum: f64,
}

impl JainMeter {
    /// A waiter of `tenant` joined the queue.
    pub fn joined(&mut self, tenant: &Arc<str>) {
        let starts = self.starts;
        self.backlog
            .entry(Arc::clone(tenant))
            .or_insert(Backlogged {
                waiters: 0,
                since: starts,
            })
            .waiters += 1;
    }

    /// A waiter of `tenant` left the queue (started, refused, expired or gone).
    pub fn left(&mut self, tenant: &str) {
        if let Some(b) = self.backlog.get_mut(tenant) {
            b.waiters = b.waiters.saturating_sub(1);
            if b.waiters == 0 {
                self.backlog.remove(tenant);
            }
        }
    }

    /// A request of `tenant` started with `service` weighted tokens (call it before its waiter
    /// leaves, so a tenant whose last waiter starts the window's last request still counts).
    pub fn started(&mut self, tenant: &str, service: f64) {
        self.starts += 1;
        if self.backlog.is_empty() {
            // Nobody waits: nobody can be backlogged for this window. The next window opens
            // with the next wait, so a flood is measured from its first start. (Most requests
            // start so: nothing is recorded for them.)
            self.opened = self.starts;
            if !self.served.is_empty() {
                self.served.clear();
            }
            return;
        }
        self.add(tenant, service);
        if self.starts - self.opened >= WINDOW_STARTS {
            self.close();
        }
    }

    /// Corrects `tenant`'s service in the current window by `delta` (real usage known), when it
    /// started a request in it: a request started while nobody waited was not measured, and
    /// neither is its correction (most requests: no entry made and cleared per request).
    pub fn correct(&mut self, tenant: &str, delta: f64) {
        if let Some(s) = self.served.get_mut(tenant)
            && delta.is_finite()
        {
            *s = (*s + delta).max(0.0);
        }
    }

    /// The figures so far.
    pub fn summary(&self) -> JainSummary {
        self.summary
    }

    fn add(&mut self, tenant: &str, service: f64) {
        if !service.is_finite() {
            return;
        }
        match self.served.get_mut(tenant) {
            Some(s) => *s = (*s + service).max(0.0),
            None => {
                self.served.insert(Arc::from(tenant), service.max(0.0));
            }
        }
    }

    /// Ends the window: the index over the tenants backlogged since it opened.
    fn close(&mut self) {
        let opened = self.opened;
        let service: Vec<f64> = self
            .backlog
            .iter()
            .filter(|(_, b)| b.since <= opened)
            .map(|(t, _)| self.served.get(t).copied().unwrap_or(0.0))
            .collect();
        self.served.clear();
        self.opened = self.starts;
        if service.len() < 2 {
            return;
        }
        let index = jain(&service);
        let s = &mut self.summary;
        s.last = Some(WindowIndex {
            index,
            tenants: service.len(),
        });
        s.min = if s.windows == 0 {
            index
        } else {
            s.min.min(index)
        };
        s.windows += 1;
        self.sum += index;
        s.mean = self.sum / s.windows as f64;
    }
}

/// Jain's index of `xs`: (Σx)² / (n·Σx²); 1 for none, or all zero.
pub fn jain(xs: &[f64]) -> f64 {
    let (sum, squares) = xs.iter().fold((0.0, 0.0), |(s, q), x| (s + x, q + x * x));
    if squares > 0.0 {
        sum * sum / (xs.len() as f64 * squares)
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    #[test]
    fn jain_is_one_for_equal_shares_and_one_over_n_for_one_taker() {
        assert_eq!(jain(&[5.0, 5.0, 5.0]), 1.0);
        assert!((jain(&[9.0, 0.0, 0.0]) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
    }

    /// Three tenants always waiting, served 10 : 1 : 1 as first come serves a flood.
    #[test]
    fn a_flood_served_first_come_scores_low_and_even_turns_score_one() {
        let mut m = JainMeter::default();
        let (a, b, c) = (t("a"), t("b"), t("c"));
        for x in [&a, &b, &c] {
            for _ in 0..100 {
                m.joined(x);
            }
        }
        for i in 0..WINDOW_STARTS * 2 {
            let who = match i % 12 {
                0 => &b,
                1 => &c,
                _ => &a,
            };
            m.started(who, 100.0);
            m.left(who);
            m.joined(who);
        }
        let s = m.summary();
        assert_eq!(s.windows, 2);
        let last = s.last.unwrap();
        assert_eq!(last.tenants, 3);
        assert!(last.index < 0.6, "{last:?}");

        let mut even = JainMeter::default();
        for x in [&a, &b, &c] {
            even.joined(x);
        }
        for i in 0..WINDOW_STARTS * 3 {
            let who = [&a, &b, &c][(i % 3) as usize];
            // One waiter each, replaced as it starts: always backlogged.
            even.joined(who);
            even.started(who, 100.0);
            even.left(who);
        }
        let s = even.summary();
        assert_eq!(s.windows, 3);
        assert!(s.min > 0.99, "{s:?}");
    }

    /// A tenant that waits now and then got what it asked for: it is not counted, and a window
    /// with one backlogged tenant has no index.
    #[test]
    fn tenants_not_backlogged_the_whole_window_are_left_out() {
        let mut m = JainMeter::default();
        let (a, b) = (t("a"), t("b"));
        m.joined(&a);
        for i in 0..WINDOW_STARTS {
            if i % 8 == 0 {
                m.joined(&b);
                m.started(&b, 10.0);
                m.left(&b);
            } else {
                m.started(&a, 100.0);
                m.left(&a);
                m.joined(&a);
            }
        }
        assert_eq!(m.summary().windows, 0);
        assert_eq!(m.summary().last, None);
    }

    /// The waiter that starts the window's last request was its tenant's last: it still counts.
    #[test]
    fn a_tenant_emptied_by_the_windows_last_start_counts() {
        let mut m = JainMeter::default();
        let (a, b) = (t("a"), t("b"));
        for _ in 0..WINDOW_STARTS {
            m.joined(&a);
        }
        m.joined(&b);
        for _ in 0..WINDOW_STARTS - 1 {
            m.started(&a, 1.0);
            m.left(&a);
        }
        m.started(&b, 1.0);
        m.left(&b);
        let last = m.summary().last.unwrap();
        assert_eq!(last.tenants, 2);
        assert!(last.index < 0.6, "{last:?}");
    }

    /// A request started with nobody waiting (a free slot) restarts the window: the flood
    /// queued behind it is measured from its first start.
    #[test]
    fn a_window_opens_with_the_flood_not_before_it() {
        let mut m = JainMeter::default();
        let (a, b) = (t("a"), t("b"));
        m.started(&a, 1.0);
        for _ in 0..WINDOW_STARTS {
            m.joined(&a);
            m.joined(&b);
        }
        for i in 0..WINDOW_STARTS {
            let who = if i % 2 == 0 { &a } else { &b };
            m.started(who, 1.0);
            m.left(who);
        }
        let s = m.summary();
        assert_eq!(s.windows, 1, "{s:?}");
        assert!(s.min > 0.999, "{s:?}");
    }

    #[test]
    fn corrections_move_the_current_windows_service_and_never_below_zero() {
        let mut m = JainMeter::default();
        let (a, b) = (t("a"), t("b"));
        m.joined(&a);
        m.joined(&b);
        m.correct("a", -50.0);
        m.correct("b", f64::NAN);
        for i in 0..WINDOW_STARTS {
            let who = if i % 2 == 0 { &a } else { &b };
            m.joined(who);
            m.started(who, 10.0);
            m.left(who);
        }
        // Equal starts; the negative correction was clamped at zero before them.
        assert!(m.summary().last.unwrap().index > 0.999);
    }
}
