//! Backends: the one part of the engine that differs between `sim` (a roofline time model) and
//! real forward passes (`cpu`, and `cuda` with the cargo feature of that name). Everything else
//! (scheduler, KV cache, server, metrics) is shared.

pub mod cpu;
#[cfg(feature = "cuda")]
#[expect(
    unsafe_code,
    reason = "the CUDA FFI: kernel launches, cuBLAS calls and graph handles"
)]
pub mod cuda;
pub mod sim;
pub mod step_logits;
pub mod step_plan;

use crate::logprobs::TokenLogprob;
use crate::roofline::StepCost;
use crate::scheduler::Batch;
use crate::sequence::Sequence;

/// A sampled token and, when the sequence asked for logprobs, its log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The next token.
    pub token: u32,
    /// Its log-probability and top alternatives; `Some` exactly when `params.logprobs` is.
    pub logprob: Option<TokenLogprob>,
}

/// Runs a scheduled batch and samples next tokens.
pub trait Backend: Send {
    /// Runs one step's forward pass over `batch` (indices into `running`) and returns its cost;
    /// the engine waits on its clock until the step would have ended.
    fn execute(&mut self, batch: &Batch, running: &[Sequence]) -> StepCost;
    /// Samples the next token for a sequence whose last token was just computed; with
    /// `params.logprobs` set, also reports its log-probability and that many alternatives.
    fn sample(&mut self, seq: &mut Sequence) -> Sampled;
    /// Appends to `seq.prompt_logprobs` the entries of the prompt positions the last step made
    /// known. Called after each step (and its commit) for sequences that still need them.
    fn prompt_logprobs(&mut self, seq: &mut Sequence);
    /// End-of-sequence token id.
    fn eos_token(&self) -> u32;
    /// Host seconds before `batch` can start, for a backend that models them (sim); `None` for
    /// one that runs in real time, whose host time is what the clock measures.
    fn host_seconds(&self, _batch: &Batch, _running: &[Sequence]) -> Option<f64> {
        None
    }
    /// The largest capture size, the most sequences and tokens a step may hold and stay within
    /// what captured graphs cover (vLLM's piecewise graphs cover a mixed step up to that many
    /// tokens); `None` when the backend captures none.
    fn capture_budget(&self) -> Option<usize> {
        None
    }
    /// Warms one capture size before the engine reports ready (see [`crate::warmup`]); the
    /// default has nothing to warm.
    fn warm_up(
        &mut self,
        _cost: &crate::capture_cost::SizeCost,
    ) -> Result<crate::warmup::Warmed, String> {
        Ok(crate::warmup::Warmed::default())
    }
    /// Whether `token` ends generation (models may have several EOS tokens).
    fn is_eos(&self, token: u32) -> bool {
        token == self.eos_token()
    }
}
