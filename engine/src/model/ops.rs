//! The element-wise and attention operations of a Llama block, on plain f32 slices.
//! Each one computes a row (token) from that row alone, in a fixed order, so results do not
//! depend on batch composition.

use super::config::RopeScaling;
use super::kv_cache::KvCache;
use crate::block_manager::BlockId;

/// `out = x / rms(x) * weight` for one row.
pub fn rms_norm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let n = x.len();
    let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / n as f32;
    let inv = 1.0 / (mean_sq + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (v * inv);
    }
}

/// `gate = silu(gate) * up`, element-wise (the SwiGLU activation).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// Softmax in place (max-subtracted).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Rotary position embedding frequencies for one head width, as Hugging Face computes them.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    /// Frequencies `theta^(-2i/d)`, stretched by `scaling` when given.
    pub fn new(head_dim: usize, theta: f32, scaling: Option<RopeScaling>) -> Self {
        let half = head_dim / 2;
        let mut inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        match scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) => {
                for f in &mut inv_freq {
                    *f /= factor;
                }
            }
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let old = original_max_position_embeddings as f32;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                for f in &mut inv_freq {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    if wavelen < high_wavelen {
                        continue;
                    }
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
        }
        Self { inv_freq }
    }

    /// The frequencies, `head_dim / 2` of them (what a GPU kernel rotates by).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Rotates every head of `x` (`[heads × head_dim]`) for position `pos`, rotate-half style
    /// (pairs `i` and `i + head_dim/2`), as Hugging Face Llama does.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        let p = pos as f32;
        for head in x.chunks_exact_mut(2 * half) {
            let (a, b) = head.split_at_mut(half);
            for ((x1, x2), f) in a.iter_mut().zip(b.iter_mut()).zip(&self.inv_freq) {
                let (sin, cos) = (p * f).sin_cos();
                let (u, v) = (*x1, *x2);
                *x1 = u * cos - v * sin;
                *x2 = v * cos + u * sin;
            }
        }
    }
}

/// Geometry of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
}

/// Causal attention of one query token at position `pos` over the keys and values at positions
/// `0..=pos` of the sequence owning `table` in `layer`; `q` and `out` are `[num_heads × head_dim]`.
/// `scores` is scratch of at least `pos + 1` values.
#[expect(
    clippy::too_many_arguments,
    reason = "the attention kernel's inputs are separate slices and shapes; a struct would only rename them"
)]
pub fn attend(
    out: &mut [f32],
    q: &[f32],
    cache: &KvCache,
    table: &[BlockId],
    layer: usize,
    pos: usize,
    shape: AttnShape,
    scores: &mut Vec<f32>,
) {
    let d = shape.head_dim;
    let group = shape.num_heads / shape.num_kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    scores.clear();
    scores.resize(pos + 1, 0.0);
    for h in 0..shape.num_heads {
        let kvh = h / group;
        let qh = &q[h * d..(h + 1) * d];
        for (j, s) in scores.iter_mut().enumerate() {
            let k = &cache.key(table, layer, j)[kvh * d..(kvh + 1) * d];
            *s = dot(qh, k) * scale;
        }
        softmax(scores);
        let oh = &mut out[h * d..(h + 1) * d];
        oh.fill(0.0);
        for (j, &p) in scores.iter().enumerate() {
            let v = &cache.value(table, layer, j)[kvh * d..(kvh + 1) * d];
            for (o, x) in oh.iter_mut().zip(v) {
                *o += p * x;
            }
        }
    }
}

/// Dot product with eight independent partial sums (vectorizes; fixed order).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0.0;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

#[cfg(test)]
#[path = "ops_tests.rs"]
mod tests;
