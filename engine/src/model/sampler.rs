//! Next-token sampling on real logits, with vLLM's semantics: greedy at temperature 0 or top-k 1,
//! otherwise temperature, top-k, softmax, top-p (nucleus), and one uniform draw from the
//! sequence's own splitmix64 state, so a seeded request reproduces its tokens.

use std::cmp::Ordering;

use crate::request::SamplingParams;

/// First slice of the ranking the nucleus search sorts; most nuclei fit in it, and each retry
/// quadruples it, so the common case never sorts the whole vocabulary.
const NUCLEUS_FIRST_CHUNK: usize = 64;

/// Picks the next token from `logits` under `params`; `rng` is the sequence's PRNG state, advanced only when the draw is random.
///
/// "Random" is decided by `params` alone: every non-greedy call on non-empty logits takes exactly
/// one splitmix64 step, whatever the logits look like, so a seed's stream depends only on how
/// many tokens were sampled. NaN logits count as `-inf`; a `+inf` logit wins outright (the
/// lowest index among several); all `-inf` falls back to [`argmax`], i.e. index 0.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut u64) -> u32 {
    if logits.is_empty() {
        return 0;
    }
    let t = params.temperature;
    // Negative and NaN temperatures are invalid; greedy is the only sane reading of them.
    if t.is_nan() || t <= 0.0 || params.top_k == 1 {
        return argmax(logits);
    }
    let u = uniform(rng);

    let max = logits
        .iter()
        .copied()
        .map(clean)
        .fold(f32::NEG_INFINITY, f32::max);
    if max.is_infinite() {
        // Nothing to weigh (all -inf/NaN), or the softmax limit puts all mass on the +inf ones.
        return argmax(logits);
    }
    // Max-subtracted, so every exponent is ≤ 0 and the top token weighs exactly 1: no overflow
    // at tiny temperatures, and the total is never zero.
    let weight = |x: f32| -> f32 {
        let x = clean(x);
        if x == f32::NEG_INFINITY {
            return 0.0;
        }
        let w = ((x - max) / t).exp();
        // `-inf / inf` (finite logits whose difference overflows, at t = inf) is NaN: weigh 0.
        if w.is_nan() { 0.0 } else { w }
    };

    let n = logits.len();
    let k = match usize::try_from(params.top_k) {
        Ok(k) if k > 0 => k.min(n),
        _ => n,
    };
    let nucleus = params.top_p < 1.0;

    if k == n && !nucleus {
        // Plain softmax sampling: one pass of weights and a cumulative scan, no ranking at all.
        let w: Vec<f32> = logits.iter().map(|&x| weight(x)).collect();
        let total: f64 = w.iter().map(|&v| f64::from(v)).sum();
        let pick = draw(w.iter().enumerate().map(|(i, &v)| (i, v)), u * total);
        return pick.map_or(0, |i| i as u32);
    }

    // Candidates: every token that can carry mass, ranked by (logit desc, index asc) so that
    // ties at the top-k or top-p boundary keep the lowest indices, deterministically.
    let key = |i: u32| clean(logits[i as usize]);
    let desc = |a: &u32, b: &u32| -> Ordering { key(*b).total_cmp(&key(*a)).then(a.cmp(b)) };
    let mut idx: Vec<u32> = (0..n as u32)
        .filter(|&i| key(i) > f32::NEG_INFINITY)
        .collect();
    if k < idx.len() {
        // Only the k best are needed, in no particular order yet: O(n) instead of a sort.
        idx.select_nth_unstable_by(k - 1, desc);
        idx.truncate(k);
    }

    let kept = if nucleus {
        let total: f64 = idx
            .iter()
            .map(|&i| f64::from(weight(logits[i as usize])))
            .sum();
        let cut = nucleus_len(
            &mut idx,
            desc,
            |i| weight(logits[i as usize]),
            params.top_p,
            total,
        );
        &idx[..cut]
    } else {
        &idx[..]
    };
    let kept_total: f64 = kept
        .iter()
        .map(|&i| f64::from(weight(logits[i as usize])))
        .sum();
    let pick = draw(
        kept.iter()
            .map(|&i| (i as usize, weight(logits[i as usize]))),
        u * kept_total,
    );
    pick.map_or_else(|| argmax(logits), |i| i as u32)
}

/// Index of the largest logit (the lowest index among equals); NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_val = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        // Strictly greater: ties keep the first, and NaN compares false so it never takes over.
        if v > best_val {
            best = i;
            best_val = v;
        }
    }
    best as u32
}

/// NaN is no evidence for a token: rank and weigh it as `-inf`.
fn clean(x: f32) -> f32 {
    if x.is_nan() { f32::NEG_INFINITY } else { x }
}

/// Sorts the best of `idx` (already unordered candidates) just far enough to find the nucleus,
/// and returns its length: the smallest prefix of the ranking whose mass reaches
/// `top_p × total` (vLLM keeps a token while the mass ranked above it is below that), never 0.
fn nucleus_len(
    idx: &mut [u32],
    desc: impl Fn(&u32, &u32) -> Ordering + Copy,
    weight: impl Fn(u32) -> f32,
    top_p: f32,
    total: f64,
) -> usize {
    let threshold = f64::from(top_p) * total;
    let len = idx.len();
    let mut sorted = 0;
    let mut chunk = NUCLEUS_FIRST_CHUNK;
    let mut cum = 0.0f64;
    while sorted < len {
        let end = (sorted + chunk).min(len);
        let rest = &mut idx[sorted..];
        if end < len {
            // Bring the next best `end - sorted` to the front of the unsorted tail.
            rest.select_nth_unstable_by(end - sorted - 1, desc);
        }
        rest[..end - sorted].sort_unstable_by(desc);
        for (j, &i) in idx.iter().enumerate().take(end).skip(sorted) {
            if j > 0 && cum >= threshold {
                return j;
            }
            cum += f64::from(weight(i));
        }
        sorted = end;
        chunk = chunk.saturating_mul(4);
    }
    len
}

/// The first entry of `items` at which the running weight passes `target`; rounding can leave
/// `target` at the very total, so the last positive-weight entry stands in for "past the end".
fn draw(items: impl Iterator<Item = (usize, f32)>, target: f64) -> Option<usize> {
    let mut cum = 0.0f64;
    let mut last = None;
    for (i, w) in items {
        if w > 0.0 {
            cum += f64::from(w);
            last = Some(i);
            if cum > target {
                return last;
            }
        }
    }
    last
}

/// A uniform in `[0, 1)` from the top 53 bits of one splitmix64 step.
fn uniform(state: &mut u64) -> f64 {
    (splitmix64(state) >> 11) as f64 / (1u64 << 53) as f64
}

/// splitmix64: one add and a finalizer; tiny state, well mixed even from adjacent seeds.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, top_k: i32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            top_k,
            seed: Some(7),
            ..SamplingParams::default()
        }
    }

    fn softmax64(logits: &[f32], t: f64) -> Vec<f64> {
        let m = logits
            .iter()
            .map(|&x| f64::from(x))
            .fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = logits
            .iter()
            .map(|&x| ((f64::from(x) - m) / t).exp())
            .collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    fn histogram(logits: &[f32], p: &SamplingParams, draws: usize, seed: u64) -> Vec<f64> {
        let mut rng = seed;
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..draws {
            counts[sample(logits, p, &mut rng) as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    /// Seeded pseudo-random logits in `[-scale, scale)`.
    fn random_logits(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| (uniform(&mut s) as f32 * 2.0 - 1.0) * scale)
            .collect()
    }

    #[test]
    fn greedy_picks_the_max_and_ties_go_to_the_lowest_index() {
        let p = params(0.0, 1.0, -1);
        let mut rng = 5;
        assert_eq!(sample(&[0.1, 2.0, -1.0, 1.9], &p, &mut rng), 1);
        assert_eq!(sample(&[1.0, 3.0, 3.0, 3.0], &p, &mut rng), 1);
        assert_eq!(sample(&[-5.0, -5.0], &p, &mut rng), 0);
        assert_eq!(rng, 5, "greedy draws nothing");
        assert_eq!(argmax(&[0.0, 7.0, 7.0]), 1);
        assert_eq!(argmax(&[4.0]), 0);
    }

    #[test]
    fn top_k_one_is_greedy_even_with_temperature() {
        let logits = [0.0, 0.5, 0.49, 0.3];
        let p = params(5.0, 0.9, 1);
        let mut rng = 123;
        for _ in 0..100 {
            assert_eq!(sample(&logits, &p, &mut rng), 1);
        }
        assert_eq!(rng, 123, "top_k = 1 draws nothing");
    }

    #[test]
    fn seeded_draws_are_deterministic_and_seeds_differ() {
        let logits = random_logits(1000, 1, 3.0);
        for p in [
            params(1.0, 1.0, -1),
            params(0.8, 0.9, 50),
            params(1.2, 0.7, 0),
        ] {
            let run = |seed: u64| {
                let mut rng = seed;
                (0..64)
                    .map(|_| sample(&logits, &p, &mut rng))
                    .collect::<Vec<_>>()
            };
            assert_eq!(run(42), run(42));
            assert_ne!(run(42), run(43));
        }
        // Each random draw takes exactly one step of the state.
        let mut rng = 9;
        let mut expected = 9;
        sample(&logits, &params(1.0, 1.0, -1), &mut rng);
        splitmix64(&mut expected);
        assert_eq!(rng, expected);
    }

    #[test]
    fn empirical_distribution_matches_softmax() {
        let logits = [1.0, 2.0, 0.5, -1.0, 3.0, 2.5];
        let want = softmax64(&logits, 1.0);
        let got = histogram(&logits, &params(1.0, 1.0, -1), 20_000, 11);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 0.02, "got {got:?} want {want:?}");
        }
        // top_k larger than the vocabulary and top_k = 0 / -1 change nothing.
        for k in [0, -1, 6, 100] {
            let got = histogram(&logits, &params(1.0, 1.0, k), 20_000, 12);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 0.02, "top_k {k}: got {got:?} want {want:?}");
            }
        }
    }

    #[test]
    fn top_k_keeps_only_the_k_best_renormalized() {
        let logits = [1.0, 2.0, 0.5, -1.0, 3.0, 2.5];
        let got = histogram(&logits, &params(1.0, 1.0, 2), 20_000, 13);
        let want = softmax64(&[3.0, 2.5], 1.0);
        for (i, g) in got.iter().enumerate() {
            match i {
                4 => assert!((g - want[0]).abs() < 0.02, "{got:?}"),
                5 => assert!((g - want[1]).abs() < 0.02, "{got:?}"),
                _ => assert_eq!(*g, 0.0, "token {i} is outside the top 2"),
            }
        }
        // Ties at the boundary keep the lowest indices.
        let tied = [1.0, 5.0, 1.0, 1.0, 1.0];
        let got = histogram(&tied, &params(1.0, 1.0, 2), 2_000, 14);
        assert!(got[0] > 0.0 && got[1] > 0.0);
        assert_eq!(got[2] + got[3] + got[4], 0.0);
    }

    #[test]
    fn top_p_on_a_peaked_distribution_returns_only_the_top_token() {
        let logits = [0.0, 5.0, 1.0, 0.5, 2.0];
        let mut rng = 3;
        let p = params(1.0, 0.5, -1);
        for _ in 0..1000 {
            assert_eq!(sample(&logits, &p, &mut rng), 1);
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        // Probabilities 0.5, 0.3, 0.2 (in logit space): top_p 0.7 needs the first two.
        let probs = [0.2f64, 0.5, 0.3];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        let got = histogram(&logits, &params(1.0, 0.7, -1), 20_000, 15);
        assert_eq!(got[0], 0.0);
        assert!((got[1] - 0.625).abs() < 0.02, "{got:?}");
        assert!((got[2] - 0.375).abs() < 0.02, "{got:?}");
        // 0.79: the mass above the third token (0.8) already reaches it, so it stays out.
        let got = histogram(&logits, &params(1.0, 0.79, -1), 5_000, 16);
        assert_eq!(got[0], 0.0);
        // A non-positive top_p still keeps one token.
        let mut rng = 1;
        assert_eq!(sample(&logits, &params(1.0, 0.0, -1), &mut rng), 1);
    }

    #[test]
    fn nucleus_search_matches_a_full_sort_on_a_large_vocabulary() {
        let logits = random_logits(152_064, 77, 8.0);
        for (top_p, top_k, t) in [
            (0.9, -1, 1.0),
            (0.5, -1, 0.7),
            (0.999, -1, 1.3),
            (0.95, 500, 1.0),
        ] {
            let p = params(t, top_p, top_k);
            // Reference: full sort, then the HF/vLLM rule, then the same cumulative draw.
            let mut order: Vec<usize> = (0..logits.len()).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
            if top_k > 0 {
                order.truncate(top_k as usize);
            }
            let m = logits[order[0]];
            let w: Vec<f32> = order.iter().map(|&i| ((logits[i] - m) / t).exp()).collect();
            let total: f64 = w.iter().map(|&v| f64::from(v)).sum();
            let mut cum = 0.0;
            let mut cut = order.len();
            for (j, &v) in w.iter().enumerate() {
                if j > 0 && cum >= f64::from(top_p) * total {
                    cut = j;
                    break;
                }
                cum += f64::from(v);
            }
            let kept: f64 = w[..cut].iter().map(|&v| f64::from(v)).sum();
            for seed in 0..50u64 {
                let mut rng = seed;
                let mut ref_rng = seed;
                let target = uniform(&mut ref_rng) * kept;
                let mut acc = 0.0;
                let mut want = order[cut - 1];
                for (j, &v) in w[..cut].iter().enumerate() {
                    acc += f64::from(v);
                    if acc > target {
                        want = order[j];
                        break;
                    }
                }
                assert_eq!(sample(&logits, &p, &mut rng) as usize, want, "seed {seed}");
                assert_eq!(rng, ref_rng);
            }
        }
    }

    #[test]
    fn lower_temperature_is_sharper() {
        let logits = [1.0, 2.0, 0.0, 1.5];
        let cold = histogram(&logits, &params(0.5, 1.0, -1), 20_000, 17);
        let warm = histogram(&logits, &params(1.0, 1.0, -1), 20_000, 17);
        let hot = histogram(&logits, &params(2.0, 1.0, -1), 20_000, 17);
        assert!(cold[1] > warm[1] + 0.05 && warm[1] > hot[1] + 0.05);
        for (g, w) in cold.iter().zip(softmax64(&logits, 0.5)) {
            assert!((g - w).abs() < 0.02, "{cold:?}");
        }
        // A tiny positive temperature is greedy in effect (no overflow to NaN).
        let mut rng = 2;
        for _ in 0..100 {
            assert_eq!(sample(&logits, &params(1e-30, 1.0, -1), &mut rng), 1);
        }
    }

    #[test]
    fn nan_and_infinite_logits_do_not_panic() {
        let nan = f32::NAN;
        let inf = f32::INFINITY;
        let all = [
            params(0.0, 1.0, -1),
            params(1.0, 1.0, -1),
            params(1.0, 0.9, -1),
            params(1.0, 1.0, 2),
            params(f32::INFINITY, 0.5, 3),
            params(f32::NAN, 1.0, -1),
            params(-1.0, 1.0, -1),
        ];
        for p in &all {
            let mut rng = 4;
            // NaN never wins and is never drawn.
            for _ in 0..200 {
                let t = sample(&[nan, 1.0, nan, 0.5], p, &mut rng);
                assert!(t == 1 || t == 3, "{t}");
            }
            // All -inf / NaN: index 0.
            assert_eq!(sample(&[-inf, nan, -inf], p, &mut rng), 0);
            assert_eq!(sample(&[nan, nan], p, &mut rng), 0);
            // +inf wins outright, the first of several.
            assert_eq!(sample(&[0.0, inf, 3.0, inf], p, &mut rng), 1);
            // -inf tokens are never drawn.
            for _ in 0..200 {
                assert_ne!(sample(&[-inf, 0.0, 0.0, -inf], p, &mut rng), 0);
            }
            // Extreme finite logits stay finite after max subtraction.
            for _ in 0..50 {
                let t = sample(&[f32::MIN, f32::MAX, f32::MAX, f32::MIN], p, &mut rng);
                assert!(t == 1 || t == 2);
            }
        }
        assert_eq!(argmax(&[nan, nan, 2.0, nan]), 2);
        assert_eq!(argmax(&[nan]), 0);
    }

    #[test]
    fn empty_logits_do_not_panic() {
        let mut rng = 8;
        for p in [
            params(0.0, 1.0, -1),
            params(1.0, 0.5, 3),
            params(1.0, 1.0, -1),
        ] {
            assert_eq!(sample(&[], &p, &mut rng), 0);
        }
        assert_eq!(argmax(&[]), 0);
        assert_eq!(rng, 8);
    }
}
