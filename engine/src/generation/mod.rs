//! One request's output on its way to the client: the engine events of its sequences (one per
//! prompt × `best_of`) → detokenized, stop-checked choices → a whole JSON response, or a live
//! SSE stream where each chunk is written as soon as its tokens exist and names its choice.

mod choice;
mod responses;
mod stream;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;

pub use responses::ResponsesSse;
pub use stream::SseBody;

use crate::flight::{EngineInfo, Features, FlightRecord};
use crate::openai::{self, ApiError, Choice, ResponseMeta, Usage};
use crate::request::SamplingParams;
use crate::sequence::{EventSink, SendError, SeqEvent};
use crate::tokenizer::EngineTokenizer;
use choice::{ChoiceState, Delta};

/// Events buffered per sequence between the engine thread and the HTTP response.
pub const EVENT_BUFFER: usize = 64;

/// An engine event of one of a request's sequences, tagged with the sequence's index.
pub type TaggedEvent = (usize, SeqEvent);

/// The engine-side end of one sequence of a request: its events go, tagged with its index, into
/// the request's bounded channel; `stop` is raised when its text matched a stop string, so the
/// engine ends the sequence (as finished, not aborted).
pub struct ChannelSink {
    tx: mpsc::Sender<TaggedEvent>,
    index: usize,
    stop: Arc<AtomicBool>,
}

impl ChannelSink {
    /// The sink of sequence `index` over `tx`; `stop` is shared with the request's [`Generation`].
    pub fn new(tx: mpsc::Sender<TaggedEvent>, index: usize, stop: Arc<AtomicBool>) -> Self {
        Self { tx, index, stop }
    }
}

impl EventSink for ChannelSink {
    fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn try_send(&mut self, event: SeqEvent) -> Result<(), SendError> {
        self.tx.try_send((self.index, event)).map_err(|e| match e {
            mpsc::error::TrySendError::Full((_, ev)) => SendError::Full(ev),
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

/// One prompt of a request, as its choices show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptPlan {
    /// Its length in tokens (billed once, however many choices).
    pub tokens: usize,
    /// Its first token (named in the echoed logprobs).
    pub first_token: u32,
    /// With `echo`, the text each of its choices starts with.
    pub echo: Option<String>,
}

/// How a request's sequences become choices: sequence `s` belongs to prompt `s / best_of`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPlan {
    /// The prompts, in request order.
    pub prompts: Vec<PromptPlan>,
    /// Choices returned per prompt.
    pub n: usize,
    /// Sequences generated per prompt; with more than `n`, the `n` of highest cumulative
    /// logprob are returned (and streaming is refused earlier).
    pub best_of: usize,
    /// The client asked for logprobs.
    pub logprobs: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
}

impl RequestPlan {
    /// Sequences the request runs.
    pub fn num_sequences(&self) -> usize {
        self.prompts.len() * self.best_of
    }
}

/// The state shared by the streaming and the non-streaming answer.
pub struct Generation {
    meta: ResponseMeta,
    rx: mpsc::Receiver<TaggedEvent>,
    tokenizer: EngineTokenizer,
    plan: RequestPlan,
    choices: Vec<ChoiceState>,
    finished: usize,
    /// The engine's part of the flight record and the request's features.
    flight: (Arc<EngineInfo>, Features),
}

/// What one engine event meant for the client.
enum Step {
    /// Sequence `.0` has more to show.
    Delta(usize, Delta),
    /// Sequence `.0` ended; the delta is what it still held.
    Done(usize, Delta),
    /// The engine failed the request or went away.
    Failed(ApiError),
}

impl Generation {
    /// Output state for a request planned by `plan`, whose sequences' events arrive on `rx`;
    /// `stops[s]` is sequence `s`'s stop flag.
    pub fn new(
        meta: ResponseMeta,
        rx: mpsc::Receiver<TaggedEvent>,
        plan: RequestPlan,
        params: &SamplingParams,
        stops: Vec<Arc<AtomicBool>>,
        tokenizer: EngineTokenizer,
    ) -> Self {
        let best_of = plan.best_of.max(1);
        let choices = stops
            .into_iter()
            .enumerate()
            .map(|(s, stop)| {
                let prompt = plan.prompts.get(s / best_of);
                ChoiceState::new(
                    params,
                    stop,
                    prompt.and_then(|p| p.echo.clone()),
                    prompt.map_or(0, |p| p.first_token),
                    plan.logprobs,
                )
            })
            .collect();
        Self {
            meta,
            rx,
            tokenizer,
            plan,
            choices,
            finished: 0,
            flight: Default::default(),
        }
    }

    /// The flight record names `engine` and the request's `features` (those the plan does not
    /// know: stream, tools, response format, images).
    pub fn with_flight(mut self, engine: Arc<EngineInfo>, features: Features) -> Self {
        self.flight = (engine, features);
        self
    }

    /// The request's flight record, from what its sequences reported when they ended.
    pub fn flight(&self) -> FlightRecord {
        let p = &self.plan;
        let features = self
            .flight
            .1
            .with_plan(p.prompts.len(), p.n, p.best_of, p.logprobs);
        let usage = self.usage(std::iter::empty::<&ChoiceState>());
        FlightRecord::build(
            &self.flight.0,
            features,
            usage.prompt_tokens as u64,
            usage.cached_tokens as u64,
            self.choices.iter().filter_map(|c| c.info.as_ref()),
        )
    }

    /// True once every sequence ended.
    fn all_finished(&self) -> bool {
        self.finished >= self.choices.len()
    }

    fn on_event(&mut self, ev: Option<TaggedEvent>) -> Step {
        let Some((s, ev)) = ev else {
            return Step::Failed(ApiError::internal(
                "the engine stopped before the request finished",
            ));
        };
        let Some(choice) = self.choices.get_mut(s).filter(|c| c.finish.is_none()) else {
            // Nothing is sent after a sequence's final event; ignore what cannot be placed.
            return Step::Delta(s, Delta::default());
        };
        match ev {
            SeqEvent::Tokens(chunk) => Step::Delta(s, choice.on_tokens(&self.tokenizer, chunk)),
            SeqEvent::Finished(info) => {
                self.finished += 1;
                Step::Done(s, choice.on_finished(&self.tokenizer, *info))
            }
            SeqEvent::Error(msg) => Step::Failed(ApiError::bad_request(msg, None)),
        }
    }

    /// Token counts of the choices `returned`: each prompt counts once, with the cached tokens
    /// of its first sequence (the one that computed it), and every returned choice's tokens.
    fn usage<'a>(&self, returned: impl Iterator<Item = &'a ChoiceState>) -> Usage {
        let best_of = self.plan.best_of.max(1);
        Usage {
            prompt_tokens: self.plan.prompts.iter().map(|p| p.tokens).sum(),
            completion_tokens: returned.map(|c| c.completion_tokens).sum(),
            cached_tokens: (0..self.plan.prompts.len())
                .filter_map(|i| self.choices.get(i * best_of)?.info)
                .map(|info| info.cached_tokens)
                .sum(),
        }
    }

    /// Steps of every sequence of the request, by path.
    fn paths(&self) -> ExecPaths {
        let mut paths = ExecPaths::default();
        for info in self.choices.iter().filter_map(|c| c.info) {
            paths.graph += info.graph_steps;
            paths.eager += info.eager_steps;
        }
        paths
    }

    /// Waits for the whole answer (non-streaming).
    pub async fn collect(mut self) -> Result<(String, ExecPaths, FlightRecord), ApiError> {
        let total = self.choices.len();
        let mut texts = vec![String::new(); total];
        let mut logprobs: Vec<Vec<openai::LogprobEntry>> = vec![Vec::new(); total];
        while !self.all_finished() {
            let ev = self.rx.recv().await;
            match self.on_event(ev) {
                Step::Delta(s, d) | Step::Done(s, d) => {
                    if let (Some(t), Some(l)) = (texts.get_mut(s), logprobs.get_mut(s)) {
                        t.push_str(&d.text);
                        l.extend(d.logprobs);
                    }
                }
                Step::Failed(e) => return Err(e),
            }
        }
        let (n, best_of) = (self.plan.n, self.plan.best_of.max(1));
        let mut out = Vec::with_capacity(self.plan.prompts.len() * n);
        let mut returned = Vec::with_capacity(out.capacity());
        for i in 0..self.plan.prompts.len() {
            let mut seqs: Vec<usize> = (i * best_of..(i + 1) * best_of).collect();
            if best_of > n {
                // vLLM's `best_of`: the highest cumulative logprob first (a stable sort, so
                // ties keep the order they were generated in).
                let cum = |s: usize| self.choices[s].cumulative_logprob;
                seqs.sort_by(|&a, &b| cum(b).total_cmp(&cum(a)));
                seqs.truncate(n);
            }
            for (rank, s) in seqs.into_iter().enumerate() {
                let c = &self.choices[s];
                returned.push(c);
                out.push(Choice {
                    index: i * n + rank,
                    text: &texts[s],
                    finish: c.finish.unwrap_or(openai::FinishReason::Stop),
                    logprobs: self.plan.logprobs.then_some(logprobs[s].as_slice()),
                });
            }
        }
        let usage = self.usage(returned.into_iter());
        let body = openai::full_response(&self.meta, &out, &usage);
        Ok((body, self.paths(), self.flight()))
    }

    /// Waits for the first event, so errors the engine reports up front become real HTTP errors.
    pub async fn first_event(&mut self) -> Result<Option<TaggedEvent>, ApiError> {
        match self.rx.recv().await {
            Some((_, SeqEvent::Error(msg))) => Err(ApiError::bad_request(msg, None)),
            None => Err(ApiError::internal(
                "the engine stopped before the request started",
            )),
            ev => Ok(ev),
        }
    }
}

#[cfg(test)]
mod tests;
