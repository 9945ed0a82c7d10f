//! Every op of `ops.rs` against a plain reference written out here in f64, with the tolerance
//! each comparison allows stated next to it.

use super::*;
use crate::model::config::RopeScaling;
use crate::model::kv_cache::KvCache;

/// Seeded LCG (Knuth's MMIX constants): values in `[-1, 1)`, reproducible without a crate.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn assert_close(got: &[f32], want: &[f64], tol: impl Fn(f64) -> f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let t = tol(w);
        assert!(
            (f64::from(g) - w).abs() <= t,
            "{what}[{i}]: got {g}, want {w} (tolerance {t:e})"
        );
    }
}

// ---------------------------------------------------------------- rms_norm

#[test]
fn rms_norm_matches_reference() {
    let mut rng = Lcg(1);
    for n in [1, 7, 64, 4096] {
        for eps in [1e-5f32, 1e-6] {
            let x: Vec<f32> = rng.vec(n).iter().map(|v| v * 3.0).collect();
            let w = rng.vec(n);
            let mut out = vec![0.0; n];
            rms_norm(&mut out, &x, &w, eps);
            let ms = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n as f64;
            let inv = 1.0 / (ms + f64::from(eps)).sqrt();
            let want: Vec<f64> = x
                .iter()
                .zip(&w)
                .map(|(&v, &g)| f64::from(g) * f64::from(v) * inv)
                .collect();
            // f32 sum of squares over n terms: relative error well under 1e-5 at these sizes.
            assert_close(&out, &want, |w| 1e-5 * w.abs() + 1e-6, "rms_norm");
        }
    }
}

#[test]
fn rms_norm_of_zeros_is_zero_not_nan() {
    let mut out = [9.0f32; 4];
    rms_norm(&mut out, &[0.0; 4], &[1.0; 4], 1e-6);
    assert_eq!(out, [0.0; 4]);
}

// ---------------------------------------------------------------- silu_mul

#[test]
fn silu_mul_matches_reference() {
    let mut rng = Lcg(2);
    let mut gate: Vec<f32> = rng.vec(200).iter().map(|v| v * 20.0).collect();
    gate.extend([
        0.0, -0.0, 1.0, -1.0, 88.0, -88.0, 100.0, -100.0, 1e-8, -1e-8,
    ]);
    let up: Vec<f32> = rng.vec(gate.len()).iter().map(|v| v * 4.0).collect();
    let want: Vec<f64> = gate
        .iter()
        .zip(&up)
        .map(|(&g, &u)| {
            let g = f64::from(g);
            g / (1.0 + (-g).exp()) * f64::from(u)
        })
        .collect();
    let mut got = gate.clone();
    silu_mul(&mut got, &up);
    // A few f32 roundings (exp, add, divide, multiply): 1e-6 relative, 1e-6 absolute near 0.
    assert_close(&got, &want, |w| 1e-6 * w.abs() + 1e-6, "silu_mul");
    assert!(got.iter().all(|v| v.is_finite()));
}

// ---------------------------------------------------------------- softmax

fn softmax_ref(x: &[f32]) -> Vec<f64> {
    let m = x
        .iter()
        .map(|&v| f64::from(v))
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|&v| (f64::from(v) - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

#[test]
fn softmax_matches_reference_and_sums_to_one() {
    let mut rng = Lcg(3);
    for n in [1, 2, 7, 1000, 32_000] {
        let x: Vec<f32> = rng.vec(n).iter().map(|v| v * 10.0).collect();
        let mut got = x.clone();
        softmax(&mut got);
        // Each probability: f32 exp and a normalisation by an f32 sum of n terms.
        assert_close(&got, &softmax_ref(&x), |w| 1e-5 * w + 1e-7, "softmax");
        let sum: f64 = got.iter().map(|&v| f64::from(v)).sum();
        assert!((sum - 1.0).abs() < 1e-4, "n {n}: sum {sum}");
    }
    let mut one = [42.0f32];
    softmax(&mut one);
    assert_eq!(one, [1.0]);
}

#[test]
fn softmax_is_stable_for_large_values() {
    let mut big = [1000.0f32, 1001.0, 1002.0, -1000.0];
    softmax(&mut big);
    assert!(big.iter().all(|v| v.is_finite()));
    let mut small = [0.0f32, 1.0, 2.0, -2000.0];
    softmax(&mut small);
    // Shift invariance: the max subtraction makes both inputs the same computation up to rounding.
    for (b, s) in big.iter().zip(&small) {
        assert!((b - s).abs() < 1e-6, "{big:?} vs {small:?}");
    }
    assert_close(
        &big,
        &softmax_ref(&[0.0, 1.0, 2.0, -2000.0]),
        |_| 1e-6,
        "large",
    );
    let mut extreme = [f32::MAX, f32::MAX, 0.0];
    softmax(&mut extreme);
    assert_close(&extreme, &[0.5, 0.5, 0.0], |_| 1e-7, "extreme");
    let mut masked = [f32::NEG_INFINITY, 3.0, f32::NEG_INFINITY, 3.0];
    softmax(&mut masked);
    assert_eq!(masked, [0.0, 0.5, 0.0, 0.5]);
}

// ---------------------------------------------------------------- dot

#[test]
fn dot_matches_naive_sum() {
    let mut rng = Lcg(4);
    for n in [0, 1, 7, 8, 9, 15, 16, 17, 100, 1000] {
        let a = rng.vec(n);
        let b = rng.vec(n);
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum();
        let mag: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| f64::from(x * y).abs())
            .sum();
        let got = f64::from(dot(&a, &b));
        // Classic summation bound: n·ε·Σ|aᵢbᵢ| (the tree of partial sums only does better).
        let tol = (n as f64 + 1.0) * f64::from(f32::EPSILON) * mag + 1e-30;
        assert!((got - want).abs() <= tol, "n {n}: got {got}, want {want}");
        // Small integers are exact in f32, whatever the order: every element must be counted.
        let ai: Vec<f32> = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
        let bi: Vec<f32> = (0..n).map(|i| (i % 3 + 1) as f32).collect();
        let exact: f32 = ai.iter().zip(&bi).map(|(x, y)| x * y).sum();
        assert_eq!(dot(&ai, &bi), exact, "n {n}");
    }
    assert_eq!(dot(&[], &[]), 0.0);
}

// ---------------------------------------------------------------- RoPE

/// `inv_freq` as Hugging Face writes it, with the scaling rules re-derived here in f64.
fn inv_freq_ref(head_dim: usize, theta: f64, scaling: Option<RopeScaling>) -> Vec<f64> {
    let base: Vec<f64> = (0..head_dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f64 / head_dim as f64))
        .collect();
    match scaling {
        None => base,
        // Linear scaling is applied to positions in `rope_ref`, not here.
        Some(RopeScaling::Linear { .. }) => base,
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => {
            let (factor, lo, hi) = (
                f64::from(factor),
                f64::from(low_freq_factor),
                f64::from(high_freq_factor),
            );
            let old = original_max_position_embeddings as f64;
            let low_wavelen = old / lo;
            let high_wavelen = old / hi;
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - lo) / (hi - lo);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

/// HF's `apply_rotary_pos_emb` for one position, literally: `x·cos + rotate_half(x)·sin` with
/// cos/sin duplicated over both halves of every head.
fn rope_ref(
    x: &[f32],
    head_dim: usize,
    theta: f64,
    s: Option<RopeScaling>,
    pos: usize,
) -> Vec<f64> {
    let inv = inv_freq_ref(head_dim, theta, s);
    let p = match s {
        Some(RopeScaling::Linear { factor }) => pos as f64 / f64::from(factor),
        _ => pos as f64,
    };
    let emb: Vec<f64> = inv.iter().chain(&inv).map(|f| p * f).collect();
    let half = head_dim / 2;
    let mut out = Vec::with_capacity(x.len());
    for head in x.chunks(head_dim) {
        let x: Vec<f64> = head.iter().map(|&v| f64::from(v)).collect();
        let rotated: Vec<f64> = x[half..]
            .iter()
            .map(|v| -v)
            .chain(x[..half].iter().copied())
            .collect();
        for d in 0..head_dim {
            out.push(x[d] * emb[d].cos() + rotated[d] * emb[d].sin());
        }
    }
    out
}

/// f32 angles `pos·f` lose about 2 ulp of the angle (the f32 `inv_freq`, then the product), so
/// the allowed error grows with the position: 2e-6 + 5e-7·pos for |x| ≤ 1. This is inherent to
/// f32 RoPE (HF computes the angles in f32 too), not slack for a wrong formula.
fn rope_tol(pos: usize) -> f64 {
    2e-6 + 5e-7 * pos as f64
}

const LLAMA31: RopeScaling = RopeScaling::Llama3 {
    factor: 8.0,
    low_freq_factor: 1.0,
    high_freq_factor: 4.0,
    original_max_position_embeddings: 8192,
};

const LLAMA32: RopeScaling = RopeScaling::Llama3 {
    factor: 32.0,
    low_freq_factor: 1.0,
    high_freq_factor: 4.0,
    original_max_position_embeddings: 8192,
};

#[test]
fn rope_matches_hf_formula() {
    let cases = [
        (64, 10_000.0, None),
        (128, 500_000.0, None),
        (128, 1_000_000.0, None),
        (64, 10_000.0, Some(RopeScaling::Linear { factor: 4.0 })),
        (128, 10_000.0, Some(RopeScaling::Linear { factor: 2.5 })),
        (128, 500_000.0, Some(LLAMA31)),
        (64, 500_000.0, Some(LLAMA32)),
    ];
    let mut rng = Lcg(5);
    for (head_dim, theta, scaling) in cases {
        let rope = Rope::new(head_dim, theta as f32, scaling);
        for pos in [0, 1, 2, 3, 17, 100, 511, 1000, 4095, 8191] {
            let x = rng.vec(3 * head_dim);
            let mut got = x.clone();
            rope.apply(&mut got, pos);
            let want = rope_ref(&x, head_dim, theta, scaling, pos);
            let what = format!("d {head_dim} θ {theta} {scaling:?} pos {pos}");
            assert_close(&got, &want, |_| rope_tol(pos), &what);
        }
    }
}

#[test]
fn linear_scaling_is_positions_divided_by_factor() {
    let plain = Rope::new(64, 10_000.0, None);
    let linear = Rope::new(64, 10_000.0, Some(RopeScaling::Linear { factor: 4.0 }));
    let mut rng = Lcg(6);
    for pos in [4, 8, 400, 4000] {
        let x = rng.vec(2 * 64);
        let (mut a, mut b) = (x.clone(), x.clone());
        linear.apply(&mut a, pos);
        plain.apply(&mut b, pos / 4);
        let b64: Vec<f64> = b.iter().map(|&v| f64::from(v)).collect();
        assert_close(&a, &b64, |_| 2.0 * rope_tol(pos), "linear vs plain");
    }
}

#[test]
fn llama3_reference_covers_all_three_bands() {
    // Otherwise `rope_matches_hf_formula` would not exercise every branch of the rule.
    let base = inv_freq_ref(128, 500_000.0, None);
    let scaled = inv_freq_ref(128, 500_000.0, Some(LLAMA31));
    let kept = base.iter().zip(&scaled).filter(|(b, s)| b == s).count();
    let divided = base
        .iter()
        .zip(&scaled)
        .filter(|(b, s)| (*b / 8.0 - *s).abs() < 1e-15)
        .count();
    let smoothed = base.len() - kept - divided;
    assert!(
        kept > 0 && divided > 0 && smoothed > 0,
        "{kept} {divided} {smoothed}"
    );
    // And the op really does differ from unscaled RoPE where the reference says it should.
    let x = Lcg(7).vec(128);
    let (mut a, mut b) = (x.clone(), x.clone());
    Rope::new(128, 500_000.0, Some(LLAMA31)).apply(&mut a, 5000);
    Rope::new(128, 500_000.0, None).apply(&mut b, 5000);
    assert_ne!(a, b);
}

#[test]
fn rope_at_position_zero_is_identity() {
    let mut rng = Lcg(8);
    for scaling in [
        None,
        Some(RopeScaling::Linear { factor: 8.0 }),
        Some(LLAMA31),
    ] {
        let rope = Rope::new(128, 500_000.0, scaling);
        let x = rng.vec(4 * 128);
        let mut y = x.clone();
        rope.apply(&mut y, 0);
        assert_eq!(x, y, "{scaling:?}");
    }
}

#[test]
fn rope_preserves_the_norm_of_each_pair() {
    let mut rng = Lcg(9);
    let (d, half) = (64, 32);
    for scaling in [
        None,
        Some(RopeScaling::Linear { factor: 2.0 }),
        Some(LLAMA32),
    ] {
        let rope = Rope::new(d, 10_000.0, scaling);
        for pos in [1, 7, 300, 131_071] {
            let x = rng.vec(2 * d);
            let mut y = x.clone();
            rope.apply(&mut y, pos);
            for (hx, hy) in x.chunks(d).zip(y.chunks(d)) {
                for i in 0..half {
                    let n0 = f64::from(hx[i]).hypot(f64::from(hx[i + half]));
                    let n1 = f64::from(hy[i]).hypot(f64::from(hy[i + half]));
                    // A rotation: only rounding of sin/cos and four products (~1e-6 relative).
                    assert!((n0 - n1).abs() <= 2e-6 * n0 + 1e-7, "pos {pos} pair {i}");
                }
            }
        }
    }
}

// ---------------------------------------------------------------- attend

const SHAPE: AttnShape = AttnShape {
    num_heads: 4,
    num_kv_heads: 2,
    head_dim: 8,
};
const BLOCK: usize = 4;
const LAYERS: usize = 2;
const KV_DIM: usize = 2 * 8;

/// Keys and values per layer and position, `[layer][pos][kv_dim]`, kept outside the cache so the
/// reference never reads through block tables.
struct History {
    k: Vec<Vec<Vec<f32>>>,
    v: Vec<Vec<Vec<f32>>>,
}

fn history(len: usize, seed: u64) -> History {
    let mut rng = Lcg(seed);
    let mut layers = || -> Vec<Vec<Vec<f32>>> {
        (0..LAYERS)
            .map(|_| (0..len).map(|_| rng.vec(KV_DIM)).collect())
            .collect()
    };
    let k = layers();
    let v = layers();
    History { k, v }
}

fn fill(cache: &mut KvCache, table: &[BlockId], h: &History) {
    for layer in 0..LAYERS {
        for pos in 0..h.k[layer].len() {
            cache.write(table, layer, pos, &h.k[layer][pos], &h.v[layer][pos]);
        }
    }
}

/// Naive causal attention: per query head, softmax(q·kⱼ/√d) over j ≤ pos, then Σ pⱼ vⱼ, with
/// query head h reading KV head h / (num_heads / num_kv_heads) as HF's `repeat_kv` does.
fn attend_ref(q: &[f32], h: &History, layer: usize, pos: usize) -> Vec<f64> {
    let d = SHAPE.head_dim;
    let group = SHAPE.num_heads / SHAPE.num_kv_heads;
    let mut out = Vec::new();
    for head in 0..SHAPE.num_heads {
        let kvh = head / group;
        let qh = &q[head * d..(head + 1) * d];
        let scores: Vec<f64> = (0..=pos)
            .map(|j| {
                let k = &h.k[layer][j][kvh * d..(kvh + 1) * d];
                let s: f64 = qh
                    .iter()
                    .zip(k)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                s / (d as f64).sqrt()
            })
            .collect();
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let z: f64 = e.iter().sum();
        for c in 0..d {
            let o: f64 = (0..=pos)
                .map(|j| e[j] / z * f64::from(h.v[layer][j][kvh * d + c]))
                .sum();
            out.push(o);
        }
    }
    out
}

#[test]
fn attend_matches_naive_causal_gqa() {
    let table: [BlockId; 3] = [5, 2, 7];
    let len = table.len() * BLOCK;
    let h = history(len, 10);
    let mut cache = KvCache::new(8, BLOCK, LAYERS, KV_DIM);
    fill(&mut cache, &table, &h);
    let mut rng = Lcg(11);
    // Scratch arrives dirty and oversized, as it does when reused across tokens.
    let mut scores = vec![f32::NAN; 100];
    for layer in 0..LAYERS {
        for pos in [0, 1, 3, 4, 5, 7, 8, 10, 11] {
            let q: Vec<f32> = rng
                .vec(SHAPE.num_heads * SHAPE.head_dim)
                .iter()
                .map(|v| v * 3.0)
                .collect();
            let mut out = vec![f32::NAN; q.len()];
            attend(&mut out, &q, &cache, &table, layer, pos, SHAPE, &mut scores);
            // Values in [-1, 1] and weights summing to 1: f32 rounding stays far below 1e-5.
            let what = format!("layer {layer} pos {pos}");
            assert_close(&out, &attend_ref(&q, &h, layer, pos), |_| 1e-5, &what);
        }
    }
}

#[test]
fn attend_at_position_zero_returns_the_first_value() {
    let table: [BlockId; 1] = [3];
    let h = history(BLOCK, 12);
    let mut cache = KvCache::new(4, BLOCK, LAYERS, KV_DIM);
    fill(&mut cache, &table, &h);
    let q = Lcg(13).vec(SHAPE.num_heads * SHAPE.head_dim);
    let mut out = vec![0.0; q.len()];
    attend(&mut out, &q, &cache, &table, 1, 0, SHAPE, &mut Vec::new());
    let d = SHAPE.head_dim;
    for head in 0..SHAPE.num_heads {
        let kvh = head / 2;
        assert_eq!(
            out[head * d..(head + 1) * d],
            h.v[1][0][kvh * d..(kvh + 1) * d]
        );
    }
}

#[test]
fn query_heads_share_kv_heads_in_contiguous_groups() {
    // KV head 0 holds values 1, KV head 1 values 2: heads 0-1 must read 1 and heads 2-3 read 2
    // (an interleaved h % num_kv_heads mapping would mix them).
    let table: [BlockId; 2] = [1, 0];
    let mut cache = KvCache::new(2, BLOCK, 1, KV_DIM);
    let mut rng = Lcg(14);
    let v: Vec<f32> = (0..KV_DIM).map(|i| if i < 8 { 1.0 } else { 2.0 }).collect();
    for pos in 0..6 {
        cache.write(&table, 0, pos, &rng.vec(KV_DIM), &v);
    }
    let q = rng.vec(32);
    let mut out = vec![0.0; 32];
    attend(&mut out, &q, &cache, &table, 0, 5, SHAPE, &mut Vec::new());
    for (i, o) in out.iter().enumerate() {
        let want = if i < 16 { 1.0 } else { 2.0 };
        assert!((o - want).abs() < 1e-6, "out[{i}] = {o}");
    }
}

#[test]
fn block_placement_does_not_change_the_result() {
    let h = history(3 * BLOCK, 15);
    let mut cache = KvCache::new(8, BLOCK, LAYERS, KV_DIM);
    let (ta, tb): ([BlockId; 3], [BlockId; 3]) = ([5, 2, 7], [0, 6, 1]);
    fill(&mut cache, &ta, &h);
    fill(&mut cache, &tb, &h);
    let mut contiguous = KvCache::new(3, BLOCK, LAYERS, KV_DIM);
    fill(&mut contiguous, &[0, 1, 2], &h);
    let mut rng = Lcg(16);
    let mut scratch = Vec::new();
    for pos in [0, 2, 4, 9, 11] {
        let q = rng.vec(32);
        let run = |c: &KvCache, t: &[BlockId], s: &mut Vec<f32>| {
            let mut out = vec![0.0f32; 32];
            attend(&mut out, &q, c, t, 1, pos, SHAPE, s);
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let a = run(&cache, &ta, &mut scratch);
        assert_eq!(a, run(&cache, &tb, &mut scratch), "pos {pos}");
        assert_eq!(a, run(&contiguous, &[0, 1, 2], &mut scratch), "pos {pos}");
    }
}
