//! The validate phase: turns a raw body into a `ValidRequest` that carries what later phases need
//! (target pool, stream flag, routing features). Only a `ValidRequest` can be routed. Cheap checks
//! only; engines validate sampling parameters themselves and their 400s pass through.

use std::borrow::Cow;

use hyper::HeaderMap;
use hyper::body::Bytes;
use hyper::header::HeaderName;
use infergate_engine::openai::ApiError;
use infergate_engine::openai::fields::{FieldValue, number_field, wrong_type};
use infergate_engine::openai::params::{check_temperature, check_top_p};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::config::{Snapshot, TierSpec};
use crate::error::GatewayError;
use crate::pipeline::forward::upstream_body::UpstreamBody;
use crate::routing::RequestFeatures;
use crate::routing::features::{
    DEFAULT_BLOCK_BYTES, Turn, canonical_chat, canonical_completion, prefix_hashes, session_hash,
};
use crate::tokens::Estimator;

use super::messages::{TEXT_PARTS, TextMessages, utf8};

/// Most prefix blocks hashed per request (64 KiB of prompt at the default block size).
const MAX_PREFIX_BLOCKS: usize = 256;

/// The header that names a client's session (sticky canary versions, session routing).
const SESSION_ID: HeaderName = HeaderName::from_static("x-session-id");

/// Which OpenAI endpoint a request targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    ChatCompletions,
    /// `/v1/embeddings`: input tokens only, never streamed.
    Embeddings,
    /// `/v1/responses`, OpenAI's Responses API.
    Responses,
}

impl Endpoint {
    /// The path to call on the worker.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Responses => "/v1/responses",
        }
    }

    /// The body fields that bound the completion, in the order they are checked.
    pub fn limit_keys(self) -> &'static [&'static str] {
        match self {
            Endpoint::Completions | Endpoint::ChatCompletions => {
                &["max_completion_tokens", "max_tokens"]
            }
            Endpoint::Responses => &["max_output_tokens"],
            Endpoint::Embeddings => &[],
        }
    }

    /// Whether the answer is generated text (and so reserves completion tokens).
    pub fn generates(self) -> bool {
        self != Endpoint::Embeddings
    }
}

/// A request that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    /// Target endpoint.
    pub endpoint: Endpoint,
    /// Model as the client named it.
    pub model: String,
    /// Index of the target pool in the snapshot.
    pub pool: usize,
    /// The client asked for SSE.
    pub stream: bool,
    /// The body to send upstream: the client's bytes and the edits the phases make to them.
    pub body: UpstreamBody,
    /// Routing inputs.
    pub features: RequestFeatures,
    /// Completion tokens to reserve: the request's `max_tokens`, or the tier's default (which
    /// is then also sent upstream).
    pub max_tokens: u64,
    /// Choices asked for (`n`, default 1): the worker may produce `max_tokens` for each.
    pub n: u32,
    /// Image, audio and file parts of the prompt, which the gateway's text count leaves out.
    pub media_parts: u32,
    /// What to count prompt tokens of.
    pub prompt: PromptSize,
    /// Tokenizer for the estimate.
    pub estimator: Estimator,
    /// The model's context length, when configured.
    pub max_context: Option<usize>,
    /// The `x-session-id` header.
    pub session_id: Option<String>,
    /// The body's `user`.
    pub user: Option<String>,
    /// The client asked for the usage chunk (`stream_options.include_usage`); when it did not,
    /// the gateway asks upstream anyway and hides the chunk.
    pub client_wants_usage: bool,
}

/// The prompt, as far as metering needs it.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptSize {
    /// Text to tokenize (chat messages joined, or the completion prompt).
    Text(String),
    /// A prompt given as token ids: its length is exact.
    Tokens(u64),
}

/// The request's top-level fields the gateway reads, as borrowed slices of the body: every
/// other field is skipped unread (and forwarded as sent), and nothing is copied until a phase
/// needs it. A field sent as `null` is present (`Some("null")`), as in the JSON, except
/// `messages`, read as `M`: typed in the first pass ([`TextMessages`]), raw in the general one.
#[derive(Deserialize)]
#[serde(bound(deserialize = "M: Deserialize<'de>"))]
struct Fields<'a, M> {
    #[serde(default, borrow, deserialize_with = "present")]
    model: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    stream: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    temperature: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    top_p: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    max_tokens: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    max_output_tokens: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    stream_options: Option<&'a RawValue>,
    #[serde(default)]
    messages: Option<M>,
    #[serde(default, borrow, deserialize_with = "present")]
    prompt: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    input: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    instructions: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    user: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    n: Option<&'a RawValue>,
}

/// One chat message's fields the gateway reads.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    role: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    content: Option<&'a RawValue>,
}

/// How a request's `messages` was read.
trait ChatMessages {
    /// The conversation's canonical bytes and the text to meter; a 400 unless a non-empty array.
    fn prompt(messages: Option<&Self>) -> Result<(Vec<u8>, PromptSize), GatewayError>;
    /// Parts of the contents that are not text.
    fn media(messages: Option<&Self>) -> u32;
}

/// Read in the first pass, with the other fields.
impl<const PLAIN: bool> ChatMessages for TextMessages<'_, PLAIN> {
    fn prompt(messages: Option<&Self>) -> Result<(Vec<u8>, PromptSize), GatewayError> {
        match messages {
            Some(m) if !m.0.is_empty() => Ok(chat_prompt(&m.0)),
            _ => Err(no_messages()),
        }
    }

    fn media(messages: Option<&Self>) -> u32 {
        messages.map_or(0, |m| m.media_parts())
    }
}

/// Kept raw, for the general reading.
impl ChatMessages for &RawValue {
    fn prompt(messages: Option<&Self>) -> Result<(Vec<u8>, PromptSize), GatewayError> {
        chat_messages(messages.copied())
    }

    fn media(messages: Option<&Self>) -> u32 {
        media_parts(messages.copied())
    }
}

/// A field that is there, `null` included (serde would read a `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

impl<'a, M> Fields<'a, M> {
    /// The field named `key` among those that bound the completion.
    fn limit(&self, key: &str) -> Option<&'a RawValue> {
        match key {
            "max_tokens" => self.max_tokens,
            "max_completion_tokens" => self.max_completion_tokens,
            "max_output_tokens" => self.max_output_tokens,
            _ => None,
        }
    }
}

/// A JSON string's text, borrowed from the body unless it has escapes (one parse either way).
fn text(raw: &RawValue) -> Option<Cow<'_, str>> {
    raw.as_text()
}

/// A field as a tree, for the rarer shapes (arrays of parts, token ids, Responses input).
fn tree(raw: Option<&RawValue>) -> Option<Value> {
    raw.and_then(|r| serde_json::from_str(r.get()).ok())
}

/// A numeric field, read by the engine's own rule (the same 400 either side).
fn number(raw: Option<&RawValue>, key: &str) -> Result<Option<f64>, GatewayError> {
    number_field(raw, key).map_err(field_error)
}

/// A field's 400 from the shared reader, as the gateway's error.
fn field_error(e: ApiError) -> GatewayError {
    GatewayError::bad_request(e.message, e.param.as_deref())
}

/// Validates `body` for `endpoint` against the snapshot's models and the caller's tier.
pub fn validate(
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Bytes,
    snapshot: &Snapshot,
    tier: &TierSpec,
) -> Result<ValidRequest, GatewayError> {
    // JSON is UTF-8: checked once for the whole body, skipped fields included (they go upstream
    // as sent), so that strings serde reads need no check of their own.
    let text = utf8(&body)
        .map_err(|e| GatewayError::bad_request(format!("invalid JSON body: {e}"), None))?;
    // serde would read a struct from an array too: only an object takes the fast path.
    let object = text.trim_start().starts_with('{');
    if object {
        // The usual body in one pass, its messages included; any unusual shape in them is read
        // again below with the messages kept raw.
        if !has_control_bytes(&body) {
            if let Ok(fields) = serde_json::from_str::<Fields<TextMessages<true>>>(text) {
                return validate_fields(endpoint, headers, &fields, body.clone(), snapshot, tier);
            }
        } else if let Ok(fields) = serde_json::from_str::<Fields<TextMessages>>(text) {
            return validate_fields(endpoint, headers, &fields, body.clone(), snapshot, tier);
        }
    }
    let fields = if object {
        serde_json::from_str::<Fields<&RawValue>>(text).ok()
    } else {
        None
    };
    match fields {
        Some(fields) => validate_fields(endpoint, headers, &fields, body.clone(), snapshot, tier),
        None => {
            // Not an object, not JSON, or a key given twice: the tree says which. A repeated key
            // keeps its last value (as the tree reads it), and the deduplicated body is what
            // goes upstream, so the worker cannot read the request differently.
            let json: Value = serde_json::from_slice(&body)
                .map_err(|e| GatewayError::bad_request(format!("invalid JSON body: {e}"), None))?;
            if !json.is_object() {
                return Err(GatewayError::bad_request(
                    "the body must be a JSON object",
                    None,
                ));
            }
            let deduped = Bytes::from(
                serde_json::to_vec(&json).map_err(|e| GatewayError::Internal(e.to_string()))?,
            );
            let fields = serde_json::from_slice::<Fields<&RawValue>>(&deduped)
                .map_err(|e| GatewayError::bad_request(format!("invalid JSON body: {e}"), None))?;
            validate_fields(endpoint, headers, &fields, deduped.clone(), snapshot, tier)
        }
    }
}

/// Whether `body` holds a control character (below 0x20), line breaks and tabs included. In
/// blocks with no early exit, so that the compiler compares many bytes at once.
fn has_control_bytes(body: &[u8]) -> bool {
    body.chunks(64)
        .any(|block| block.iter().fold(false, |seen, &b| seen | (b < 0x20)))
}

/// [`validate`] on the fields read from `body`.
fn validate_fields<M: ChatMessages>(
    endpoint: Endpoint,
    headers: &HeaderMap,
    fields: &Fields<'_, M>,
    body: Bytes,
    snapshot: &Snapshot,
    tier: &TierSpec,
) -> Result<ValidRequest, GatewayError> {
    let model = match fields.model.map(text) {
        Some(Some(m)) => m.into_owned(),
        Some(None) => return Err(field_error(wrong_type("model", "a string"))),
        None => {
            return Err(GatewayError::bad_request(
                "`model` is required",
                Some("model"),
            ));
        }
    };
    let route = snapshot
        .model(&model)
        .filter(|r| r.direct || !snapshot.is_version_only(&r.name))
        .ok_or_else(|| GatewayError::NotFound(format!("The model `{model}` does not exist.")))?;
    if !tier.allows_model(&model) {
        return Err(GatewayError::Forbidden(format!(
            "your tier `{}` may not use the model `{model}`",
            tier.name
        )));
    }
    let stream = endpoint.generates() && fields.stream.is_some_and(|r| r.get() == "true");
    // The engine's own ranges and messages: refused the same way here or at the worker.
    if let Some(t) = number(fields.temperature, "temperature")? {
        check_temperature(t).map_err(|m| GatewayError::bad_request(m, Some("temperature")))?;
    }
    if let Some(p) = number(fields.top_p, "top_p")? {
        check_top_p(p).map_err(|m| GatewayError::bad_request(m, Some("top_p")))?;
    }
    // Both limit fields are checked, and the larger is reserved: engines differ in which one
    // they read (ours and vLLM read only `max_tokens` on completions), so a small
    // `max_completion_tokens` must not carry a large `max_tokens` past the ceiling.
    let mut asked: Option<u64> = None;
    for &max_key in endpoint.limit_keys() {
        let m = match number(fields.limit(max_key), max_key)? {
            None => continue,
            Some(m) if m < 1.0 || m.fract() != 0.0 => {
                return Err(GatewayError::bad_request(
                    format!("{max_key} must be a whole number of at least 1, got {m}"),
                    Some(max_key),
                ));
            }
            Some(m) if m > f64::from(tier.max_tokens) => {
                return Err(GatewayError::bad_request(
                    format!(
                        "{max_key} is {m} but your tier `{}` allows at most {}",
                        tier.name, tier.max_tokens
                    ),
                    Some(max_key),
                ));
            }
            Some(m) => m as u64,
        };
        asked = Some(asked.map_or(m, |a| a.max(m)));
    }
    let max_tokens = match endpoint.generates() {
        true => asked.unwrap_or(u64::from(tier.default_max_tokens)),
        false => 0,
    };
    // OpenAI's range; the worker would produce up to `max_tokens` for each choice.
    let n = match number(fields.n, "n")? {
        None => 1,
        Some(n) if endpoint.generates() && (!(1.0..=128.0).contains(&n) || n.fract() != 0.0) => {
            return Err(GatewayError::bad_request(
                format!("n must be a whole number from 1 to 128, got {n}"),
                Some("n"),
            ));
        }
        Some(n) => (n as u32).max(1),
    };
    let media_parts = match endpoint {
        Endpoint::ChatCompletions => M::media(fields.messages.as_ref()),
        Endpoint::Responses => media_parts(fields.input),
        Endpoint::Completions | Endpoint::Embeddings => 0,
    };
    let client_wants_usage = tree(fields.stream_options)
        .and_then(|o| o.get("include_usage").and_then(Value::as_bool))
        .unwrap_or(false);
    let (canonical, prompt) = match endpoint {
        Endpoint::ChatCompletions => M::prompt(fields.messages.as_ref())?,
        Endpoint::Embeddings => embeddings_input(tree(fields.input).as_ref())?,
        Endpoint::Responses => {
            responses_input(tree(fields.instructions), tree(fields.input).as_ref())?
        }
        Endpoint::Completions => match tree(fields.prompt) {
            Some(Value::String(p)) if !p.is_empty() => {
                (canonical_completion(&p), PromptSize::Text(p))
            }
            Some(Value::Array(items)) if !items.is_empty() => {
                // Token ids (or one string in an array): hash their text so equal prompts match.
                let text = items
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(" ");
                let size = if items.iter().all(Value::is_number) {
                    PromptSize::Tokens(items.len() as u64)
                } else {
                    PromptSize::Text(text.clone())
                };
                (canonical_completion(&text), size)
            }
            _ => {
                return Err(GatewayError::bad_request(
                    "`prompt` must be a non-empty string or array",
                    Some("prompt"),
                ));
            }
        },
    };
    // A pool whose workers report their cache as token ids (vLLM's KV events) hashes chat
    // prompts as their chat template writes them, so the keys rebuilt from the events match.
    let chat_markup = snapshot
        .pools
        .get(route.pool)
        .and_then(|p| p.kv_events.as_ref())
        .and_then(|k| k.chat.as_ref());
    let canonical = match (endpoint, chat_markup) {
        (Endpoint::ChatCompletions | Endpoint::Responses, Some(markup)) => {
            markup.render(&canonical)
        }
        _ => canonical,
    };
    let session_id = headers
        .get(SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let user = fields.user.and_then(text).map(Cow::into_owned);
    let session = session_id.clone().or_else(|| user.clone());
    let features = RequestFeatures {
        prefix_hashes: prefix_hashes(&canonical, DEFAULT_BLOCK_BYTES, MAX_PREFIX_BLOCKS),
        session_key: session.as_deref().map(session_hash),
        prompt_bytes: canonical.len(),
        max_output_tokens: u32::try_from(max_tokens).unwrap_or(u32::MAX),
        home: None,
    };
    let pool = route.pool;
    // The fields the gateway may set upstream, found where they are in the body.
    let editable = [
        ("model", fields.model),
        ("stream", fields.stream),
        ("max_tokens", fields.max_tokens),
        ("max_completion_tokens", fields.max_completion_tokens),
        ("max_output_tokens", fields.max_output_tokens),
        ("stream_options", fields.stream_options),
    ]
    .into_iter()
    .filter_map(|(key, raw)| raw.map(|r| (key, r.get())));
    let mut upstream = UpstreamBody::new(body, editable);
    if let Some(up) = route.upstream_model.as_deref()
        && up != model
    {
        upstream.set_string("model", up);
    }
    // Reserve and enforce the tier's default instead of the engine's (possibly whole-context)
    // one; on completions engines read only `max_tokens`, so it is set from
    // `max_completion_tokens` when that is all the client sent.
    let unlimited_upstream = match endpoint {
        Endpoint::ChatCompletions => asked.is_none().then_some("max_tokens"),
        Endpoint::Completions => fields
            .max_tokens
            .is_none_or(|r| r.is_null())
            .then_some("max_tokens"),
        Endpoint::Responses => asked.is_none().then_some("max_output_tokens"),
        Endpoint::Embeddings => None,
    };
    if let Some(key) = unlimited_upstream {
        upstream.set(key, max_tokens.to_string());
    }
    // The Responses API reports usage in its `response.completed` event whatever is asked.
    let usage_chunk = matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Completions);
    if stream && usage_chunk && !client_wants_usage {
        // Ask for the usage chunk to reconcile the reservation; it is hidden from the client.
        upstream.set("stream_options", r#"{"include_usage":true}"#.to_string());
    }
    Ok(ValidRequest {
        endpoint,
        model,
        pool,
        stream,
        body: upstream,
        features,
        max_tokens,
        n,
        media_parts,
        prompt,
        estimator: route.tokenizer,
        max_context: route.max_context,
        client_wants_usage,
        session_id,
        user,
    })
}

/// A chat request's `messages`: a non-empty array whose items' `role` and `content` make the
/// prompt (an item that is not a message adds an empty turn; the engine judges it).
fn chat_messages(raw: Option<&RawValue>) -> Result<(Vec<u8>, PromptSize), GatewayError> {
    let bad = no_messages;
    let raw = raw.filter(|r| r.get().starts_with('[')).ok_or_else(bad)?;
    let items: Vec<&RawValue> = serde_json::from_str(raw.get())
        .ok()
        .filter(|m: &Vec<&RawValue>| !m.is_empty())
        .ok_or_else(bad)?;
    let turns: Vec<(Cow<'_, str>, Cow<'_, str>)> = items
        .iter()
        .map(|item| {
            // serde would read a struct from an array too: only an object is a message.
            let typed = item
                .get()
                .starts_with('{')
                .then(|| serde_json::from_str::<Message>(item.get()).ok());
            match typed.flatten() {
                Some(m) => (
                    m.role.and_then(text).unwrap_or_default(),
                    match m.content.and_then(text) {
                        Some(t) => t,
                        None => Cow::Owned(content_text(tree(m.content).as_ref())),
                    },
                ),
                // Not an object, or a key given twice: read as a tree.
                None => {
                    let m = tree(Some(item));
                    let m = m.as_ref();
                    let role = m
                        .and_then(|m| m.get("role"))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    (
                        Cow::Owned(role),
                        Cow::Owned(content_text(m.and_then(|m| m.get("content")))),
                    )
                }
            }
        })
        .collect();
    Ok(chat_prompt(&turns))
}

/// A chat request without a non-empty `messages` array.
fn no_messages() -> GatewayError {
    GatewayError::bad_request("`messages` must be a non-empty array", Some("messages"))
}

/// The meter phase's context check: a prompt estimated at `prompt_tokens` that is longer than
/// the model's configured context is refused with 400 before any upstream work. Shared with the
/// simulator, so both refuse exactly the same requests.
pub fn check_context(valid: &ValidRequest, prompt_tokens: u64) -> Result<(), GatewayError> {
    match valid.max_context {
        Some(context) if prompt_tokens > context as u64 => Err(GatewayError::bad_request(
            format!(
                "the prompt is about {prompt_tokens} tokens but the model `{}` has a context of {context} tokens",
                valid.model
            ),
            Some("messages"),
        )),
        _ => Ok(()),
    }
}

/// `input` of an embeddings request: a string, an array of strings, an array of token ids, or
/// an array of such arrays. Returns the canonical text and the size to meter.
fn embeddings_input(input: Option<&Value>) -> Result<(Vec<u8>, PromptSize), GatewayError> {
    let bad = || {
        GatewayError::bad_request(
            "`input` must be a non-empty string, array of strings, array of token ids or array of token-id arrays",
            Some("input"),
        )
    };
    let tokens = |v: &Value| {
        v.as_array()
            .filter(|a| !a.is_empty() && a.iter().all(Value::is_u64))
            .map(|a| a.len() as u64)
    };
    match input {
        Some(Value::String(s)) if !s.is_empty() => {
            Ok((canonical_completion(s), PromptSize::Text(s.clone())))
        }
        Some(v @ Value::Array(items)) if !items.is_empty() => {
            if let Some(n) = tokens(v) {
                return Ok((canonical_completion(&v.to_string()), PromptSize::Tokens(n)));
            }
            if let Some(n) = items.iter().map(tokens).sum::<Option<u64>>() {
                return Ok((canonical_completion(&v.to_string()), PromptSize::Tokens(n)));
            }
            let texts: Option<Vec<&str>> = items
                .iter()
                .map(|i| i.as_str().filter(|s| !s.is_empty()))
                .collect();
            let text = texts.ok_or_else(bad)?.join("\n");
            Ok((canonical_completion(&text), PromptSize::Text(text)))
        }
        _ => Err(bad()),
    }
}

/// `instructions` and `input` of a Responses API request (a string, or an array of message
/// items whose `content` is a string or `input_text` parts), as the chat they amount to.
fn responses_input(
    instructions: Option<Value>,
    input: Option<&Value>,
) -> Result<(Vec<u8>, PromptSize), GatewayError> {
    let mut flat: Vec<(String, String)> = Vec::new();
    match instructions {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => flat.push(("system".into(), s)),
        Some(_) => {
            return Err(GatewayError::bad_request(
                "`instructions` must be a string",
                Some("instructions"),
            ));
        }
    }
    match input {
        Some(Value::String(s)) if !s.is_empty() => flat.push(("user".into(), s.clone())),
        Some(Value::Array(items)) if !items.is_empty() => {
            for item in items {
                let role = item.get("role").and_then(Value::as_str).ok_or_else(|| {
                    GatewayError::bad_request(
                        "each `input` item must be a message with a `role` (other item types are not supported)",
                        Some("input"),
                    )
                })?;
                flat.push((role.to_string(), content_text(item.get("content"))));
            }
        }
        _ => {
            return Err(GatewayError::bad_request(
                "`input` must be a non-empty string or array of messages",
                Some("input"),
            ));
        }
    }
    Ok(chat_prompt(&flat))
}

/// A conversation's turns: its canonical bytes (prefix hashing) and the text to meter. Chat and
/// the Responses API share it, so the same turns hash and meter the same.
fn chat_prompt<T: Turn>(turns: &[T]) -> (Vec<u8>, PromptSize) {
    let mut text = String::with_capacity(
        turns
            .iter()
            .map(|t| t.role().len() + t.text().len() + 2)
            .sum(),
    );
    for t in turns {
        text.push_str(t.role());
        text.push('\n');
        text.push_str(t.text());
        text.push('\n');
    }
    (canonical_chat(turns), PromptSize::Text(text))
}

/// Parts of the messages' `content` arrays that are not text (images, audio, files), which the
/// usage check allows prompt tokens for. Only bodies with typed parts are parsed again.
fn media_parts(messages: Option<&RawValue>) -> u32 {
    let Some(raw) = messages.filter(|r| r.get().contains("\"type\"")) else {
        return 0;
    };
    let Some(Value::Array(items)) = tree(Some(raw)) else {
        return 0;
    };
    let is_media = |part: &Value| {
        part.get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| !TEXT_PARTS.contains(&t))
    };
    let count = items
        .iter()
        .filter_map(|m| m.get("content").and_then(Value::as_array))
        .flatten()
        .filter(|p| is_media(p))
        .count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// Text of a message's `content`: a string, or the text parts of an array.
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
