//! Prompt token estimates for metering: a real BPE tokenizer (cl100k or o200k, embedded in the
//! binary, so it works offline), run off the async reactor by the caller for long prompts.

use serde::Deserialize;

/// Which tokenizer estimates a model's prompt tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    /// OpenAI's cl100k BPE (close to Llama-3's 128k vocabulary in tokens per byte).
    #[default]
    Cl100k,
    /// OpenAI's o200k BPE.
    O200k,
    /// One token per 4 bytes: no tokenizer at all.
    Bytes,
}

impl Estimator {
    /// Estimated tokens of `text`.
    pub fn count(self, text: &str) -> u64 {
        match self {
            Estimator::Cl100k => tiktoken_rs::cl100k_base_singleton()
                .encode_ordinary(text)
                .len() as u64,
            Estimator::O200k => tiktoken_rs::o200k_base_singleton()
                .encode_ordinary(text)
                .len() as u64,
            Estimator::Bytes => (text.len() as u64).div_ceil(4),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_plausible_for_english() {
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(20);
        let cl = Estimator::Cl100k.count(&text);
        let o2 = Estimator::O200k.count(&text);
        let by = Estimator::Bytes.count(&text);
        // 10 tokens per sentence, plus the trailing space of the last one.
        assert_eq!(cl, 201);
        assert!((180..=220).contains(&o2), "{o2}");
        assert_eq!(by, 225);
        assert_eq!(Estimator::Cl100k.count(""), 0);
    }
}
