//! Response bodies and SSE events in the shapes vLLM's OpenAI server sends.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Serialize, Serializer};

use super::Endpoint;
use super::logprobs::{ChatLogprobs, CompletionLogprobs, LogprobEntry};

/// Token counts of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

impl Serialize for Usage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Details {
            cached_tokens: usize,
        }
        #[derive(Serialize)]
        struct Wire {
            prompt_tokens: usize,
            total_tokens: usize,
            completion_tokens: usize,
            prompt_tokens_details: Details,
        }
        Wire {
            prompt_tokens: self.prompt_tokens,
            total_tokens: self.prompt_tokens + self.completion_tokens,
            completion_tokens: self.completion_tokens,
            prompt_tokens_details: Details {
                cached_tokens: self.cached_tokens,
            },
        }
        .serialize(s)
    }
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// EOS or a stop string.
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
}

/// What every response and chunk of one request repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseMeta {
    /// `cmpl-…` or `chatcmpl-…` followed by 32 hex digits.
    pub id: String,
    /// Unix seconds when the request was accepted.
    pub created: u64,
    /// The model name echoed back.
    pub model: String,
    /// Which endpoint's shapes to use.
    pub endpoint: Endpoint,
}

impl ResponseMeta {
    /// A fresh id and the current time for a request to `endpoint`.
    pub fn new(endpoint: Endpoint, model: impl Into<String>) -> Self {
        let prefix = match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::ChatCompletions => "chatcmpl",
        };
        Self {
            id: format!("{prefix}-{}", unique_hex()),
            created: unix_secs(),
            model: model.into(),
            endpoint,
        }
    }
}

pub(super) fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// SplitMix64's finalizer: a bijection on `u64` that scatters nearby inputs.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 32 hex digits: the high half mixes time and pid, the low half is a bijection of a
/// process-wide counter, so ids never repeat within a process.
pub(super) fn unique_hex() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static SEED: OnceLock<u64> = OnceLock::new();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let seed = *SEED.get_or_init(|| mix(nanos ^ u64::from(std::process::id()).rotate_left(40)));
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:016x}{:016x}", mix(nanos ^ seed), mix(n ^ seed))
}

fn to_json<T: Serialize>(value: &T) -> String {
    // These types hold only strings, integers and string-keyed structs: serializing cannot fail.
    serde_json::to_string(value).unwrap_or_default()
}

#[derive(Serialize)]
struct Envelope<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: C,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<&'a Usage>,
}

impl<'a, C> Envelope<'a, C> {
    fn new(meta: &'a ResponseMeta, object: &'static str, choices: C) -> Self {
        Self {
            id: &meta.id,
            object,
            created: meta.created,
            model: &meta.model,
            choices,
            usage: None,
        }
    }
}

#[derive(Serialize)]
struct TextChoice<'a> {
    index: usize,
    text: &'a str,
    logprobs: Option<CompletionLogprobs<'a>>,
    finish_reason: Option<FinishReason>,
    stop_reason: (),
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_logprobs: Option<()>,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
    tool_calls: [(); 0],
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: usize,
    message: Message<'a>,
    logprobs: Option<ChatLogprobs<'a>>,
    finish_reason: FinishReason,
    stop_reason: (),
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    content: &'a str,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: usize,
    delta: Delta<'a>,
    logprobs: Option<ChatLogprobs<'a>>,
    finish_reason: Option<FinishReason>,
    /// vLLM sets `stop_reason` only on the finishing chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<()>,
}

/// One choice of a whole (non-streamed) answer.
#[derive(Debug, Clone, Copy)]
pub struct Choice<'a> {
    /// Position in `choices`: prompt × `n` + rank.
    pub index: usize,
    /// The whole text (with `echo`, the prompt first).
    pub text: &'a str,
    /// Why it ended.
    pub finish: FinishReason,
    /// Its tokens' log-probabilities, when asked for.
    pub logprobs: Option<&'a [LogprobEntry]>,
}

/// The non-streaming body: `text_completion` or `chat.completion`, with `usage`.
pub fn full_response(meta: &ResponseMeta, choices: &[Choice<'_>], usage: &Usage) -> String {
    match meta.endpoint {
        Endpoint::Completions => {
            let choices: Vec<TextChoice<'_>> = choices
                .iter()
                .map(|c| TextChoice {
                    index: c.index,
                    text: c.text,
                    logprobs: c.logprobs.map(CompletionLogprobs),
                    finish_reason: Some(c.finish),
                    stop_reason: (),
                    prompt_logprobs: Some(()),
                })
                .collect();
            let mut body = Envelope::new(meta, "text_completion", choices);
            body.usage = Some(usage);
            to_json(&body)
        }
        Endpoint::ChatCompletions => {
            let choices: Vec<ChatChoice<'_>> = choices
                .iter()
                .map(|c| ChatChoice {
                    index: c.index,
                    message: Message {
                        role: "assistant",
                        content: c.text,
                        tool_calls: [],
                    },
                    logprobs: c.logprobs.map(ChatLogprobs),
                    finish_reason: c.finish,
                    stop_reason: (),
                })
                .collect();
            let mut body = Envelope::new(meta, "chat.completion", choices);
            body.usage = Some(usage);
            to_json(&body)
        }
    }
}

/// One streamed SSE event, `data: {...}\n\n`, for choice `index`; chat puts `role` in each
/// choice's `first` chunk's delta. `logprobs` are those of the tokens of `delta`.
pub fn chunk(
    meta: &ResponseMeta,
    index: usize,
    delta: &str,
    first: bool,
    finish: Option<FinishReason>,
    logprobs: Option<&[LogprobEntry]>,
) -> String {
    let json = match meta.endpoint {
        Endpoint::Completions => {
            let choice = TextChoice {
                index,
                text: delta,
                logprobs: logprobs.map(CompletionLogprobs),
                finish_reason: finish,
                stop_reason: (),
                prompt_logprobs: None,
            };
            to_json(&Envelope::new(meta, "text_completion", [choice]))
        }
        Endpoint::ChatCompletions => {
            let choice = ChunkChoice {
                index,
                delta: Delta {
                    role: first.then_some("assistant"),
                    content: delta,
                },
                logprobs: logprobs.map(ChatLogprobs),
                finish_reason: finish,
                stop_reason: finish.map(|_| ()),
            };
            to_json(&Envelope::new(meta, "chat.completion.chunk", [choice]))
        }
    };
    super::sse::data_event(json)
}

/// The final `stream_options.include_usage` event: empty `choices` and the `usage`.
pub fn usage_chunk(meta: &ResponseMeta, usage: &Usage) -> String {
    let object = match meta.endpoint {
        Endpoint::Completions => "text_completion",
        Endpoint::ChatCompletions => "chat.completion.chunk",
    };
    let mut body = Envelope::new(meta, object, [(); 0]);
    body.usage = Some(usage);
    super::sse::data_event(to_json(&body))
}

/// The `GET /v1/models` body.
pub fn models_list(names: &[String], max_model_len: usize, created: u64) -> String {
    #[derive(Serialize)]
    struct Card<'a> {
        id: &'a str,
        object: &'static str,
        created: u64,
        owned_by: &'static str,
        root: &'a str,
        parent: (),
        max_model_len: usize,
    }
    #[derive(Serialize)]
    struct List<'a> {
        object: &'static str,
        data: Vec<Card<'a>>,
    }
    let data = names
        .iter()
        .map(|name| Card {
            id: name,
            object: "model",
            created,
            owned_by: "infergate",
            root: name,
            parent: (),
            max_model_len,
        })
        .collect();
    to_json(&List {
        object: "list",
        data,
    })
}

#[cfg(test)]
#[path = "response_tests.rs"]
mod tests;
