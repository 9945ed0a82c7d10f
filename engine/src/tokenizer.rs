//! The sim backend's tokenizer: OpenAI's cl100k BPE, embedded in the binary, so prompt lengths are
//! realistic without any download.

use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

/// cl100k's `<|endoftext|>` id, used as end-of-sequence.
pub const CL100K_EOS: u32 = 100_257;

/// A BPE tokenizer plus the set of plain-word tokens the sim backend samples from.
pub struct SimTokenizer {
    bpe: CoreBPE,
    words: Vec<u32>,
}

static SHARED: OnceLock<Result<SimTokenizer, String>> = OnceLock::new();

impl SimTokenizer {
    /// The process-wide instance (built once: parsing the ranks takes ~100 ms).
    pub fn shared() -> Result<&'static SimTokenizer, String> {
        SHARED
            .get_or_init(Self::build)
            .as_ref()
            .map_err(|e| e.clone())
    }

    fn build() -> Result<SimTokenizer, String> {
        let bpe = tiktoken_rs::cl100k_base().map_err(|e| format!("cl100k tokenizer: {e}"))?;
        // Sampled text should read as words: " lowercase" tokens of 2..=10 letters.
        let words = (0..CL100K_EOS)
            .filter(|&id| {
                bpe.decode_bytes(&[id]).is_ok_and(|b| {
                    b.len() >= 3
                        && b.len() <= 11
                        && b[0] == b' '
                        && b[1..].iter().all(|c| c.is_ascii_lowercase())
                })
            })
            .collect::<Vec<_>>();
        if words.is_empty() {
            return Err("cl100k tokenizer has no word tokens".into());
        }
        Ok(SimTokenizer { bpe, words })
    }

    /// Token ids of `text` (special-token strings are treated as plain text).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.bpe.encode_ordinary(text)
    }

    /// Text of `tokens`; invalid UTF-8 is replaced, unknown ids are skipped.
    pub fn decode(&self, tokens: &[u32]) -> String {
        let bytes = tokens
            .iter()
            .filter_map(|&t| self.bpe.decode_bytes(&[t]).ok())
            .flatten()
            .collect::<Vec<u8>>();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Token ids that decode to a space and a lowercase word.
    pub fn word_tokens(&self) -> &[u32] {
        &self.words
    }

    /// End-of-sequence token id.
    pub fn eos(&self) -> u32 {
        CL100K_EOS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_text_and_has_word_tokens() {
        let t = SimTokenizer::shared().unwrap();
        let ids = t.encode("The capital of France is Paris.");
        assert!(ids.len() >= 6 && ids.len() <= 9, "{ids:?}");
        assert_eq!(t.decode(&ids), "The capital of France is Paris.");
        assert!(t.word_tokens().len() > 10_000);
        let w = t.decode(&t.word_tokens()[..50]);
        assert!(w.starts_with(' ') && w.chars().all(|c| c == ' ' || c.is_ascii_lowercase()));
    }
}
