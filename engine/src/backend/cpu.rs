//! `cpu` backend: a real forward pass of a Llama-family model on this machine's cores, over the
//! engine's paged KV cache, and sampling on its logits. Step time is whatever the pass took.

use std::collections::HashMap;
use std::time::Instant;

use crate::backend::Backend;
use crate::model::forward::{Model, SeqChunk};
use crate::model::kv_cache::KvCache;
use crate::model::sampler;
use crate::roofline::{ExecPath, StepCost};
use crate::scheduler::Batch;
use crate::sequence::Sequence;

/// The real forward pass.
pub struct CpuBackend {
    model: Model,
    cache: KvCache,
    /// Logits of sequences whose last token this step computed, by sequence id.
    logits: HashMap<u64, Vec<f32>>,
    eos: Vec<u32>,
}

impl CpuBackend {
    /// A backend running `model` with a cache of `num_blocks` blocks of `block_size` tokens.
    pub fn new(model: Model, num_blocks: usize, block_size: usize) -> Self {
        let cache = model.new_cache(num_blocks, block_size);
        let eos = model.config.eos_token_ids.clone();
        Self {
            model,
            cache,
            logits: HashMap::new(),
            eos,
        }
    }
}

impl Backend for CpuBackend {
    fn execute(&mut self, batch: &Batch, running: &[Sequence]) -> StepCost {
        let started = Instant::now();
        self.logits.clear();
        let chunks: Vec<SeqChunk<'_>> = batch
            .seqs
            .iter()
            .map(|s| {
                let seq = &running[s.index];
                let end = seq.num_computed + s.num_tokens;
                SeqChunk {
                    tokens: &seq.tokens[seq.num_computed..end],
                    start: seq.num_computed,
                    block_table: &seq.block_table,
                    want_logits: end == seq.tokens.len(),
                    prompt_len: seq.prompt_len,
                }
            })
            .collect();
        match self.model.forward(&mut self.cache, &chunks) {
            Ok(all) => {
                let wanting = batch
                    .seqs
                    .iter()
                    .zip(&chunks)
                    .filter(|(_, c)| c.want_logits && !c.tokens.is_empty());
                for ((s, _), logits) in wanting.zip(all) {
                    self.logits.insert(running[s.index].id, logits);
                }
            }
            // Sequences without logits end at EOS (see `sample`); the cause is logged once here.
            Err(e) => tracing::error!(error = %e, "forward pass failed"),
        }
        StepCost {
            seconds: started.elapsed().as_secs_f64(),
            path: ExecPath::Eager,
            padded_batch: batch.seqs.len(),
        }
    }

    fn sample(&mut self, seq: &mut Sequence) -> u32 {
        match self.logits.remove(&seq.id) {
            Some(logits) => sampler::sample(&logits, &seq.params, &mut seq.rng_state),
            None => self.eos_token(),
        }
    }

    fn eos_token(&self) -> u32 {
        self.eos.first().copied().unwrap_or(0)
    }

    fn is_eos(&self, token: u32) -> bool {
        self.eos.contains(&token)
    }
}
