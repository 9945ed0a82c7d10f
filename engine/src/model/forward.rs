//! The Llama-family forward pass over a batch of sequence chunks, reading and writing K/V in the
//! engine's paged cache. All tokens of a step (decodes and prefill chunks alike) go through the
//! linear layers together as one matrix; attention runs per token over that token's own history.

use super::config::ModelConfig;
use super::kv_cache::KvCache;
use super::matmul::{Rows, multiply};
use super::ops::{AttnShape, Rope, attend, rms_norm, silu_mul};
use super::weights::ModelWeights;
use crate::block_manager::BlockId;
use rayon::prelude::*;

/// One sequence's share of a step: `tokens` sit at positions `start..start + tokens.len()`.
#[derive(Debug, Clone, Copy)]
pub struct SeqChunk<'a> {
    /// Tokens to compute this step.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]` (tokens before it are already in the cache).
    pub start: usize,
    /// The sequence's KV blocks, covering at least `start + tokens.len()` positions.
    pub block_table: &'a [BlockId],
    /// Return the logits after the last token of this chunk.
    pub want_logits: bool,
    /// Positions from here on hold generated tokens, which use the decode kernel (see
    /// [`super::matmul`]); prompt tokens use sgemm.
    pub prompt_len: usize,
}

/// A step's final hidden states (`[tokens × hidden]`) and which tokens are generated ones.
type Hidden = (Vec<f32>, Vec<bool>);

/// A model ready to run: shape, weights and RoPE frequencies.
pub struct Model {
    /// Shape.
    pub config: ModelConfig,
    /// Weights.
    pub weights: ModelWeights,
    rope: Rope,
}

/// Rows of extra logits (prompt logprobs) computed per head call: bounds their memory to
/// this many × vocabulary floats.
pub const EXTRA_ROWS_BLOCK: usize = 64;

/// Attention work (query-key pairs × heads) below which threads cost more than they save.
const PARALLEL_ATTENTION_WORK: usize = 1 << 16;

impl Model {
    /// Wraps loaded weights.
    pub fn new(config: ModelConfig, weights: ModelWeights) -> Self {
        let rope = Rope::new(config.head_dim, config.rope_theta, config.rope_scaling);
        Self {
            config,
            weights,
            rope,
        }
    }

    /// Bytes of KV cache one token takes.
    pub fn kv_bytes_per_token(&self) -> usize {
        KvCache::block_bytes(1, self.config.num_layers, self.config.kv_dim())
    }

    /// A cache sized for this model.
    pub fn new_cache(&self, num_blocks: usize, block_size: usize) -> KvCache {
        KvCache::new(
            num_blocks,
            block_size,
            self.config.num_layers,
            self.config.kv_dim(),
        )
    }

    /// Runs one step. Returns the logits (`vocab_size` values) of the last token of every chunk
    /// with `want_logits`, in chunk order. Token ids outside the vocabulary are an error.
    pub fn forward(
        &self,
        cache: &mut KvCache,
        chunks: &[SeqChunk<'_>],
    ) -> Result<Vec<Vec<f32>>, String> {
        self.forward_with_rows(cache, chunks, &[], &mut |_, _| {})
    }

    /// Runs one step as [`forward`](Self::forward) does, and also computes the logits after
    /// each `(chunk, position)` of `rows` (every position of a prompt, for its prompt logprobs),
    /// handing them to `on_row(index into rows, logits)` in order. They are computed
    /// [`EXTRA_ROWS_BLOCK`] rows at a time, so a long prompt never holds a whole
    /// `[tokens × vocabulary]` matrix. A position outside its chunk is an error.
    pub fn forward_with_rows(
        &self,
        cache: &mut KvCache,
        chunks: &[SeqChunk<'_>],
        rows: &[(usize, usize)],
        on_row: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<Vec<Vec<f32>>, String> {
        let c = &self.config;
        // Flattened index of each chunk's first token, to find the requested rows.
        let mut first = Vec::with_capacity(chunks.len());
        let mut total = 0;
        for ch in chunks {
            first.push(total);
            total += ch.tokens.len();
        }
        let extra = rows
            .iter()
            .map(|&(i, p)| match chunks.get(i) {
                Some(ch) if p >= ch.start && p < ch.start + ch.tokens.len() => {
                    Ok(first[i] + p - ch.start)
                }
                _ => Err(format!(
                    "logits row ({i}, {p}) is outside the step's chunks"
                )),
            })
            .collect::<Result<Vec<usize>, String>>()?;
        let Some((x, generated)) = self.hidden_states(cache, chunks)? else {
            return Ok(Vec::new());
        };

        // Only the last token of chunks that sample needs the (vocabulary-wide) head.
        let mut last_rows = Vec::new();
        let mut last = 0;
        for ch in chunks {
            last += ch.tokens.len();
            if ch.want_logits && !ch.tokens.is_empty() {
                last_rows.push(last - 1);
            }
        }
        let logits = self.head(&x, &generated, &last_rows);
        for (b, block) in extra.chunks(EXTRA_ROWS_BLOCK).enumerate() {
            let block_logits = self.head(&x, &generated, block);
            for (j, row) in block_logits.chunks_exact(c.vocab_size).enumerate() {
                on_row(b * EXTRA_ROWS_BLOCK + j, row);
            }
        }
        Ok(logits
            .chunks_exact(c.vocab_size)
            .map(<[f32]>::to_vec)
            .collect())
    }

    /// The final hidden states (`[tokens × hidden]`) of every token of the step, and which
    /// tokens are generated ones; `None` when the step has no tokens.
    pub(super) fn hidden_states(
        &self,
        cache: &mut KvCache,
        chunks: &[SeqChunk<'_>],
    ) -> Result<Option<Hidden>, String> {
        let c = &self.config;
        let (h, qd, kvd, inter) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        // Token t of the flattened step belongs to chunk `owner[t]` at position `pos[t]`.
        let mut owner = Vec::new();
        let mut pos = Vec::new();
        let mut generated = Vec::new();
        for (i, ch) in chunks.iter().enumerate() {
            let end = ch.start + ch.tokens.len();
            if end.div_ceil(cache.block_size()) > ch.block_table.len() {
                return Err(format!(
                    "chunk {i} reaches position {end} but holds {} blocks",
                    ch.block_table.len()
                ));
            }
            for p in ch.start..end {
                owner.push(i);
                pos.push(p);
                generated.push(p >= ch.prompt_len);
            }
        }
        let n = pos.len();
        if n == 0 {
            return Ok(None);
        }
        let rows = Rows::new(generated.clone());

        let mut x = vec![0.0f32; n * h];
        let mut t = 0;
        for ch in chunks {
            for &tok in ch.tokens {
                let id = tok as usize;
                if id >= c.vocab_size {
                    return Err(format!(
                        "token id {id} is outside the vocabulary of {}",
                        c.vocab_size
                    ));
                }
                x[t * h..(t + 1) * h]
                    .copy_from_slice(&self.weights.embed_tokens[id * h..(id + 1) * h]);
                t += 1;
            }
        }

        let mut normed = vec![0.0f32; n * h];
        let mut q = vec![0.0f32; n * qd];
        let mut k = vec![0.0f32; n * kvd];
        let mut v = vec![0.0f32; n * kvd];
        let mut attn = vec![0.0f32; n * qd];
        let mut proj = vec![0.0f32; n * h];
        let mut gate = vec![0.0f32; n * inter];
        let mut up = vec![0.0f32; n * inter];
        let shape = AttnShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };

        for (li, layer) in self.weights.layers.iter().enumerate() {
            for (o, row) in normed.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
                rms_norm(o, row, &layer.input_norm, c.rms_norm_eps);
            }
            layer.q_proj.forward(&mut q, &normed, &rows);
            layer.k_proj.forward(&mut k, &normed, &rows);
            layer.v_proj.forward(&mut v, &normed, &rows);
            for t in 0..n {
                self.rope.apply(&mut q[t * qd..(t + 1) * qd], pos[t]);
                self.rope.apply(&mut k[t * kvd..(t + 1) * kvd], pos[t]);
                let table = chunks[owner[t]].block_table;
                cache.write(
                    table,
                    li,
                    pos[t],
                    &k[t * kvd..(t + 1) * kvd],
                    &v[t * kvd..(t + 1) * kvd],
                );
            }
            self.attention(&mut attn, &q, cache, chunks, &owner, &pos, li, shape);
            layer.o_proj.forward(&mut proj, &attn, &rows);
            for (a, b) in x.iter_mut().zip(&proj) {
                *a += b;
            }

            for (o, row) in normed.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
                rms_norm(o, row, &layer.post_attention_norm, c.rms_norm_eps);
            }
            layer.gate_proj.forward(&mut gate, &normed, &rows);
            layer.up_proj.forward(&mut up, &normed, &rows);
            silu_mul(&mut gate, &up);
            layer.down_proj.forward(&mut proj, &gate, &rows);
            for (a, b) in x.iter_mut().zip(&proj) {
                *a += b;
            }
        }

        Ok(Some((x, generated)))
    }

    /// Logits of the flattened tokens `rows` of the hidden states `x`: final norm, then the
    /// tied or untied head, with each row's kernel chosen by whether it is a generated token.
    fn head(&self, x: &[f32], generated: &[bool], rows: &[usize]) -> Vec<f32> {
        let c = &self.config;
        let h = c.hidden_size;
        let m = rows.len();
        let mut final_norm = vec![0.0f32; m * h];
        for (o, &r) in final_norm.chunks_exact_mut(h).zip(rows) {
            rms_norm(
                o,
                &x[r * h..(r + 1) * h],
                &self.weights.norm,
                c.rms_norm_eps,
            );
        }
        let head_rows = Rows::new(rows.iter().map(|&r| generated[r]).collect());
        let mut logits = vec![0.0f32; m * c.vocab_size];
        match &self.weights.lm_head {
            Some(head) => head.forward(&mut logits, &final_norm, &head_rows),
            None => multiply(
                &mut logits,
                &final_norm,
                &self.weights.embed_tokens,
                h,
                c.vocab_size,
                &head_rows,
            ),
        }
        logits
    }

    /// Attention for every token of the step, spread over threads by token when there is enough
    /// work. Each token's result depends only on its own query and history.
    #[expect(
        clippy::too_many_arguments,
        reason = "the step's buffers are borrowed separately so threads can share them"
    )]
    fn attention(
        &self,
        out: &mut [f32],
        q: &[f32],
        cache: &KvCache,
        chunks: &[SeqChunk<'_>],
        owner: &[usize],
        pos: &[usize],
        layer: usize,
        shape: AttnShape,
    ) {
        let qd = shape.num_heads * shape.head_dim;
        let n = pos.len();
        let work: usize = pos.iter().map(|p| p + 1).sum::<usize>() * shape.num_heads;
        let one = |t: usize, o: &mut [f32], scores: &mut Vec<f32>| {
            let table = chunks[owner[t]].block_table;
            attend(
                o,
                &q[t * qd..(t + 1) * qd],
                cache,
                table,
                layer,
                pos[t],
                shape,
                scores,
            );
        };
        let out = &mut out[..n * qd];
        if work < PARALLEL_ATTENTION_WORK {
            let mut scores = Vec::new();
            for (t, o) in out.chunks_exact_mut(qd).enumerate() {
                one(t, o, &mut scores);
            }
        } else {
            out.par_chunks_mut(qd)
                .enumerate()
                .for_each_init(Vec::new, |scores, (t, o)| one(t, o, scores));
        }
    }
}
