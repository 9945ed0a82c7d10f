//! Precise mode for vLLM workers: subscribes to vLLM's KV-event publisher over ZMQ
//! (`--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'`) and feeds
//! the pool's routing index the same way our engine's `GET /kv/events` does
//! ([`super::kv_events`]).
//!
//! Each message is multipart `[topic, sequence (8-byte big-endian), payload]`, the payload a
//! msgpack `KVEventBatch` ([`wire`]). Everything from the publisher is untrusted: a message past
//! [`MAX_MESSAGE_BYTES`], with the wrong frames or topic, not msgpack, not a batch, or naming a
//! token the vocabulary lacks is refused and counted
//! (`infergate_routing_vllm_kv_rejected_total{pool,reason}`), and drops the worker to the
//! approximate index until the next good batch. A gap in the sequence is counted
//! (`..._missed_total`); a sequence that goes back means the publisher restarted, with an empty
//! cache, so what the worker was thought to hold is forgotten. vLLM sends nothing while idle,
//! so silence is not loss: the connection is (a ZMQ disconnect, a failed connect, or the worker
//! ejected by its health checks all drop to the approximate index, and the subscription is
//! reopened with the same backoff as the engine's stream).
//!
//! Blocks map to the gateway's prefix keys by their token contents ([`blocks`], [`vocab`]). The
//! socket reads the publisher through a loopback relay that bounds ZMTP frame lengths before
//! the `zeromq` crate sees them ([`guard`]): a message past the bound cuts the connection
//! (counted as `oversize`), which is then reopened.

pub mod blocks;
pub mod guard;
pub mod msgpack;
pub mod vocab;
pub mod wire;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;
use zeromq::{Socket, SocketEvent, SocketOptions, SocketRecv, SubSocket};

use self::blocks::{BlockMap, MapError};
use self::vocab::Vocab;
use self::wire::Event;
use crate::metrics::GatewayMetrics;
use crate::routing::Residency;
use crate::routing::features::DEFAULT_BLOCK_BYTES;
use crate::workers::kv_events::{Ended, Reopen, StreamSettings};
use crate::workers::pool::PolicyHolder;
use crate::workers::state::{KvEventsState, WorkerState};

/// Largest message accepted, all frames together, bytes.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// Most msgpack values in one payload (a 64k-token event is about 66k).
const MAX_VALUES: usize = 1 << 19;
/// vLLM blocks mapped per worker (a million tokens in 16-token blocks); past it new chains go
/// unmapped and routing's guesses cover them.
pub const MAX_BLOCKS_PER_WORKER: usize = 65_536;
/// Keys hashed per prompt: as many as the gateway hashes for a request.
const MAX_KEYS: usize = crate::routing::features::DEFAULT_MAX_BLOCKS;

/// Why a message was refused; its `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// Not three frames, or a sequence frame that is not 8 bytes.
    Frames,
    /// Another topic than the configured one.
    Topic,
    /// Past [`MAX_MESSAGE_BYTES`].
    Oversize,
    /// Not msgpack within the bounds.
    Malformed,
    /// msgpack, but not a `KVEventBatch` within the bounds.
    Schema,
    /// A token id the pool's tokenizer lacks.
    Vocab,
}

impl Reject {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Reject::Frames => "frames",
            Reject::Topic => "topic",
            Reject::Oversize => "oversize",
            Reject::Malformed => "malformed",
            Reject::Schema => "schema",
            Reject::Vocab => "vocab",
        }
    }
}

/// A refused message, with its sequence number when its frames were readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// Its sequence number, so a refused batch is not also counted as missed.
    pub seq: Option<u64>,
    /// Why.
    pub reason: Reject,
}

/// Checks one multipart message: its sequence number and events.
pub fn read_message(frames: &[&[u8]], topic: &str) -> Result<(u64, Vec<Event>), Refused> {
    let refuse = |seq, reason| Refused { seq, reason };
    let [t, seq, payload] = frames else {
        let oversize = frames.iter().map(|f| f.len()).sum::<usize>() > MAX_MESSAGE_BYTES;
        return Err(refuse(
            None,
            if oversize {
                Reject::Oversize
            } else {
                Reject::Frames
            },
        ));
    };
    let seq: [u8; 8] = (*seq)
        .try_into()
        .map_err(|_| refuse(None, Reject::Frames))?;
    let seq = u64::from_be_bytes(seq);
    if t.len() + 8 + payload.len() > MAX_MESSAGE_BYTES {
        return Err(refuse(Some(seq), Reject::Oversize));
    }
    if *t != topic.as_bytes() {
        return Err(refuse(None, Reject::Topic));
    }
    let value =
        msgpack::decode(payload, MAX_VALUES).map_err(|_| refuse(Some(seq), Reject::Malformed))?;
    let events = wire::batch(&value).map_err(|_| refuse(Some(seq), Reject::Schema))?;
    Ok((seq, events))
}

/// What one batch changed, ready for the index.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The worker's cache was emptied first (cleared, or the publisher restarted).
    pub reset: bool,
    /// Keys resident after the batch that were not before.
    pub stored: Vec<u64>,
    /// Keys no longer resident.
    pub removed: Vec<u64>,
    /// Batches skipped over in the sequence.
    pub missed: u64,
}

/// One worker's side of the stream: its mapped blocks and the last sequence number.
#[derive(Debug)]
pub struct Subscriber {
    map: BlockMap,
    last_seq: Option<u64>,
}

impl Default for Subscriber {
    fn default() -> Self {
        Self {
            map: BlockMap::new(MAX_BLOCKS_PER_WORKER, DEFAULT_BLOCK_BYTES, MAX_KEYS),
            last_seq: None,
        }
    }
}

impl Subscriber {
    /// Takes sequence number `seq`: the batches skipped over, and whether the publisher
    /// restarted (its numbers start again at 0, with an empty cache; the map is cleared).
    pub fn advance(&mut self, seq: u64) -> (u64, bool) {
        let last = self.last_seq.replace(seq);
        match last {
            Some(last) if seq <= last => {
                self.map.clear();
                (0, true)
            }
            Some(last) => (seq - last - 1, false),
            None => (0, false),
        }
    }

    /// Applies batch `seq`; keys stored and removed within it are netted out.
    pub fn apply(&mut self, seq: u64, events: &[Event], vocab: &Vocab) -> Result<Applied, Reject> {
        let mut out = Applied::default();
        (out.missed, out.reset) = self.advance(seq);
        // Final state per key, in the order first touched.
        let mut state: HashMap<u64, bool> = HashMap::new();
        let mut order = Vec::new();
        let mark = |state: &mut HashMap<u64, bool>, order: &mut Vec<u64>, keys, resident| {
            for k in keys {
                if state.insert(k, resident).is_none() {
                    order.push(k);
                }
            }
        };
        for ev in events {
            match ev {
                Event::Stored {
                    hashes,
                    parent,
                    token_ids,
                    block_size,
                } => {
                    let change = self
                        .map
                        .stored(*parent, hashes, token_ids, *block_size, vocab)
                        .map_err(|MapError::UnknownToken(_)| Reject::Vocab)?;
                    mark(&mut state, &mut order, change.stored, true);
                }
                Event::Removed(hashes) => {
                    let gone = self.map.removed(hashes).removed;
                    mark(&mut state, &mut order, gone, false);
                }
                Event::Cleared => {
                    self.map.clear();
                    out.reset = true;
                    // Everything before is gone: only what follows counts.
                    for v in state.values_mut() {
                        *v = false;
                    }
                }
                Event::Skipped => {}
            }
        }
        for k in order {
            match state.get(&k) {
                Some(true) => out.stored.push(k),
                Some(false) if !out.reset => out.removed.push(k),
                _ => {}
            }
        }
        Ok(out)
    }
}

/// Where one worker publishes, and how to read it.
#[derive(Debug, Clone)]
pub struct Source {
    /// `tcp://host:port`.
    pub endpoint: String,
    /// The publisher's topic.
    pub topic: String,
    /// The model's vocabulary.
    pub vocab: Arc<Vocab>,
    /// Pool name (metric label).
    pub pool: String,
}

/// Runs subscriptions to `worker`'s publisher, reopening lost ones with backoff, like
/// [`super::kv_events::subscribe`]. Returns when the policy was replaced, or a lost
/// subscription's worker was ejected or left the pool.
pub async fn subscribe(
    worker: Arc<WorkerState>,
    current_policy: impl Fn() -> Option<Arc<PolicyHolder>>,
    source: Source,
    settings: StreamSettings,
    metrics: Arc<GatewayMetrics>,
) -> Ended {
    let mut reopen = Reopen::default();
    let mut sub = Subscriber::default();
    loop {
        let opened = Instant::now();
        let ended = run(
            &worker,
            &current_policy,
            &source,
            settings,
            &metrics,
            &mut sub,
        )
        .await;
        let Ended::Lost(why) = &ended else {
            worker.set_kv_events(KvEventsState::Idle);
            return ended;
        };
        let lost = (opened, why.as_str(), source.endpoint.as_str());
        if !reopen
            .after_loss(&worker, &current_policy, settings, lost)
            .await
        {
            return ended;
        }
    }
}

async fn run(
    worker: &WorkerState,
    current_policy: &impl Fn() -> Option<Arc<PolicyHolder>>,
    source: &Source,
    settings: StreamSettings,
    metrics: &GatewayMetrics,
    sub: &mut Subscriber,
) -> Ended {
    // The socket reads the publisher through the frame-length guard.
    let relay = match guard::relay(&source.endpoint, (MAX_MESSAGE_BYTES + 64) as u64).await {
        Ok(r) => r,
        Err(e) => return Ended::Lost(format!("relay: {e}")),
    };
    let mut options = SocketOptions::default();
    options.connect_timeout(settings.open_timeout);
    let mut socket = SubSocket::with_options(options);
    let mut monitor = socket.monitor();
    let open = settings.open_timeout;
    match tokio::time::timeout(open, socket.connect(&relay.endpoint)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Ended::Lost(format!("connect: {e}")),
        Err(_) => return Ended::Lost(format!("no connection within {open:?}")),
    }
    if let Err(e) = socket.subscribe(&source.topic).await {
        return Ended::Lost(format!("subscribe: {e}"));
    }
    let Some(policy) = current_policy() else {
        return Ended::PolicyReplaced;
    };
    let key = worker.key;
    let go_live = |policy: &PolicyHolder| {
        policy.policy.residency(key, Residency::Snapshot(&[]));
        worker.set_kv_events(KvEventsState::Live);
    };
    go_live(&policy);
    tracing::info!(worker = %worker.url, endpoint = %source.endpoint, "vLLM KV events live: routing on the worker's real residency");
    let pool = [source.pool.as_str()];
    loop {
        let msg = tokio::select! {
            msg = socket.recv() => msg,
            ev = monitor.next() => match ev {
                Some(SocketEvent::Disconnected(_)) | None => {
                    if relay.cut.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                        metrics
                            .vllm_kv_rejected
                            .with_label_values(&[&source.pool, Reject::Oversize.label()])
                            .inc();
                        return Ended::Lost("a frame past the size bound".into());
                    }
                    return Ended::Lost("publisher disconnected".into());
                }
                Some(_) => continue,
            },
            // vLLM is silent while idle: wake now and then to notice a reload or an ejection.
            _ = tokio::time::sleep(settings.silence_timeout) => {
                if !current_policy().is_some_and(|p| Arc::ptr_eq(&p, &policy)) {
                    return Ended::PolicyReplaced;
                }
                if !worker.is_healthy() {
                    return Ended::Lost("worker ejected".into());
                }
                continue;
            }
        };
        let msg = match msg {
            Ok(m) => m,
            Err(e) => return Ended::Lost(format!("receive: {e}")),
        };
        if !current_policy().is_some_and(|p| Arc::ptr_eq(&p, &policy)) {
            return Ended::PolicyReplaced;
        }
        let frames: Vec<&[u8]> = msg.iter().map(|b| b.as_ref()).collect();
        let applied = read_message(&frames, &source.topic).and_then(|(seq, events)| {
            sub.apply(seq, &events, &source.vocab)
                .map_err(|reason| Refused { seq: None, reason })
        });
        let applied = match applied {
            Ok(a) => a,
            Err(Refused { seq, reason }) => {
                if let Some(seq) = seq {
                    let (missed, reset) = sub.advance(seq);
                    metrics
                        .vllm_kv_missed
                        .with_label_values(&pool)
                        .inc_by(missed);
                    if reset {
                        policy.policy.forget(key);
                    }
                }
                metrics
                    .vllm_kv_rejected
                    .with_label_values(&[&source.pool, reason.label()])
                    .inc();
                if worker.kv_events() == KvEventsState::Live {
                    tracing::warn!(worker = %worker.url, reason = reason.label(), "vLLM KV event refused; approximate index until the next good batch");
                    policy.policy.residency(key, Residency::Lost);
                    worker.set_kv_events(KvEventsState::Connecting);
                }
                continue;
            }
        };
        if applied.missed > 0 {
            metrics
                .vllm_kv_missed
                .with_label_values(&pool)
                .inc_by(applied.missed);
        }
        if applied.reset {
            policy.policy.forget(key);
        }
        if applied.reset || worker.kv_events() != KvEventsState::Live {
            go_live(&policy);
        }
        if !applied.stored.is_empty() {
            policy
                .policy
                .residency(key, Residency::Stored(&applied.stored));
        }
        if !applied.removed.is_empty() {
            policy
                .policy
                .residency(key, Residency::Removed(&applied.removed));
        }
        // Counted once applied, so a reader of the counter sees the index updated.
        metrics.vllm_kv_batches.with_label_values(&pool).inc();
    }
}

#[cfg(test)]
mod tests;
