//! Test doubles shared by the degradation tests: a hand-built three-level policy and signals.

use std::time::Duration;

use super::policy::{Action, DegradationPolicy, Level, Thresholds};
use super::signals::Signals;

/// Seconds as a `Duration`.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Thresholds on queue depth and KV usage only.
fn on(queue_depth: u64, kv_usage: f64) -> Thresholds {
    Thresholds {
        queue_depth: Some(queue_depth),
        kv_usage: Some(kv_usage),
        ..Thresholds::default()
    }
}

/// The tiers as a list.
fn tiers(names: &[&str]) -> Vec<String> {
    names.iter().map(|t| (*t).to_string()).collect()
}

/// Three levels, each dwelling 30s: 1 caps free at 256 tokens (queue ≥ 50 / < 20); 2 refuses long
/// free prompts, caps free at 512 and paid at 1024, falls free back to `small` (≥ 100 / < 60);
/// 3 sheds free and falls it back to `tiny` (≥ 200 / < 150). KV: ≥ 0.9/0.95/0.98, < 0.8/0.9/0.96.
pub fn three_levels() -> DegradationPolicy {
    let level = |name: &str, enter, exit, actions| Level {
        name: name.to_string(),
        enter,
        exit,
        min_dwell: secs(30),
        actions,
    };
    DegradationPolicy {
        window: secs(10),
        tick: secs(1),
        levels: vec![
            level(
                "cap_free",
                on(50, 0.9),
                on(20, 0.8),
                vec![Action::CapMaxTokens {
                    tiers: tiers(&["free"]),
                    max_tokens: 256,
                }],
            ),
            level(
                "refuse_long",
                on(100, 0.95),
                on(60, 0.9),
                vec![
                    Action::RefuseLongPrompts {
                        tiers: tiers(&["free"]),
                        max_prompt_tokens: 4000,
                    },
                    Action::CapMaxTokens {
                        tiers: tiers(&["free", "paid"]),
                        max_tokens: 1024,
                    },
                    Action::Fallback {
                        tiers: tiers(&["free"]),
                        model: "small".to_string(),
                    },
                ],
            ),
            level(
                "shed_free",
                on(200, 0.98),
                on(150, 0.96),
                vec![
                    Action::Shed {
                        tiers: tiers(&["free"]),
                    },
                    Action::Fallback {
                        tiers: tiers(&["free"]),
                        model: "tiny".to_string(),
                    },
                ],
            ),
        ],
    }
}

/// Signals with only a queue depth.
pub fn depth(n: u64) -> Signals {
    Signals {
        queue_depth: Some(n),
        samples: 1,
        ..Signals::default()
    }
}
