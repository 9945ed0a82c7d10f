//! The sim backend's next-token distribution, written out so that it can report
//! log-probabilities. They are synthetic: they describe the placeholder sampler (an EOS draw,
//! then a word of the prompt at a random position), not any language model.

use std::collections::HashMap;

use super::{ECHO_PROBES, SimBackend};
use crate::logprobs::TokenLogprob;
use crate::sequence::Sequence;

/// The probabilities with which [`SimBackend::sample`] draws a sequence's next token.
///
/// With `e` the EOS probability (0 while the sequence may not stop), `W` the prompt positions
/// holding vocabulary words out of `L`, `c(t)` the positions holding `t`, `V` the vocabulary
/// size and `miss = (1 - W/L)^ECHO_PROBES` the chance that every probe misses a word:
/// `P(EOS) = e` and `P(t) = (1 - e) · ((1 - miss) · c(t)/W + miss · [t in vocabulary]/V)`.
pub(super) struct SimDistribution {
    counts: HashMap<u32, u32>,
    words: usize,
    miss: f64,
    vocab_len: usize,
    p_eos: f64,
    eos: u32,
}

impl SimBackend {
    /// The distribution of `seq`'s next token; `p_eos` is its EOS share (0 when it cannot stop).
    pub(super) fn distribution(&self, seq: &Sequence, p_eos: f64) -> SimDistribution {
        let prompt = &seq.tokens[..seq.prompt_len.min(seq.tokens.len())];
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in prompt.iter().filter(|&&t| self.in_vocab(t)) {
            *counts.entry(t).or_default() += 1;
        }
        let words: usize = counts.values().map(|&c| c as usize).sum();
        let miss = if prompt.is_empty() {
            1.0
        } else {
            let probes = i32::try_from(ECHO_PROBES).unwrap_or(i32::MAX);
            (1.0 - words as f64 / prompt.len() as f64).powi(probes)
        };
        SimDistribution {
            counts,
            words,
            miss,
            vocab_len: self.vocab.len(),
            p_eos,
            eos: self.eos,
        }
    }

    /// The entry of `token` with the `k` most likely tokens of `dist`.
    pub(super) fn logprob_entry(
        &self,
        dist: &SimDistribution,
        token: u32,
        k: usize,
    ) -> TokenLogprob {
        let mut candidates: Vec<(u32, f64)> = dist
            .counts
            .keys()
            .map(|&t| (t, dist.prob(t, true)))
            .collect();
        if dist.p_eos > 0.0 {
            candidates.push((dist.eos, dist.p_eos));
        }
        // Every vocabulary word outside the prompt weighs the same (nothing when no probe
        // can miss): any k of them will do, and they keep the list k long.
        let outside = self
            .vocab
            .iter()
            .filter(|t| !dist.counts.contains_key(t))
            .take(k)
            .map(|&t| (t, dist.prob(t, true)));
        candidates.extend(outside);
        candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        candidates.truncate(k);
        TokenLogprob {
            token,
            logprob: dist.prob(token, self.in_vocab(token)).ln() as f32,
            top: candidates
                .into_iter()
                .map(|(t, p)| (t, p.ln() as f32))
                .collect(),
        }
    }
}

impl SimDistribution {
    /// Probability of `token`; `in_vocab` says whether it is a vocabulary word.
    fn prob(&self, token: u32, in_vocab: bool) -> f64 {
        if token == self.eos {
            return self.p_eos;
        }
        let word = match self.counts.get(&token) {
            Some(&c) if self.words > 0 => f64::from(c) / self.words as f64,
            _ => 0.0,
        };
        let fallback = if in_vocab && self.vocab_len > 0 {
            1.0 / self.vocab_len as f64
        } else {
            0.0
        };
        (1.0 - self.p_eos) * ((1.0 - self.miss) * word + self.miss * fallback)
    }
}
