//! Token id → bytes for the model a vLLM pool serves, read from its Hugging Face
//! `tokenizer.json`, so the token ids of vLLM's `BlockStored` events can be turned back into the
//! prompt bytes the gateway hashes.
//!
//! Byte-level BPE vocabularies (GPT-2 style: Llama 3, Qwen, Mistral Nemo, …) map each byte to a
//! printable character; sentencepiece ones (Llama 2, Mistral v0.1) write a space as `▁` and
//! unknown bytes as `<0xNN>`. Special added tokens (BOS, chat markers) decode to nothing: they are
//! not text the gateway can see.

use serde_json::Value;

/// Largest vocabulary accepted (ids above it are refused as unknown).
pub const MAX_VOCAB: usize = 1 << 21;

/// The bytes of every token id of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocab {
    pieces: Vec<Option<Box<[u8]>>>,
    /// Sentencepiece vocabularies write the space a prompt's first word is given (`▁Hello`);
    /// decoding drops it, as Hugging Face's decoders do.
    strip_first_space: bool,
    /// Contents of the special added tokens (`<|im_start|>`, BOS, ...), which decode to nothing.
    specials: Vec<String>,
}

/// Name of the built-in vocabulary: OpenAI's cl100k, the sim engine's tokenizer.
pub const BUILTIN_CL100K: &str = "builtin:cl100k";
/// cl100k's ordinary ids are `0..CL100K_ORDINARY`; its special ones lie below `CL100K_END`.
const CL100K_ORDINARY: u32 = 100_256;
const CL100K_END: u32 = 100_277;

impl Vocab {
    /// The bytes of token `id`; `None` for an id the vocabulary lacks.
    pub fn bytes(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize)?.as_deref()
    }

    /// Whether the space opening a prompt's text is dropped (sentencepiece vocabularies).
    pub fn strips_first_space(&self) -> bool {
        self.strip_first_space
    }

    /// Whether `text` is one of the vocabulary's special tokens (decoded to nothing).
    pub fn is_special(&self, text: &str) -> bool {
        self.specials.iter().any(|s| s == text)
    }

    /// OpenAI's cl100k (embedded in the binary): the sim engine's tokenizer, which encodes every
    /// prompt as ordinary text, so no id decodes to nothing.
    pub fn cl100k() -> Result<Self, String> {
        let bpe = tiktoken_rs::cl100k_base_singleton();
        let (mut pieces, mut specials) = (Vec::with_capacity(CL100K_END as usize), Vec::new());
        for id in 0..CL100K_END {
            let piece = bpe.decode_bytes(&[id]).ok().map(|bytes| {
                if id < CL100K_ORDINARY {
                    bytes.into_boxed_slice()
                } else {
                    // `<|endoftext|>` and the like: special, as in a tokenizer.json.
                    specials.push(String::from_utf8_lossy(&bytes).into_owned());
                    Box::default()
                }
            });
            pieces.push(piece);
        }
        if pieces
            .iter()
            .take(CL100K_ORDINARY as usize)
            .any(Option::is_none)
        {
            return Err("the built-in cl100k tokenizer has holes".into());
        }
        Ok(Self {
            pieces,
            strip_first_space: false,
            specials,
        })
    }

    /// Number of ids (including holes).
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// True for an empty vocabulary.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Reads `tokenizer.json` text.
    pub fn from_tokenizer_json(text: &str) -> Result<Self, String> {
        let doc: Value =
            serde_json::from_str(text).map_err(|e| format!("not a tokenizer.json: {e}"))?;
        let model = doc.get("model").ok_or("tokenizer.json has no `model`")?;
        let byte_level = doc
            .get("decoder")
            .is_some_and(|d| d.to_string().contains("\"ByteLevel\""));
        let mut pieces: Vec<Option<Box<[u8]>>> = Vec::new();
        let mut specials = Vec::new();
        let mut put = |id: u64, bytes: Vec<u8>| -> Result<(), String> {
            let id = usize::try_from(id)
                .ok()
                .filter(|&i| i < MAX_VOCAB)
                .ok_or_else(|| format!("token id {id} is past {MAX_VOCAB}"))?;
            if pieces.len() <= id {
                pieces.resize(id + 1, None);
            }
            pieces[id] = Some(bytes.into_boxed_slice());
            Ok(())
        };
        match model.get("vocab") {
            // BPE and WordPiece: {piece: id}.
            Some(Value::Object(map)) => {
                for (piece, id) in map {
                    let id = id.as_u64().ok_or("a vocab id is not an integer")?;
                    put(id, piece_bytes(piece, byte_level))?;
                }
            }
            // Unigram: [[piece, score], ...], the id being the position.
            Some(Value::Array(list)) => {
                for (id, entry) in list.iter().enumerate() {
                    let piece = entry
                        .get(0)
                        .and_then(Value::as_str)
                        .ok_or("a unigram vocab entry has no piece")?;
                    put(id as u64, piece_bytes(piece, byte_level))?;
                }
            }
            _ => return Err("tokenizer.json's model has no vocab".into()),
        }
        for added in doc
            .get("added_tokens")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (Some(id), Some(content)) = (
                added.get("id").and_then(Value::as_u64),
                added.get("content").and_then(Value::as_str),
            ) else {
                continue;
            };
            let special = added
                .get("special")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if special {
                specials.push(content.to_string());
            }
            put(
                id,
                if special {
                    Vec::new()
                } else {
                    content.as_bytes().to_vec()
                },
            )?;
        }
        if pieces.is_empty() {
            return Err("tokenizer.json's vocab is empty".into());
        }
        Ok(Self {
            pieces,
            strip_first_space: !byte_level,
            specials,
        })
    }
}

/// The bytes one vocabulary entry stands for.
fn piece_bytes(piece: &str, byte_level: bool) -> Vec<u8> {
    if byte_level {
        // Every char is one byte in GPT-2's printable mapping; a char outside it (an entry the
        // mapping cannot produce) keeps its UTF-8.
        let mut out = Vec::with_capacity(piece.len());
        for c in piece.chars() {
            match unprintable_byte(c) {
                Some(b) => out.push(b),
                None => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        return out;
    }
    if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>'))
        && hex.len() == 2
        && let Ok(b) = u8::from_str_radix(hex, 16)
    {
        return vec![b];
    }
    piece.replace('\u{2581}', " ").into_bytes()
}

/// Whether GPT-2's byte-level alphabet writes byte (or code point) `b` as itself.
const fn printable(b: u32) -> bool {
    (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)
}

/// The 68 bytes GPT-2's alphabet shifts to U+0100 and up, in order.
const SHIFTED: [u8; 68] = {
    let mut out = [0u8; 68];
    let (mut b, mut n) = (0u32, 0usize);
    while b < 256 {
        if !printable(b) {
            out[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    out
};

/// The byte GPT-2's byte-level alphabet writes as `c`. Printable bytes (`!`..=`~`, `¡`..=`¬`,
/// `®`..=`ÿ`) stand for themselves; the other 68 bytes are shifted to U+0100 and up, in order.
fn unprintable_byte(c: char) -> Option<u8> {
    let code = c as u32;
    if printable(code) {
        return Some(code as u8);
    }
    let shifted = usize::try_from(code.checked_sub(256)?).ok()?;
    SHIFTED.get(shifted).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The printable character GPT-2's alphabet uses for byte `b` (the test's encoder).
    fn gpt2_char(b: u8) -> char {
        (0u32..=255)
            .map(|x| (x, printable(x)))
            .scan(0u32, |n, (x, printable)| {
                let c = if printable {
                    x
                } else {
                    *n += 1;
                    255 + *n
                };
                Some((x, c))
            })
            .find(|&(x, _)| x == u32::from(b))
            .and_then(|(_, c)| char::from_u32(c))
            .unwrap()
    }

    #[test]
    fn byte_level_alphabet_round_trips_every_byte() {
        for b in 0..=255u8 {
            assert_eq!(unprintable_byte(gpt2_char(b)), Some(b), "byte {b}");
        }
        assert_eq!(gpt2_char(b' '), 'Ġ');
        assert_eq!(gpt2_char(b'\n'), 'Ċ');
    }

    #[test]
    fn byte_level_tokenizer_json() {
        let json = r#"{"model":{"type":"BPE","vocab":{"Hello":0,"ĠworldĊ":1,"Ã©":2}},
            "decoder":{"type":"ByteLevel"},
            "added_tokens":[{"id":5,"content":"<|begin_of_text|>","special":true},
                            {"id":6,"content":"plain","special":false}]}"#;
        let v = Vocab::from_tokenizer_json(json).unwrap();
        assert_eq!(v.bytes(0), Some(&b"Hello"[..]));
        assert_eq!(v.bytes(1), Some(&b" world\n"[..]));
        assert_eq!(v.bytes(2), Some("é".as_bytes()));
        assert_eq!(v.bytes(5), Some(&b""[..]));
        assert_eq!(v.bytes(6), Some(&b"plain"[..]));
        assert_eq!(v.bytes(3), None, "a hole");
        assert_eq!(v.bytes(99), None);
        assert_eq!(v.len(), 7);
        assert!(v.is_special("<|begin_of_text|>"));
        assert!(!v.is_special("plain"));
    }

    #[test]
    fn builtin_cl100k_decodes_what_the_sim_engine_encodes() {
        let v = Vocab::cl100k().unwrap();
        let bpe = tiktoken_rs::cl100k_base_singleton();
        let text = "<|im_start|>system\nYou are terse.<|im_end|>\n";
        let ids = bpe.encode_ordinary(text);
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&i| v.bytes(i).unwrap().to_vec())
            .collect();
        assert_eq!(bytes, text.as_bytes());
        assert!(!v.is_special("<|im_start|>"));
        assert!(v.is_special("<|endoftext|>"));
        assert_eq!(v.bytes(100_257), Some(&b""[..]), "EOS decodes to nothing");
    }

    #[test]
    fn sentencepiece_tokenizer_json() {
        let json = r#"{"model":{"type":"Unigram","vocab":[["<unk>",0],["▁Hello",-1],["<0x0A>",-2]]},
            "decoder":{"type":"Metaspace"}}"#;
        let v = Vocab::from_tokenizer_json(json).unwrap();
        assert_eq!(v.bytes(1), Some(&b" Hello"[..]));
        assert_eq!(v.bytes(2), Some(&b"\n"[..]));
    }

    #[test]
    fn bad_files_are_errors() {
        assert!(Vocab::from_tokenizer_json("{").is_err());
        assert!(Vocab::from_tokenizer_json(r#"{"model":{}}"#).is_err());
        assert!(Vocab::from_tokenizer_json(r#"{"model":{"vocab":{"a":99999999999}}}"#).is_err());
        assert!(Vocab::from_tokenizer_json(r#"{"model":{"vocab":{"a":"x"}}}"#).is_err());
    }
}
