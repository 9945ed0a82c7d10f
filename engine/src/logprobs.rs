//! Log-probabilities of tokens: what a backend reports for a generated token (and, when asked,
//! for each prompt token), and the log-softmax over real logits that the `cpu` backend uses.
//!
//! Values are those of the model's raw distribution, before temperature, top-k and top-p, as
//! vLLM's default (`logprobs_mode = raw_logprobs`) returns them: they describe the model, not
//! the sampler's settings.

use std::cmp::Ordering;

/// Most alternatives a request may ask for per position, as vLLM's default `max_logprobs`.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The log-probability of the token at one position and the most likely tokens there.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token actually at this position (sampled, or the prompt's).
    pub token: u32,
    /// Its natural-log probability; `-inf` when the distribution gives it no mass.
    pub logprob: f32,
    /// The most likely tokens with their log-probabilities, most likely first (ties: lower id).
    pub top: Vec<(u32, f32)>,
}

/// NaN is no evidence for a token: it ranks and weighs as `-inf` (as in the sampler).
fn clean(x: f32) -> f32 {
    if x.is_nan() { f32::NEG_INFINITY } else { x }
}

/// How a distribution's logits turn into log-probabilities.
enum Norm {
    /// Finite maximum: subtract the log-sum-exp.
    Finite(f64),
    /// Some logits are `+inf`: they share all the mass (this is each one's share).
    Infinite(f32),
    /// No logit is above `-inf`: nothing has mass.
    Empty,
}

impl Norm {
    fn log_prob(&self, x: f32) -> f32 {
        match *self {
            Self::Finite(lse) => (f64::from(clean(x)) - lse) as f32,
            Self::Infinite(share) if x == f32::INFINITY => share,
            Self::Infinite(_) | Self::Empty => f32::NEG_INFINITY,
        }
    }
}

/// Log-softmax of `logits` at `token`, with the `k` most likely tokens.
///
/// Computed in f64 around the maximum, so large logits neither overflow nor lose the small
/// differences. NaN logits count as `-inf`; with `+inf` logits the mass is split evenly among
/// them; with no finite logit at all every token gets `-inf`. A `token` outside `logits` gets
/// `-inf`.
pub fn from_logits(logits: &[f32], token: u32, k: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .map(clean)
        .fold(f32::NEG_INFINITY, f32::max);
    let norm = if max == f32::INFINITY {
        let count = logits.iter().filter(|&&x| x == f32::INFINITY).count();
        Norm::Infinite(-(count as f64).ln() as f32)
    } else if max == f32::NEG_INFINITY {
        Norm::Empty
    } else {
        let m = f64::from(max);
        let sum: f64 = logits
            .iter()
            .map(|&x| (f64::from(clean(x)) - m).exp())
            .sum();
        Norm::Finite(m + sum.ln())
    };
    let log_prob = |x: f32| norm.log_prob(x);
    let logprob = logits
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&x| log_prob(x));
    let top = top_k(logits, k)
        .into_iter()
        .map(|i| (i, log_prob(logits[i as usize])))
        .collect();
    TokenLogprob {
        token,
        logprob,
        top,
    }
}

/// Indices of the `k` largest logits, largest first, ties to the lower index.
fn top_k(logits: &[f32], k: usize) -> Vec<u32> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let key = |i: u32| clean(logits[i as usize]);
    let desc = |a: &u32, b: &u32| -> Ordering { key(*b).total_cmp(&key(*a)).then(a.cmp(b)) };
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    if k < idx.len() {
        // Only the k best are needed: O(n) selection, then a sort of k.
        idx.select_nth_unstable_by(k - 1, desc);
        idx.truncate(k);
    }
    idx.sort_unstable_by(desc);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference log-softmax in f64.
    fn log_softmax(logits: &[f32]) -> Vec<f64> {
        let m = logits
            .iter()
            .map(|&x| f64::from(x))
            .fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = logits.iter().map(|&x| (f64::from(x) - m).exp()).sum();
        logits.iter().map(|&x| f64::from(x) - m - s.ln()).collect()
    }

    fn random_logits(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    #[test]
    fn values_are_the_log_softmax() {
        let logits = random_logits(5_000, 3, 12.0);
        let want = log_softmax(&logits);
        for token in [0u32, 17, 4_999] {
            let lp = from_logits(&logits, token, 5);
            assert!(
                (f64::from(lp.logprob) - want[token as usize]).abs() < 1e-5,
                "{} vs {}",
                lp.logprob,
                want[token as usize]
            );
            for &(i, v) in &lp.top {
                assert!((f64::from(v) - want[i as usize]).abs() < 1e-5);
            }
        }
        // Shifting every logit changes nothing (max-subtracted), up to f32 rounding.
        let shifted: Vec<f32> = logits.iter().map(|x| x + 64.0).collect();
        let a = from_logits(&logits, 9, 3);
        let b = from_logits(&shifted, 9, 3);
        assert_eq!(
            a.top.iter().map(|t| t.0).collect::<Vec<_>>(),
            b.top.iter().map(|t| t.0).collect::<Vec<_>>()
        );
        assert!((a.logprob - b.logprob).abs() < 1e-4);
    }

    #[test]
    fn top_k_is_sorted_complete_and_sums_to_at_most_one() {
        let logits = random_logits(50_000, 7, 8.0);
        let want = log_softmax(&logits);
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| want[b].total_cmp(&want[a]).then(a.cmp(&b)));
        for k in [0, 1, 5, 20] {
            let lp = from_logits(&logits, 123, k);
            assert_eq!(lp.top.len(), k);
            let ids: Vec<usize> = lp.top.iter().map(|t| t.0 as usize).collect();
            assert_eq!(ids, order[..k], "the k most likely, in order");
            assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1), "sorted");
            let mass: f64 = lp.top.iter().map(|t| f64::from(t.1).exp()).sum();
            assert!(mass <= 1.0 + 1e-6, "{mass}");
        }
        // The whole vocabulary sums to one.
        let all = from_logits(&logits[..100], 0, 100);
        let mass: f64 = all.top.iter().map(|t| f64::from(t.1).exp()).sum();
        assert!((mass - 1.0).abs() < 1e-5, "{mass}");
        // k beyond the vocabulary is the vocabulary.
        assert_eq!(from_logits(&[1.0, 2.0], 0, 20).top.len(), 2);
    }

    #[test]
    fn ties_go_to_the_lower_id_and_the_argmax_is_first() {
        let lp = from_logits(&[1.0, 3.0, 3.0, 0.0], 2, 3);
        assert_eq!(
            lp.top.iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![1, 2, 0]
        );
        assert_eq!(lp.top[0].1, lp.logprob, "the chosen token's entry agrees");
        assert!((f64::from(lp.logprob) - (0.5f64 * 0.9).ln()).abs() < 0.1);
    }

    #[test]
    fn degenerate_logits_stay_total() {
        let nan = f32::NAN;
        let inf = f32::INFINITY;
        let lp = from_logits(&[nan, 0.0, nan], 0, 2);
        assert_eq!(lp.logprob, f32::NEG_INFINITY);
        assert_eq!(lp.top[0], (1, 0.0));
        let lp = from_logits(&[inf, 1.0, inf], 2, 3);
        assert!((lp.logprob - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(lp.top[2], (1, f32::NEG_INFINITY));
        let lp = from_logits(&[f32::NEG_INFINITY; 3], 1, 1);
        assert_eq!(lp.logprob, f32::NEG_INFINITY);
        assert_eq!(lp.top.len(), 1);
        assert_eq!(from_logits(&[], 0, 5).top.len(), 0);
        assert_eq!(from_logits(&[0.0], 9, 1).logprob, f32::NEG_INFINITY);
    }
}
