//! One request's state inside the engine: its tokens, KV block table, progress and timings.

use crate::batch_hist::BatchHist;
use crate::block_manager::{BlockId, extend_block_hashes};
use crate::kv_events::PrefixKeys;
use crate::logprobs::TokenLogprob;
use crate::request::SamplingParams;
use crate::roofline::ExecPath;

/// Why a sequence stopped generating.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-sequence token sampled (or a stop string matched downstream).
    #[default]
    Stop,
    /// `max_tokens` reached.
    Length,
}

/// Final accounting of one sequence, sent to its client after the last tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FinishInfo {
    /// Why generation ended.
    pub reason: FinishReason,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: usize,
    /// Decode steps this sequence took on the CUDA-graph path.
    pub graph_steps: u32,
    /// Steps this sequence took on the eager path (prefill and large batches).
    pub eager_steps: u32,
    /// Of its eager steps, those in which it only decoded while the step went past the captured
    /// budget for the others in it: another's prefill chunk took it past the largest capture
    /// size in tokens, or the batch outgrew it in sequences (with no capture sizes, every eager
    /// step it only decoded in).
    pub eager_shared_steps: u32,
    /// Eager steps it was in (prefilling or decoding) that went past the captured budget, by
    /// its own prefill chunk or the others': the steps that took it off the fast path (with no
    /// capture sizes, every eager step).
    pub off_path_steps: u32,
    /// Times this sequence was preempted and recomputed.
    pub preemptions: u32,
    /// Smallest batch (sequences) of the steps it was in; 0 before any.
    pub batch_min: u32,
    /// Largest batch of the steps it was in.
    pub batch_max: u32,
    /// Sum of the batch sizes of the steps it was in (their mean: over its steps).
    pub batch_sum: u64,
    /// The batch sizes of the steps it was in, decode-only apart from prefill.
    pub batch_hist: BatchHist,
    /// Seconds from arrival to first scheduled.
    pub queue_s: f64,
    /// Seconds from first scheduled to first token.
    pub prefill_s: f64,
    /// Seconds from first to last token.
    pub decode_s: f64,
}

impl FinishInfo {
    /// Adds `other`, a sibling sequence of the same request (its `n` or `best_of` choices), as
    /// the request's flight record counts them: steps, tokens and preemptions summed, the batch
    /// span widened, times the slowest sequence's; prompt, cached tokens and reason stay this
    /// one's. A request's totals, for a client that sees one answer for all its sequences.
    pub fn absorb(&mut self, other: &FinishInfo) {
        let steps = |i: &FinishInfo| i.graph_steps > 0 || i.eager_steps > 0;
        if steps(other) {
            self.batch_min = if steps(self) {
                self.batch_min.min(other.batch_min)
            } else {
                other.batch_min
            };
        }
        self.batch_max = self.batch_max.max(other.batch_max);
        self.graph_steps = self.graph_steps.saturating_add(other.graph_steps);
        self.eager_steps = self.eager_steps.saturating_add(other.eager_steps);
        self.eager_shared_steps = self
            .eager_shared_steps
            .saturating_add(other.eager_shared_steps);
        self.off_path_steps = self.off_path_steps.saturating_add(other.off_path_steps);
        self.preemptions = self.preemptions.saturating_add(other.preemptions);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.batch_sum = self.batch_sum.saturating_add(other.batch_sum);
        self.batch_hist.merge(&other.batch_hist);
        self.queue_s = self.queue_s.max(other.queue_s);
        self.prefill_s = self.prefill_s.max(other.prefill_s);
        self.decode_s = self.decode_s.max(other.decode_s);
    }
}

/// Tokens generated since the last event, with the log-probabilities the request asked for.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TokenChunk {
    /// Newly generated token ids, in order.
    pub ids: Vec<u32>,
    /// One entry per id when the request asked for logprobs, else empty.
    pub logprobs: Vec<TokenLogprob>,
    /// Every prompt token's entry (the first is `None`), once, in the first event after the
    /// prompt was computed, when the request asked for prompt logprobs.
    pub prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
}

impl TokenChunk {
    /// Number of generated tokens in the chunk.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// True when the chunk holds no generated token (it may still carry prompt logprobs).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// What the engine delivers to a request's client.
#[derive(Debug, Clone, PartialEq)]
pub enum SeqEvent {
    /// Newly generated tokens, in order.
    Tokens(TokenChunk),
    /// The sequence ended; no event follows (boxed: its batch histogram makes it large).
    Finished(Box<FinishInfo>),
    /// The engine could not run the request; no event follows.
    Error(String),
}

/// Outcome of a non-blocking send to a client.
#[derive(Debug)]
pub enum SendError {
    /// The client's buffer is full; the event comes back to be retried next step.
    Full(SeqEvent),
    /// The client is gone; the sequence should be aborted.
    Closed,
}

/// Where a sequence's events go: a bounded channel to an HTTP response, or a recorder in the simulator.
pub trait EventSink: Send {
    /// Delivers an event without blocking.
    fn try_send(&mut self, event: SeqEvent) -> Result<(), SendError>;
    /// True once the receiver is gone (client disconnected).
    fn is_closed(&self) -> bool;
    /// True when the client matched a stop string: end the sequence as finished.
    fn stop_requested(&self) -> bool {
        false
    }
}

/// A request handed to the engine core.
pub struct NewRequest {
    /// Engine-unique id.
    pub id: u64,
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Sampling and stopping parameters.
    pub params: SamplingParams,
    /// Destination of generated tokens.
    pub sink: Box<dyn EventSink>,
    /// The router's keys for this prompt, when it sent them (KV events).
    pub prefix_keys: Option<PrefixKeys>,
}

/// Engine-side state of one request.
pub struct Sequence {
    /// Engine-unique id.
    pub id: u64,
    /// Prompt followed by generated tokens.
    pub tokens: Vec<u32>,
    /// Number of prompt tokens at the front of `tokens`.
    pub prompt_len: usize,
    /// Tokens whose KV entries are in the cache.
    pub num_computed: usize,
    /// KV blocks holding this sequence's tokens, in order.
    pub block_table: Vec<BlockId>,
    /// Chained content hashes of the full blocks of `tokens`.
    pub block_hashes: Vec<u64>,
    /// Leading blocks of `block_table` already registered in the prefix cache.
    pub num_registered_blocks: usize,
    /// Sampling and stopping parameters.
    pub params: SamplingParams,
    /// Sampler state (sim backend); seeded from the request.
    pub rng_state: u64,
    /// Clock time the request arrived.
    pub arrival: f64,
    /// Clock time it was first scheduled.
    pub first_scheduled: Option<f64>,
    /// Clock time of its latest generated token.
    pub last_token_at: Option<f64>,
    /// Prompt tokens found in the prefix cache at first admission.
    pub cached_tokens: Option<usize>,
    /// Decode steps taken on the graph path.
    pub graph_steps: u32,
    /// Steps taken on the eager path.
    pub eager_steps: u32,
    /// Eager steps in which it only decoded (see [`FinishInfo::eager_shared_steps`]).
    pub eager_shared_steps: u32,
    /// Steps past the captured budget it was in (see [`FinishInfo::off_path_steps`]).
    pub off_path_steps: u32,
    /// Times preempted.
    pub preemptions: u32,
    /// Smallest batch of its steps (0 before any).
    pub batch_min: u32,
    /// Largest batch of its steps.
    pub batch_max: u32,
    /// Sum of the batch sizes of its steps.
    pub batch_sum: u64,
    /// Its steps by batch size.
    pub batch_hist: BatchHist,
    /// Most tokens computed before a preemption: positions below it computed again are
    /// recomputed work.
    pub recompute_until: usize,
    /// Set when generation ended.
    pub finish: Option<FinishReason>,
    /// Events not yet accepted by the sink.
    pub pending_tokens: Vec<u32>,
    /// Log-probabilities of `pending_tokens`, when the request asked for them.
    pub pending_logprobs: Vec<TokenLogprob>,
    /// Prompt tokens' log-probabilities by position, filled as the prompt is computed (entry 0,
    /// which has no context, is `None`); empty unless the request asked for them.
    pub prompt_logprobs: Vec<Option<TokenLogprob>>,
    /// Whether `prompt_logprobs` went out to the client.
    pub prompt_logprobs_sent: bool,
    /// Id of a sequence with the same prompt whose full prompt blocks this one waits for, so
    /// that it reads them from the prefix cache instead of computing them again (`n` > 1).
    pub share_prefix_of: Option<u64>,
    /// Destination of events.
    pub sink: Box<dyn EventSink>,
    /// `(block index, router key)` anchors, ordered by block (KV events).
    pub key_anchors: Vec<(usize, u64)>,
    /// Leading anchors already attached to the cache.
    pub anchors_attached: usize,
}

impl Sequence {
    /// A waiting sequence for `req`, arrived at `now`.
    pub fn new(req: NewRequest, block_size: usize, now: f64) -> Self {
        let mut block_hashes = Vec::new();
        extend_block_hashes(&mut block_hashes, &req.prompt, block_size);
        let seed = req
            .params
            .seed
            .unwrap_or(req.id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let key_anchors = req
            .prefix_keys
            .as_ref()
            .map(|k| k.anchors(req.prompt.len(), block_size))
            .unwrap_or_default();
        // Position 0 has no context, so no entry; the rest fill in as the prompt is computed.
        let prompt_logprobs = if req.params.prompt_logprobs.is_some() {
            vec![None]
        } else {
            Vec::new()
        };
        Self {
            id: req.id,
            prompt_len: req.prompt.len(),
            tokens: req.prompt,
            num_computed: 0,
            block_table: Vec::new(),
            block_hashes,
            num_registered_blocks: 0,
            params: req.params,
            rng_state: seed,
            arrival: now,
            first_scheduled: None,
            last_token_at: None,
            cached_tokens: None,
            graph_steps: 0,
            eager_steps: 0,
            eager_shared_steps: 0,
            off_path_steps: 0,
            preemptions: 0,
            batch_min: 0,
            batch_max: 0,
            batch_sum: 0,
            batch_hist: BatchHist::default(),
            recompute_until: 0,
            finish: None,
            pending_tokens: Vec::new(),
            pending_logprobs: Vec::new(),
            prompt_logprobs,
            prompt_logprobs_sent: false,
            share_prefix_of: None,
            sink: req.sink,
            key_anchors,
            anchors_attached: 0,
        }
    }

    /// Generated tokens so far.
    pub fn num_output(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Tokens still to compute before the next token can be sampled.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// Appends a sampled token and extends the block hashes.
    pub fn push_token(&mut self, token: u32, block_size: usize) {
        self.tokens.push(token);
        extend_block_hashes(&mut self.block_hashes, &self.tokens, block_size);
        self.pending_tokens.push(token);
    }

    /// Records the log-probability of the token just pushed.
    pub fn push_logprob(&mut self, logprob: TokenLogprob) {
        self.pending_logprobs.push(logprob);
    }

    /// True while the request wants prompt logprobs that are not all computed yet; such a
    /// sequence computes its whole prompt rather than reading it from the prefix cache.
    pub fn needs_prompt_logprobs(&self) -> bool {
        self.params.prompt_logprobs.is_some() && self.prompt_logprobs.len() < self.prompt_len
    }

    /// Counts one step on `path` for this sequence.
    pub fn record_path(&mut self, path: ExecPath) {
        match path {
            ExecPath::Graph => self.graph_steps += 1,
            ExecPath::Eager => self.eager_steps += 1,
        }
    }

    /// Counts a step (already committed) in which this sequence computed `own_tokens`, that
    /// left the fast path (`off_path`): one in which it only decoded (its one last token, with
    /// output already under way) left it because of the others in it.
    pub fn record_shared(&mut self, off_path: bool, own_tokens: usize) {
        let decoded = own_tokens == 1 && self.remaining() == 0 && self.num_output() > 0;
        if off_path {
            self.off_path_steps = self.off_path_steps.saturating_add(1);
        }
        if off_path && decoded {
            self.eager_shared_steps = self.eager_shared_steps.saturating_add(1);
        }
    }

    /// Counts a step of `batch` sequences this sequence was in (its flight record), a
    /// decode-only step or one with prefill tokens.
    pub fn record_batch(&mut self, batch: usize, decode_only: bool) {
        let b = u32::try_from(batch).unwrap_or(u32::MAX);
        self.batch_hist.add(b, decode_only);
        self.batch_min = if self.batch_sum == 0 {
            b
        } else {
            self.batch_min.min(b)
        };
        self.batch_max = self.batch_max.max(b);
        self.batch_sum = self.batch_sum.saturating_add(u64::from(b));
    }

    /// The final accounting for the client.
    pub fn finish_info(&self, reason: FinishReason) -> FinishInfo {
        FinishInfo {
            reason,
            prompt_tokens: self.prompt_len,
            completion_tokens: self.num_output(),
            cached_tokens: self.cached_tokens.unwrap_or(0),
            graph_steps: self.graph_steps,
            eager_steps: self.eager_steps,
            eager_shared_steps: self.eager_shared_steps,
            off_path_steps: self.off_path_steps,
            preemptions: self.preemptions,
            batch_min: self.batch_min,
            batch_max: self.batch_max,
            batch_sum: self.batch_sum,
            batch_hist: self.batch_hist,
            // Filled in by the core, which knows the clock.
            ..FinishInfo::default()
        }
    }

    /// Tries to hand pending tokens (and, once complete, the prompt logprobs) to the sink.
    /// Returns false when the client is gone.
    pub fn flush(&mut self) -> bool {
        let prompt_ready = self.prompt_logprobs_ready();
        if self.pending_tokens.is_empty() && !prompt_ready {
            return !self.sink.is_closed();
        }
        let chunk = TokenChunk {
            ids: std::mem::take(&mut self.pending_tokens),
            logprobs: std::mem::take(&mut self.pending_logprobs),
            // Cloned, not taken: a full buffer hands the event back and it goes again.
            prompt_logprobs: prompt_ready.then(|| self.prompt_logprobs.clone()),
        };
        match self.sink.try_send(SeqEvent::Tokens(chunk)) {
            Ok(()) => {
                self.prompt_logprobs_sent |= prompt_ready;
                true
            }
            Err(SendError::Full(SeqEvent::Tokens(c))) => {
                self.pending_tokens = c.ids;
                self.pending_logprobs = c.logprobs;
                true
            }
            Err(SendError::Full(_)) => true,
            Err(SendError::Closed) => false,
        }
    }

    /// True while something is still to be handed to the client before the final event.
    pub fn has_pending(&self) -> bool {
        !self.pending_tokens.is_empty() || self.prompt_logprobs_ready()
    }

    /// Prompt logprobs are all computed but not yet sent.
    fn prompt_logprobs_ready(&self) -> bool {
        self.params.prompt_logprobs.is_some()
            && !self.prompt_logprobs_sent
            && !self.needs_prompt_logprobs()
    }
}
