//! Graded degradation on the simulator's virtual clock: the gateway's pure `SignalWindow` and
//! `Degrader`, fed the fleet's signals every policy tick (instants are a fixed base plus virtual
//! seconds, so runs stay reproducible), and the level's actions applied to each arriving request
//! by its tier (the tenant's name). Fallback to another model is not simulated: the fleet serves
//! one model, so a `fallback` action leaves the request as it is.

use std::path::Path;
use std::time::{Duration, Instant};

use infergate::degrade::{Actions, DegradationPolicy, Degrader, SignalWindow, Verdict};

/// Tier of a request sent without a tenant (the gateway's built-in tier).
const DEFAULT_TIER: &str = "default";

/// The policy of pool `local` (or of the only pool) in a degradation.yaml.
pub fn load_policy(path: &Path) -> Result<DegradationPolicy, String> {
    let at = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {at}: {e}"))?;
    let mut pools =
        infergate::degrade::parse(&text).map_err(|e| format!("{at}: {}", e.join("; ")))?;
    if let Some(policy) = pools.remove("local") {
        return Ok(policy);
    }
    let names: Vec<String> = pools.keys().cloned().collect();
    match pools.pop_first() {
        Some((_, policy)) if pools.is_empty() => Ok(policy),
        _ => Err(format!(
            "{at}: no pool `local` and not exactly one pool (found: {})",
            names.join(", ")
        )),
    }
}

/// Degradation of the simulated fleet: window, state machine and the level's actions.
#[derive(Debug)]
pub(super) struct SimDegradation {
    policy: DegradationPolicy,
    window: SignalWindow,
    degrader: Degrader,
    /// The instant standing for virtual time zero.
    base: Instant,
    actions: Actions,
    max_level: usize,
    shed: u64,
    refused_long: u64,
    capped: u64,
}

impl SimDegradation {
    /// Normal service at virtual time zero under `policy`.
    pub(super) fn new(policy: DegradationPolicy) -> Self {
        let base = Instant::now();
        Self {
            window: SignalWindow::new(policy.window),
            degrader: Degrader::new(base),
            base,
            actions: Actions::none(),
            max_level: 0,
            shed: 0,
            refused_long: 0,
            capped: 0,
            policy,
        }
    }

    /// Seconds between two ticks.
    pub(super) fn tick_interval(&self) -> f64 {
        self.policy.tick.as_secs_f64()
    }

    /// The instant of virtual time `t` (seconds).
    fn at(&self, t: f64) -> Instant {
        self.base + Duration::from_secs_f64(t.max(0.0))
    }

    /// One request left the admission queue at `t` after waiting `wait` seconds.
    pub(super) fn record_queue_wait(&mut self, wait: f64, t: f64) {
        let at = self.at(t);
        self.window
            .record_queue_wait(Duration::from_secs_f64(wait.max(0.0)), at);
    }

    /// One request's first token arrived at `t`, `ttft` seconds after it was sent.
    pub(super) fn record_ttft(&mut self, ttft: f64, t: f64) {
        let at = self.at(t);
        self.window
            .record_ttft(Duration::from_secs_f64(ttft.max(0.0)), at);
    }

    /// Samples queue depth and mean KV usage at `t`, then reconsiders the level.
    pub(super) fn tick(&mut self, t: f64, queue_depth: usize, kv_mean: f64) {
        let now = self.at(t);
        self.window.record_queue(queue_depth as u64, now);
        self.window.record_kv(kv_mean, now);
        let signals = self.window.snapshot(now, self.policy.window);
        if self.degrader.tick(&self.policy, &signals, now).is_some() {
            self.actions = self.degrader.actions(&self.policy);
            self.max_level = self.max_level.max(self.degrader.level());
        }
    }

    /// Applies the level's actions to a request of `tenant`: caps `output_tokens` in place, or
    /// returns the status it is refused with (429 shed, 503 prompt too long for the level).
    pub(super) fn apply(
        &mut self,
        tenant: Option<&str>,
        prompt_tokens: u64,
        output_tokens: &mut u32,
    ) -> Option<u16> {
        if self.actions.is_empty() {
            return None;
        }
        let tier = self.actions.for_tier(tenant.unwrap_or(DEFAULT_TIER));
        // The simulated fleet serves one model: a fallback leaves the request as it is.
        match tier.verdict("", prompt_tokens, u64::from(*output_tokens)) {
            Verdict::Shed => {
                self.shed += 1;
                Some(429)
            }
            Verdict::RefuseLong { .. } => {
                self.refused_long += 1;
                Some(503)
            }
            Verdict::Serve { cap_max_tokens, .. } => {
                if let Some(cap) = cap_max_tokens {
                    *output_tokens = cap;
                    self.capped += 1;
                }
                None
            }
        }
    }

    /// Numbers for the report's `extra`.
    pub(super) fn extra(&self) -> [(&'static str, f64); 5] {
        [
            ("degradation_max_level", self.max_level as f64),
            (
                "degradation_transitions",
                self.degrader.transitions() as f64,
            ),
            ("degradation_shed", self.shed as f64),
            ("degradation_refused_long", self.refused_long as f64),
            ("degradation_capped", self.capped as f64),
        ]
    }
}
