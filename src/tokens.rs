//! Prompt token estimates for metering: a real BPE tokenizer (cl100k or o200k, embedded in the
//! binary, so it works offline), run off the async reactor by the caller for long prompts.
//!
//! A prompt is counted in pieces of about [`PIECE_BYTES`], each ending before a newline or a
//! whitespace character (where the tokenizer's pre-split starts a new word anyway), and each
//! piece's count
//! is kept in a small lock-free table keyed by a hash of its bytes. Prompts repeat (system
//! prompts, few-shot examples, a conversation's earlier turns), so most pieces are counted
//! once. The estimate is a pure function of the text: the sum of its pieces' counts, which
//! differs from a whole-text count only where a piece boundary falls inside a run of
//! whitespace.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;

/// Target size of a counted piece, in bytes.
pub const PIECE_BYTES: usize = 256;
/// A piece ends at the last whitespace after this many bytes (else at `PIECE_BYTES`).
const MIN_PIECE_BYTES: usize = 64;
/// Entries of each tokenizer's count table (direct-mapped; 128 KiB).
const SLOTS: usize = 1 << 14;
/// Low bits of an entry hold the count; the rest are the piece hash's high bits.
const COUNT_BITS: u32 = 16;

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

/// Counts of pieces already seen, for one tokenizer.
struct CountTable(Box<[AtomicU64]>);

impl CountTable {
    fn new() -> Self {
        Self((0..SLOTS).map(|_| AtomicU64::new(0)).collect())
    }

    /// The kept count of the piece hashing to `hash`.
    fn get(&self, hash: u64) -> Option<u64> {
        let entry = self.0[(hash as usize) % SLOTS].load(Ordering::Relaxed);
        // A zero entry is empty (a real tag of zero merely misses).
        (entry != 0 && entry & !((1 << COUNT_BITS) - 1) == hash & !((1 << COUNT_BITS) - 1))
            .then_some(entry & ((1 << COUNT_BITS) - 1))
    }

    /// The count of the piece hashing to `hash`, computing (and keeping) it on a miss.
    fn count(&self, hash: u64, compute: impl FnOnce() -> u64) -> u64 {
        if let Some(n) = self.get(hash) {
            return n;
        }
        let n = compute();
        if n < (1 << COUNT_BITS) {
            let tag = hash & !((1 << COUNT_BITS) - 1);
            self.0[(hash as usize) % SLOTS].store(tag | n, Ordering::Relaxed);
        }
        n
    }
}

fn table(e: Estimator) -> &'static CountTable {
    static CL100K: OnceLock<CountTable> = OnceLock::new();
    static O200K: OnceLock<CountTable> = OnceLock::new();
    match e {
        Estimator::O200k => O200K.get_or_init(CountTable::new),
        _ => CL100K.get_or_init(CountTable::new),
    }
}

/// `text` cut into pieces of at most [`PIECE_BYTES`], each ending before a newline, else before
/// a whitespace character when one lies past [`MIN_PIECE_BYTES`]. Cutting at newlines keeps a
/// chat prompt's pieces within its messages (joined by newlines), so a shared system prompt's
/// last piece is the same whatever question follows it, and only the new message is tokenized.
pub fn pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut end = rest.len().min(PIECE_BYTES);
        // A character is at most 4 bytes, so a boundary lies within the last three.
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let first = rest.chars().next().map_or(1, char::len_utf8).min(end);
        if let Some(i) = rest[first..end].find('\n') {
            let (piece, tail) = rest.split_at(first + i);
            rest = tail;
            return Some(piece);
        }
        if rest.len() <= PIECE_BYTES {
            return Some(std::mem::take(&mut rest));
        }
        let cut = rest[..end]
            .char_indices()
            .rev()
            .take_while(|&(i, _)| i >= MIN_PIECE_BYTES)
            .find(|(_, c)| c.is_whitespace())
            .map_or(end, |(i, _)| i);
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

impl Estimator {
    /// The tokens of `text`'s pieces counted before, and the pieces not counted yet (for
    /// [`Self::count_pieces`]): a hash lookup per piece, cheap enough for the reactor.
    pub fn count_known(self, text: &str) -> (u64, Vec<&str>) {
        if self == Estimator::Bytes {
            return ((text.len() as u64).div_ceil(4), Vec::new());
        }
        let table = table(self);
        let mut known = 0;
        let mut missing = Vec::new();
        for piece in pieces(text) {
            match table.get(xxhash_rust::xxh3::xxh3_64(piece.as_bytes())) {
                Some(n) => known += n,
                None => missing.push(piece),
            }
        }
        (known, missing)
    }

    /// Estimated tokens of `pieces` (of [`pieces`]), each counted by the tokenizer unless
    /// counted before, and kept.
    pub fn count_pieces<S: AsRef<str>>(self, pieces: impl IntoIterator<Item = S>) -> u64 {
        let bpe = match self {
            Estimator::Cl100k => tiktoken_rs::cl100k_base_singleton(),
            Estimator::O200k => tiktoken_rs::o200k_base_singleton(),
            Estimator::Bytes => {
                return pieces
                    .into_iter()
                    .map(|p| (p.as_ref().len() as u64).div_ceil(4))
                    .sum();
            }
        };
        let table = table(self);
        pieces
            .into_iter()
            .map(|piece| {
                let piece = piece.as_ref();
                let hash = xxhash_rust::xxh3::xxh3_64(piece.as_bytes());
                table.count(hash, || bpe.encode_ordinary(piece).len() as u64)
            })
            .sum()
    }

    /// Estimated tokens of `text`.
    pub fn count(self, text: &str) -> u64 {
        if self == Estimator::Bytes {
            return (text.len() as u64).div_ceil(4);
        }
        self.count_pieces(pieces(text))
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

    #[test]
    fn a_shared_system_prompts_pieces_do_not_depend_on_the_question_after_it() {
        let system = "Answer from the documents given, and cite them. ".repeat(30);
        let a = format!("system\n{system}\nuser\nWhich section covers travel?\n");
        let b = format!("system\n{system}\nuser\nWho approves a budget over 10k?\n");
        let (pa, pb): (Vec<&str>, Vec<&str>) = (pieces(&a).collect(), pieces(&b).collect());
        let shared = pa.iter().zip(&pb).take_while(|(x, y)| x == y).count();
        // Every piece but the question's (and the final newline) is the same.
        assert_eq!(shared, pa.len() - 2, "{pa:?}");
        assert_eq!(pa.concat(), a);
    }

    #[test]
    fn pieces_cover_the_text_and_end_before_whitespace() {
        let text = "word ".repeat(200) + &"é".repeat(300) + "tail";
        let parts: Vec<&str> = pieces(&text).collect();
        assert_eq!(parts.concat(), text);
        assert!(parts.iter().all(|p| p.len() <= PIECE_BYTES), "{parts:?}");
        // Word pieces end before a space (the next one starts with it).
        assert!(parts[1].starts_with(' '), "{:?}", parts[1]);
        assert!(pieces("").next().is_none());
        // One piece for short text.
        assert_eq!(pieces("hello").collect::<Vec<_>>(), ["hello"]);
        // Lines are pieces of their own, each starting with its newline.
        assert_eq!(
            pieces("system\nbe brief\nuser\nhi\n").collect::<Vec<_>>(),
            ["system", "\nbe brief", "\nuser", "\nhi", "\n"]
        );
    }

    #[test]
    fn known_counts_leave_only_the_new_pieces_to_the_tokenizer() {
        let text = "A prompt that no other test counts, long enough for two pieces. ".repeat(6);
        let e = Estimator::Cl100k;
        let (known, new) = e.count_known(&text);
        assert_eq!((known, new.concat()), (0, text.clone()));
        let n = e.count(&text);
        assert_eq!(e.count_known(&text), (n, vec![]));
        // A new message after it is the one piece left to count, and the sum is the whole count.
        let longer = format!("{text}\nand a fresh question");
        let (known, new) = e.count_known(&longer);
        assert_eq!((known, new.clone()), (n, vec!["\nand a fresh question"]));
        assert_eq!(known + e.count_pieces(&new), e.count(&longer));
        assert_eq!(Estimator::Bytes.count_known("12345"), (2, vec![]));
    }

    #[test]
    fn piecewise_counts_match_a_whole_count_of_prose_and_repeat_exactly() {
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(40);
        let whole = tiktoken_rs::cl100k_base_singleton()
            .encode_ordinary(&text)
            .len() as u64;
        let first = Estimator::Cl100k.count(&text);
        assert_eq!(first, whole, "a cut before a space splits no token");
        // The second count comes from the table and is the same.
        assert_eq!(Estimator::Cl100k.count(&text), first);
        assert_eq!(Estimator::O200k.count(&text), Estimator::O200k.count(&text));
    }

    proptest::proptest! {
        #[test]
        fn any_text_cuts_into_pieces_that_rebuild_it(text in "\\PC{0,700}") {
            let parts: Vec<&str> = pieces(&text).collect();
            proptest::prop_assert_eq!(parts.concat(), text.clone());
            for p in &parts {
                proptest::prop_assert!(!p.is_empty());
                proptest::prop_assert!(p.len() <= PIECE_BYTES || p.chars().count() == 1);
            }
        }
    }
}
