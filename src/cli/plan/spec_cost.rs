//! Speculative decoding on the roofline: times of the target's decode step, the draft's step and
//! the target's verify step at a batch size, and the speedup they give.
//!
//! One speculative step runs the draft `k` times (one token per sequence each) and the target
//! once over `k + 1` tokens per sequence; it yields `E` tokens per sequence on average. Plain
//! decoding yields one token per target step, so
//! `speedup = E x t_target(batch, 1) / (k x t_draft(batch) + t_target(batch, k + 1))`.
//! At small batches a step is bound by streaming the weights, so the verify step costs about one
//! decode step; at large batches it turns compute-bound and verifying `k + 1` tokens costs up to
//! `k + 1` decode steps, which is where speculation stops paying.

use infergate_engine::roofline::{BatchShape, RooflineConfig, RooflineModel};

/// Largest batch scanned for the break-even point, and the largest CUDA-graph capture size.
pub(crate) const MAX_SCAN_BATCH: usize = 512;

/// Expected tokens per target step with acceptance rate `alpha` and `k` draft tokens:
/// `(1 - alpha^(k+1)) / (1 - alpha)`, which is `k + 1` at `alpha = 1`.
pub fn expected_tokens(alpha: f64, k: usize) -> f64 {
    if alpha >= 1.0 {
        return (k + 1) as f64;
    }
    let exponent = i32::try_from(k.saturating_add(1)).unwrap_or(i32::MAX);
    (1.0 - alpha.powi(exponent)) / (1.0 - alpha)
}

/// Speedup bound when a draft pass costs `draft_cost` target steps and verifying costs one target
/// step: `E / (1 + k x draft_cost)`.
pub fn speedup_bound(alpha: f64, k: usize, draft_cost: f64) -> f64 {
    expected_tokens(alpha, k) / (1.0 + k as f64 * draft_cost)
}

/// How a draft pass is costed.
#[derive(Debug, Clone)]
pub(crate) enum Draft {
    /// A fixed fraction of the target's decode step at the same batch.
    Relative(f64),
    /// The draft model's own decode step on the roofline.
    Model(RooflineModel),
}

/// Step times of one batch, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StepTimes {
    /// Target decode step, one token per sequence.
    pub target: f64,
    /// One draft pass, one token per sequence.
    pub draft: f64,
    /// Target verify step, `k + 1` tokens per sequence.
    pub verify: f64,
}

/// The target and draft cost models at one context length.
#[derive(Debug, Clone)]
pub(crate) struct SpecCost {
    /// The target model's roofline.
    pub target: RooflineModel,
    /// How draft passes are costed.
    pub draft: Draft,
    /// Tokens of context each sequence attends to.
    pub context: usize,
}

/// Roofline settings for the planner: engine defaults with CUDA graphs captured up to the
/// largest scanned batch, so every scanned decode and verify step takes the graph path.
pub(crate) fn roofline_config() -> RooflineConfig {
    RooflineConfig {
        max_num_seqs: MAX_SCAN_BATCH,
        ..RooflineConfig::default()
    }
}

/// A step where each of `batch` sequences computes `tokens` new tokens against `context` tokens.
///
/// Marked decode-only, so it takes the CUDA-graph path even when `tokens > 1`: engines capture
/// graphs for uniform verify batches (vLLM V1 does), and charging eager launch and prefill
/// preparation to every verify step would make speculation look worse than it is.
fn shape(batch: usize, tokens: usize, context: usize) -> BatchShape {
    let new_tokens = batch.saturating_mul(tokens);
    BatchShape {
        num_seqs: batch,
        num_decode_seqs: batch,
        new_tokens,
        kv_tokens_read: batch.saturating_mul(context),
        attn_token_pairs: new_tokens as u64 * context as u64,
    }
}

impl SpecCost {
    /// Step times at `batch` sequences with `k` draft tokens.
    pub fn times(&self, batch: usize, k: usize) -> StepTimes {
        let target = self
            .target
            .step_cost(&shape(batch, 1, self.context))
            .seconds;
        let draft = match &self.draft {
            Draft::Relative(c) => c * target,
            Draft::Model(m) => m.step_cost(&shape(batch, 1, self.context)).seconds,
        };
        let verify = self
            .target
            .step_cost(&shape(batch, k + 1, self.context))
            .seconds;
        StepTimes {
            target,
            draft,
            verify,
        }
    }

    /// Speedup over plain decoding at `batch` with acceptance rate `alpha` and `k` draft tokens.
    pub fn speedup(&self, alpha: f64, batch: usize, k: usize) -> f64 {
        let t = self.times(batch, k);
        expected_tokens(alpha, k) * t.target / (k as f64 * t.draft + t.verify)
    }

    /// Smallest batch in `1..=MAX_SCAN_BATCH` at which speculation no longer pays (speedup <= 1).
    pub fn break_even_batch(&self, alpha: f64, k: usize) -> Option<usize> {
        (1..=MAX_SCAN_BATCH).find(|&b| self.speedup(alpha, b, k) <= 1.0)
    }
}
