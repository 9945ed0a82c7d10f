//! `cpu` backend: a real forward pass of a Llama-family model on this machine's cores, over the
//! engine's paged KV cache, and sampling on its logits. Step time is whatever the pass took.

use std::sync::Arc;
use std::time::Instant;

use crate::backend::step_logits::{self, StepLogits};
use crate::backend::{Backend, Sampled};
use crate::model::forward::{Model, SeqChunk};
use crate::model::kv_cache::KvCache;
use crate::roofline::{ExecPath, StepCost};
use crate::scheduler::Batch;
use crate::sequence::Sequence;

/// The real forward pass.
pub struct CpuBackend {
    /// Shared with the embeddings path, which only reads the weights.
    model: Arc<Model>,
    cache: KvCache,
    logits: StepLogits,
}

impl CpuBackend {
    /// A backend running `model` with a cache of `num_blocks` blocks of `block_size` tokens.
    pub fn new(model: Arc<Model>, num_blocks: usize, block_size: usize) -> Self {
        let cache = model.new_cache(num_blocks, block_size);
        let logits = StepLogits::new(model.config.eos_token_ids.clone());
        Self {
            model,
            cache,
            logits,
        }
    }
}

impl Backend for CpuBackend {
    fn execute(&mut self, batch: &Batch, running: &[Sequence]) -> StepCost {
        let started = Instant::now();
        let rows = self.logits.begin_step(batch, running);
        let chunks = step_logits::chunks(batch, running);
        let logits = &mut self.logits;
        let mut on_row = |r: usize, row: &[f32]| logits.on_row(r, row);
        match self
            .model
            .forward_with_rows(&mut self.cache, &chunks, &rows, &mut on_row)
        {
            Ok(all) => self.logits.finish(batch, running, &chunks, all),
            Err(e) => self.logits.failed(&e),
        }
        StepCost {
            seconds: started.elapsed().as_secs_f64(),
            path: ExecPath::Eager,
            padded_batch: batch.seqs.len(),
        }
    }

    /// A real decode-shaped forward pass of `size` one-token sequences (each in its own block
    /// where the cache has enough; nothing is cached yet, so writing them is harmless), so the
    /// first requests of that batch size find buffers and pages touched.
    fn warm_up(
        &mut self,
        cost: &crate::capture_cost::SizeCost,
    ) -> Result<crate::warmup::Warmed, String> {
        let blocks = self.cache.num_blocks().max(1);
        let tables: Vec<[crate::block_manager::BlockId; 1]> = (0..cost.size)
            .map(|i| [(i % blocks) as crate::block_manager::BlockId])
            .collect();
        let token = [0u32];
        let chunks: Vec<SeqChunk<'_>> = tables
            .iter()
            .map(|t| SeqChunk {
                tokens: &token,
                start: 0,
                block_table: t,
                want_logits: true,
                prompt_len: 0,
            })
            .collect();
        self.model.forward(&mut self.cache, &chunks)?;
        Ok(crate::warmup::Warmed::default())
    }

    fn sample(&mut self, seq: &mut Sequence) -> Sampled {
        self.logits.sample(seq)
    }

    fn prompt_logprobs(&mut self, seq: &mut Sequence) {
        self.logits.prompt_logprobs(seq);
    }

    fn eos_token(&self) -> u32 {
        self.logits.eos_token()
    }

    fn is_eos(&self, token: u32) -> bool {
        self.logits.is_eos(token)
    }
}

#[cfg(test)]
#[path = "cpu_tests.rs"]
mod tests;
