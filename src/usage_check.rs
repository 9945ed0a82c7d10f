//! Checks the token usage a worker reports against what the request made possible, before it is
//! priced, counted or reconciled: a buggy or lying worker cannot bill a tenant past its request,
//! lock it out with an absurd debt, or overflow a ledger sum. Numbers outside the bounds are
//! replaced by the gateway's own count, and each replacement is named so it can be counted.

use crate::pricing::TokenCounts;

/// Token counts reported by the worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub prompt: u64,
    /// Completion tokens.
    pub completion: u64,
    /// Prompt tokens served from the prefix cache; `None` when the worker does not say.
    pub cached: Option<u64>,
}

/// How far a worker's numbers may stray from the gateway's own (`usage_check` in the config).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UsageCheckConfig {
    /// A reported prompt may be up to this many times the gateway's estimate (and down to the
    /// estimate over it): the gateway's tokenizer is not the model's.
    pub prompt_ratio: f64,
    /// Tokens allowed past the ratio either way: chat templates and special tokens.
    pub prompt_slack: u64,
    /// Prompt tokens allowed for each image, audio or file part (the gateway counts text only).
    pub media_part_tokens: u64,
    /// Completion tokens allowed past `max_tokens × n`: stop tokens, a reasoning parser's extras.
    pub completion_slack: u64,
}

impl Default for UsageCheckConfig {
    fn default() -> Self {
        Self {
            prompt_ratio: 2.0,
            prompt_slack: 256,
            media_part_tokens: 8192,
            completion_slack: 16,
        }
    }
}

/// What the request made possible, known at metering.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageBounds {
    /// The gateway's own prompt count.
    pub prompt_estimate: u64,
    /// The prompt was given as token ids: the estimate is exact.
    pub prompt_exact: bool,
    /// Image, audio and file parts of the prompt.
    pub media_parts: u32,
    /// `max_tokens × n` (0 for embeddings).
    pub completion_max: u64,
}

/// Why a reported number was not believed (the `reason` label of
/// `infergate_upstream_usage_rejected_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// More prompt tokens than the prompt can hold.
    PromptOver,
    /// Fewer prompt tokens than the prompt holds.
    PromptUnder,
    /// More completion tokens than `max_tokens × n` allowed.
    CompletionOver,
    /// More cached tokens than prompt tokens.
    CachedOver,
}

impl Rejected {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejected::PromptOver => "prompt_over",
            Rejected::PromptUnder => "prompt_under",
            Rejected::CompletionOver => "completion_over",
            Rejected::CachedOver => "cached_over",
        }
    }
}

/// The counts to bill and what was rejected on the way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checked {
    /// Tokens to price and reconcile.
    pub tokens: TokenCounts,
    /// Rejections, in field order; `None` past the last.
    pub rejected: [Option<Rejected>; 3],
}

impl Checked {
    /// The rejections made.
    pub fn rejections(&self) -> impl Iterator<Item = Rejected> + '_ {
        self.rejected.iter().flatten().copied()
    }
}

impl UsageBounds {
    /// The prompt counts a worker may report: `[low, high]`.
    pub fn prompt_range(&self, cfg: &UsageCheckConfig) -> (u64, u64) {
        let est = self.prompt_estimate;
        let media = u64::from(self.media_parts).saturating_mul(cfg.media_part_tokens);
        if self.prompt_exact {
            return (
                est.saturating_sub(cfg.prompt_slack),
                est.saturating_add(cfg.prompt_slack).saturating_add(media),
            );
        }
        // A ratio below one (or not a number) would reject honest workers: read it as one.
        let ratio = if cfg.prompt_ratio.is_finite() {
            cfg.prompt_ratio.max(1.0)
        } else {
            1.0
        };
        let high = (est as f64 * ratio).min(u64::MAX as f64) as u64;
        let low = (est as f64 / ratio) as u64;
        (
            low.saturating_sub(cfg.prompt_slack),
            high.saturating_add(cfg.prompt_slack).saturating_add(media),
        )
    }

    /// The most completion tokens a worker may report.
    pub fn completion_high(&self, cfg: &UsageCheckConfig) -> u64 {
        self.completion_max.saturating_add(cfg.completion_slack)
    }
}

/// Checks `reported` against `bounds`. A field out of bounds is replaced by the gateway's own
/// count: the prompt estimate; for the completion, `own_completion` (content events seen on a
/// stream) capped at `max_tokens × n`, or `max_tokens × n` itself when the gateway counted
/// nothing (a whole JSON answer); for cached tokens, none (the full prompt price).
pub fn check(
    reported: TokenUsage,
    bounds: &UsageBounds,
    cfg: &UsageCheckConfig,
    own_completion: Option<u64>,
) -> Checked {
    let mut out = Checked::default();
    let mut n = 0;
    let mut reject = |r: Rejected| {
        out.rejected[n] = Some(r);
        n += 1;
    };
    let (low, high) = bounds.prompt_range(cfg);
    let prompt = if reported.prompt > high {
        reject(Rejected::PromptOver);
        bounds.prompt_estimate
    } else if reported.prompt < low {
        reject(Rejected::PromptUnder);
        bounds.prompt_estimate
    } else {
        reported.prompt
    };
    let completion = if reported.completion > bounds.completion_high(cfg) {
        reject(Rejected::CompletionOver);
        own_completion.map_or(bounds.completion_max, |c| c.min(bounds.completion_max))
    } else {
        reported.completion
    };
    let cached = match reported.cached {
        Some(c) if c > reported.prompt => {
            reject(Rejected::CachedOver);
            0
        }
        // A prompt replaced by the estimate keeps no cached share the worker claimed.
        Some(c) if prompt == reported.prompt => c,
        _ => 0,
    };
    out.tokens = TokenCounts {
        prompt,
        cached: cached.min(prompt),
        completion,
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: UsageCheckConfig = UsageCheckConfig {
        prompt_ratio: 2.0,
        prompt_slack: 10,
        media_part_tokens: 1000,
        completion_slack: 4,
    };

    fn bounds(prompt_estimate: u64, completion_max: u64) -> UsageBounds {
        UsageBounds {
            prompt_estimate,
            prompt_exact: false,
            media_parts: 0,
            completion_max,
        }
    }

    fn usage(prompt: u64, completion: u64, cached: Option<u64>) -> TokenUsage {
        TokenUsage {
            prompt,
            completion,
            cached,
        }
    }

    fn rejections(c: &Checked) -> Vec<Rejected> {
        c.rejections().collect()
    }

    #[test]
    fn honest_usage_passes_unchanged() {
        let c = check(usage(120, 8, Some(64)), &bounds(100, 8), &CFG, Some(8));
        assert_eq!(
            c.tokens,
            TokenCounts {
                prompt: 120,
                cached: 64,
                completion: 8
            }
        );
        assert!(rejections(&c).is_empty());
    }

    #[test]
    fn each_prompt_bound_holds_at_its_edge() {
        let b = bounds(100, 8);
        assert_eq!(b.prompt_range(&CFG), (40, 210));
        for (prompt, want) in [
            (210, None),
            (211, Some(Rejected::PromptOver)),
            (40, None),
            (39, Some(Rejected::PromptUnder)),
            (u64::MAX, Some(Rejected::PromptOver)),
            (0, Some(Rejected::PromptUnder)),
        ] {
            let c = check(usage(prompt, 1, None), &b, &CFG, None);
            assert_eq!(c.rejected[0], want, "prompt {prompt}");
            let billed = if want.is_some() { 100 } else { prompt };
            assert_eq!(c.tokens.prompt, billed, "prompt {prompt}");
        }
    }

    #[test]
    fn exact_prompts_and_media_parts_move_the_bounds() {
        let exact = UsageBounds {
            prompt_exact: true,
            ..bounds(100, 8)
        };
        assert_eq!(exact.prompt_range(&CFG), (90, 110));
        let images = UsageBounds {
            media_parts: 2,
            ..bounds(100, 8)
        };
        assert_eq!(images.prompt_range(&CFG), (40, 2210));
        let odd = UsageCheckConfig {
            prompt_ratio: f64::NAN,
            ..CFG
        };
        assert_eq!(bounds(100, 8).prompt_range(&odd), (90, 110));
        let huge = bounds(u64::MAX, 8);
        assert_eq!(huge.prompt_range(&CFG).1, u64::MAX, "saturates");
    }

    #[test]
    fn completion_past_max_tokens_times_n_uses_the_gateways_count() {
        let b = bounds(100, 8);
        let ok = check(usage(100, 12, None), &b, &CFG, Some(3));
        assert!(rejections(&ok).is_empty(), "within the slack");
        assert_eq!(ok.tokens.completion, 12);
        let lie = check(
            usage(100, 1_000_000_000_000_000_000, None),
            &b,
            &CFG,
            Some(3),
        );
        assert_eq!(rejections(&lie), [Rejected::CompletionOver]);
        assert_eq!(lie.tokens.completion, 3, "the content events seen");
        let max = check(usage(100, u64::MAX, None), &b, &CFG, None);
        assert_eq!(max.tokens.completion, 8, "a JSON answer: max_tokens × n");
        let many = check(usage(100, u64::MAX, None), &b, &CFG, Some(500));
        assert_eq!(many.tokens.completion, 8, "never past max_tokens × n");
        let embeddings = check(usage(100, 1, None), &bounds(100, 0), &CFG, None);
        assert_eq!(
            embeddings.tokens.completion, 1,
            "the slack covers a stray token"
        );
    }

    #[test]
    fn cached_past_prompt_is_not_believed() {
        let b = bounds(100, 8);
        let c = check(usage(100, 8, Some(101)), &b, &CFG, None);
        assert_eq!(rejections(&c), [Rejected::CachedOver]);
        assert_eq!(c.tokens.cached, 0);
        let lied_prompt = check(usage(u64::MAX, u64::MAX, Some(u64::MAX)), &b, &CFG, None);
        assert_eq!(
            rejections(&lied_prompt),
            [Rejected::PromptOver, Rejected::CompletionOver]
        );
        assert_eq!(
            lied_prompt.tokens,
            TokenCounts {
                prompt: 100,
                cached: 0,
                completion: 8
            }
        );
    }
}
