//! Matrix multiplication for the forward pass.
//!
//! Two kernels, each of which computes an output row from its input row alone, in an order that
//! does not depend on how many other rows share the call, so a sequence's numbers do not depend
//! on its batch:
//! - prompt tokens go through `matrixmultiply`'s multithreaded sgemm, which orders the `k` loop by
//!   `k` alone and pads short row panels instead of switching kernels (about 110 GFLOP/s on 128
//!   rows here);
//! - generated tokens (decode) go through [`gemv_bt`], dot products over each weight row split
//!   across threads (AVX2/FMA where the CPU has them): sgemm repacks the whole weight matrix on
//!   every call, which makes one-row calls about 7× slower than reading the weights once.
//!
//! A token keeps its kernel for life (a preempted sequence recomputes its generated tokens with
//! the decode kernel), so recomputation reproduces the same K/V bit for bit.
#![expect(
    unsafe_code,
    reason = "the SIMD kernels call `std::arch` intrinsics behind runtime CPU-feature checks"
)]

use rayon::prelude::*;

use super::ops::dot;
use super::weights::Linear;

/// `out[n, m] = x[n, k] · w[m, k]ᵀ` for row-major `x`, `w` and `out`, through sgemm.
pub fn matmul_bt(out: &mut [f32], x: &[f32], w: &[f32], n: usize, k: usize, m: usize) {
    assert!(
        x.len() >= n * k && w.len() >= m * k && out.len() >= n * m,
        "matmul shape"
    );
    if n == 0 || m == 0 {
        return;
    }
    if k == 0 {
        out[..n * m].fill(0.0);
        return;
    }
    // SAFETY: the asserts above keep every index the strides reach inside the three slices:
    // x is n×k with row stride k, wᵀ is k×m read as w[j*k + kk], out is n×m with row stride m.
    unsafe {
        matrixmultiply::sgemm(
            n,
            k,
            m,
            1.0,
            x.as_ptr(),
            k as isize,
            1,
            w.as_ptr(),
            1,
            k as isize,
            0.0,
            out.as_mut_ptr(),
            m as isize,
            1,
        );
    }
}

/// Weight rows per parallel task of [`gemv_bt`].
const GEMV_BLOCK: usize = 64;

/// The same product as [`matmul_bt`] for few rows: every weight row is read once and dotted with
/// each input row; blocks of weight rows run in parallel. On x86-64 with AVX2 and FMA the dot
/// products use fused multiply-adds over four 8-lane accumulators (3.3× the portable loop for 8
/// rows of 576×1536 here); the kernel is chosen per machine, never per call, so every generated
/// token on a machine gets the same arithmetic.
pub fn gemv_bt(out: &mut [f32], x: &[f32], w: &[f32], n: usize, k: usize, m: usize) {
    assert!(
        x.len() >= n * k && w.len() >= m * k && out.len() >= n * m,
        "gemv shape"
    );
    if n == 0 || m == 0 {
        return;
    }
    let x = &x[..n * k];
    let fma = has_fma();
    // Computed transposed (`[m, n]`) so each task owns a contiguous slice, then scattered.
    let mut t = vec![0.0f32; m * n];
    t.par_chunks_mut(GEMV_BLOCK * n)
        .enumerate()
        .for_each(|(b, chunk)| {
            let rows = chunk.len() / n;
            let w = &w[b * GEMV_BLOCK * k..(b * GEMV_BLOCK + rows) * k];
            if fma {
                gemv_block_fma(chunk, x, w, n, k);
            } else {
                gemv_block(chunk, x, w, n, k);
            }
        });
    for (j, col) in t.chunks_exact(n).enumerate() {
        for (i, v) in col.iter().enumerate() {
            out[i * m + j] = *v;
        }
    }
}

/// `out[j * n + i] = dot(x_i, w_j)` for the weight rows `w` (`[rows, k]`) and input rows `x`.
fn gemv_block(out: &mut [f32], x: &[f32], w: &[f32], n: usize, k: usize) {
    for (col, wj) in out.chunks_exact_mut(n).zip(w.chunks_exact(k)) {
        for (o, xi) in col.iter_mut().zip(x.chunks_exact(k)) {
            *o = dot(xi, wj);
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn has_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_fma() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn gemv_block_fma(out: &mut [f32], x: &[f32], w: &[f32], n: usize, k: usize) {
    gemv_block(out, x, w, n, k);
}

/// [`gemv_block`] with AVX2 fused multiply-adds; callers check [`has_fma`] first.
#[cfg(target_arch = "x86_64")]
fn gemv_block_fma(out: &mut [f32], x: &[f32], w: &[f32], n: usize, k: usize) {
    // SAFETY: only reached when `has_fma()` found AVX2 and FMA on this CPU.
    unsafe { gemv_block_fma_inner(out, x, w, n, k) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gemv_block_fma_inner(out: &mut [f32], x: &[f32], w: &[f32], n: usize, k: usize) {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps,
        _mm256_storeu_ps,
    };
    let k32 = k / 32 * 32;
    for (col, wj) in out.chunks_exact_mut(n).zip(w.chunks_exact(k)) {
        for (o, xi) in col.iter_mut().zip(x.chunks_exact(k)) {
            let mut acc: [__m256; 4] = [_mm256_setzero_ps(); 4];
            for (xs, ws) in xi[..k32].chunks_exact(32).zip(wj[..k32].chunks_exact(32)) {
                for (l, a) in acc.iter_mut().enumerate() {
                    // SAFETY: `xs` and `ws` hold 32 floats, so lanes 8l..8l+8 are in bounds.
                    let (xv, wv) = unsafe {
                        (
                            _mm256_loadu_ps(xs.as_ptr().add(8 * l)),
                            _mm256_loadu_ps(ws.as_ptr().add(8 * l)),
                        )
                    };
                    *a = _mm256_fmadd_ps(xv, wv, *a);
                }
            }
            let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let mut lanes = [0.0f32; 8];
            // SAFETY: `lanes` holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
            let mut total = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
                + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
            for (a, b) in xi[k32..].iter().zip(&wj[k32..]) {
                total += a * b;
            }
            *o = total;
        }
    }
}

/// Which rows of a step's activations are generated tokens (decode kernel) and which are prompt
/// tokens (sgemm).
#[derive(Debug, Clone, Default)]
pub struct Rows {
    generated: Vec<bool>,
    num_generated: usize,
}

impl Rows {
    /// Rows flagged `true` are generated tokens.
    pub fn new(generated: Vec<bool>) -> Self {
        let num_generated = generated.iter().filter(|g| **g).count();
        Self {
            generated,
            num_generated,
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.generated.len()
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.generated.is_empty()
    }
}

/// `out[rows, m] = x[rows, k] · w[m, k]ᵀ`, each row through its kernel (see the module comment).
pub fn multiply(out: &mut [f32], x: &[f32], w: &[f32], k: usize, m: usize, rows: &Rows) {
    let n = rows.len();
    if rows.num_generated == 0 {
        matmul_bt(out, x, w, n, k, m);
    } else if rows.num_generated == n {
        gemv_bt(out, x, w, n, k, m);
    } else {
        // A mixed step: gather each kind's rows, multiply, scatter back.
        for generated in [false, true] {
            let idx: Vec<usize> = (0..n).filter(|&i| rows.generated[i] == generated).collect();
            let mut xs = Vec::with_capacity(idx.len() * k);
            for &i in &idx {
                xs.extend_from_slice(&x[i * k..(i + 1) * k]);
            }
            let mut os = vec![0.0f32; idx.len() * m];
            if generated {
                gemv_bt(&mut os, &xs, w, idx.len(), k, m);
            } else {
                matmul_bt(&mut os, &xs, w, idx.len(), k, m);
            }
            for (r, &i) in idx.iter().enumerate() {
                out[i * m..(i + 1) * m].copy_from_slice(&os[r * m..(r + 1) * m]);
            }
        }
    }
}

impl Linear {
    /// `out[rows, out_features] = x[rows, in_features] · weightᵀ + bias`, each row through its
    /// kernel.
    pub fn forward(&self, out: &mut [f32], x: &[f32], rows: &Rows) {
        let m = self.out_features;
        multiply(out, x, &self.weight, self.in_features, m, rows);
        if let Some(bias) = &self.bias {
            for row in out[..rows.len() * m].chunks_exact_mut(m) {
                for (o, b) in row.iter_mut().zip(bias) {
                    *o += b;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    fn naive(x: &[f32], w: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
        let mut out = vec![0.0f64; n * m];
        for i in 0..n {
            for j in 0..m {
                for kk in 0..k {
                    out[i * m + j] += f64::from(x[i * k + kk]) * f64::from(w[j * k + kk]);
                }
            }
        }
        out.into_iter().map(|v| v as f32).collect()
    }

    #[test]
    fn matches_a_plain_triple_loop() {
        let mut s = 7;
        for &(n, k, m) in &[
            (1, 1, 1),
            (1, 64, 96),
            (3, 17, 5),
            (9, 130, 33),
            (32, 256, 64),
        ] {
            let x: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
            let w: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
            let mut out = vec![f32::NAN; n * m];
            matmul_bt(&mut out, &x, &w, n, k, m);
            let want = naive(&x, &w, n, k, m);
            for (a, b) in out.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-5 * (k as f32).sqrt(),
                    "{n}x{k}x{m}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn row_results_do_not_depend_on_batch_size() {
        let mut s = 11;
        let (k, m) = (576, 1536);
        let w: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
        let x: Vec<f32> = (0..37 * k).map(|_| lcg(&mut s)).collect();
        let mut all = vec![0.0; 37 * m];
        matmul_bt(&mut all, &x, &w, 37, k, m);
        for (row, n_rows) in [(0usize, 1usize), (5, 3), (20, 8), (36, 1)] {
            let mut part = vec![0.0; n_rows * m];
            matmul_bt(&mut part, &x[row * k..], &w, n_rows, k, m);
            assert_eq!(
                &part[..],
                &all[row * m..(row + n_rows) * m],
                "rows {row}+{n_rows}"
            );
        }
    }

    #[test]
    fn bias_is_added_per_row() {
        let lin = Linear {
            weight: vec![1.0, 0.0, 0.0, 1.0],
            bias: Some(vec![10.0, 20.0]),
            out_features: 2,
            in_features: 2,
        };
        for kinds in [vec![false, false], vec![true, true], vec![true, false]] {
            let mut out = vec![0.0; 4];
            lin.forward(&mut out, &[1.0, 2.0, 3.0, 4.0], &Rows::new(kinds));
            assert_eq!(out, vec![11.0, 22.0, 13.0, 24.0]);
        }
    }

    #[test]
    fn gemv_matches_the_plain_loop_and_ignores_batch_company() {
        let mut s = 3;
        let (k, m) = (200, 150);
        let w: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
        let x: Vec<f32> = (0..9 * k).map(|_| lcg(&mut s)).collect();
        let mut all = vec![0.0; 9 * m];
        gemv_bt(&mut all, &x, &w, 9, k, m);
        let want = naive(&x, &w, 9, k, m);
        for (a, b) in all.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5 * (k as f32).sqrt(), "{a} vs {b}");
        }
        for row in [0usize, 4, 8] {
            let mut one = vec![0.0; m];
            gemv_bt(&mut one, &x[row * k..], &w, 1, k, m);
            assert_eq!(&one[..], &all[row * m..(row + 1) * m]);
        }
    }

    #[test]
    fn a_mixed_step_gives_each_row_what_its_kernel_gives_it_alone() {
        let mut s = 5;
        let (k, m) = (96, 70);
        let lin = Linear {
            weight: (0..m * k).map(|_| lcg(&mut s)).collect(),
            bias: None,
            out_features: m,
            in_features: k,
        };
        let x: Vec<f32> = (0..5 * k).map(|_| lcg(&mut s)).collect();
        let kinds = vec![false, true, true, false, true];
        let mut mixed = vec![0.0; 5 * m];
        lin.forward(&mut mixed, &x, &Rows::new(kinds.clone()));
        for (i, &g) in kinds.iter().enumerate() {
            let mut alone = vec![0.0; m];
            lin.forward(&mut alone, &x[i * k..(i + 1) * k], &Rows::new(vec![g]));
            assert_eq!(&alone[..], &mixed[i * m..(i + 1) * m], "row {i}");
        }
    }
}
