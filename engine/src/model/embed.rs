//! Sentence embeddings from the generation model: the final hidden states (after the final
//! norm, before the LM head) mean-pooled over the input's tokens, then L2-normalised.
//!
//! The pass runs over a private scratch KV cache sized for the one input, never the serving
//! cache, so it cannot disturb running sequences or the prefix cache, and it does not go
//! through the core thread (the server runs it on a blocking worker thread).

use super::forward::{Model, SeqChunk};
use super::ops::rms_norm;
use crate::block_manager::BlockId;

/// Tokens per block of the scratch cache.
const SCRATCH_BLOCK: usize = 16;

impl Model {
    /// The unit-norm embedding of `tokens` (`hidden_size` values). Empty input or token ids
    /// outside the vocabulary are an error.
    pub fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>, String> {
        if tokens.is_empty() {
            return Err("the input is empty".into());
        }
        let blocks = tokens.len().div_ceil(SCRATCH_BLOCK);
        let mut cache = self.new_cache(blocks, SCRATCH_BLOCK);
        let table: Vec<BlockId> = (0..blocks as BlockId).collect();
        let chunk = SeqChunk {
            tokens,
            start: 0,
            block_table: &table,
            want_logits: false,
            prompt_len: tokens.len(),
        };
        let Some((x, _)) = self.hidden_states(&mut cache, &[chunk])? else {
            return Err("the input is empty".into());
        };
        let h = self.config.hidden_size;
        let mut sum = vec![0.0f64; h];
        let mut normed = vec![0.0f32; h];
        for row in x.chunks_exact(h) {
            rms_norm(
                &mut normed,
                row,
                &self.weights.norm,
                self.config.rms_norm_eps,
            );
            for (s, v) in sum.iter_mut().zip(&normed) {
                *s += f64::from(*v);
            }
        }
        // The mean's direction is the sum's: normalising the sum is enough.
        let mut v: Vec<f32> = sum.into_iter().map(|s| s as f32).collect();
        crate::openai::l2_normalize(&mut v);
        Ok(v)
    }
}
