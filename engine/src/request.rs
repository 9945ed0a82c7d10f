//! What a validated generation request asks the engine for.

/// Sampling and stopping parameters of one sequence, already validated and defaulted.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Most completion tokens to generate (always ≥ 1 once resolved against the context).
    pub max_tokens: usize,
    /// Fewest completion tokens before EOS or a stop string may end the sequence.
    pub min_tokens: usize,
    /// Softmax temperature, 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1].
    pub top_p: f32,
    /// Keep only the k most likely tokens; -1 or 0 disables.
    pub top_k: i32,
    /// Seed for reproducible sampling; `None` draws one.
    pub seed: Option<u64>,
    /// Keep generating past EOS until `max_tokens`.
    pub ignore_eos: bool,
    /// Stop strings; the output is cut before the first match.
    pub stop: Vec<String>,
    /// Report each generated token's log-probability with this many top alternatives
    /// (`Some(0)`: the token's own only); `None` computes none.
    pub logprobs: Option<usize>,
    /// Report each prompt token's log-probability (the first has none) with this many
    /// alternatives. Such a prompt is computed in full: it never reads the prefix cache.
    pub prompt_logprobs: Option<usize>,
    /// Tokens emitted in place of sampled ones (`--fault-*-rate` quality faults); `None` for
    /// every honest answer.
    pub script: Option<std::sync::Arc<crate::misbehave::Script>>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            max_tokens: 16,
            min_tokens: 0,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            seed: None,
            ignore_eos: false,
            stop: Vec::new(),
            logprobs: None,
            prompt_logprobs: None,
            script: None,
        }
    }
}

impl SamplingParams {
    /// The parameters of each of a prompt's `best_of` sequences: these, with choice `j`'s
    /// seed [`choice_seed`] of the request's (unseeded choices stay unseeded).
    pub fn for_choices(&self, best_of: usize) -> impl Iterator<Item = SamplingParams> + '_ {
        (0..best_of.max(1)).map(move |j| {
            let mut params = self.clone();
            params.seed = self.seed.map(|seed| choice_seed(seed, j));
            params
        })
    }
}

/// The logprobs a request's sequences compute: those asked for (`logprobs`, with that many
/// alternatives), and the sampled token's own when `best_of` > `n`, which ranks its sequences
/// by cumulative logprob even unasked.
pub fn sequence_logprobs(logprobs: Option<usize>, n: usize, best_of: usize) -> Option<usize> {
    logprobs.or((best_of > n).then_some(0))
}

/// The engine's context rule: a prompt of `prompt` tokens asking for `max_tokens` more fits a
/// context of `limit` tokens (a prompt filling the whole context fits only `max_tokens: 0`, the
/// echo-only request). The gateway's simulator applies the same function, so both refuse the
/// same requests.
pub fn fits_context(prompt: usize, max_tokens: usize, limit: usize) -> bool {
    prompt.saturating_add(max_tokens) <= limit && (max_tokens == 0 || prompt < limit)
}

/// The seed of choice `j` of a seeded request: the seed itself for the first choice (so `n: 1`
/// and the first of `n: 3` agree), a splitmix64-scrambled mix of seed and index for the rest,
/// so that choices differ and neighbouring seeds do not share streams.
pub fn choice_seed(seed: u64, j: usize) -> u64 {
    if j == 0 {
        return seed;
    }
    let mut z = seed ^ (j as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_rule_leaves_room_for_the_answer() {
        assert!(fits_context(8_000, 192, 8_192));
        assert!(!fits_context(8_000, 193, 8_192));
        assert!(fits_context(8_192, 0, 8_192));
        assert!(!fits_context(8_193, 0, 8_192));
    }

    #[test]
    fn choice_seeds_keep_the_first_and_spread_the_rest() {
        assert_eq!(choice_seed(42, 0), 42);
        let seeds: Vec<u64> = (0..64).map(|j| choice_seed(42, j)).collect();
        let mut unique = seeds.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), seeds.len());
        // Seed s's second choice is not seed s + 1's first (unlike seed + index).
        assert_ne!(choice_seed(42, 1), 43);
        assert_eq!(choice_seed(7, 3), choice_seed(7, 3));
    }

    #[test]
    fn choices_get_their_own_seeds_and_best_of_computes_logprobs() {
        let seeded = SamplingParams {
            seed: Some(42),
            ..SamplingParams::default()
        };
        let seeds: Vec<Option<u64>> = seeded.for_choices(3).map(|p| p.seed).collect();
        assert_eq!(
            seeds,
            vec![Some(42), Some(choice_seed(42, 1)), Some(choice_seed(42, 2))]
        );
        assert_eq!(SamplingParams::default().for_choices(0).count(), 1);
        assert!(
            SamplingParams::default()
                .for_choices(2)
                .all(|p| p.seed.is_none())
        );
        assert_eq!(sequence_logprobs(None, 2, 2), None);
        assert_eq!(sequence_logprobs(None, 1, 3), Some(0));
        assert_eq!(sequence_logprobs(Some(5), 1, 3), Some(5));
    }
}
