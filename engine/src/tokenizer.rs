//! Tokenizers of the engine: the sim backend's OpenAI cl100k BPE, embedded in the binary so prompt
//! lengths are realistic without any download, and a real model's own tokenizer for the cpu
//! backend; plus incremental detokenization for streaming.

use std::sync::{Arc, OnceLock};

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

/// The tokenizer an engine serves with.
#[derive(Clone)]
pub enum EngineTokenizer {
    /// cl100k, for the sim backend.
    Sim(&'static SimTokenizer),
    /// A model's `tokenizer.json` (or one built from GGUF metadata).
    Model(Arc<tokenizers::Tokenizer>),
}

impl EngineTokenizer {
    /// Token ids of `text`. `add_special` adds what the tokenizer's post-processor adds (BOS):
    /// right for raw completions prompts, wrong for chat prompts, whose template prints it.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, String> {
        match self {
            Self::Sim(t) => Ok(t.encode(text)),
            Self::Model(t) => t
                .encode(text, add_special)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| format!("cannot tokenize the prompt: {e}")),
        }
    }

    /// Text of `tokens`, without special tokens; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, tokens: &[u32]) -> String {
        match self {
            Self::Sim(t) => t.decode(tokens),
            Self::Model(t) => t.decode(tokens, true).unwrap_or_default(),
        }
    }
}

/// Turns a growing list of token ids into text deltas without splitting a multi-byte character
/// or a merge that only resolves with the next token: each delta is the difference between
/// decoding a short window with and without the newest tokens.
pub struct IncrementalDecoder {
    tokens: Vec<u32>,
    /// Start of the window decoded for context.
    prefix_offset: usize,
    /// Tokens before this index have been emitted as text.
    read_offset: usize,
}

/// Tokens of context kept before the unread ones (byte-level BPE never needs more).
const DECODE_CONTEXT: usize = 6;

impl IncrementalDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self {
            tokens: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Adds `token` and returns the text it completes (possibly empty while a character is
    /// still incomplete).
    pub fn push(&mut self, tokenizer: &EngineTokenizer, token: u32) -> String {
        self.tokens.push(token);
        let prefix = tokenizer.decode(&self.tokens[self.prefix_offset..self.read_offset]);
        let full = tokenizer.decode(&self.tokens[self.prefix_offset..]);
        if full.len() <= prefix.len() || full.ends_with('\u{FFFD}') {
            return String::new();
        }
        let Some(delta) = full
            .get(prefix.len()..)
            .filter(|_| full.starts_with(&prefix))
        else {
            // The window re-tokenized differently (rare): emit from the last char boundary.
            return String::new();
        };
        let delta = delta.to_string();
        self.read_offset = self.tokens.len();
        self.prefix_offset = self.read_offset.saturating_sub(DECODE_CONTEXT);
        delta
    }

    /// Whatever text the pending tokens make, even if it ends mid-character.
    pub fn finish(&mut self, tokenizer: &EngineTokenizer) -> String {
        if self.read_offset == self.tokens.len() {
            return String::new();
        }
        let prefix = tokenizer.decode(&self.tokens[self.prefix_offset..self.read_offset]);
        let full = tokenizer.decode(&self.tokens[self.prefix_offset..]);
        self.read_offset = self.tokens.len();
        full.get(prefix.len()..)
            .filter(|_| full.starts_with(&prefix))
            .unwrap_or("")
            .to_string()
    }
}

impl Default for IncrementalDecoder {
    fn default() -> Self {
        Self::new()
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

#[cfg(test)]
mod incremental_tests {
    use super::*;

    #[test]
    fn streamed_deltas_equal_the_whole_decode() {
        let sim = EngineTokenizer::Sim(SimTokenizer::shared().unwrap());
        let text = "Paris — the capital of France (日本語: パリ) 🇫🇷 costs €5.";
        let ids = sim.encode(text, false).unwrap();
        let mut d = IncrementalDecoder::new();
        let mut out = String::new();
        for &t in &ids {
            let delta = d.push(&sim, t);
            assert!(!delta.contains('\u{FFFD}'), "split a character: {delta:?}");
            out += &delta;
        }
        out += &d.finish(&sim);
        assert_eq!(out, text);
    }

    #[test]
    fn an_incomplete_character_is_held_back_then_flushed() {
        let sim = EngineTokenizer::Sim(SimTokenizer::shared().unwrap());
        let ids = sim.encode("🇫🇷", false).unwrap();
        assert!(ids.len() > 1);
        let mut d = IncrementalDecoder::new();
        assert_eq!(d.push(&sim, ids[0]), "");
        // Ending on half a character still yields what there is, lossily.
        assert!(!d.finish(&sim).is_empty());
    }
}
