//! What a degradation level means for one request: the actions of levels 1..=N together, asked
//! per tier. Built once per level change (off the request path) and read by every request.

use super::policy::{Action, DegradationPolicy};

/// The accumulated actions of one level of one pool's policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actions {
    level: usize,
    name: String,
    actions: Vec<Action>,
}

/// What degradation does to one request of a tier; all empty when the tier is untouched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierActions {
    /// Largest `max_tokens` allowed (the lowest cap of every level naming the tier).
    pub cap_max_tokens: Option<u32>,
    /// Longest prompt accepted, in tokens (the lowest of every level naming the tier).
    pub max_prompt_tokens: Option<u64>,
    /// Model to serve the request with instead (the highest level naming the tier wins).
    pub fallback_model: Option<String>,
    /// Refuse the request (429 with Retry-After).
    pub shed: bool,
    /// Labels of the actions above that apply, in a fixed order, for `x-infergate-degraded`
    /// ("cap_max_tokens", "refuse_long_prompts", "fallback", "shed"). The request path names
    /// only those that actually altered the request.
    pub labels: Vec<&'static str>,
}

impl Actions {
    /// Normal service: level 0, no actions.
    pub fn none() -> Self {
        Actions::default()
    }

    /// The actions of levels 1..=`level` of `policy` (a level past the last counts as the last).
    pub fn at(policy: &DegradationPolicy, level: usize) -> Self {
        let level = level.min(policy.levels.len());
        let applied = &policy.levels[..level];
        Actions {
            level,
            name: applied.last().map(|l| l.name.clone()).unwrap_or_default(),
            actions: applied
                .iter()
                .flat_map(|l| l.actions.iter().cloned())
                .collect(),
        }
    }

    /// The level these actions belong to; 0 is normal service.
    pub fn level(&self) -> usize {
        self.level
    }

    /// The level's name from the policy, for error messages; `None` at level 0.
    pub fn level_name(&self) -> Option<&str> {
        (self.level > 0).then_some(self.name.as_str())
    }

    /// True when no action applies to any tier.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }

    /// What applies to a request of `tier`.
    pub fn for_tier(&self, tier: &str) -> TierActions {
        let mut out = TierActions::default();
        let naming = self
            .actions
            .iter()
            .filter(|a| a.tiers().iter().any(|t| t == tier));
        for action in naming {
            match action {
                Action::CapMaxTokens { max_tokens, .. } => {
                    out.cap_max_tokens = Some(
                        out.cap_max_tokens
                            .map_or(*max_tokens, |c| c.min(*max_tokens)),
                    );
                }
                Action::RefuseLongPrompts {
                    max_prompt_tokens, ..
                } => {
                    let limit = *max_prompt_tokens;
                    out.max_prompt_tokens =
                        Some(out.max_prompt_tokens.map_or(limit, |m| m.min(limit)));
                }
                Action::Fallback { model, .. } => out.fallback_model = Some(model.clone()),
                Action::Shed { .. } => out.shed = true,
            }
        }
        let applies = [
            ("cap_max_tokens", out.cap_max_tokens.is_some()),
            ("refuse_long_prompts", out.max_prompt_tokens.is_some()),
            ("fallback", out.fallback_model.is_some()),
            ("shed", out.shed),
        ];
        out.labels = applies
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(l, _)| l)
            .collect();
        out
    }
}

/// What degradation does to one request, in the order the gateway and the simulator both apply:
/// shed first, then refuse a prompt longer than the level allows, else serve (capped, or on the
/// fallback model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Refused with 429 and `Retry-After`.
    Shed,
    /// Refused with 503: the prompt is longer than `max_prompt_tokens`.
    RefuseLong {
        /// The level's limit for the tier.
        max_prompt_tokens: u64,
    },
    /// Served; each field set only when it changes the request.
    Serve {
        /// The new `max_tokens`, when the request asked for more.
        cap_max_tokens: Option<u32>,
        /// The model to serve it with instead, when it is another model.
        fallback_model: Option<&'a str>,
    },
}

impl TierActions {
    /// True when degradation touches the tier at all.
    pub fn is_degraded(&self) -> bool {
        !self.labels.is_empty()
    }

    /// The verdict for a request of `model` with a `prompt_tokens` estimate asking for up to
    /// `max_tokens`.
    pub fn verdict(&self, model: &str, prompt_tokens: u64, max_tokens: u64) -> Verdict<'_> {
        if self.shed {
            return Verdict::Shed;
        }
        if let Some(max) = self.max_prompt_tokens
            && prompt_tokens > max
        {
            return Verdict::RefuseLong {
                max_prompt_tokens: max,
            };
        }
        Verdict::Serve {
            cap_max_tokens: self
                .cap_max_tokens
                .filter(|&cap| max_tokens > u64::from(cap)),
            fallback_model: self.fallback_model.as_deref().filter(|m| *m != model),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::degrade::testkit::three_levels;

    #[test]
    fn the_verdict_sheds_then_refuses_long_prompts_then_caps_and_falls_back() {
        let mut t = TierActions {
            cap_max_tokens: Some(100),
            max_prompt_tokens: Some(1_000),
            fallback_model: Some("small".into()),
            shed: true,
            labels: vec!["cap_max_tokens", "refuse_long_prompts", "fallback", "shed"],
        };
        assert_eq!(t.verdict("big", 10, 10), Verdict::Shed);
        t.shed = false;
        assert_eq!(
            t.verdict("big", 1_001, 10),
            Verdict::RefuseLong {
                max_prompt_tokens: 1_000
            }
        );
        assert_eq!(
            t.verdict("big", 1_000, 500),
            Verdict::Serve {
                cap_max_tokens: Some(100),
                fallback_model: Some("small")
            }
        );
        // Nothing to change: under the cap, already on the fallback model.
        assert_eq!(
            t.verdict("small", 5, 100),
            Verdict::Serve {
                cap_max_tokens: None,
                fallback_model: None
            }
        );
        assert_eq!(
            TierActions::default().verdict("big", u64::MAX, u64::MAX),
            Verdict::Serve {
                cap_max_tokens: None,
                fallback_model: None
            }
        );
    }

    #[test]
    fn level_zero_touches_nobody() {
        let actions = Actions::at(&three_levels(), 0);
        assert!(actions.is_empty());
        assert_eq!(actions.level_name(), None);
        assert_eq!(actions.for_tier("free"), TierActions::default());
        assert_eq!(Actions::none(), actions);
    }

    #[test]
    fn actions_accumulate_and_paid_is_untouched_until_named() {
        let policy = three_levels();
        let one = Actions::at(&policy, 1);
        assert_eq!(one.level_name(), Some("cap_free"));
        let free = one.for_tier("free");
        assert_eq!(free.cap_max_tokens, Some(256));
        assert_eq!(free.labels, ["cap_max_tokens"]);
        assert!(!one.for_tier("paid").is_degraded());

        let two = Actions::at(&policy, 2);
        let free = two.for_tier("free");
        // Level 2 caps free at 1024, but level 1's lower cap of 256 still wins.
        assert_eq!(free.cap_max_tokens, Some(256));
        assert_eq!(free.max_prompt_tokens, Some(4000));
        assert_eq!(free.fallback_model.as_deref(), Some("small"));
        assert!(!free.shed);
        assert_eq!(
            free.labels,
            ["cap_max_tokens", "refuse_long_prompts", "fallback"]
        );
        let paid = two.for_tier("paid");
        assert_eq!(paid.cap_max_tokens, Some(1024));
        assert_eq!(paid.labels, ["cap_max_tokens"]);

        let three = Actions::at(&policy, 3);
        let free = three.for_tier("free");
        assert!(free.shed);
        assert_eq!(free.fallback_model.as_deref(), Some("tiny"));
        assert_eq!(free.labels.len(), 4);
        assert_eq!(three.for_tier("paid"), paid);
        assert!(!three.for_tier("enterprise").is_degraded());
    }

    #[test]
    fn a_level_past_the_last_counts_as_the_last() {
        let policy = three_levels();
        assert_eq!(Actions::at(&policy, 9), Actions::at(&policy, 3));
    }
}
