//! Backends: the one part of the engine that differs between `sim` (a roofline time model) and
//! real forward passes (`cpu`). Everything else (scheduler, KV cache, server, metrics) is shared.

pub mod cpu;
pub mod sim;

use crate::roofline::StepCost;
use crate::scheduler::Batch;
use crate::sequence::Sequence;

/// Runs a scheduled batch and samples next tokens.
pub trait Backend: Send {
    /// Runs one step's forward pass over `batch` (indices into `running`) and returns its cost;
    /// the engine waits on its clock until the step would have ended.
    fn execute(&mut self, batch: &Batch, running: &[Sequence]) -> StepCost;
    /// Samples the next token for a sequence whose last token was just computed.
    fn sample(&mut self, seq: &mut Sequence) -> u32;
    /// End-of-sequence token id.
    fn eos_token(&self) -> u32;
    /// Whether `token` ends generation (models may have several EOS tokens).
    fn is_eos(&self, token: u32) -> bool {
        token == self.eos_token()
    }
}
