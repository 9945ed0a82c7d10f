//! Prompt token estimates for metering: a real BPE tokenizer (cl100k or o200k, embedded in the
//! binary, so it works offline), run off the async reactor by the caller for long new text.
//!
//! A prompt is counted by lines (each ends after its line breaks), and a line by words: a word ends
//! before whitespace that follows non-whitespace (but keeps line breaks that follow punctuation),
//! and after at most [`WORD_BYTES`]. Both tokenizers' pre-split starts a new piece at such
//! whitespace, so a word's tokens are the same alone as in the text. Inside a word, each run of
//! ASCII digits is one token per three digits (the pre-split cuts digits into runs of one to three,
//! each one token in both vocabularies) and the text between runs is counted on its own, so a
//! number never reaches the tokenizer. Lines and words are kept in one lock-free table keyed by a
//! hash of their bytes: prompts repeat (system prompts, few-shot examples, a conversation's earlier
//! turns) and so do words, so a request usually costs one hash of its text and a few lookups. The
//! estimate is a pure function of the text: the sum of its words' counts, which differs from a
//! whole-text count only where a cut falls inside a run of whitespace or a word longer than
//! [`WORD_BYTES`].

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;
use tiktoken_rs::CoreBPE;
use xxhash_rust::xxh3::xxh3_64;

/// Longest word counted whole, in bytes (a longer run without whitespace is cut).
pub const WORD_BYTES: usize = 256;
/// Entries of each tokenizer's count table (direct-mapped; 512 KiB).
const SLOTS: usize = 1 << 16;
/// Low bits of an entry hold the count; the rest are the text hash's high bits.
const COUNT_BITS: u32 = 24;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// Hash seed of text counted before digits (its count differs from the same text alone).
const BEFORE_DIGITS: u64 = 0x6469_6769_7473;

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

/// Counts of lines and words already seen, for one tokenizer.
struct CountTable(Box<[AtomicU64]>);

impl CountTable {
    fn new() -> Self {
        Self((0..SLOTS).map(|_| AtomicU64::new(0)).collect())
    }

    /// The kept count of the text hashing to `hash`.
    fn get(&self, hash: u64) -> Option<u64> {
        let entry = self.0[(hash as usize) % SLOTS].load(Ordering::Relaxed);
        // A zero entry is empty (a real tag of zero merely misses).
        (entry != 0 && entry & !COUNT_MASK == hash & !COUNT_MASK).then_some(entry & COUNT_MASK)
    }

    /// The count of the text hashing to `hash`, computed (and kept, unless too large) on a miss.
    fn count(&self, hash: u64, compute: impl FnOnce() -> u64) -> u64 {
        if let Some(n) = self.get(hash) {
            return n;
        }
        let n = compute();
        if n <= COUNT_MASK {
            self.0[(hash as usize) % SLOTS].store((hash & !COUNT_MASK) | n, Ordering::Relaxed);
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

/// `text`'s lines: each ends after a run of line breaks (and the whitespace between them), so a
/// chat prompt's messages (joined by newlines) are lines of their own whatever follows them, and
/// a line break stays with the text before it, as the pre-split keeps it (`.\n` is one piece).
pub fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let bytes = rest.as_bytes();
        // After the last line break of the whitespace that follows the newline (the pre-split
        // keeps `\n \n` whole).
        let cut = match memchr::memchr(b'\n', bytes) {
            Some(i) => bytes[i..]
                .iter()
                .take_while(|b| b.is_ascii_whitespace())
                .enumerate()
                .filter(|&(_, &b)| b == b'\n' || b == b'\r')
                .last()
                .map_or(i + 1, |(j, _)| i + j + 1),
            None => bytes.len(),
        };
        let (line, tail) = rest.split_at(cut);
        rest = tail;
        Some(line)
    })
}

/// `line`'s words: cut before whitespace that follows non-whitespace (but not before line breaks
/// after punctuation, which the pre-split joins to it), and at most [`WORD_BYTES`] long (cut at
/// a character boundary).
pub fn words(line: &str) -> impl Iterator<Item = &str> {
    let mut rest = line;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let bytes = rest.as_bytes();
        let limit = bytes.len().min(WORD_BYTES);
        let mut cut = limit;
        let mut seen_text = false;
        // Whether line breaks here join the punctuation before them.
        let mut attach = false;
        for (i, &b) in bytes[..limit].iter().enumerate() {
            let space = b.is_ascii_whitespace();
            let line_break = b == b'\n' || b == b'\r';
            if space && seen_text && !(line_break && attach) {
                cut = i;
                break;
            }
            seen_text |= !space;
            if !line_break {
                attach = b.is_ascii_punctuation();
            }
        }
        // A character is at most 4 bytes, so a boundary lies within the last three.
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        if cut == 0 {
            // Only when the first character is wider than the room left: take it whole.
            cut = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        let (word, tail) = rest.split_at(cut);
        rest = tail;
        Some(word)
    })
}

/// The tokenizer behind a count table.
struct Counter {
    table: &'static CountTable,
    bpe: &'static CoreBPE,
}

impl Counter {
    /// Tokens of one line: its words' counts, kept as the line's.
    fn line(&self, line: &str) -> u64 {
        self.table.count(xxh3_64(line.as_bytes()), || {
            words(line).map(|w| self.word(w)).sum()
        })
    }

    /// Tokens of one word (or of the text between a word's digit runs).
    fn word(&self, word: &str) -> u64 {
        self.table.count(xxh3_64(word.as_bytes()), || {
            if word.bytes().any(|b| b.is_ascii_digit()) {
                self.split_digits(word)
            } else {
                self.bpe.encode_ordinary(word).len() as u64
            }
        })
    }

    /// Tokens of a word with digits: a token per three digits of each run, and the text
    /// between runs counted on its own.
    fn split_digits(&self, word: &str) -> u64 {
        let mut n = 0;
        let mut rest = word;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits > 0 {
                n += (digits as u64).div_ceil(3);
                rest = &rest[digits..];
                continue;
            }
            // ASCII digits are single bytes, so these cuts are character boundaries.
            match rest.bytes().position(|b| b.is_ascii_digit()) {
                Some(text) => {
                    n += self.before_digits(&rest[..text]);
                    rest = &rest[text..];
                }
                None => return n + self.word(rest),
            }
        }
        n
    }

    /// Tokens of text that digits follow. The pre-split never joins a digit to the text before
    /// it, but the digit can change how that text splits (`"  "` is one piece at the end, two
    /// before a digit), so it is counted with a digit after it, less that digit's token.
    fn before_digits(&self, text: &str) -> u64 {
        let hash = xxhash_rust::xxh3::xxh3_64_with_seed(text.as_bytes(), BEFORE_DIGITS);
        self.table.count(hash, || {
            let mut with_digit = String::with_capacity(text.len() + 1);
            with_digit.push_str(text);
            with_digit.push('0');
            (self.bpe.encode_ordinary(&with_digit).len() as u64).saturating_sub(1)
        })
    }
}

impl Estimator {
    /// The tokenizer and table of a BPE estimator (`None` for [`Estimator::Bytes`]).
    fn counter(self) -> Option<Counter> {
        let bpe = match self {
            Estimator::Cl100k => tiktoken_rs::cl100k_base_singleton(),
            Estimator::O200k => tiktoken_rs::o200k_base_singleton(),
            Estimator::Bytes => return None,
        };
        Some(Counter {
            table: table(self),
            bpe,
        })
    }

    /// The tokens of `text`'s lines counted before, and the lines not counted yet (for
    /// [`Self::count_pieces`]): a hash of the text and a lookup per line, cheap enough for the
    /// reactor.
    pub fn count_known(self, text: &str) -> (u64, Vec<&str>) {
        if self == Estimator::Bytes {
            return ((text.len() as u64).div_ceil(4), Vec::new());
        }
        let table = table(self);
        let mut known = 0;
        let mut missing = Vec::new();
        for line in lines(text) {
            match table.get(xxh3_64(line.as_bytes())) {
                Some(n) => known += n,
                None => missing.push(line),
            }
        }
        (known, missing)
    }

    /// Estimated tokens of `pieces` (lines of [`lines`], or any text), each counted word by word
    /// unless counted before, and kept.
    pub fn count_pieces<S: AsRef<str>>(self, pieces: impl IntoIterator<Item = S>) -> u64 {
        let Some(counter) = self.counter() else {
            return pieces
                .into_iter()
                .map(|p| (p.as_ref().len() as u64).div_ceil(4))
                .sum();
        };
        pieces
            .into_iter()
            .map(|piece| lines(piece.as_ref()).map(|l| counter.line(l)).sum::<u64>())
            .sum()
    }

    /// Estimated tokens of `text`.
    pub fn count(self, text: &str) -> u64 {
        if self == Estimator::Bytes {
            return (text.len() as u64).div_ceil(4);
        }
        self.count_pieces([text])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(e: Estimator, text: &str) -> u64 {
        let bpe = match e {
            Estimator::O200k => tiktoken_rs::o200k_base_singleton(),
            _ => tiktoken_rs::cl100k_base_singleton(),
        };
        bpe.encode_ordinary(text).len() as u64
    }

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
    fn a_shared_system_prompts_lines_do_not_depend_on_the_question_after_it() {
        let system = "Answer from the documents given, and cite them. ".repeat(30);
        let a = format!("system\n{system}\nuser\nWhich section covers travel?\n");
        let b = format!("system\n{system}\nuser\nWho approves a budget over 10k?\n");
        let (la, lb): (Vec<&str>, Vec<&str>) = (lines(&a).collect(), lines(&b).collect());
        let shared = la.iter().zip(&lb).take_while(|(x, y)| x == y).count();
        // Every line but the question's is the same.
        assert_eq!(shared, la.len() - 1, "{la:?}");
        assert_eq!(la.concat(), a);
    }

    #[test]
    fn lines_and_words_cover_the_text_and_cut_where_the_pre_split_does() {
        assert_eq!(
            lines("system\nbe brief\r\nuser\n\nhi").collect::<Vec<_>>(),
            ["system\n", "be brief\r\n", "user\n\n", "hi"]
        );
        assert_eq!(lines("\n\nx").collect::<Vec<_>>(), ["\n\n", "x"]);
        assert!(lines("").next().is_none());
        assert_eq!(
            words("  Say hi,\tthen stop.\n").collect::<Vec<_>>(),
            ["  Say", " hi,", "\tthen", " stop.\n"]
        );
        assert_eq!(words("A\n \n").collect::<Vec<_>>(), ["A", "\n \n"]);
        assert_eq!(words("end.  \n").collect::<Vec<_>>(), ["end.", "  \n"]);
        // A run without whitespace is cut at WORD_BYTES, on a character boundary.
        let long = "é".repeat(300);
        let parts: Vec<&str> = words(&long).collect();
        assert_eq!(parts.concat(), long);
        assert!(parts.iter().all(|p| p.len() <= WORD_BYTES), "{parts:?}");
        assert_eq!(parts[0].len(), WORD_BYTES);
    }

    #[test]
    fn every_run_of_one_to_three_digits_is_one_token_in_both_vocabularies() {
        // What the digit rule rests on.
        for e in [Estimator::Cl100k, Estimator::O200k] {
            for width in 1..=3 {
                for n in 0..10u32.pow(width as u32) {
                    let digits = format!("{n:0width$}");
                    assert_eq!(whole(e, &digits), 1, "{e:?} {digits}");
                }
            }
        }
    }

    #[test]
    fn word_counts_match_a_whole_count_of_prose_code_and_numbers() {
        let texts = [
            "The quick brown fox jumps over the lazy dog. ".repeat(40),
            "Question 17: which section covers travel expenses for trip 48213?".to_owned(),
            "Invoice #2024-0117 totals $1,234,567.89 (VAT 20%), due 2026-12-31T23:59:59Z.".into(),
            "fn main() {\n    let x = vec![1, 22, 333, 4444];\n    println!(\"{x:?}\");\n}\n"
                .into(),
            "Ünïcödé wörds, 日本語のテキスト, and emoji 🎉🎉 with   three spaces.".into(),
            "a'b 12's it's DON'T we've 3rd 4th 1st-class v2.0.1 x86_64 0x1F".into(),
            // Whitespace before a digit, and whitespace between line breaks (once failing cases
            // of the property test below).
            "  0".into(),
            "\n \n".into(),
            "A\n \n".into(),
        ];
        for e in [Estimator::Cl100k, Estimator::O200k] {
            for text in &texts {
                assert_eq!(e.count(text), whole(e, text), "{e:?}: {text}");
                // The second count comes from the table and is the same.
                assert_eq!(e.count(text), whole(e, text), "{e:?} again: {text}");
            }
        }
    }

    #[test]
    fn known_counts_leave_only_the_new_lines_to_count() {
        let text = "A prompt that no other test counts, on one line of its own. ".repeat(6);
        let e = Estimator::Cl100k;
        let (known, new) = e.count_known(&text);
        assert_eq!((known, new.concat()), (0, text.clone()));
        let n = e.count(&text);
        assert_eq!(e.count_known(&text), (n, vec![]));
        // A new message after it is the one line left to count, and the sum is the whole count.
        let text = format!("{text}\n");
        let n = e.count(&text);
        let longer = format!("{text}and a fresh question no test asked before");
        let (known, new) = e.count_known(&longer);
        assert_eq!(
            (known, new.clone()),
            (n, vec!["and a fresh question no test asked before"])
        );
        assert_eq!(known + e.count_pieces(&new), e.count(&longer));
        assert_eq!(Estimator::Bytes.count_known("12345"), (2, vec![]));
        assert_eq!(Estimator::Bytes.count_pieces(["12345", "1"]), 3);
    }

    proptest::proptest! {
        #[test]
        fn any_text_cuts_into_lines_and_words_that_rebuild_it(text in "\\PC{0,700}") {
            let parts: Vec<&str> = lines(&text).collect();
            proptest::prop_assert_eq!(parts.concat(), text.clone());
            for line in &parts {
                proptest::prop_assert!(!line.is_empty());
                let w: Vec<&str> = words(line).collect();
                proptest::prop_assert_eq!(w.concat(), line.to_string());
                for word in &w {
                    proptest::prop_assert!(!word.is_empty());
                    proptest::prop_assert!(word.len() <= WORD_BYTES);
                }
            }
        }

        #[test]
        fn ascii_text_counts_as_the_tokenizer_does(text in "[a-zA-Z0-9 .,:;!?'()\n\t-]{0,300}") {
            for e in [Estimator::Cl100k, Estimator::O200k] {
                proptest::prop_assert_eq!(e.count(&text), whole(e, &text));
            }
        }
    }
}
