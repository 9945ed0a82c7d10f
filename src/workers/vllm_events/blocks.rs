//! One vLLM worker's cached blocks, named in the gateway's own prefix keys.
//!
//! vLLM's block hashes cannot be recomputed here (a random or `PYTHONHASHSEED` seed, Python's
//! `hash()` or sha256 of pickled or CBOR tuples, by version and flags), and the gateway never
//! tokenizes a prompt the model's way. So the keys are rebuilt from the events' contents: each
//! stored block's token ids become bytes through the model's vocabulary, and those bytes, continued
//! from the parent block's, are hashed exactly as the gateway hashes a request's canonical prompt
//! (`routing::features::prefix_hashes`: 256-byte blocks, chained by `chain_hash`). A gateway key is
//! *anchored* to the vLLM block in which its 256th byte lands, and is resident while that block is
//! (counted, since two blocks may complete the same key). A completion prompt decodes to its own
//! bytes (special tokens such as BOS decode to nothing, and a sentencepiece vocabulary's space
//! before the first word is dropped), so its keys agree exactly; a chat prompt passes through the
//! model's chat template, whose text the gateway's canonical chat form does not reproduce, so chat
//! keys rarely agree and those requests keep the approximate index (see the README).
//!
//! A block whose parent is unknown here (stored before the subscription, or past the cap) is
//! not mapped: its keys are unknowable, and routing's own guesses still cover them.

use std::collections::HashMap;

use crate::routing::features::chain_hash;

use super::vocab::Vocab;

/// What one vLLM block contributes, and where hashing stands after it.
#[derive(Debug, Clone)]
struct Block {
    /// Stored events for this hash not yet matched by removals.
    refs: u32,
    /// Chain value after the last whole key block ending in or before this block.
    chain: u64,
    /// Keys completed from the prompt's start through this block.
    keys_done: usize,
    /// Bytes after the last whole key block (fewer than `block_bytes`).
    partial: Box<[u8]>,
    /// Keys whose last byte lies in this block.
    anchored: Vec<u64>,
}

/// Net change of the gateway keys a worker holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Keys that became resident.
    pub stored: Vec<u64>,
    /// Keys no longer resident.
    pub removed: Vec<u64>,
}

/// Why a stored event could not be mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapError {
    /// A token id the vocabulary lacks (the pool's `tokenizer` is not the model's).
    UnknownToken(u32),
}

/// A worker's vLLM blocks with their gateway keys.
#[derive(Debug)]
pub struct BlockMap {
    blocks: HashMap<u64, Block>,
    /// Anchors per resident key.
    keys: HashMap<u64, u32>,
    max_blocks: usize,
    block_bytes: usize,
    max_keys: usize,
}

impl BlockMap {
    /// An empty map holding at most `max_blocks` blocks, hashing keys of `block_bytes` bytes,
    /// at most `max_keys` per prompt (the gateway hashes no more).
    pub fn new(max_blocks: usize, block_bytes: usize, max_keys: usize) -> Self {
        Self {
            blocks: HashMap::new(),
            keys: HashMap::new(),
            max_blocks,
            block_bytes: block_bytes.max(1),
            max_keys,
        }
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// True when no block is held.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Blocks `hashes` holding `token_ids` (`block_size` each) were stored after `parent`.
    pub fn stored(
        &mut self,
        parent: Option<u64>,
        hashes: &[u64],
        token_ids: &[u32],
        block_size: usize,
        vocab: &Vocab,
    ) -> Result<Change, MapError> {
        let mut change = Change::default();
        let (mut chain, mut keys_done, mut partial) = match parent {
            None => (0u64, 0usize, Vec::new()),
            Some(p) => match self.blocks.get(&p) {
                Some(b) => (b.chain, b.keys_done, b.partial.to_vec()),
                // Unknown parent: nothing after it can be named.
                None => return Ok(change),
            },
        };
        for (i, &hash) in hashes.iter().enumerate() {
            if let Some(b) = self.blocks.get_mut(&hash) {
                // The same content again: its keys are already counted once per hash.
                b.refs = b.refs.saturating_add(1);
                (chain, keys_done, partial) = (b.chain, b.keys_done, b.partial.to_vec());
                continue;
            }
            if self.blocks.len() >= self.max_blocks {
                // Past the cap the rest of the chain goes unmapped (as if unknown).
                break;
            }
            let tokens = token_ids
                .get(i * block_size..(i + 1) * block_size)
                .unwrap_or_default();
            let mut anchored = Vec::new();
            for &t in tokens {
                if keys_done >= self.max_keys {
                    break;
                }
                let mut bytes = vocab.bytes(t).ok_or(MapError::UnknownToken(t))?;
                if keys_done == 0 && partial.is_empty() && vocab.strips_first_space() {
                    bytes = bytes.strip_prefix(b" ").unwrap_or(bytes);
                }
                for &byte in bytes {
                    partial.push(byte);
                    if partial.len() == self.block_bytes {
                        chain = chain_hash(chain, &partial);
                        partial.clear();
                        keys_done += 1;
                        anchored.push(chain);
                        if keys_done >= self.max_keys {
                            break;
                        }
                    }
                }
            }
            for &k in &anchored {
                let n = self.keys.entry(k).or_insert(0);
                if *n == 0 {
                    change.stored.push(k);
                }
                *n += 1;
            }
            self.blocks.insert(
                hash,
                Block {
                    refs: 1,
                    chain,
                    keys_done,
                    partial: partial.clone().into_boxed_slice(),
                    anchored,
                },
            );
        }
        Ok(change)
    }

    /// Blocks `hashes` left the cache.
    pub fn removed(&mut self, hashes: &[u64]) -> Change {
        let mut change = Change::default();
        for h in hashes {
            let Some(b) = self.blocks.get_mut(h) else {
                continue;
            };
            b.refs -= 1;
            if b.refs > 0 {
                continue;
            }
            let Some(b) = self.blocks.remove(h) else {
                continue;
            };
            for k in b.anchored {
                if let Some(n) = self.keys.get_mut(&k) {
                    *n -= 1;
                    if *n == 0 {
                        self.keys.remove(&k);
                        change.removed.push(k);
                    }
                }
            }
        }
        change
    }

    /// Everything left the cache; the keys that were resident.
    pub fn clear(&mut self) -> Vec<u64> {
        self.blocks.clear();
        self.keys.drain().map(|(k, _)| k).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::features::prefix_hashes;

    /// A byte vocabulary: id b < 256 is byte b, 256 is a special token.
    fn bytes_vocab() -> Vocab {
        let mut vocab = String::from(r#"{"model":{"vocab":{"#);
        for b in 0..256u32 {
            if b > 0 {
                vocab.push(',');
            }
            vocab.push_str(&format!("\"<0x{b:02X}>\":{b}"));
        }
        vocab.push_str(r#"}},"added_tokens":[{"id":256,"content":"<s>","special":true}]}"#);
        Vocab::from_tokenizer_json(&vocab).unwrap()
    }

    fn ids(text: &[u8]) -> Vec<u32> {
        text.iter().map(|&b| u32::from(b)).collect()
    }

    #[test]
    fn keys_match_the_gateways_prefix_hashes_across_events_and_a_bos() {
        let vocab = bytes_vocab();
        let text: Vec<u8> = (0..700u32).map(|i| b'a' + (i % 26) as u8).collect();
        // BOS, then the text, in 16-token blocks; the trailing partial block is never stored.
        let mut tokens = vec![256];
        tokens.extend(ids(&text));
        let blocks = tokens.len() / 16;
        let tokens = &tokens[..blocks * 16];
        let hashes: Vec<u64> = (1..=blocks as u64).collect();
        let mut map = BlockMap::new(1000, 256, 256);
        // Two events, the second chained on the first's last block.
        let a = map
            .stored(None, &hashes[..10], &tokens[..160], 16, &vocab)
            .unwrap();
        let b = map
            .stored(Some(10), &hashes[10..], &tokens[160..], 16, &vocab)
            .unwrap();
        let all: Vec<u64> = a.stored.iter().chain(&b.stored).copied().collect();
        // 43 blocks × 16 = 688 tokens, 687 text bytes: two whole keys.
        assert_eq!(all, prefix_hashes(&text[..687], 256, 256));
        assert_eq!(all.len(), 2);
        // Removing the block that completed the second key removes it alone.
        let anchor = 1 + 512 / 16; // the block holding byte 512 (after the BOS)
        assert_eq!(map.removed(&[anchor as u64]).removed, vec![all[1]]);
        assert_eq!(map.clear(), vec![all[0]]);
        assert!(map.is_empty());
    }

    #[test]
    fn a_sentencepiece_prompts_first_space_is_dropped() {
        let v = Vocab::from_tokenizer_json(
            r#"{"model":{"vocab":{"<s>":0,"\u2581ab":1,"\u2581c":2}},
                "added_tokens":[{"id":0,"content":"<s>","special":true}]}"#,
        )
        .unwrap();
        // <s> ▁ab ▁c ▁c: "ab c c", a 6-byte key.
        let mut map = BlockMap::new(10, 6, 4);
        let c = map.stored(None, &[1], &[0, 1, 2, 2], 4, &v).unwrap();
        assert_eq!(c.stored, prefix_hashes(b"ab c c", 6, 4));
    }

    #[test]
    fn unknown_parents_duplicates_caps_and_bad_tokens() {
        let vocab = bytes_vocab();
        let text = vec![b'x'; 512];
        let tokens = ids(&text);
        let mut map = BlockMap::new(1000, 256, 256);
        let none = map
            .stored(Some(99), &[1], &tokens[..16], 16, &vocab)
            .unwrap();
        assert_eq!(none, Change::default(), "unknown parent");
        let hashes: Vec<u64> = (1..=32).collect();
        let first = map.stored(None, &hashes, &tokens, 16, &vocab).unwrap();
        assert_eq!(first.stored.len(), 2);
        // Stored again (a second copy): no new keys, and one removal keeps them.
        let again = map.stored(None, &hashes, &tokens, 16, &vocab).unwrap();
        assert!(again.stored.is_empty());
        assert!(map.removed(&hashes).removed.is_empty());
        assert_eq!(map.removed(&hashes).removed.len(), 2);
        assert!(map.removed(&hashes).removed.is_empty(), "already gone");
        // The cap stops mapping; keys are capped too.
        let mut small = BlockMap::new(3, 256, 1);
        let c = small.stored(None, &hashes, &tokens, 16, &vocab).unwrap();
        assert_eq!((small.len(), c.stored.len()), (3, 0));
        let mut one_key = BlockMap::new(100, 256, 1);
        let c = one_key.stored(None, &hashes, &tokens, 16, &vocab).unwrap();
        assert_eq!(c.stored, prefix_hashes(&text, 256, 1));
        assert_eq!(
            map.stored(None, &[77], &[300; 16], 16, &vocab),
            Err(MapError::UnknownToken(300))
        );
    }
}
