//! Turns `/v1/completions` and `/v1/chat/completions` bodies into a validated [`ParsedRequest`].

use serde_json::Value;

use super::fields::{Fields, as_int, invalid, wrong_type};
use super::{ApiError, ChatTemplate};
use crate::logprobs::MAX_TOP_LOGPROBS;
use crate::request::SamplingParams;

/// Which OpenAI endpoint a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    ChatCompletions,
}

/// The prompt to prefill: text still to tokenize, or token ids given by the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Text; for chat, the rendered template.
    Text(String),
    /// Token ids sent as the completions `prompt`.
    Tokens(Vec<u32>),
}

/// One chat message, its content flattened to text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool` or `developer`.
    pub role: String,
    /// The text parts joined with `\n`; empty for an assistant message without content.
    pub content: String,
}

/// A request that passed validation; only this type reaches the scheduler.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    /// The endpoint, which decides the response shape.
    pub endpoint: Endpoint,
    /// The `model` named by the client.
    pub model: String,
    /// The prompts: for chat, the rendered template text; for completions, one per element
    /// of a list prompt.
    pub prompts: Vec<Prompt>,
    /// Answer as server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`: end the stream with a usage chunk.
    pub include_usage: bool,
    /// The client's `max_tokens` (chat: `max_completion_tokens` first); `None` → caller defaults
    /// it. 0 only with `echo`: the answer is the prompt alone.
    pub max_tokens: Option<usize>,
    /// Sampling parameters; `sampling.max_tokens` is 0 until the caller resolves it.
    pub sampling: SamplingParams,
    /// The opaque `user` tag.
    pub user: Option<String>,
    /// Choices returned per prompt.
    pub n: usize,
    /// Sequences generated per prompt (≥ `n`); the `n` with the highest cumulative logprob
    /// are returned.
    pub best_of: usize,
    /// Completions `echo`: each choice's text starts with its prompt.
    pub echo: bool,
    /// Logprobs asked for, with this many alternatives per token (completions `logprobs`,
    /// chat `top_logprobs`); `None` when not asked for.
    pub logprobs: Option<usize>,
    /// What the flight record says of the request's shape (tools, `response_format`, images),
    /// read from the body parsed here.
    pub features: crate::flight::Features,
}

/// Most stop strings a request may carry, as in OpenAI's API.
const MAX_STOP: usize = 4;

/// Most choices (`n`) and sequences per prompt (`best_of`), as OpenAI's bound on `n`.
pub const MAX_CHOICES: usize = 128;

/// Roles a chat message may have.
pub(super) const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];

/// Parses and validates a `/v1/completions` body.
pub fn parse_completion(body: &[u8]) -> Result<ParsedRequest, ApiError> {
    let value = Fields::parse(body)?;
    let f = Fields::new(&value)?;
    let model = model(&f)?;
    let prompts = completion_prompts(f.get("prompt"))?;
    let echo = f.bool("echo")?.unwrap_or(false);
    let mut parsed = common(
        &f,
        Endpoint::Completions,
        model,
        prompts,
        "max_tokens",
        echo,
    )?;
    parsed.echo = echo;
    parsed.logprobs = match f.int("logprobs")? {
        None => None,
        Some(k) => Some(top_logprobs_count("logprobs", k)?),
    };
    Ok(parsed)
}

/// Parses and validates a `/v1/chat/completions` body and renders its messages with `template`.
pub fn parse_chat(body: &[u8], template: &ChatTemplate) -> Result<ParsedRequest, ApiError> {
    let value = Fields::parse(body)?;
    let f = Fields::new(&value)?;
    let model = model(&f)?;
    let messages = chat_messages(f.get("messages"))?;
    let max_field = if f.get("max_completion_tokens").is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let add_generation_prompt = f.bool("add_generation_prompt")?.unwrap_or(true);
    if f.bool("echo")? == Some(true) {
        return Err(invalid(
            "echo",
            "`echo` is not supported on chat completions".to_owned(),
        ));
    }
    // Validate the cheap fields before rendering the template.
    let placeholder = vec![Prompt::Text(String::new())];
    let mut parsed = common(
        &f,
        Endpoint::ChatCompletions,
        model,
        placeholder,
        max_field,
        false,
    )?;
    parsed.logprobs = chat_logprobs(&f)?;
    parsed.prompts = vec![Prompt::Text(
        template.render(&messages, add_generation_prompt)?,
    )];
    Ok(parsed)
}

/// Chat's `logprobs` (a boolean) and `top_logprobs` (alternatives, which need `logprobs`).
fn chat_logprobs(f: &Fields<'_>) -> Result<Option<usize>, ApiError> {
    let on = f.bool("logprobs")?.unwrap_or(false);
    let top = match f.int("top_logprobs")? {
        None => None,
        Some(_) if !on => {
            return Err(invalid(
                "top_logprobs",
                "`top_logprobs` requires `logprobs` to be true".to_owned(),
            ));
        }
        Some(k) => Some(top_logprobs_count("top_logprobs", k)?),
    };
    Ok(on.then(|| top.unwrap_or(0)))
}

/// A count of alternatives per token, 0 ..= [`MAX_TOP_LOGPROBS`].
fn top_logprobs_count(field: &str, k: i128) -> Result<usize, ApiError> {
    match usize::try_from(k) {
        Ok(k) if k <= MAX_TOP_LOGPROBS => Ok(k),
        _ => Err(invalid(
            field,
            format!("`{field}` must be in [0, {MAX_TOP_LOGPROBS}], got {k}"),
        )),
    }
}

pub(super) fn model(f: &Fields<'_>) -> Result<String, ApiError> {
    f.string("model")?
        .map(str::to_owned)
        .ok_or_else(|| ApiError::bad_request("`model` is required", Some("model")))
}

/// The fields both endpoints share. `echo` allows `max_tokens: 0` (the prompt alone).
pub(super) fn common(
    f: &Fields<'_>,
    endpoint: Endpoint,
    model: String,
    prompts: Vec<Prompt>,
    max_field: &str,
    echo: bool,
) -> Result<ParsedRequest, ApiError> {
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = stream_options(f, stream)?;
    let (n, best_of) = choices(f, stream)?;

    let least = usize::from(!echo);
    let max_tokens = match f.int(max_field)? {
        None => None,
        Some(n) if n >= least as i128 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        Some(n) => {
            let why = if echo { "" } else { " (0 only with `echo`)" };
            return Err(invalid(
                max_field,
                format!("`{max_field}` must be at least 1{why}, got {n}"),
            ));
        }
    };
    let min_tokens = match f.int("min_tokens")? {
        None => 0,
        Some(n) if n < 0 => {
            return Err(invalid(
                "min_tokens",
                format!("`min_tokens` must be at least 0, got {n}"),
            ));
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    if let Some(max) = max_tokens.filter(|&max| min_tokens > max) {
        return Err(invalid(
            "min_tokens",
            format!("`min_tokens` ({min_tokens}) must be at most `{max_field}` ({max})"),
        ));
    }

    let temperature = f.number("temperature")?.unwrap_or(1.0);
    super::params::check_temperature(temperature).map_err(|m| invalid("temperature", m))?;
    let top_p = f.number("top_p")?.unwrap_or(1.0);
    super::params::check_top_p(top_p).map_err(|m| invalid("top_p", m))?;
    let top_k = match f.int("top_k")? {
        None | Some(0) | Some(-1) => -1,
        Some(k) if k >= 1 => i32::try_from(k).unwrap_or(i32::MAX),
        Some(k) => {
            return Err(invalid(
                "top_k",
                format!("`top_k` must be -1 (disabled) or at least 1, got {k}"),
            ));
        }
    };
    let seed = match f.int("seed")? {
        None => None,
        // Negative seeds keep their bits, so -1 and u64::MAX name the same stream.
        Some(s) if s < 0 => Some(i64::try_from(s).map_err(|_| seed_range())? as u64),
        Some(s) => Some(u64::try_from(s).map_err(|_| seed_range())?),
    };

    Ok(ParsedRequest {
        endpoint,
        model,
        prompts,
        stream,
        include_usage,
        max_tokens,
        sampling: SamplingParams {
            max_tokens: 0,
            min_tokens,
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k,
            seed,
            ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
            stop: stop(f.get("stop"))?,
            logprobs: None,
            prompt_logprobs: None,
            script: None,
        },
        user: f.string("user")?.map(str::to_owned),
        n,
        best_of,
        echo: false,
        logprobs: None,
        features: crate::flight::Features::of(f.members(), stream),
    })
}

fn seed_range() -> ApiError {
    invalid("seed", "`seed` must fit in 64 bits".to_owned())
}

/// `stream_options.include_usage`; like vLLM, the options are only accepted with `stream: true`.
fn stream_options(f: &Fields<'_>, stream: bool) -> Result<bool, ApiError> {
    let Some(options) = f.get("stream_options") else {
        return Ok(false);
    };
    let options = Fields::new(options).map_err(|_| wrong_type("stream_options", "an object"))?;
    if !stream {
        return Err(invalid(
            "stream_options",
            "`stream_options` can only be set when `stream` is true".to_owned(),
        ));
    }
    options
        .bool("include_usage")
        .map(|b| b.unwrap_or(false))
        .map_err(|_| wrong_type("stream_options.include_usage", "a boolean"))
}

/// `n` (choices per prompt) and `best_of` (sequences per prompt, ≥ `n`, default `n`). Like
/// OpenAI and vLLM, results cannot stream while `best_of` > `n`: the best are known only at
/// the end.
fn choices(f: &Fields<'_>, stream: bool) -> Result<(usize, usize), ApiError> {
    let count = |field: &str, least: usize| -> Result<Option<usize>, ApiError> {
        match f.int(field)? {
            None => Ok(None),
            Some(v) if v < least as i128 => Err(invalid(
                field,
                format!("`{field}` must be at least {least}, got {v}"),
            )),
            Some(v) if v > MAX_CHOICES as i128 => Err(invalid(
                field,
                format!("`{field}` must be at most {MAX_CHOICES}, got {v}"),
            )),
            Some(v) => Ok(Some(usize::try_from(v).unwrap_or(MAX_CHOICES))),
        }
    };
    let n = count("n", 1)?.unwrap_or(1);
    let best_of = match count("best_of", 1)? {
        Some(b) if b < n => {
            return Err(invalid(
                "best_of",
                format!("`best_of` ({b}) must be at least `n` ({n})"),
            ));
        }
        Some(b) => b,
        None => n,
    };
    if stream && best_of > n {
        return Err(invalid(
            "best_of",
            "`best_of` greater than `n` cannot be streamed: the best are known only at the end"
                .to_owned(),
        ));
    }
    Ok((n, best_of))
}

fn stop(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let non_empty = |s: &str| {
        if s.is_empty() {
            Err(invalid(
                "stop",
                "`stop` strings must not be empty".to_owned(),
            ))
        } else {
            Ok(s.to_owned())
        }
    };
    match value {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![non_empty(s)?]),
        Some(Value::Array(items)) => {
            if items.len() > MAX_STOP {
                return Err(invalid(
                    "stop",
                    format!(
                        "`stop` may hold at most {MAX_STOP} strings, got {}",
                        items.len()
                    ),
                ));
            }
            items
                .iter()
                .map(|item| {
                    item.as_str()
                        .ok_or_else(|| wrong_type("stop", "a string or an array of strings"))
                        .and_then(non_empty)
                })
                .collect()
        }
        Some(_) => Err(wrong_type("stop", "a string or an array of strings")),
    }
}

/// The completions `prompt`: a string, token ids, or a list of either (one choice set each).
fn completion_prompts(value: Option<&Value>) -> Result<Vec<Prompt>, ApiError> {
    prompt_list("prompt", value)
}

/// A prompt-shaped `field` (completions `prompt`, embeddings `input`): a string, token ids, or a
/// list of either.
pub(super) fn prompt_list(field: &str, value: Option<&Value>) -> Result<Vec<Prompt>, ApiError> {
    const EXPECTED: &str =
        "a string, an array of strings, an array of token ids, or an array of token-id arrays";
    let empty = || invalid(field, format!("`{field}` must not be empty"));
    let text = |s: &str| {
        if s.is_empty() {
            Err(empty())
        } else {
            Ok(Prompt::Text(s.to_owned()))
        }
    };
    match value {
        None => Err(ApiError::bad_request(
            format!("`{field}` is required"),
            Some(field),
        )),
        Some(Value::String(s)) => Ok(vec![text(s)?]),
        Some(Value::Array(items)) => match items.first() {
            None => Err(empty()),
            Some(Value::Number(_)) => Ok(vec![Prompt::Tokens(token_ids(field, items)?)]),
            Some(Value::String(_)) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => text(s),
                    _ => Err(wrong_type(field, EXPECTED)),
                })
                .collect(),
            Some(Value::Array(_)) => items
                .iter()
                .map(|item| match item {
                    Value::Array(ids) => token_ids(field, ids).map(Prompt::Tokens),
                    _ => Err(wrong_type(field, EXPECTED)),
                })
                .collect(),
            Some(_) => Err(wrong_type(field, EXPECTED)),
        },
        Some(_) => Err(wrong_type(field, EXPECTED)),
    }
}

fn token_ids(field: &str, items: &[Value]) -> Result<Vec<u32>, ApiError> {
    if items.is_empty() {
        return Err(invalid(field, format!("`{field}` must not be empty")));
    }
    items
        .iter()
        .map(|item| {
            as_int(item)
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    invalid(
                        field,
                        format!("`{field}` token ids must be integers in [0, 2^32), got {item}"),
                    )
                })
        })
        .collect()
}

fn chat_messages(value: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match value {
        None => {
            return Err(ApiError::bad_request(
                "`messages` is required",
                Some("messages"),
            ));
        }
        Some(Value::Array(items)) => items,
        Some(_) => return Err(wrong_type("messages", "an array of messages")),
    };
    if items.is_empty() {
        return Err(invalid(
            "messages",
            "`messages` must not be empty".to_owned(),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| chat_message(i, item))
        .collect()
}

pub(super) fn chat_message(i: usize, item: &Value) -> Result<ChatMessage, ApiError> {
    let at = format!("messages[{i}]");
    let f = Fields::new(item).map_err(|_| wrong_type(&at, "an object"))?;
    let role_field = format!("{at}.role");
    let role = f
        .string("role")
        .map_err(|_| wrong_type(&role_field, "a string"))?
        .ok_or_else(|| invalid(&role_field, format!("`{role_field}` is required")))?;
    if !ROLES.contains(&role) {
        return Err(invalid(
            &role_field,
            format!(
                "unsupported role `{role}` in `{role_field}`; expected one of {}",
                ROLES.join(", ")
            ),
        ));
    }
    let content_field = format!("{at}.content");
    let content = match f.get("content") {
        None if role == "assistant" => String::new(),
        None => {
            return Err(invalid(
                &content_field,
                format!("`{content_field}` is required for role `{role}`"),
            ));
        }
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_parts(&content_field, parts, &["text"])?,
        Some(_) => {
            return Err(wrong_type(
                &content_field,
                "a string or an array of text parts",
            ));
        }
    };
    Ok(ChatMessage {
        role: role.to_owned(),
        content,
    })
}

/// Joins text parts (`{"type": T, "text": ...}` with `T` one of `types`) with `\n`, as vLLM
/// flattens them for text-only models; any other part type is refused, naming `types[0]`.
pub(super) fn text_parts(field: &str, parts: &[Value], types: &[&str]) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{field}[{j}]");
        let f = Fields::new(part).map_err(|_| wrong_type(&at, "an object"))?;
        match f.string("type") {
            Ok(Some(t)) if types.contains(&t) => {}
            Ok(Some(other)) => {
                let only = types.first().copied().unwrap_or("text");
                return Err(invalid(
                    &at,
                    format!(
                        "content part type `{other}` in `{at}` is not supported; only `{only}` is"
                    ),
                ));
            }
            _ => return Err(invalid(&at, format!("`{at}.type` must be a string"))),
        }
        match f.string("text") {
            Ok(Some(text)) => texts.push(text),
            _ => return Err(wrong_type(&format!("{at}.text"), "a string")),
        }
    }
    Ok(texts.join("\n"))
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
