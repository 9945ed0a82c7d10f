//! One request's output on its way to the client: engine events → detokenized, stop-checked text →
//! a whole JSON response or a live SSE stream (each chunk written as soon as its tokens exist).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame};
use tokio::sync::mpsc;

use crate::openai::{self, ApiError, FinishReason, ResponseMeta, Usage};
use crate::output_text::OutputText;
use crate::sequence::{self, EventSink, SendError, SeqEvent};
use crate::tokenizer::{EngineTokenizer, IncrementalDecoder};

/// Events buffered per request between the engine thread and the HTTP response.
pub const EVENT_BUFFER: usize = 64;

/// The engine-side end of a request's bounded event channel, plus the flag a matched stop
/// string raises so the engine ends the sequence (as finished, not aborted).
pub struct ChannelSink {
    tx: mpsc::Sender<SeqEvent>,
    stop: Arc<AtomicBool>,
}

impl ChannelSink {
    /// A sink over `tx`; `stop` is shared with the request's [`Generation`].
    pub fn new(tx: mpsc::Sender<SeqEvent>, stop: Arc<AtomicBool>) -> Self {
        Self { tx, stop }
    }
}

impl EventSink for ChannelSink {
    fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn try_send(&mut self, event: SeqEvent) -> Result<(), SendError> {
        self.tx.try_send(event).map_err(|e| match e {
            mpsc::error::TrySendError::Full(ev) => SendError::Full(ev),
            mpsc::error::TrySendError::Closed(_) => SendError::Closed,
        })
    }

    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Counts of engine steps by execution path, as sent in `x-infergate-exec-path`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecPaths {
    /// Decode steps replayed from a CUDA graph.
    pub graph: u32,
    /// Steps launched kernel by kernel.
    pub eager: u32,
}

impl ExecPaths {
    /// Header value form: `graph=N,eager=M`.
    pub fn header_value(&self) -> String {
        format!("graph={},eager={}", self.graph, self.eager)
    }
}

/// The state shared by the streaming and the non-streaming answer.
pub struct Generation {
    meta: ResponseMeta,
    rx: mpsc::Receiver<SeqEvent>,
    out: OutputText,
    tokenizer: EngineTokenizer,
    decoder: IncrementalDecoder,
    usage: Usage,
    include_usage: bool,
    first_sent: bool,
    stop: Arc<AtomicBool>,
    /// Set once the answer is complete.
    pub finish: Option<FinishReason>,
    /// Execution paths reported by the engine.
    pub paths: ExecPaths,
}

/// What one engine event meant for the client.
enum Step {
    /// Newly visible text (may be empty).
    Text(String),
    /// Generation ended (remaining text included).
    Done(String),
    /// The engine failed the request or went away.
    Failed(ApiError),
}

impl Generation {
    /// Output state for a request whose events arrive on `rx`.
    pub fn new(
        meta: ResponseMeta,
        rx: mpsc::Receiver<SeqEvent>,
        stop: Arc<AtomicBool>,
        params: &crate::request::SamplingParams,
        prompt_tokens: usize,
        include_usage: bool,
        tokenizer: EngineTokenizer,
    ) -> Self {
        Self {
            meta,
            rx,
            out: OutputText::new(params.stop.clone(), params.min_tokens),
            tokenizer,
            decoder: IncrementalDecoder::new(),
            usage: Usage {
                prompt_tokens,
                ..Usage::default()
            },
            include_usage,
            first_sent: false,
            stop,
            finish: None,
            paths: ExecPaths::default(),
        }
    }

    fn on_event(&mut self, ev: Option<SeqEvent>) -> Step {
        match ev {
            Some(SeqEvent::Tokens(tokens)) => {
                let mut text = String::new();
                for t in tokens {
                    if self.out.stopped() {
                        // Tokens the engine made before it saw the stop flag: not shown.
                        break;
                    }
                    let piece = self.decoder.push(&self.tokenizer, t);
                    text += &self.out.push(&piece);
                    if self.out.stopped() {
                        // The engine ends the sequence at its next step and reports its
                        // accounting; the answer completes on that report.
                        self.stop.store(true, Ordering::Release);
                    }
                }
                Step::Text(text)
            }
            Some(SeqEvent::Finished(info)) => {
                self.usage.completion_tokens = if self.out.stopped() {
                    self.out.tokens()
                } else {
                    info.completion_tokens
                };
                self.usage.cached_tokens = info.cached_tokens;
                self.paths = ExecPaths {
                    graph: info.graph_steps,
                    eager: info.eager_steps,
                };
                self.finish = Some(match info.reason {
                    _ if self.out.stopped() => FinishReason::Stop,
                    sequence::FinishReason::Stop => FinishReason::Stop,
                    sequence::FinishReason::Length => FinishReason::Length,
                });
                let mut text = String::new();
                if !self.out.stopped() {
                    // Text of tokens a decoding window still held (a character left
                    // incomplete is dropped there, never shown as U+FFFD).
                    let tail = self.decoder.finish(&self.tokenizer);
                    if !tail.is_empty() {
                        text += &self.out.push_text(&tail);
                    }
                }
                text += &self.out.finish();
                Step::Done(text)
            }
            Some(SeqEvent::Error(msg)) => Step::Failed(ApiError::bad_request(msg, None)),
            None => Step::Failed(ApiError::internal(
                "the engine stopped before the request finished",
            )),
        }
    }

    /// Waits for the whole answer (non-streaming).
    pub async fn collect(mut self) -> Result<(String, ExecPaths), ApiError> {
        let mut text = String::new();
        loop {
            let ev = self.rx.recv().await;
            match self.on_event(ev) {
                Step::Text(t) => text += &t,
                Step::Done(t) => {
                    text += &t;
                    let finish = self.finish.unwrap_or(FinishReason::Stop);
                    let body = openai::full_response(&self.meta, &text, finish, &self.usage);
                    return Ok((body, self.paths));
                }
                Step::Failed(e) => return Err(e),
            }
        }
    }

    /// Waits for the first event, so errors the engine reports up front become real HTTP errors.
    pub async fn first_event(&mut self) -> Result<Option<SeqEvent>, ApiError> {
        match self.rx.recv().await {
            Some(SeqEvent::Error(msg)) => Err(ApiError::bad_request(msg, None)),
            None => Err(ApiError::internal(
                "the engine stopped before the request started",
            )),
            ev => Ok(ev),
        }
    }

    /// Turns this generation into an SSE body, starting with an already received event.
    pub fn into_sse(self, first: Option<SeqEvent>) -> SseBody {
        let mut body = SseBody {
            generation: self,
            queue: VecDeque::new(),
            done: false,
        };
        if first.is_some() {
            body.handle(first);
        }
        body
    }
}

/// A streamed answer: SSE `data:` chunks as tokens arrive, then usage, then `[DONE]`.
pub struct SseBody {
    generation: Generation,
    queue: VecDeque<Bytes>,
    done: bool,
}

impl SseBody {
    /// Chat streams open with a role-only chunk, as vLLM's do; empty text sends nothing else.
    fn push_text(queue: &mut VecDeque<Bytes>, g: &mut Generation, text: &str) {
        if !g.first_sent {
            g.first_sent = true;
            if g.meta.endpoint == openai::Endpoint::ChatCompletions || text.is_empty() {
                queue.push_back(Bytes::from(openai::chunk(&g.meta, "", true, None)));
            } else {
                queue.push_back(Bytes::from(openai::chunk(&g.meta, text, true, None)));
                return;
            }
        }
        if !text.is_empty() {
            queue.push_back(Bytes::from(openai::chunk(&g.meta, text, false, None)));
        }
    }

    fn handle(&mut self, ev: Option<SeqEvent>) {
        let g = &mut self.generation;
        match g.on_event(ev) {
            Step::Text(t) => Self::push_text(&mut self.queue, g, &t),
            Step::Done(t) => {
                Self::push_text(&mut self.queue, g, &t);
                let finish = g.finish.unwrap_or(FinishReason::Stop);
                let c = openai::chunk(&g.meta, "", false, Some(finish));
                self.queue.push_back(Bytes::from(c));
                if g.include_usage {
                    let c = openai::usage_chunk(&g.meta, &g.usage);
                    self.queue.push_back(Bytes::from(c));
                }
                // An SSE comment: ignored by OpenAI clients, read by `infergate bench`.
                let c = format!(": x-infergate-exec-path {}\n\n", g.paths.header_value());
                self.queue.push_back(Bytes::from(c));
                self.queue
                    .push_back(Bytes::from_static(openai::DONE.as_bytes()));
                self.done = true;
            }
            Step::Failed(e) => {
                // Mid-stream failures end with an error event, never a silent truncation.
                self.queue.push_back(Bytes::from(e.sse_event()));
                self.queue
                    .push_back(Bytes::from_static(openai::DONE.as_bytes()));
                self.done = true;
            }
        }
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        loop {
            if let Some(b) = this.queue.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match this.generation.rx.poll_recv(cx) {
                Poll::Ready(ev) => this.handle(ev),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.queue.is_empty()
    }
}
