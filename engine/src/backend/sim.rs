//! `sim` backend: step time from the roofline model of a GPU and model preset; tokens drawn
//! deterministically from a real tokenizer's vocabulary.

use crate::backend::Backend;
use crate::roofline::{RooflineModel, StepCost};
use crate::scheduler::Batch;
use crate::sequence::Sequence;

/// The simulated forward pass.
pub struct SimBackend {
    model: RooflineModel,
    vocab: Vec<u32>,
    eos: u32,
    eos_probability: f64,
    block_size: usize,
}

impl SimBackend {
    /// A backend costing steps with `model`, sampling from `vocab`; without `ignore_eos` a
    /// sequence ends after `mean_output_tokens` tokens on average (geometric).
    pub fn new(
        model: RooflineModel,
        vocab: Vec<u32>,
        eos: u32,
        mean_output_tokens: f64,
        block_size: usize,
    ) -> Self {
        Self {
            block_size,
            model,
            vocab,
            eos,
            eos_probability: 1.0 / mean_output_tokens.max(1.0),
        }
    }
}

/// splitmix64: a tiny, well-mixed PRNG step.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Backend for SimBackend {
    fn execute(&mut self, batch: &Batch, _running: &[Sequence]) -> StepCost {
        self.model.step_cost(&batch.shape)
    }

    fn sample(&mut self, seq: &mut Sequence) -> u32 {
        let greedy = seq.params.temperature == 0.0 || seq.params.top_k == 1;
        // Greedy output depends only on the tokens so far (same prompt, same answer);
        // sampled output on the request's seed.
        let mut state = if greedy {
            let parent = seq.block_hashes.last().copied().unwrap_or(0);
            let tail_from = seq.block_hashes.len() * self.block_size;
            let mut h = parent ^ seq.tokens.len() as u64;
            for &t in seq.tokens.iter().skip(tail_from) {
                h = h.rotate_left(5) ^ u64::from(t);
                splitmix64(&mut h);
            }
            h
        } else {
            seq.rng_state
        };
        let r = splitmix64(&mut state);
        let e = splitmix64(&mut state);
        if !greedy {
            seq.rng_state = state;
        }
        let can_stop = !seq.params.ignore_eos && seq.num_output() >= seq.params.min_tokens;
        if can_stop && (e >> 11) as f64 / (1u64 << 53) as f64 <= self.eos_probability {
            return self.eos;
        }
        self.vocab[(r % self.vocab.len() as u64) as usize]
    }

    fn eos_token(&self) -> u32 {
        self.eos
    }
}
