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
    /// tokenizers whose decoding is a plain concatenation of per-token bytes: cl100k, byte-level
    /// BPE, and SentencePiece-style decoders (`▁` as the space, `<0xNN>` byte fallback), whose
    /// `<0xNN>` tokens are the single byte NN and other tokens their text with `▁` as a space.
    /// These are the bytes of a token after the first; the first token of a text may differ
    /// (SentencePiece decoders drop its leading space), which [`IncrementalDecoder`] applies.
    /// `None` for tokenizers whose decoder rewrites text across tokens (WordPiece, CTC, ...),
    /// which [`IncrementalDecoder`] decodes by windows.
    pub fn token_bytes(&self, token: u32) -> Option<Vec<u8>> {
        self.token_text(token, false)
            .map(|t| t.bytes.unwrap_or_default())
    }

    /// What `token` adds to the text, `first` if no token before it in the text did (tokens
    /// the decoder skips do not count); `None` where that is not a matter of exact bytes.
    fn token_text(&self, token: u32, first: bool) -> Option<TokenText> {
        match self {
            Self::Sim(t) => Some(TokenText {
                bytes: t.bpe.decode_bytes(&[token]).ok(),
                strip_start: None,
            }),
            Self::Model(t) => {
                let plan = BytePlan::of(t)?;
                // What `Tokenizer::decode(.., skip_special_tokens = true)` looks up.
                let bytes = t
                    .id_to_token(token)
                    .filter(|piece| !t.get_added_vocabulary().is_special_token(piece))
                    .map(|piece| plan.piece_bytes(piece, first));
                Some(TokenText {
                    bytes,
                    strip_start: plan.strip_start,
                })
            }
        }
    }
}

/// One token's share of a text whose decoding is exact per-token bytes.
struct TokenText {
    /// Its bytes; `None` for a token decoding skips (special tokens, unknown ids).
    bytes: Option<Vec<u8>>,
    /// `(byte, n)`: decoding removes up to `n` leading `byte`s from the start of the text.
    strip_start: Option<(u8, usize)>,
}

/// How a `tokenizer.json` decoder chain makes text out of tokens, where that text is the
/// concatenation of per-token bytes, but for the first token and the start of the text.
///
/// Recognized: per-token rewrites (`Replace`, `Metaspace`, `Strip`), then optionally
/// `ByteFallback` (a `<0xNN>` token is the byte NN) or `ByteLevel` (the GPT-2 byte alphabet),
/// then `Fuse` and a `Strip` of the start of the whole text. No decoder at all joins the tokens
/// with spaces. Anything else (WordPiece, CTC, a rewrite after the tokens were fused) is not.
///
/// Where `ByteFallback` turns a run of byte tokens that is not valid UTF-8 into one U+FFFD per
/// byte, the bytes go through [`Utf8Holdback`], which keeps the characters that are whole and
/// drops only the bytes that are not; for valid text the two agree.
struct BytePlan<'a> {
    /// Rewrites of each token's text, in order: `Replace` and `Metaspace` (decoders whose
    /// `decode_chain` maps each token on its own), and a per-token `Strip`.
    rewrites: Vec<Rewrite<'a>>,
    /// How a rewritten token becomes bytes.
    bytes: PieceBytes,
    /// `(byte, n)`: up to `n` leading `byte`s of the whole text are removed (a `Strip` after
    /// the tokens were fused).
    strip_start: Option<(u8, usize)>,
    /// No decoder: tokens are joined with a space.
    space_joined: bool,
}

/// A per-token rewrite of [`BytePlan`].
enum Rewrite<'a> {
    /// A decoder that maps each token on its own, possibly the first differently.
    Chain(&'a tokenizers::decoders::DecoderWrapper),
    /// `Strip`: up to `start` leading and `stop` trailing `content` characters removed.
    Strip {
        content: char,
        start: usize,
        stop: usize,
    },
}

/// How [`BytePlan`] takes the bytes of a token's (rewritten) text.
#[derive(Clone, Copy)]
enum PieceBytes {
    /// Its UTF-8.
    Text,
    /// `<0xNN>` is the byte NN, anything else its UTF-8.
    ByteFallback,
    /// Each character of the GPT-2 byte alphabet is a byte; a token with any other character
    /// (an added token) is its UTF-8.
    ByteLevel,
}

impl<'a> BytePlan<'a> {
    /// The plan for `tokenizer`'s decoder; `None` if its text is not exact per-token bytes.
    fn of(tokenizer: &'a tokenizers::Tokenizer) -> Option<Self> {
        use tokenizers::decoders::DecoderWrapper as D;

        /// Where in the decoder chain the plan is.
        #[derive(PartialEq)]
        enum Stage {
            /// Tokens are strings, one per token.
            Pieces,
            /// After `ByteFallback`: runs of byte tokens are one string, not yet fused.
            Bytes,
            /// All tokens are one string.
            Fused,
        }

        fn flatten<'d>(decoder: &'d D, into: &mut Vec<&'d D>) {
            match decoder {
                D::Sequence(s) => s.get_decoders().iter().for_each(|d| flatten(d, into)),
                d => into.push(d),
            }
        }

        let mut plan = BytePlan {
            rewrites: Vec::new(),
            bytes: PieceBytes::Text,
            strip_start: None,
            space_joined: false,
        };
        let Some(decoder) = tokenizer.get_decoder() else {
            plan.space_joined = true;
            return Some(plan);
        };
        let mut steps = Vec::new();
        flatten(decoder, &mut steps);
        let mut stage = Stage::Pieces;
        for step in steps {
            match step {
                D::Replace(_) | D::Metaspace(_) if stage == Stage::Pieces => {
                    plan.rewrites.push(Rewrite::Chain(step));
                }
                D::Strip(s) if stage == Stage::Pieces => plan.rewrites.push(Rewrite::Strip {
                    content: s.content,
                    start: s.start,
                    stop: s.stop,
                }),
                D::ByteFallback(_) if stage == Stage::Pieces => {
                    plan.bytes = PieceBytes::ByteFallback;
                    stage = Stage::Bytes;
                }
                D::ByteLevel(_) if stage == Stage::Pieces => {
                    plan.bytes = PieceBytes::ByteLevel;
                    stage = Stage::Fused;
                }
                D::Fuse(_) => stage = Stage::Fused,
                D::Strip(s)
                    if stage == Stage::Fused
                        && s.stop == 0
                        && s.content.is_ascii()
                        && plan.strip_start.is_none() =>
                {
                    plan.strip_start = Some((s.content as u8, s.start));
                }
                _ => return None,
            }
        }
        Some(plan)
    }

    /// The bytes of the token spelled `piece`, `first` in the text or not.
    fn piece_bytes(&self, mut piece: String, first: bool) -> Vec<u8> {
        use tokenizers::Decoder;

        for rewrite in &self.rewrites {
            piece = match rewrite {
                // A `Metaspace` treats the first token of the list apart: put it first or not.
                Rewrite::Chain(decoder) => {
                    let tokens = if first {
                        vec![piece]
                    } else {
                        vec![String::new(), piece]
                    };
                    decoder
                        .decode_chain(tokens)
                        .ok()
                        .and_then(|mut out| out.pop())
                        .unwrap_or_default()
                }
                Rewrite::Strip {
                    content,
                    start,
                    stop,
                } => strip_chars(&piece, *content, *start, *stop).to_owned(),
            };
        }
        let mut bytes = if self.space_joined && !first {
            vec![b' ']
        } else {
            Vec::new()
        };
        match self.bytes {
            PieceBytes::Text => bytes.extend_from_slice(piece.as_bytes()),
            PieceBytes::ByteFallback => match byte_fallback_byte(&piece) {
                Some(b) => bytes.push(b),
                None => bytes.extend_from_slice(piece.as_bytes()),
            },
            PieceBytes::ByteLevel => {
                match piece
                    .chars()
                    .map(byte_level_byte)
                    .collect::<Option<Vec<u8>>>()
                {
                    Some(b) => bytes.extend(b),
                    None => bytes.extend_from_slice(piece.as_bytes()),
                }
            }
        }
        bytes
    }
}

/// `text` without up to `start` leading and `stop` trailing `content` characters (the
/// `Strip` decoder, which removes each only while it finds `content`).
fn strip_chars(text: &str, content: char, start: usize, stop: usize) -> &str {
    let mut s = text;
    for _ in 0..start {
        match s.strip_prefix(content) {
            Some(rest) => s = rest,
            None => break,
        }
    }
    for _ in 0..stop {
        match s.strip_suffix(content) {
            Some(rest) => s = rest,
            None => break,
        }
    }
    s
}

/// The byte a `ByteFallback` token `<0xNN>` stands for (what that decoder accepts).
fn byte_fallback_byte(piece: &str) -> Option<u8> {
    if piece.len() == 6 && piece.starts_with("<0x") && piece.ends_with('>') {
        u8::from_str_radix(piece.get(3..5)?, 16).ok()
    } else {
        None
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
/// Byte-exact tokenizers ([`EngineTokenizer::token_bytes`]: cl100k, byte-level BPE,
/// SentencePiece with `<0xNN>` byte fallback) feed each token's bytes through a
/// [`Utf8Holdback`], the first token's as the decoder has it (a SentencePiece decoder drops the
/// text's leading space). For the others each delta is the difference between decoding a short
/// window with and without the newest tokens; a window ending in U+FFFD waits for more tokens,
/// and U+FFFD elsewhere (bytes that never became a character) is removed.
pub struct IncrementalDecoder {
    /// Bytes of a character still incomplete (byte-exact tokenizers).
    utf8: Utf8Holdback,
    /// A token the decoder does not skip has been decoded as bytes.
    started: bool,
    /// `(byte, n)`: up to `n` more `byte`s to remove from the start of the text.
    strip_start: (u8, usize),
    /// Decode every tokenizer by windows (to compare the two paths in tests).
    by_windows: bool,
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
            started: false,
            strip_start: (0, 0),
            by_windows: false,
            tokens: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// An empty decoder that decodes by windows whatever the tokenizer.
    #[cfg(test)]
    fn by_windows() -> Self {
        Self {
            by_windows: true,
            ..Self::new()
        }
    }

    /// Adds `token` and returns the text it completes (possibly empty while a character is
    /// still incomplete).
    pub fn push(&mut self, tokenizer: &EngineTokenizer, token: u32) -> String {
        if let Some(text) = (!self.by_windows)
            .then(|| tokenizer.token_text(token, !self.started))
            .flatten()
        {
            let Some(bytes) = text.bytes else {
                return String::new();
            };
            if !self.started {
                self.started = true;
                self.strip_start = text.strip_start.unwrap_or((0, 0));
            }
            let (strip, left) = &mut self.strip_start;
            let mut at = 0;
            while *left > 0 && at < bytes.len() {
                if bytes[at] == *strip {
                    at += 1;
                    *left -= 1;
                } else {
                    *left = 0;
                }
            }
            return self.utf8.push(&bytes[at..]);
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

    /// Llama-2 / Mistral `tokenizer.json`: `▁` is the space, `<0xNN>` byte fallback, and the
    /// leading space of the text is stripped.
    const LLAMA_DECODER: &str = r#"{"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}"#;
    /// The same without the strip (Gemma): the leading space stays.
    const GEMMA_DECODER: &str = r#"{"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}"#;
    /// `Metaspace` (older conversions): every `▁` of the first token is dropped.
    const METASPACE_DECODER: &str = r#"{"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}"#;
    /// Pieces of the SentencePiece test vocabulary, after `<unk>`, `<s>`, `</s>` and the 256
    /// byte tokens.
    const PIECES: [&str; 9] = ["▁a", "▁b", "▁", "c", "▁the", "é", "€", "▁日本", "▁▁x"];

    /// A SentencePiece-style tokenizer (`<0xNN>` byte fallback) with `decoder`: ids 0..=2 are
    /// `<unk>` `<s>` `</s>` (the last two special), 3 + NN is `<0xNN>`, then [`PIECES`].
    fn sentencepiece_tokenizer(decoder: &str) -> EngineTokenizer {
        let mut vocab = vec![r#""<unk>": 0, "<s>": 1, "</s>": 2"#.to_owned()];
        vocab.extend((0..=255u32).map(|b| format!(r#""<0x{b:02X}>": {}"#, b + 3)));
        vocab.extend(
            (0u32..)
                .zip(PIECES)
                .map(|(i, p)| format!(r#""{p}": {}"#, 259 + i)),
        );
        let special = |id: u32, content: &str| {
            format!(
                r#"{{"id": {id}, "content": "{content}", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}}"#
            )
        };
        let json = format!(
            r#"{{
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{}, {}],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {decoder},
            "model": {{"type": "BPE", "dropout": null, "unk_token": "<unk>",
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                "vocab": {{{}}}, "merges": []}}
            }}"#,
            special(1, "<s>"),
            special(2, "</s>"),
            vocab.join(", ")
        );
        let tok: tokenizers::Tokenizer = json.parse().unwrap();
        EngineTokenizer::Model(Arc::new(tok))
    }

    /// Id of a piece of the SentencePiece test vocabulary.
    fn sp(piece: &str) -> u32 {
        259 + PIECES.iter().position(|&p| p == piece).unwrap() as u32
    }

    /// Id of the byte token `<0xNN>`.
    fn sp_byte(b: u8) -> u32 {
        3 + u32::from(b)
    }

    /// `c`'s UTF-8 as byte tokens.
    fn sp_bytes(c: char) -> Vec<u32> {
        c.to_string().bytes().map(sp_byte).collect()
    }

    /// Runs `ids` through a decoder that decodes by windows (the path byte-fallback
    /// tokenizers took before they were decoded as bytes).
    fn stream_by_windows(tok: &EngineTokenizer, ids: &[u32]) -> (Vec<String>, String) {
        let mut d = IncrementalDecoder::by_windows();
        let deltas: Vec<String> = ids.iter().map(|&t| d.push(tok, t)).collect();
        let tail = d.finish(tok);
        (deltas, tail)
    }

    #[test]
    fn byte_fallback_tokens_are_their_byte_and_pieces_their_text() {
        for decoder in [LLAMA_DECODER, GEMMA_DECODER, METASPACE_DECODER] {
            let tok = sentencepiece_tokenizer(decoder);
            assert_eq!(tok.token_bytes(sp_byte(0xE2)), Some(vec![0xE2]));
            assert_eq!(tok.token_bytes(sp_byte(b' ')), Some(vec![b' ']));
            assert_eq!(tok.token_bytes(sp("▁the")), Some(b" the".to_vec()));
            assert_eq!(tok.token_bytes(sp("▁")), Some(b" ".to_vec()));
            assert_eq!(tok.token_bytes(sp("€")), Some("€".as_bytes().to_vec()));
            assert_eq!(tok.token_bytes(1), Some(Vec::new()), "<s> is special");
            assert_eq!(tok.token_bytes(0), Some(b"<unk>".to_vec()));
            assert_eq!(tok.token_bytes(99_999), Some(Vec::new()), "unknown id");
        }
    }

    #[test]
    fn a_character_split_over_three_byte_fallback_tokens_comes_out_whole() {
        let tok = sentencepiece_tokenizer(LLAMA_DECODER);
        let euro = sp_bytes('€');
        assert_eq!(euro.len(), 3);
        let ids = [vec![sp("▁a")], euro.clone(), vec![sp("▁b")]].concat();
        let (deltas, tail) = stream(&tok, &ids);
        assert_eq!(deltas, ["a", "", "", "€", " b"]);
        assert_eq!(tail, "");
        // First in the text, and left incomplete at the end.
        let (deltas, tail) = stream(&tok, &[euro.clone(), euro[..2].to_vec()].concat());
        assert_eq!(deltas, ["", "", "€", "", ""]);
        assert_eq!(
            tail, "",
            "the dangling bytes are dropped, not shown as U+FFFD"
        );
    }

    #[test]
    fn text_keeps_streaming_after_an_invalid_byte_that_follows_a_whole_character() {
        let tok = sentencepiece_tokenizer(LLAMA_DECODER);
        let after = [sp("▁a"), sp("▁the"), sp("c"), sp("▁b")];
        // "€" from byte tokens, then a stray continuation byte; "€" as a piece, then a byte
        // that is never UTF-8; "é", then a lead byte that the next text cuts short.
        for (before, bad) in [
            (sp_bytes('€'), 0x82),
            (vec![sp("€")], 0xFF),
            (sp_bytes('é'), 0xE2),
        ] {
            let ids = [before.clone(), vec![sp_byte(bad)], after.to_vec()].concat();
            let (deltas, tail) = stream(&tok, &ids);
            let shown: Vec<&str> = deltas.iter().map(String::as_str).collect();
            let whole = tok.decode(&before);
            assert_eq!(shown[before.len() - 1], whole, "{ids:?}");
            assert_eq!(shown[before.len()], "", "the invalid byte shows nothing");
            assert_eq!(
                shown[before.len() + 1..],
                [" a", " the", "c", " b"],
                "{ids:?}"
            );
            assert_eq!(tail, "");
        }
        // The same mid-text, then a complete character again.
        let ids = [
            vec![sp("▁a")],
            sp_bytes('日'),
            vec![sp_byte(0x9C), sp("▁b")],
            sp_bytes('€'),
            vec![sp("c")],
        ]
        .concat();
        let (deltas, tail) = stream(&tok, &ids);
        assert_eq!(deltas.concat() + &tail, "a日 b€c");
    }

    /// Sequences of whole characters: pieces, characters spelled in byte tokens, special tokens.
    fn valid_sequences() -> Vec<Vec<u32>> {
        let mut seqs: Vec<Vec<u32>> = vec![
            vec![sp("▁a"), sp("▁b")],
            vec![sp("▁"), sp("▁a")],
            vec![sp("▁"), sp("▁")],
            vec![sp("▁▁x"), sp("▁▁x")],
            vec![1, sp("▁a"), 2],
            vec![1, 2, sp("▁the"), sp("c")],
            vec![sp_byte(b' '), sp("▁a")],
            vec![sp_byte(b' '), sp_byte(b' '), sp("c")],
            [sp_bytes('€'), vec![sp("▁a")]].concat(),
            [sp_bytes(' '), sp_bytes('日'), vec![sp("c")]].concat(),
            vec![sp("c"), sp("▁"), sp("é")],
            vec![sp("▁日本"), 0, sp("▁b")],
        ];
        let units: Vec<Vec<u32>> = PIECES
            .iter()
            .map(|&p| vec![sp(p)])
            .chain([vec![1], vec![2], vec![0], vec![sp_byte(b'z')]])
            .chain(['€', 'é', '日', '🦀', ' '].map(sp_bytes))
            .collect();
        let mut state = 11u64;
        for _ in 0..300 {
            let mut ids = Vec::new();
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            for _ in 0..(state >> 60) + 1 {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                ids.extend(&units[(state >> 33) as usize % units.len()]);
            }
            seqs.push(ids);
        }
        seqs
    }

    #[test]
    fn streamed_byte_fallback_text_is_the_whole_decode() {
        for decoder in [LLAMA_DECODER, GEMMA_DECODER, METASPACE_DECODER] {
            let tok = sentencepiece_tokenizer(decoder);
            for ids in valid_sequences() {
                let (deltas, tail) = stream(&tok, &ids);
                for d in &deltas {
                    assert!(!d.contains(char::REPLACEMENT_CHARACTER), "{d:?}");
                }
                let whole = tok.decode(&ids);
                assert!(!whole.contains(char::REPLACEMENT_CHARACTER));
                assert_eq!(deltas.concat() + &tail, whole, "{ids:?}");
            }
        }
    }

    #[test]
    fn the_leading_space_is_handled_as_the_window_decoding_did() {
        let llama = sentencepiece_tokenizer(LLAMA_DECODER);
        let gemma = sentencepiece_tokenizer(GEMMA_DECODER);
        let metaspace = sentencepiece_tokenizer(METASPACE_DECODER);
        let cases: [(&EngineTokenizer, Vec<u32>, &[&str]); 8] = [
            (&llama, vec![sp("▁a"), sp("▁b")], &["a", " b"]),
            (&llama, vec![1, sp("▁a")], &["", "a"]),
            (&llama, vec![sp("▁"), sp("▁a")], &["", " a"]),
            (&llama, vec![sp_byte(b' '), sp("▁a")], &["", " a"]),
            (&llama, vec![sp("▁▁x"), sp("▁a")], &[" x", " a"]),
            (&gemma, vec![sp("▁a"), sp("▁b")], &[" a", " b"]),
            (&metaspace, vec![1, sp("▁▁x"), sp("▁▁x")], &["", "x", "  x"]),
            // `Metaspace` drops `▁`s, not a space spelled in bytes.
            (&metaspace, vec![sp_byte(b' '), sp("▁a")], &[" ", " a"]),
        ];
        for (tok, ids, expected) in cases {
            let (deltas, tail) = stream(tok, &ids);
            assert_eq!(deltas, expected, "{ids:?}");
            assert_eq!(tail, "");
            assert_eq!((deltas, tail), stream_by_windows(tok, &ids), "{ids:?}");
        }
        // Whatever the text, the first delta with text is what the windows showed.
        for tok in [&llama, &gemma, &metaspace] {
            for ids in valid_sequences() {
                let (deltas, _) = stream(tok, &ids);
                // (Only the start: later, the windows lose characters whose byte tokens a
                // window cuts, or that special tokens between them run together.)
                let (old, _) = stream_by_windows(tok, &ids);
                let first = |d: &[String]| d.iter().find(|s| !s.is_empty()).cloned();
                assert_eq!(first(&deltas), first(&old), "{ids:?}");
            }
        }
    }

    #[test]
    fn window_decoding_holds_split_characters_and_hides_invalid_bytes() {
        let tok = sentencepiece_tokenizer(LLAMA_DECODER);
        let [e2, x82, xac] = [0xE2, 0x82, 0xAC].map(sp_byte);
        let ids = [sp("▁a"), e2, x82, xac, sp("▁b"), e2, sp("▁a"), e2];
        let expected = ["a", "", "", "€", " b", "", " a", ""];
        for (deltas, tail) in [stream(&tok, &ids), stream_by_windows(&tok, &ids)] {
            assert_eq!(deltas, expected);
            assert_eq!(tail, "", "the dangling <0xE2> is dropped");
        }
    }

    #[test]
    fn other_decoders_are_decoded_by_windows() {
        let json = r###"{
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
            "model": {"type": "WordPiece", "unk_token": "[UNK]",
                "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
                "vocab": {"[UNK]": 0, "play": 1, "##ing": 2, "well": 3}}
        }"###;
        let tok = EngineTokenizer::Model(Arc::new(json.parse().unwrap()));
        assert!(tok.token_bytes(1).is_none());
        let (deltas, tail) = stream(&tok, &[1, 2, 3]);
        assert_eq!(deltas.concat() + &tail, "playing well");
    }

    #[test]
    fn no_decoder_joins_tokens_with_spaces() {
        let json = r#"{
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 1, "content": "<s>", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "unk_token": "<unk>",
                "vocab": {"<unk>": 0, "<s>": 1, "a": 2, "b": 3}}
        }"#;
        let tok = EngineTokenizer::Model(Arc::new(json.parse().unwrap()));
        assert_eq!(tok.token_bytes(2), Some(b" a".to_vec()));
        let ids = [1, 2, 3, 1, 2];
        let (deltas, tail) = stream(&tok, &ids);
        assert_eq!(deltas, ["", "a", " b", "", " a"]);
        assert_eq!(deltas.concat() + &tail, tok.decode(&ids));
        assert_eq!(stream_by_windows(&tok, &ids), (deltas, tail));
    }

    #[test]
    fn the_strip_decoder_is_followed_exactly() {
        assert_eq!(strip_chars("  a  ", ' ', 1, 0), " a  ");
        assert_eq!(strip_chars("  a  ", ' ', 5, 1), "a ");
        assert_eq!(strip_chars("x a", ' ', 1, 1), "x a");
        assert_eq!(strip_chars("", ' ', 1, 1), "");
        assert_eq!(byte_fallback_byte("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_fallback_byte("<0xZZ>"), None);
        assert_eq!(byte_fallback_byte("<0x0A"), None);
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
