//! `cpu` backend: a real forward pass of a Llama-family model on this machine's cores, over the
//! engine's paged KV cache, and sampling on its logits. Step time is whatever the pass took.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::backend::{Backend, Sampled};
use crate::logprobs::{self, TokenLogprob};
use crate::model::forward::{Model, SeqChunk};
use crate::model::kv_cache::KvCache;
use crate::model::sampler;
use crate::roofline::{ExecPath, StepCost};
use crate::scheduler::Batch;
use crate::sequence::Sequence;

/// The real forward pass.
pub struct CpuBackend {
    /// Shared with the embeddings path, which only reads the weights.
    model: Arc<Model>,
    cache: KvCache,
    /// Logits of sequences whose last token this step computed, by sequence id.
    logits: HashMap<u64, Vec<f32>>,
    /// Prompt logprobs this step computed, by sequence id: the first position, then entries.
    prompt_logprobs: HashMap<u64, (usize, Vec<TokenLogprob>)>,
    eos: Vec<u32>,
}

impl CpuBackend {
    /// A backend running `model` with a cache of `num_blocks` blocks of `block_size` tokens.
    pub fn new(model: Arc<Model>, num_blocks: usize, block_size: usize) -> Self {
        let cache = model.new_cache(num_blocks, block_size);
        let eos = model.config.eos_token_ids.clone();
        Self {
            model,
            cache,
            logits: HashMap::new(),
            prompt_logprobs: HashMap::new(),
            eos,
        }
    }
}

impl Backend for CpuBackend {
    fn execute(&mut self, batch: &Batch, running: &[Sequence]) -> StepCost {
        let started = Instant::now();
        self.logits.clear();
        self.prompt_logprobs.clear();
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
        // Extra logits rows for prompt logprobs: the entry of prompt position p comes from the
        // logits after position p - 1, so a chunk covering [start, end) yields the entries of
        // positions start + 1 ..= end (the token at `end` is known: it is still prompt).
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        for (i, s) in batch.seqs.iter().enumerate() {
            let seq = &running[s.index];
            let Some(k) = seq
                .params
                .prompt_logprobs
                .filter(|_| seq.needs_prompt_logprobs())
            else {
                continue;
            };
            let from = (seq.num_computed + 1).max(seq.prompt_logprobs.len());
            let to = (seq.num_computed + s.num_tokens).min(seq.prompt_len.saturating_sub(1));
            if from <= to {
                self.prompt_logprobs.insert(seq.id, (from, Vec::new()));
            }
            for p in from..=to {
                rows.push((i, p - 1));
                targets.push((seq.id, seq.tokens[p], k));
            }
        }
        let entries = &mut self.prompt_logprobs;
        let mut on_row = |r: usize, logits: &[f32]| {
            let (id, token, k) = targets[r];
            if let Some((_, v)) = entries.get_mut(&id) {
                v.push(logprobs::from_logits(logits, token, k));
            }
        };
        match self
            .model
            .forward_with_rows(&mut self.cache, &chunks, &rows, &mut on_row)
        {
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
            Err(e) => {
                self.prompt_logprobs.clear();
                tracing::error!(error = %e, "forward pass failed");
            }
        }
        StepCost {
            seconds: started.elapsed().as_secs_f64(),
            path: ExecPath::Eager,
            padded_batch: batch.seqs.len(),
        }
    }

    fn sample(&mut self, seq: &mut Sequence) -> Sampled {
        match self.logits.remove(&seq.id) {
            Some(logits) => {
                let token = sampler::sample(&logits, &seq.params, &mut seq.rng_state);
                // The raw model distribution, before temperature, top-k and top-p (vLLM's
                // default `raw_logprobs`).
                let logprob = seq
                    .params
                    .logprobs
                    .map(|k| logprobs::from_logits(&logits, token, k));
                Sampled { token, logprob }
            }
            // No logits (the pass failed): end the sequence; a logprob is still owed when asked.
            None => Sampled {
                token: self.eos_token(),
                logprob: seq.params.logprobs.map(|_| TokenLogprob {
                    token: self.eos_token(),
                    logprob: f32::NEG_INFINITY,
                    top: Vec::new(),
                }),
            },
        }
    }

    fn prompt_logprobs(&mut self, seq: &mut Sequence) {
        if let Some((from, entries)) = self.prompt_logprobs.remove(&seq.id)
            && from == seq.prompt_logprobs.len()
        {
            seq.prompt_logprobs.extend(entries.into_iter().map(Some));
        }
    }

    fn eos_token(&self) -> u32 {
        self.eos.first().copied().unwrap_or(0)
    }

    fn is_eos(&self, token: u32) -> bool {
        self.eos.contains(&token)
    }
}

#[cfg(test)]
#[path = "cpu_tests.rs"]
mod tests;
