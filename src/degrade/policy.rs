//! `policies/degradation.yaml`: per pool, the signal window, the tick and the ordered levels of
//! degradation (entry and lower exit thresholds, minimum dwell, actions). The `Raw*` types are the
//! file exactly as written; `validate` turns them into the checked `DegradationPolicy`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// Signal window of a pool that gives none.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);
/// Tick of a pool that gives none.
pub const DEFAULT_TICK: Duration = Duration::from_secs(1);
/// Minimum dwell of a level that gives none.
pub const DEFAULT_MIN_DWELL: Duration = Duration::from_secs(30);

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDegradationFile {
    /// Pool name (from the main config's `pools:`) → its degradation policy.
    pub pools: BTreeMap<String, RawPoolPolicy>,
}

/// One pool's entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPoolPolicy {
    /// Sliding window the signals are computed over, e.g. `10s`; > 0; default 10s.
    pub window: Option<String>,
    /// How often the signals are computed and the level reconsidered, e.g. `1s`; > 0 and
    /// ≤ `window`; default 1s.
    pub tick: Option<String>,
    /// Levels in order of severity: the first entry is level 1. At least one.
    pub levels: Vec<RawLevel>,
}

/// One level as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLevel {
    /// Name for logs, metrics and error messages; unique within the pool.
    pub name: String,
    /// Entered (from the level below) when any one of these is met: signal ≥ threshold.
    pub enter: RawThresholds,
    /// Left (to the level below) when every one of these is met: signal < threshold. Gives a
    /// threshold for exactly the signals `enter` gives, each ≤ its entry threshold.
    pub exit: RawThresholds,
    /// Least time spent at this level before moving up or down, e.g. `30s`; default 30s.
    pub min_dwell: Option<String>,
    /// Actions added by this level (levels above keep them); may be empty.
    #[serde(default)]
    pub actions: Vec<Action>,
}

/// Thresholds as written; durations as text (`250ms`, `2s`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawThresholds {
    /// Requests waiting in the pool's queue (largest in the window).
    pub queue_depth: Option<u64>,
    /// 95th percentile of time spent queued, over the window.
    pub queue_wait_p95: Option<String>,
    /// Mean KV-cache usage of the pool's workers over the window, 0..=1.
    pub kv_usage: Option<f64>,
    /// 95th percentile of time to first token at the gateway, over the window.
    pub ttft_p95: Option<String>,
}

/// One action of a level; the same shape in the file and after validation.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// Lower `max_tokens` of the tiers' requests to at most `max_tokens` (≥ 1).
    CapMaxTokens {
        /// Tier names from tenants.yaml.
        tiers: Vec<String>,
        /// Largest completion the tiers may ask for, in tokens.
        max_tokens: u32,
    },
    /// Refuse the tiers' prompts longer than `max_prompt_tokens` (≥ 1) with Retry-After.
    RefuseLongPrompts {
        /// Tier names from tenants.yaml.
        tiers: Vec<String>,
        /// Longest prompt accepted, in (estimated) tokens.
        max_prompt_tokens: u64,
    },
    /// Serve the tiers' requests with `model` (a model from the main config) instead.
    Fallback {
        /// Tier names from tenants.yaml.
        tiers: Vec<String>,
        /// The fallback model's name.
        model: String,
    },
    /// Refuse the tiers' requests (429 with Retry-After).
    Shed {
        /// Tier names from tenants.yaml.
        tiers: Vec<String>,
    },
}

impl Action {
    /// The tiers the action applies to.
    pub fn tiers(&self) -> &[String] {
        match self {
            Action::CapMaxTokens { tiers, .. }
            | Action::RefuseLongPrompts { tiers, .. }
            | Action::Fallback { tiers, .. }
            | Action::Shed { tiers } => tiers,
        }
    }

    /// The action's key in the file, also its label in `x-infergate-degraded`.
    pub fn label(&self) -> &'static str {
        match self {
            Action::CapMaxTokens { .. } => "cap_max_tokens",
            Action::RefuseLongPrompts { .. } => "refuse_long_prompts",
            Action::Fallback { .. } => "fallback",
            Action::Shed { .. } => "shed",
        }
    }
}

/// One pool's validated policy.
#[derive(Debug, Clone, PartialEq)]
pub struct DegradationPolicy {
    /// Sliding window the signals are computed over.
    pub window: Duration,
    /// Interval between two `Degrader::tick` calls.
    pub tick: Duration,
    /// Level 1 is `levels[0]`; never empty.
    pub levels: Vec<Level>,
}

/// One validated level.
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    /// Unique within the pool.
    pub name: String,
    /// Any one met (≥) raises the level below to this one; at least one set.
    pub enter: Thresholds,
    /// All met (<) lower this level to the one below; the same signals as `enter`, each ≤.
    pub exit: Thresholds,
    /// Least time at this level before moving up or down.
    pub min_dwell: Duration,
    /// Actions this level adds to those of the levels below.
    pub actions: Vec<Action>,
}

/// Thresholds on the four signals; `None` means the signal plays no part.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Thresholds {
    /// Queue depth, in requests.
    pub queue_depth: Option<u64>,
    /// Queue wait p95.
    pub queue_wait_p95: Option<Duration>,
    /// Mean KV-cache usage, 0..=1.
    pub kv_usage: Option<f64>,
    /// Time to first token p95.
    pub ttft_p95: Option<Duration>,
}

impl Thresholds {
    /// Names of the signals with a threshold, in a fixed order.
    pub fn signals(&self) -> Vec<&'static str> {
        let set = [
            ("queue_depth", self.queue_depth.is_some()),
            ("queue_wait_p95", self.queue_wait_p95.is_some()),
            ("kv_usage", self.kv_usage.is_some()),
            ("ttft_p95", self.ttft_p95.is_some()),
        ];
        set.into_iter()
            .filter(|(_, on)| *on)
            .map(|(n, _)| n)
            .collect()
    }
}
