//! A streamed answer: SSE `data:` chunks per choice as tokens arrive (each naming its choice's
//! index and carrying its tokens' logprobs), a finishing chunk per choice, then usage, the
//! exec-path and flight-record comments and `[DONE]` once every choice ended.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame};

use super::{Delta, Generation, Step, TaggedEvent};
use crate::openai::{self, FinishReason};

/// The SSE body of a streamed request.
pub struct SseBody {
    generation: Generation,
    queue: VecDeque<Bytes>,
    done: bool,
}

impl Generation {
    /// Turns this generation into an SSE body, starting with an already received event.
    pub fn into_sse(self, first: Option<TaggedEvent>) -> SseBody {
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

impl SseBody {
    /// Queues what choice `s` has to show. Each chat choice opens with a role-only chunk, as
    /// vLLM's do; a completions choice's first chunk goes out even when empty.
    fn push_delta(&mut self, s: usize, delta: &Delta) {
        let g = &mut self.generation;
        let Some(choice) = g.choices.get_mut(s) else {
            return;
        };
        let logprobs =
            (g.plan.logprobs && !delta.logprobs.is_empty()).then_some(delta.logprobs.as_slice());
        let has_content = !delta.text.is_empty() || logprobs.is_some();
        if !choice.first_sent {
            choice.first_sent = true;
            if g.meta.endpoint == openai::Endpoint::ChatCompletions || !has_content {
                let c = openai::chunk(&g.meta, s, "", true, None, None);
                self.queue.push_back(Bytes::from(c));
            } else {
                let c = openai::chunk(&g.meta, s, &delta.text, true, None, logprobs);
                self.queue.push_back(Bytes::from(c));
                return;
            }
        }
        if has_content {
            let c = openai::chunk(&g.meta, s, &delta.text, false, None, logprobs);
            self.queue.push_back(Bytes::from(c));
        }
    }

    fn handle(&mut self, ev: Option<TaggedEvent>) {
        match self.generation.on_event(ev) {
            Step::Delta(s, d) => self.push_delta(s, &d),
            Step::Done(s, d) => {
                self.push_delta(s, &d);
                let g = &self.generation;
                let finish = g
                    .choices
                    .get(s)
                    .and_then(|c| c.finish)
                    .unwrap_or(FinishReason::Stop);
                let c = openai::chunk(&g.meta, s, "", false, Some(finish), None);
                self.queue.push_back(Bytes::from(c));
                if !g.all_finished() {
                    return;
                }
                if g.plan.include_usage {
                    let usage = g.usage(g.choices.iter());
                    let c = openai::usage_chunk(&g.meta, &usage);
                    self.queue.push_back(Bytes::from(c));
                }
                // An SSE comment: ignored by OpenAI clients, read by `infergate bench`.
                let c = format!(": x-infergate-exec-path {}\n\n", g.paths().header_value());
                self.queue.push_back(Bytes::from(c));
                // The flight record, last before `[DONE]` (see `crate::flight`).
                self.queue.push_back(Bytes::from(g.flight().sse_comment()));
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

/// The one polling loop of every streamed body (chat/completions chunks, Responses events): hand
/// out what is queued, end once `done`, else turn the next engine event into more with `handle`.
pub(super) fn poll_queued<S>(
    state: &mut S,
    cx: &mut Context<'_>,
    parts: impl Fn(&mut S) -> (&mut VecDeque<Bytes>, bool, &mut Generation),
    handle: impl Fn(&mut S, Option<TaggedEvent>),
) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
    loop {
        let (queue, done, generation) = parts(state);
        if let Some(b) = queue.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        if done {
            return Poll::Ready(None);
        }
        match generation.rx.poll_recv(cx) {
            Poll::Ready(ev) => handle(state, ev),
            Poll::Pending => return Poll::Pending,
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
        poll_queued(
            self.get_mut(),
            cx,
            |b| (&mut b.queue, b.done, &mut b.generation),
            Self::handle,
        )
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.queue.is_empty()
    }
}
