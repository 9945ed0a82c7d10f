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

    /// The exact bytes `token` adds to the text (empty for special and unknown tokens), for
    /// tokenizers whose decoding is a plain concatenation of per-token bytes: cl100k and
    /// byte-level BPE. `None` for tokenizers whose decoder rewrites text across tokens
    /// (SentencePiece spaces, WordPiece), which [`IncrementalDecoder`] decodes by windows.
    pub fn token_bytes(&self, token: u32) -> Option<Vec<u8>> {
        match self {
            Self::Sim(t) => Some(t.bpe.decode_bytes(&[token]).unwrap_or_default()),
            Self::Model(t) => {
                if !matches!(
                    t.get_decoder(),
                    Some(tokenizers::decoders::DecoderWrapper::ByteLevel(_))
                ) {
                    return None;
                }
                // What `Tokenizer::decode(.., skip_special_tokens = true)` does, minus its
                // final lossy UTF-8 conversion.
                let Some(piece) = t.id_to_token(token) else {
                    return Some(Vec::new());
                };
                if t.get_added_vocabulary().is_special_token(&piece) {
                    return Some(Vec::new());
                }
                let bytes = piece
                    .chars()
                    .map(byte_level_byte)
                    .collect::<Option<Vec<u8>>>();
                // A piece outside the byte alphabet (an added token) stands for its own text.
                Some(bytes.unwrap_or_else(|| piece.into_bytes()))
            }
        }
    }
}

/// The byte a byte-level BPE (GPT-2) alphabet character stands for: printable Latin-1 bytes
/// are themselves, the other 68 bytes in order map to U+0100..=U+0143.
fn byte_level_byte(c: char) -> Option<u8> {
    let c = u32::from(c);
    let b = match c {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => c,
        0x100..=0x120 => c - 0x100,
        0x121..=0x142 => c - 0x121 + 0x7F,
        0x143 => 0xAD,
        _ => return None,
    };
    u8::try_from(b).ok()
}

/// Holds back the bytes of a UTF-8 character until all of them have arrived, so a character
/// split between tokens (`<0xE2>` `<0x82>` `<0xAC>` for "€") is shown once, whole, and never as
/// U+FFFD. Bytes that can never be part of a character (a stray continuation byte, a lead byte
/// followed by something else) are dropped, as is a character still incomplete at the end.
#[derive(Debug, Default, Clone)]
pub struct Utf8Holdback {
    /// At most 3 bytes: the start of a character whose remaining bytes are still to come.
    pending: Vec<u8>,
}

impl Utf8Holdback {
    /// Nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `bytes` and returns the text of every character they complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut at = 0;
        while at < self.pending.len() {
            match std::str::from_utf8(&self.pending[at..]) {
                Ok(s) => {
                    out.push_str(s);
                    at = self.pending.len();
                }
                Err(e) => {
                    let valid = at + e.valid_up_to();
                    if let Ok(s) = std::str::from_utf8(&self.pending[at..valid]) {
                        out.push_str(s);
                    }
                    match e.error_len() {
                        // Invalid whatever follows: skip it.
                        Some(n) => at = valid + n,
                        // A character cut short by the end of the input: wait for the rest.
                        None => {
                            at = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..at);
        out
    }

    /// Ends the text; returns how many bytes of an incomplete character were dropped.
    pub fn finish(&mut self) -> usize {
        let dropped = self.pending.len();
        self.pending.clear();
        dropped
    }
}

/// Turns a growing list of token ids into text deltas without splitting a multi-byte character
/// or a merge that only resolves with the next token, and without ever showing U+FFFD for bytes
/// that are not (yet) a character.
///
/// Byte-exact tokenizers ([`EngineTokenizer::token_bytes`]) feed each token's bytes through a
/// [`Utf8Holdback`]. For the others each delta is the difference between decoding a short window
/// with and without the newest tokens; a window ending in U+FFFD waits for more tokens, and
/// U+FFFD elsewhere (bytes that never became a character) is removed.
pub struct IncrementalDecoder {
    /// Bytes of a character still incomplete (byte-exact tokenizers).
    utf8: Utf8Holdback,
    /// Tokens of the window path (other tokenizers).
    tokens: Vec<u32>,
    /// Start of the window decoded for context.
    prefix_offset: usize,
    /// Tokens before this index have been emitted as text.
    read_offset: usize,
}

/// Tokens of context kept before the unread ones (byte-level BPE never needs more).
const DECODE_CONTEXT: usize = 6;

/// `text` without replacement characters: lossy decoding put them where bytes were invalid.
fn without_replacements(text: &str) -> String {
    text.replace(char::REPLACEMENT_CHARACTER, "")
}

impl IncrementalDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self {
            utf8: Utf8Holdback::new(),
            tokens: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Adds `token` and returns the text it completes (possibly empty while a character is
    /// still incomplete).
    pub fn push(&mut self, tokenizer: &EngineTokenizer, token: u32) -> String {
        if let Some(bytes) = tokenizer.token_bytes(token) {
            return self.utf8.push(&bytes);
        }
        self.tokens.push(token);
        let prefix = tokenizer.decode(&self.tokens[self.prefix_offset..self.read_offset]);
        let full = tokenizer.decode(&self.tokens[self.prefix_offset..]);
        if full.len() <= prefix.len() || full.ends_with(char::REPLACEMENT_CHARACTER) {
            return String::new();
        }
        let Some(delta) = full
            .get(prefix.len()..)
            .filter(|_| full.starts_with(&prefix))
        else {
            // The window re-tokenized differently (rare): wait for a later token to resolve it.
            return String::new();
        };
        let delta = without_replacements(delta);
        self.read_offset = self.tokens.len();
        self.prefix_offset = self.read_offset.saturating_sub(DECODE_CONTEXT);
        delta
    }

    /// The text the pending tokens still make at the end of generation; bytes of a character
    /// left incomplete are dropped, never shown as U+FFFD.
    pub fn finish(&mut self, tokenizer: &EngineTokenizer) -> String {
        self.utf8.finish();
        if self.read_offset == self.tokens.len() {
            return String::new();
        }
        let prefix = tokenizer.decode(&self.tokens[self.prefix_offset..self.read_offset]);
        let full = tokenizer.decode(&self.tokens[self.prefix_offset..]);
        self.read_offset = self.tokens.len();
        full.get(prefix.len()..)
            .filter(|_| full.starts_with(&prefix))
            .map(without_replacements)
            .unwrap_or_default()
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
    fn an_incomplete_character_is_held_back_then_dropped() {
        let sim = EngineTokenizer::Sim(SimTokenizer::shared().unwrap());
        let ids = sim.encode("🇫🇷", false).unwrap();
        assert!(ids.len() > 1);
        let mut d = IncrementalDecoder::new();
        assert_eq!(d.push(&sim, ids[0]), "");
        // Ending on half a character shows nothing of it, rather than U+FFFD.
        assert_eq!(d.finish(&sim), "");
    }

    /// The default model's tokenizer (byte-level BPE, 256 single-byte tokens).
    fn default_model_tokenizer() -> (EngineTokenizer, std::path::PathBuf) {
        let root = std::env::temp_dir().join(format!(
            "infergate-tokenizer-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let dir = crate::model::default_model::ensure(&root).unwrap();
        let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        (EngineTokenizer::Model(Arc::new(tok)), root)
    }

    /// Runs `ids` through a decoder: every delta, and the text at the end.
    fn stream(tok: &EngineTokenizer, ids: &[u32]) -> (Vec<String>, String) {
        let mut d = IncrementalDecoder::new();
        let deltas: Vec<String> = ids.iter().map(|&t| d.push(tok, t)).collect();
        let tail = d.finish(tok);
        (deltas, tail)
    }

    #[test]
    fn a_character_split_over_byte_tokens_is_shown_once_whole() {
        let (tok, root) = default_model_tokenizer();
        let EngineTokenizer::Model(t) = &tok else {
            unreachable!()
        };
        // "€" is E2 82 AC; the byte-level alphabet spells those bytes "â", "Ĥ", "¬".
        let byte = |c: &str| t.token_to_id(c).unwrap();
        let (e2, x82, xac) = (byte("â"), byte("Ĥ"), byte("¬"));
        let word = t.encode(" the", false).unwrap().get_ids()[0];
        let (deltas, tail) = stream(&tok, &[word, e2, x82, xac, word]);
        assert_eq!(deltas, [" the", "", "", "€", " the"]);
        assert_eq!(tail, "");
        // A lead byte that never completes is dropped, mid-text and at the end.
        let (deltas, tail) = stream(&tok, &[e2, word, xac, e2, x82]);
        assert_eq!(deltas, ["", " the", "", "", ""]);
        assert_eq!(tail, "");
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn byte_exact_decoding_matches_the_tokenizer_without_replacements() {
        let (model, root) = default_model_tokenizer();
        let sim = EngineTokenizer::Sim(SimTokenizer::shared().unwrap());
        for (tok, vocab) in [(&model, 576u64), (&sim, u64::from(CL100K_EOS))] {
            assert!(tok.token_bytes(0).is_some(), "byte-exact");
            // Every id once (all single-byte tokens included), then random runs.
            let mut ids: Vec<u32> = (0..vocab.min(2_000) as u32).collect();
            let mut state = 7u64;
            for _ in 0..4_000 {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                ids.push(((state >> 33) % vocab) as u32);
            }
            let (deltas, tail) = stream(tok, &ids);
            for d in &deltas {
                assert!(!d.contains(char::REPLACEMENT_CHARACTER), "{d:?}");
            }
            let whole = tok.decode(&ids).replace(char::REPLACEMENT_CHARACTER, "");
            assert_eq!(deltas.concat() + &tail, whole);
        }
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn byte_level_alphabet_maps_back_to_every_byte() {
        let mut seen = [false; 256];
        for c in (0x21..=0x143u32).filter_map(char::from_u32) {
            if let Some(b) = byte_level_byte(c) {
                assert!(!seen[usize::from(b)], "{c:?} maps to a byte already seen");
                seen[usize::from(b)] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(byte_level_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_byte('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_byte('Ń'), Some(0xAD));
        assert_eq!(byte_level_byte('a'), Some(b'a'));
        assert_eq!(byte_level_byte('€'), None);
    }

    /// A SentencePiece-style tokenizer (`<0xNN>` byte fallback), decoded by windows.
    fn byte_fallback_tokenizer() -> EngineTokenizer {
        let json = r#"{
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                "vocab": {"<unk>": 0, "<0xE2>": 1, "<0x82>": 2, "<0xAC>": 3,
                          "▁a": 4, "▁b": 5},
                "merges": []}
        }"#;
        let tok: tokenizers::Tokenizer = json.parse().unwrap();
        EngineTokenizer::Model(Arc::new(tok))
    }

    #[test]
    fn window_decoding_holds_split_characters_and_hides_invalid_bytes() {
        let tok = byte_fallback_tokenizer();
        assert!(tok.token_bytes(1).is_none(), "decoded by windows");
        let (deltas, tail) = stream(&tok, &[4, 1, 2, 3, 5, 1, 4, 1]);
        assert_eq!(deltas, ["a", "", "", "€", " b", "", " a", ""]);
        assert_eq!(tail, "", "the dangling <0xE2> is dropped");
    }
}

#[cfg(test)]
mod utf8_holdback_tests {
    use super::Utf8Holdback;

    #[test]
    fn complete_text_passes_at_once() {
        let mut h = Utf8Holdback::new();
        assert_eq!(h.push(b" hello"), " hello");
        assert_eq!(h.push("é€🦀".as_bytes()), "é€🦀");
        assert_eq!(h.finish(), 0);
    }

    #[test]
    fn a_three_byte_character_over_three_tokens_appears_with_the_last() {
        let mut h = Utf8Holdback::new();
        assert_eq!(h.push(b"\xE2"), "");
        assert_eq!(h.push(b"\x82"), "");
        assert_eq!(h.push(b"\xAC"), "€");
        assert_eq!(h.finish(), 0);
    }

    #[test]
    fn text_before_and_after_a_split_character_is_not_held() {
        let mut h = Utf8Holdback::new();
        assert_eq!(h.push(b"ab\xF0\x9F"), "ab");
        assert_eq!(h.push(b"\xA6\x80cd"), "🦀cd");
    }

    #[test]
    fn a_dangling_incomplete_character_is_dropped_at_the_end() {
        let mut h = Utf8Holdback::new();
        assert_eq!(h.push(b"ok \xE2\x82"), "ok ");
        assert_eq!(h.finish(), 2);
        // Nothing of it leaks into later text.
        assert_eq!(h.push(b"x"), "x");
        assert_eq!(h.finish(), 0);
    }

    #[test]
    fn bytes_that_can_never_be_a_character_are_dropped() {
        let mut h = Utf8Holdback::new();
        // A stray continuation byte, a lead byte cut off by ASCII, bytes never valid in UTF-8.
        assert_eq!(h.push(b"\x82a"), "a");
        assert_eq!(h.push(b"\xE2"), "");
        assert_eq!(h.push(b"b"), "b");
        assert_eq!(h.push(b"\xC0\xF5\xFFc"), "c");
        // A lead byte followed by another character's lead: only the first is lost.
        assert_eq!(h.push(b"\xE2"), "");
        assert_eq!(h.push("€".as_bytes()), "€");
        assert_eq!(h.finish(), 0);
    }
}
