//! Request features for routing: canonical prompt bytes, their chained block hashes, session hash.
//!
//! We hash bytes, not tokens: no tokenizer runs on the routing hot path, and the hashes are the same
//! whatever tokenizer the engine behind the gateway uses (ours, vLLM's, SGLang's), so a worker's
//! cache identity does not depend on which gateway replica or model revision computed it. A block
//! of bytes is only a proxy for the engine's token blocks, which is all an approximate index needs.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Default prefix block size in bytes (about 64 tokens of English text).
pub const DEFAULT_BLOCK_BYTES: usize = 256;

/// Default cap on the number of prefix blocks hashed per request (64 KiB of prompt).
pub const DEFAULT_MAX_BLOCKS: usize = 256;

/// Bytes per token assumed before any answer has said otherwise (English text, cl100k-like).
pub const DEFAULT_BYTES_PER_TOKEN: f64 = 4.0;

/// Tokens in `bytes` of prompt at [`DEFAULT_BYTES_PER_TOKEN`].
pub fn estimate_tokens(bytes: usize) -> u64 {
    (bytes as f64 / DEFAULT_BYTES_PER_TOKEN).ceil() as u64
}

/// Separates a message's role from its content. Never occurs in UTF-8, so it cannot be forged.
const ROLE_END: u8 = 0xFE;
/// Ends a message. Never occurs in UTF-8, so message boundaries are unambiguous.
const MESSAGE_END: u8 = 0xFF;

/// Canonical bytes of a chat conversation, whole and in order: per message `role 0xFE content 0xFF`.
///
/// A conversation that extends another has canonical bytes that extend the other's, so a follow-up
/// turn shares every full block of the earlier turns.
pub fn canonical_chat<T: Turn>(messages: &[T]) -> Vec<u8> {
    let len = messages
        .iter()
        .map(|m| m.role().len() + m.text().len() + 2)
        .sum();
    let mut out = Vec::with_capacity(len);
    for m in messages {
        out.extend_from_slice(m.role().as_bytes());
        out.push(ROLE_END);
        out.extend_from_slice(m.text().as_bytes());
        out.push(MESSAGE_END);
    }
    out
}

/// One message of a conversation as prompts see it: its role and its text.
pub trait Turn {
    /// The role (`system`, `user`, ...).
    fn role(&self) -> &str;
    /// The text.
    fn text(&self) -> &str;
}

impl<R: AsRef<str>, C: AsRef<str>> Turn for (R, C) {
    fn role(&self) -> &str {
        self.0.as_ref()
    }

    fn text(&self) -> &str {
        self.1.as_ref()
    }
}

/// Canonical bytes of a completion prompt: the prompt itself.
pub fn canonical_completion(prompt: &str) -> Vec<u8> {
    prompt.as_bytes().to_vec()
}

/// Chained xxh3 hashes of the full `block_bytes`-sized blocks of `canonical`, at most `max_blocks`.
///
/// `hash_0 = chain_hash(0, block_0)`, `hash_i = chain_hash(hash_{i-1}, block_i)`, so a hash names
/// its block and everything before it. A trailing partial block is not hashed.
pub fn prefix_hashes(canonical: &[u8], block_bytes: usize, max_blocks: usize) -> Vec<u64> {
    if block_bytes == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity((canonical.len() / block_bytes).min(max_blocks));
    let mut prev = 0u64;
    for block in canonical.chunks_exact(block_bytes).take(max_blocks) {
        prev = chain_hash(prev, block);
        out.push(prev);
    }
    out
}

/// Bytes xxh3 takes in one seeded call of its short path (it has one up to 240 bytes).
const CHAIN_PIECE: usize = 128;

/// The key of `block` chained after the key `prev` of everything before it: xxh3 of the block's
/// 128-byte pieces in turn, each seeded with the hash so far. xxh3's short path mixes the seed
/// into every lane and costs about half of its long path (which hashing `prev ++ block` whole,
/// 264 bytes, took, after copying them into one buffer).
pub fn chain_hash(prev: u64, block: &[u8]) -> u64 {
    block
        .chunks(CHAIN_PIECE)
        .fold(prev, |seed, piece| xxh3_64_with_seed(piece, seed))
}

/// Hash of a session key (`x-session-id` header, else the body's `user`).
pub fn session_hash(key: &str) -> u64 {
    xxh3_64(key.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_is_unambiguous() {
        let a = canonical_chat(&[("user", "ab"), ("user", "c")]);
        let b = canonical_chat(&[("user", "a"), ("user", "bc")]);
        let c = canonical_chat(&[("usera", "b"), ("user", "c")]);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(b, c);
    }

    #[test]
    fn follow_up_turn_extends_canonical_bytes() {
        let first = canonical_chat(&[("system", "be brief"), ("user", "hi")]);
        let next = canonical_chat(&[("system", "be brief"), ("user", "hi"), ("assistant", "yo")]);
        assert!(next.starts_with(&first));
    }

    #[test]
    fn full_blocks_only_and_capped() {
        let bytes = vec![7u8; 1000];
        assert_eq!(prefix_hashes(&bytes, 256, 100).len(), 3);
        assert_eq!(prefix_hashes(&bytes, 256, 2).len(), 2);
        assert_eq!(prefix_hashes(&bytes[..255], 256, 100).len(), 0);
        assert!(prefix_hashes(&bytes, 0, 100).is_empty());
    }

    #[test]
    fn hashes_are_chained() {
        let mut a = vec![1u8; 768];
        let b = a.clone();
        a[0] = 2;
        let (ha, hb) = (prefix_hashes(&a, 256, 8), prefix_hashes(&b, 256, 8));
        // Same later block contents, different first block: every hash differs.
        assert!(ha.iter().zip(&hb).all(|(x, y)| x != y));
        // Identical blocks at different positions hash differently.
        assert_ne!(hb[1], hb[2]);
    }

    #[test]
    fn shared_prefix_shares_leading_hashes() {
        let system = "s".repeat(600);
        let a = canonical_chat(&[("system", system.as_str()), ("user", "question one")]);
        let b = canonical_chat(&[("system", system.as_str()), ("user", "another question")]);
        let (ha, hb) = (prefix_hashes(&a, 256, 8), prefix_hashes(&b, 256, 8));
        assert_eq!(ha[..2], hb[..2]);
        assert_eq!(prefix_hashes(&a, 256, 8), ha, "deterministic");
    }

    #[test]
    fn completion_and_session() {
        assert_eq!(canonical_completion("abc"), b"abc".to_vec());
        assert_eq!(session_hash("u1"), session_hash("u1"));
        assert_ne!(session_hash("u1"), session_hash("u2"));
    }
}
