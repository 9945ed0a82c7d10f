//! KV block events for a router: which of a router's prefix keys this engine holds right now.
//!
//! A router names prompt prefixes by its own keys (infergate: chained hashes of 256-byte blocks
//! of the canonical prompt) and sends them with the request in [`PREFIX_KEYS_HEADER`]. The engine
//! anchors key *j* to the engine block that ends the prompt's first `(j+1)/n` share of tokens
//! (rounded down to whole blocks, so an anchor never reaches past the text its key covers), and a
//! key is resident while any of its anchor blocks is in the prefix cache. `GET /kv/events` streams
//! the changes as NDJSON: a snapshot of every resident key first, then `stored`/`removed` batches.
//! Residency is exact per engine block; only the key → block alignment is proportional.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

/// Request header carrying the router's prefix keys:
/// `<block bytes>:<canonical bytes>;<hex>,<hex>,...`.
pub const PREFIX_KEYS_HEADER: &str = "x-infergate-prefix-keys";

/// Most keys accepted from one request (a longer list is cut, not refused).
pub const MAX_KEYS: usize = 1024;

/// Batches buffered per subscriber; one that falls further behind is cut off and resubscribes.
const SUBSCRIBER_BUFFER: usize = 1024;

/// The router's keys for one request's prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixKeys {
    /// Bytes of canonical prompt one key covers.
    pub block_bytes: usize,
    /// Length of the canonical prompt the keys were computed over, bytes.
    pub canonical_bytes: usize,
    /// Chained keys of its full blocks, leading block first.
    pub keys: Vec<u64>,
}

impl PrefixKeys {
    /// Parses the header value; `None` for anything malformed (the request is served without).
    pub fn parse(value: &str) -> Option<Self> {
        let (sizes, list) = value.split_once(';')?;
        let (block, len) = sizes.split_once(':')?;
        let block_bytes: usize = block.trim().parse().ok()?;
        let canonical_bytes: usize = len.trim().parse().ok()?;
        let mut keys = Vec::new();
        for part in list.split(',').filter(|p| !p.is_empty()).take(MAX_KEYS) {
            keys.push(u64::from_str_radix(part.trim(), 16).ok()?);
        }
        (block_bytes > 0 && canonical_bytes > 0 && !keys.is_empty()).then_some(Self {
            block_bytes,
            canonical_bytes,
            keys,
        })
    }

    /// The header value for these keys.
    pub fn header_value(block_bytes: usize, canonical_bytes: usize, keys: &[u64]) -> String {
        let mut out = format!("{block_bytes}:{canonical_bytes};");
        for (i, k) in keys.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&format!("{k:016x}"));
        }
        out
    }

    /// `(engine block index, key)` anchors for a prompt of `prompt_tokens` tokens in blocks of
    /// `block_size`, ordered by block. Keys whose share ends before the first full block are
    /// left out (nothing of theirs can be cached).
    pub fn anchors(&self, prompt_tokens: usize, block_size: usize) -> Vec<(usize, u64)> {
        let full_blocks = prompt_tokens / block_size.max(1);
        let mut out = Vec::with_capacity(self.keys.len());
        for (j, &key) in self.keys.iter().enumerate() {
            // Share of the canonical prompt that keys 0..=j cover.
            let covered = ((j + 1) * self.block_bytes).min(self.canonical_bytes) as f64;
            let tokens = (covered / self.canonical_bytes as f64 * prompt_tokens as f64) as usize;
            let blocks = (tokens / block_size.max(1)).min(full_blocks);
            if blocks > 0 {
                out.push((blocks - 1, key));
            }
        }
        out
    }
}

/// Net change of resident keys since the last take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvEventBatch {
    /// Keys that became resident.
    pub stored: Vec<u64>,
    /// Keys no longer resident.
    pub removed: Vec<u64>,
}

impl KvEventBatch {
    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.stored.is_empty() && self.removed.is_empty()
    }
}

/// Which router keys are anchored on which cached engine blocks (pure; owned by the scheduler).
#[derive(Debug, Default)]
pub struct KvEventLog {
    /// Engine block hash → keys anchored on it.
    anchors: HashMap<u64, Vec<u64>>,
    /// Key → cached blocks anchoring it.
    holds: HashMap<u64, u32>,
    /// Keys whose residency may have changed since the last take.
    touched: Vec<u64>,
}

impl KvEventLog {
    /// Anchors `key` on the cached engine block `block_hash`.
    pub fn attach(&mut self, block_hash: u64, key: u64) {
        let list = self.anchors.entry(block_hash).or_default();
        if list.contains(&key) {
            return;
        }
        list.push(key);
        let n = self.holds.entry(key).or_insert(0);
        *n += 1;
        if *n == 1 {
            self.touched.push(key);
        }
    }

    /// The engine evicted `block_hash`: keys anchored only on it are no longer resident.
    pub fn evicted(&mut self, block_hash: u64) {
        let Some(keys) = self.anchors.remove(&block_hash) else {
            return;
        };
        for key in keys {
            if let Some(n) = self.holds.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.holds.remove(&key);
                    self.touched.push(key);
                }
            }
        }
    }

    /// Whether `key` is resident now.
    pub fn is_resident(&self, key: u64) -> bool {
        self.holds.contains_key(&key)
    }

    /// Keys resident now.
    pub fn resident(&self) -> impl Iterator<Item = u64> + '_ {
        self.holds.keys().copied()
    }

    /// The net change since the last take (a key stored and removed again is in neither list).
    pub fn take(&mut self) -> KvEventBatch {
        let mut batch = KvEventBatch::default();
        let mut seen = HashSet::with_capacity(self.touched.len());
        for key in self.touched.drain(..) {
            if !seen.insert(key) {
                continue;
            }
            if self.holds.contains_key(&key) {
                batch.stored.push(key);
            } else {
                batch.removed.push(key);
            }
        }
        batch
    }
}

/// Fans the core's batches out to `/kv/events` subscribers, each starting from a snapshot.
pub struct KvEventHub {
    /// Resident keys as of the last published batch.
    resident: Mutex<HashSet<u64>>,
    tx: broadcast::Sender<Arc<KvEventBatch>>,
}

impl Default for KvEventHub {
    fn default() -> Self {
        Self::new()
    }
}

impl KvEventHub {
    /// A hub with no subscribers and nothing resident.
    pub fn new() -> Self {
        Self {
            resident: Mutex::new(HashSet::new()),
            tx: broadcast::channel(SUBSCRIBER_BUFFER).0,
        }
    }

    /// Applies a batch to the snapshot and sends it to every subscriber (from the core thread).
    pub fn publish(&self, batch: KvEventBatch) {
        if batch.is_empty() {
            return;
        }
        let mut resident = self
            .resident
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for k in &batch.removed {
            resident.remove(k);
        }
        resident.extend(batch.stored.iter().copied());
        // Sent under the lock so a subscriber's snapshot and its first batch never overlap.
        let _ = self.tx.send(Arc::new(batch));
    }

    /// The resident keys now and a receiver of every later batch.
    pub fn subscribe(&self) -> (Vec<u64>, broadcast::Receiver<Arc<KvEventBatch>>) {
        let resident = self
            .resident
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        (resident.iter().copied().collect(), self.tx.subscribe())
    }
}

/// One NDJSON line of the stream: `{"type":"snapshot"|"stored"|"removed","keys":["hex",...]}`.
pub fn event_line(kind: &str, keys: &[u64]) -> String {
    let mut out = String::with_capacity(32 + keys.len() * 19);
    out.push_str("{\"type\":\"");
    out.push_str(kind);
    out.push_str("\",\"keys\":[");
    for (i, k) in keys.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!("\"{k:016x}\""));
    }
    out.push_str("]}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_junk() {
        let v = PrefixKeys::header_value(256, 600, &[1, 0xabc]);
        assert_eq!(v, "256:600;0000000000000001,0000000000000abc");
        let p = PrefixKeys::parse(&v).unwrap();
        assert_eq!(p.block_bytes, 256);
        assert_eq!(p.canonical_bytes, 600);
        assert_eq!(p.keys, vec![1, 0xabc]);
        assert_eq!(PrefixKeys::parse("256:x;01"), None);
        assert_eq!(PrefixKeys::parse("600;01"), None);
        assert_eq!(PrefixKeys::parse("256:10;zz"), None);
        assert_eq!(PrefixKeys::parse("256:10;"), None);
        assert_eq!(PrefixKeys::parse("256:0;01"), None);
    }

    #[test]
    fn anchors_never_reach_past_their_keys_text() {
        // 4 keys of 256 bytes over a 1100-byte prompt of 275 tokens (4 bytes per token), 16-token
        // blocks: key j covers 64(j+1) tokens, so it ends at block 4(j+1) − 1.
        let p = PrefixKeys {
            block_bytes: 256,
            canonical_bytes: 1100,
            keys: vec![10, 11, 12, 13],
        };
        assert_eq!(
            p.anchors(275, 16),
            vec![(3, 10), (7, 11), (11, 12), (15, 13)]
        );
        // A template's extra tokens stretch the shares, never past the prompt's full blocks.
        assert_eq!(p.anchors(40, 16), vec![(0, 11), (0, 12), (1, 13)]);
        // A prompt shorter than one block anchors nothing.
        assert!(p.anchors(10, 16).is_empty());
    }

    #[test]
    fn a_key_stays_resident_while_any_anchor_is_cached() {
        let mut log = KvEventLog::default();
        log.attach(100, 1);
        log.attach(200, 1);
        log.attach(200, 2);
        let b = log.take();
        assert_eq!(b.stored.len(), 2);
        assert!(b.removed.is_empty());
        log.evicted(100);
        assert!(log.take().is_empty(), "key 1 still anchored on 200");
        log.evicted(200);
        let mut removed = log.take().removed;
        removed.sort_unstable();
        assert_eq!(removed, vec![1, 2]);
        assert!(!log.is_resident(1));
    }

    #[test]
    fn a_batch_carries_the_net_change() {
        let mut log = KvEventLog::default();
        log.attach(100, 1);
        log.evicted(100);
        log.attach(300, 1);
        assert_eq!(
            log.take(),
            KvEventBatch {
                stored: vec![1],
                removed: vec![]
            }
        );
        log.evicted(300);
        log.attach(400, 5);
        log.evicted(400);
        assert_eq!(
            log.take(),
            KvEventBatch {
                stored: vec![],
                removed: vec![1, 5]
            }
        );
    }

    #[test]
    fn a_subscriber_sees_the_snapshot_then_every_batch() {
        let hub = KvEventHub::new();
        hub.publish(KvEventBatch {
            stored: vec![1, 2],
            removed: vec![],
        });
        let (snap, mut rx) = hub.subscribe();
        let mut snap = snap;
        snap.sort_unstable();
        assert_eq!(snap, vec![1, 2]);
        hub.publish(KvEventBatch {
            stored: vec![3],
            removed: vec![1],
        });
        let b = rx.try_recv().unwrap();
        assert_eq!(b.stored, vec![3]);
        assert_eq!(b.removed, vec![1]);
        assert_eq!(
            event_line("removed", &[0xff]),
            "{\"type\":\"removed\",\"keys\":[\"00000000000000ff\"]}\n"
        );
    }
}
