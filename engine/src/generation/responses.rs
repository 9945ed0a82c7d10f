//! A request of `/v1/responses` on its way out: the same one-sequence [`Generation`] as chat,
//! answered as a `response` object or as the Responses API's typed SSE events.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame};
use serde_json::{Map, Value, json};

use super::{ExecPaths, Generation, Step, TaggedEvent};
use crate::openai::{ApiError, FinishReason, ResponseFrame, ResponseStatus, sse_event, text_part};

impl Generation {
    /// How the (single) sequence ended, as a response status.
    fn response_status(&self) -> ResponseStatus {
        match self.choices.first().and_then(|c| c.finish) {
            Some(FinishReason::Length) => ResponseStatus::Incomplete,
            _ => ResponseStatus::Completed,
        }
    }

    /// Waits for the whole answer (non-streaming) and writes it as a `response` object.
    pub async fn collect_response(
        mut self,
        frame: &ResponseFrame,
    ) -> Result<(String, ExecPaths, crate::flight::FlightRecord), ApiError> {
        let mut text = String::new();
        while !self.all_finished() {
            let ev = self.rx.recv().await;
            match self.on_event(ev) {
                // Only sequence 0 exists: Responses runs one choice.
                Step::Delta(0, d) | Step::Done(0, d) => text.push_str(&d.text),
                Step::Delta(..) | Step::Done(..) => {}
                Step::Failed(e) => return Err(e),
            }
        }
        let usage = self.usage(self.choices.iter());
        let body = frame.object(self.response_status(), &text, Some(&usage));
        Ok((body.to_string(), self.paths(), self.flight()))
    }

    /// Turns this generation into a Responses event stream, starting with an already received
    /// event (see [`Generation::first_event`]).
    pub fn into_responses_sse(
        self,
        frame: ResponseFrame,
        first: Option<TaggedEvent>,
    ) -> ResponsesSse {
        let mut body = ResponsesSse {
            generation: self,
            frame,
            text: String::new(),
            seq: 0,
            queue: VecDeque::new(),
            done: false,
        };
        body.open();
        if first.is_some() {
            body.handle(first);
        }
        body
    }
}

/// The SSE body of a streamed `/v1/responses` request.
pub struct ResponsesSse {
    generation: Generation,
    frame: ResponseFrame,
    /// The text so far (the `.done` events repeat it whole).
    text: String,
    /// The next event's `sequence_number`.
    seq: u64,
    queue: VecDeque<Bytes>,
    done: bool,
}

impl ResponsesSse {
    fn push(&mut self, kind: &str, fields: Map<String, Value>) {
        let e = sse_event(kind, self.seq, fields);
        self.seq += 1;
        self.queue.push_back(Bytes::from(e));
    }

    fn with_response(&self, status: ResponseStatus, usage: bool) -> Map<String, Value> {
        let usage = usage.then(|| self.generation.usage(self.generation.choices.iter()));
        let mut m = Map::new();
        m.insert(
            "response".into(),
            self.frame.object(status, &self.text, usage.as_ref()),
        );
        m
    }

    /// The events before any text: the response, its message item and its empty text part.
    fn open(&mut self) {
        let created = self.with_response(ResponseStatus::InProgress, false);
        self.push("response.created", created.clone());
        self.push("response.in_progress", created);
        let mut item = Map::new();
        item.insert("output_index".into(), json!(0));
        item.insert(
            "item".into(),
            self.frame.message(ResponseStatus::InProgress, None),
        );
        self.push("response.output_item.added", item);
        let mut part = self.frame.part_location();
        part.insert("part".into(), text_part(""));
        self.push("response.content_part.added", part);
    }

    fn delta(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.text.push_str(text);
        let mut fields = self.frame.part_location();
        fields.insert("delta".into(), json!(text));
        fields.insert("logprobs".into(), json!([]));
        self.push("response.output_text.delta", fields);
    }

    /// The closing events: text, part and item done, then the final response with usage.
    fn close(&mut self) {
        let status = self.generation.response_status();
        let mut fields = self.frame.part_location();
        fields.insert("text".into(), json!(self.text));
        fields.insert("logprobs".into(), json!([]));
        self.push("response.output_text.done", fields);
        let mut part = self.frame.part_location();
        part.insert("part".into(), text_part(&self.text));
        self.push("response.content_part.done", part);
        let mut item = Map::new();
        item.insert("output_index".into(), json!(0));
        item.insert("item".into(), self.frame.message(status, Some(&self.text)));
        self.push("response.output_item.done", item);
        // An SSE comment, as on chat streams: ignored by OpenAI clients, read by `infergate
        // bench`. Sent before the final event, which clients may stop reading at.
        let c = format!(
            ": x-infergate-exec-path {}\n\n",
            self.generation.paths().header_value()
        );
        self.queue.push_back(Bytes::from(c));
        let flight = self.generation.flight().sse_comment();
        self.queue.push_back(Bytes::from(flight));
        let kind = match status {
            ResponseStatus::Incomplete => "response.incomplete",
            _ => "response.completed",
        };
        let fin = self.with_response(status, true);
        self.push(kind, fin);
        self.done = true;
    }

    fn fail(&mut self, e: &ApiError) {
        // Mid-stream failures end with an `error` event, never a silent truncation.
        let mut fields = Map::new();
        fields.insert("code".into(), json!(e.kind));
        fields.insert("message".into(), json!(e.message));
        fields.insert("param".into(), json!(e.param));
        self.push("error", fields);
        self.done = true;
    }

    fn handle(&mut self, ev: Option<TaggedEvent>) {
        match self.generation.on_event(ev) {
            Step::Delta(_, d) => self.delta(&d.text),
            Step::Done(_, d) => {
                self.delta(&d.text);
                if self.generation.all_finished() {
                    self.close();
                }
            }
            Step::Failed(e) => self.fail(&e),
        }
    }
}

impl Body for ResponsesSse {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        super::stream::poll_queued(
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

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;
