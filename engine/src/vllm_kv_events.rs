//! vLLM's KV-cache events, published the way vLLM publishes them (`--kv-events-zmq`), so a
//! router that reads vLLM workers' events can be run and tested against this engine.
//!
//! vLLM's `ZmqEventPublisher` binds a ZMQ PUB socket and sends each batch as the multipart
//! message `[topic, sequence (8-byte big-endian), payload]`, the payload a msgpack
//! `KVEventBatch` `[ts, events, data_parallel_rank]` whose events are tagged arrays:
//! `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`,
//! `["BlockRemoved", block_hashes, medium]` (the array form of vLLM v0.11–v0.2x). Block hashes
//! are this engine's own 64-bit prefix-cache hashes, as vLLM's with integer block hashes.
//! Stored events cover full blocks as they are registered in the prefix cache (prompt and
//! generated tokens alike), removed ones the blocks evicted to make room.

use std::sync::mpsc::{SyncSender, sync_channel};

use tokio::sync::mpsc;

/// Batches waiting for the socket; past this the core's newest batch is dropped, and its
/// sequence number skipped so a subscriber sees the gap.
const QUEUE: usize = 256;
/// Most tokens in one message, so a payload stays far below a subscriber's limit (vLLM's
/// batches are one engine step's; a subscriber such as infergate refuses past 4 MiB).
const MAX_TOKENS_PER_MESSAGE: usize = 65_536;

/// One cache event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VllmEvent {
    /// Consecutive full blocks cached, `tokens` holding exactly their tokens.
    Stored {
        /// Their hashes, in order.
        hashes: Vec<u64>,
        /// The block before the first one (`None`: a prompt's first block).
        parent: Option<u64>,
        /// Their tokens, `hashes.len() × block_size`.
        tokens: Vec<u32>,
    },
    /// Blocks evicted.
    Removed(Vec<u64>),
}

/// Events since the last take, runs of consecutive blocks merged (owned by the block manager).
#[derive(Debug, Default)]
pub struct VllmEventLog {
    events: Vec<VllmEvent>,
}

impl VllmEventLog {
    /// Block `hash`, child of `parent`, now cached with `tokens`.
    pub fn stored(&mut self, hash: u64, parent: Option<u64>, tokens: &[u32]) {
        if let Some(VllmEvent::Stored {
            hashes,
            tokens: all,
            ..
        }) = self.events.last_mut()
            && parent.is_some()
            && hashes.last().copied() == parent
            && all.len() + tokens.len() <= MAX_TOKENS_PER_MESSAGE
        {
            hashes.push(hash);
            all.extend_from_slice(tokens);
            return;
        }
        self.events.push(VllmEvent::Stored {
            hashes: vec![hash],
            parent,
            tokens: tokens.to_vec(),
        });
    }

    /// Block `hash` evicted.
    pub fn removed(&mut self, hash: u64) {
        if let Some(VllmEvent::Removed(hashes)) = self.events.last_mut() {
            hashes.push(hash);
            return;
        }
        self.events.push(VllmEvent::Removed(vec![hash]));
    }

    /// The events since the last take, in order.
    pub fn take(&mut self) -> Vec<VllmEvent> {
        std::mem::take(&mut self.events)
    }
}

/// A msgpack writer for the few shapes a batch needs.
struct Msgpack(Vec<u8>);

impl Msgpack {
    fn array(&mut self, len: usize) {
        match len {
            0..=15 => self.0.push(0x90 | len as u8),
            16..=0xffff => {
                self.0.push(0xdc);
                self.0.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                self.0.push(0xdd);
                self.0.extend_from_slice(&(len as u32).to_be_bytes());
            }
        }
    }

    fn uint(&mut self, n: u64) {
        match n {
            0..=0x7f => self.0.push(n as u8),
            0x80..=0xff => self.0.extend_from_slice(&[0xcc, n as u8]),
            0x100..=0xffff => {
                self.0.push(0xcd);
                self.0.extend_from_slice(&(n as u16).to_be_bytes());
            }
            0x1_0000..=0xffff_ffff => {
                self.0.push(0xce);
                self.0.extend_from_slice(&(n as u32).to_be_bytes());
            }
            _ => {
                self.0.push(0xcf);
                self.0.extend_from_slice(&n.to_be_bytes());
            }
        }
    }

    fn str(&mut self, s: &str) {
        // Only short tags and names are written here.
        self.0.push(0xa0 | (s.len().min(31) as u8));
        self.0.extend_from_slice(&s.as_bytes()[..s.len().min(31)]);
    }

    fn nil(&mut self) {
        self.0.push(0xc0);
    }

    fn f64(&mut self, x: f64) {
        self.0.push(0xcb);
        self.0.extend_from_slice(&x.to_be_bytes());
    }
}

/// The msgpack `KVEventBatch` of `events`: `[ts, events, 0]`.
pub fn encode_batch(ts: f64, events: &[VllmEvent], block_size: usize) -> Vec<u8> {
    let mut w = Msgpack(Vec::with_capacity(64 + events.len() * 32));
    w.array(3);
    w.f64(ts);
    w.array(events.len());
    for ev in events {
        match ev {
            VllmEvent::Stored {
                hashes,
                parent,
                tokens,
            } => {
                w.array(7);
                w.str("BlockStored");
                w.array(hashes.len());
                hashes.iter().for_each(|&h| w.uint(h));
                match parent {
                    Some(p) => w.uint(*p),
                    None => w.nil(),
                }
                w.array(tokens.len());
                tokens.iter().for_each(|&t| w.uint(u64::from(t)));
                w.uint(block_size as u64);
                w.nil();
                w.str("GPU");
            }
            VllmEvent::Removed(hashes) => {
                w.array(3);
                w.str("BlockRemoved");
                w.array(hashes.len());
                hashes.iter().for_each(|&h| w.uint(h));
                w.str("GPU");
            }
        }
    }
    w.uint(0);
    w.0
}

/// The core's side of the publisher: hands batches to the socket's thread without waiting.
pub struct VllmPublisher {
    tx: mpsc::Sender<(u64, Vec<VllmEvent>)>,
    next_seq: u64,
}

impl VllmPublisher {
    /// Binds a PUB socket at `endpoint` (`tcp://HOST:PORT`) on its own thread and returns once
    /// it is bound, with the address it is bound at; an endpoint that cannot be bound is an error.
    pub fn start(endpoint: &str, topic: &str, block_size: usize) -> Result<(Self, String), String> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let (bound_tx, bound_rx) = sync_channel(1);
        let (endpoint, topic) = (endpoint.to_string(), topic.to_string());
        std::thread::Builder::new()
            .name("kv-events-zmq".into())
            .spawn(move || serve(&endpoint, topic, block_size, rx, bound_tx))
            .map_err(|e| format!("cannot start the kv-events thread: {e}"))?;
        let bound = bound_rx
            .recv()
            .map_err(|_| "the kv-events thread ended before binding".to_string())??;
        Ok((Self { tx, next_seq: 0 }, bound))
    }

    /// Publishes `events` (nothing when empty); drops them when the socket is behind.
    pub fn publish(&mut self, events: Vec<VllmEvent>) {
        if events.is_empty() {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        match self.tx.try_send((seq, events)) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(seq, "kv-events publisher behind: a batch dropped");
            }
        }
    }
}

/// The socket's thread: binds, reports the bound address, then sends every batch.
fn serve(
    endpoint: &str,
    topic: String,
    block_size: usize,
    mut rx: mpsc::Receiver<(u64, Vec<VllmEvent>)>,
    bound: SyncSender<Result<String, String>>,
) {
    use zeromq::{Socket, SocketSend, ZmqMessage};
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = bound.send(Err(format!("kv-events runtime: {e}")));
            return;
        }
    };
    runtime.block_on(async move {
        let mut socket = zeromq::PubSocket::new();
        match socket.bind(endpoint).await {
            Ok(at) => {
                let _ = bound.send(Ok(at.to_string()));
            }
            Err(e) => {
                let _ = bound.send(Err(format!("cannot bind kv events at {endpoint}: {e}")));
                return;
            }
        }
        // Ends when the core (the sender) is gone.
        while let Some((seq, events)) = rx.recv().await {
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let payload = encode_batch(ts, &events, block_size);
            let frames: Vec<hyper::body::Bytes> = vec![
                topic.clone().into_bytes().into(),
                seq.to_be_bytes().to_vec().into(),
                payload.into(),
            ];
            if let Ok(message) = ZmqMessage::try_from(frames)
                && let Err(e) = socket.send(message).await
            {
                tracing::warn!(error = %e, "kv-events publish failed");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_blocks_merge_into_one_stored_event() {
        let mut log = VllmEventLog::default();
        log.stored(1, None, &[10, 11]);
        log.stored(2, Some(1), &[12, 13]);
        log.stored(9, Some(5), &[14, 15]);
        log.removed(1);
        log.removed(2);
        assert_eq!(
            log.take(),
            vec![
                VllmEvent::Stored {
                    hashes: vec![1, 2],
                    parent: None,
                    tokens: vec![10, 11, 12, 13]
                },
                VllmEvent::Stored {
                    hashes: vec![9],
                    parent: Some(5),
                    tokens: vec![14, 15]
                },
                VllmEvent::Removed(vec![1, 2]),
            ]
        );
        assert!(log.take().is_empty());
    }

    #[test]
    fn a_batch_encodes_as_vllm_tagged_arrays() {
        let events = vec![
            VllmEvent::Stored {
                hashes: vec![u64::MAX],
                parent: None,
                tokens: vec![300, 100_000],
            },
            VllmEvent::Removed(vec![7]),
        ];
        let bytes = encode_batch(1.5, &events, 2);
        let mut expect = vec![0x93, 0xcb];
        expect.extend_from_slice(&1.5f64.to_be_bytes());
        expect.push(0x92);
        expect.push(0x97);
        expect.push(0xab);
        expect.extend_from_slice(b"BlockStored");
        expect.extend_from_slice(&[0x91, 0xcf]);
        expect.extend_from_slice(&u64::MAX.to_be_bytes());
        expect.push(0xc0);
        expect.extend_from_slice(&[0x92, 0xcd, 0x01, 0x2c, 0xce, 0x00, 0x01, 0x86, 0xa0]);
        expect.extend_from_slice(&[0x02, 0xc0, 0xa3]);
        expect.extend_from_slice(b"GPU");
        expect.push(0x93);
        expect.push(0xac);
        expect.extend_from_slice(b"BlockRemoved");
        expect.extend_from_slice(&[0x91, 0x07, 0xa3]);
        expect.extend_from_slice(b"GPU");
        expect.push(0x00);
        assert_eq!(bytes, expect);
    }
}
