//! What the real backends (`cpu`, `cuda`) share around their forward passes: the step's
//! chunks, the extra logits rows prompt logprobs need, and sampling on the logits a step
//! computed. Only the forward pass itself differs between them.

use std::collections::HashMap;

use crate::backend::Sampled;
use crate::logprobs::{self, TokenLogprob};
use crate::model::forward::SeqChunk;
use crate::model::sampler;
use crate::scheduler::Batch;
use crate::sequence::Sequence;

/// Each scheduled sequence's chunk of this step, in batch order.
pub fn chunks<'a>(batch: &Batch, running: &'a [Sequence]) -> Vec<SeqChunk<'a>> {
    batch
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
        .collect()
}

/// The logits of a real backend's last step, by sequence id, and sampling on them.
#[derive(Default)]
pub struct StepLogits {
    /// Logits of sequences whose last token this step computed.
    logits: HashMap<u64, Vec<f32>>,
    /// Prompt logprobs this step computed: the first position, then entries.
    prompt_logprobs: HashMap<u64, (usize, Vec<TokenLogprob>)>,
    /// `(sequence id, prompt token, top-k)` of each extra row of the step.
    targets: Vec<(u64, u32, usize)>,
    eos: Vec<u32>,
}

impl StepLogits {
    /// Empty, for a model whose generation ends at any of `eos`.
    pub fn new(eos: Vec<u32>) -> Self {
        Self {
            eos,
            ..Self::default()
        }
    }

    /// Forgets the last step and returns this step's extra logits rows, `(chunk, position)`:
    /// the entry of prompt position p comes from the logits after position p - 1, so a chunk
    /// covering [start, end) yields the entries of positions start + 1 ..= end (the token at
    /// `end` is known: it is still prompt).
    pub fn begin_step(&mut self, batch: &Batch, running: &[Sequence]) -> Vec<(usize, usize)> {
        self.logits.clear();
        self.prompt_logprobs.clear();
        self.targets.clear();
        let mut rows = Vec::new();
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
                self.targets.push((seq.id, seq.tokens[p], k));
            }
        }
        rows
    }

    /// Takes the logits of extra row `r` (an index into [`begin_step`](Self::begin_step)'s
    /// rows, handed over in order).
    pub fn on_row(&mut self, r: usize, logits: &[f32]) {
        let Some(&(id, token, k)) = self.targets.get(r) else {
            return;
        };
        if let Some((_, v)) = self.prompt_logprobs.get_mut(&id) {
            v.push(logprobs::from_logits(logits, token, k));
        }
    }

    /// Stores the step's sampling logits: `all` holds one vector per chunk with `want_logits`
    /// and tokens, in chunk order.
    pub fn finish(
        &mut self,
        batch: &Batch,
        running: &[Sequence],
        chunks: &[SeqChunk<'_>],
        all: Vec<Vec<f32>>,
    ) {
        let wanting = batch
            .seqs
            .iter()
            .zip(chunks)
            .filter(|(_, c)| c.want_logits && !c.tokens.is_empty());
        for ((s, _), logits) in wanting.zip(all) {
            self.logits.insert(running[s.index].id, logits);
        }
    }

    /// The step failed: its sequences end at EOS (see [`sample`](Self::sample)); the cause is
    /// logged once.
    pub fn failed(&mut self, error: &str) {
        self.logits.clear();
        self.prompt_logprobs.clear();
        tracing::error!(error, "forward pass failed");
    }

    /// Samples `seq`'s next token from its logits; with none (the pass failed) it ends.
    pub fn sample(&mut self, seq: &mut Sequence) -> Sampled {
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

    /// Appends the prompt logprobs the last step computed for `seq`.
    pub fn prompt_logprobs(&mut self, seq: &mut Sequence) {
        if let Some((from, entries)) = self.prompt_logprobs.remove(&seq.id)
            && from == seq.prompt_logprobs.len()
        {
            seq.prompt_logprobs.extend(entries.into_iter().map(Some));
        }
    }

    /// The first EOS token.
    pub fn eos_token(&self) -> u32 {
        self.eos.first().copied().unwrap_or(0)
    }

    /// Whether `token` ends generation.
    pub fn is_eos(&self, token: u32) -> bool {
        self.eos.contains(&token)
    }
}
