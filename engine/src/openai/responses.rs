//! `POST /v1/responses` (OpenAI's Responses API, text only): the request mapped onto a chat
//! [`ParsedRequest`], and the `response` object and stream events it answers with.

use serde_json::{Map, Value, json};

use super::fields::{Fields, invalid, wrong_type};
use super::parse::{ROLES, common, model, text_parts};
use super::response::{Usage, unique_hex, unix_secs};
use super::{ApiError, ChatMessage, ChatTemplate, Endpoint, ParsedRequest, Prompt};

/// The request fields a `response` object echoes back.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesEcho {
    /// `instructions` (sent to the model as a leading system message).
    pub instructions: Option<String>,
    /// `max_output_tokens` as sent.
    pub max_output_tokens: Option<usize>,
    /// `temperature` in effect.
    pub temperature: f64,
    /// `top_p` in effect.
    pub top_p: f64,
    /// `metadata` as sent (an object; `{}` when absent).
    pub metadata: Value,
}

/// Parses a `/v1/responses` body into a one-choice chat request (rendered with `template`) and
/// the fields its answer echoes.
pub fn parse_responses(
    body: &[u8],
    template: &ChatTemplate,
) -> Result<(ParsedRequest, ResponsesEcho), ApiError> {
    let value = Fields::parse(body)?;
    let f = Fields::new(&value)?;
    let model = model(&f)?;
    let instructions = f.string("instructions")?.map(str::to_owned);
    let mut messages = Vec::new();
    if let Some(text) = &instructions {
        messages.push(ChatMessage {
            role: "system".into(),
            content: text.clone(),
        });
    }
    messages.extend(input_messages(f.get("input"))?);
    let metadata = match f.get("metadata") {
        None => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => return Err(wrong_type("metadata", "an object")),
    };
    // Cheap fields first (the chat path's validation, with the Responses field name).
    let placeholder = vec![Prompt::Text(String::new())];
    let mut parsed = common(
        &f,
        Endpoint::ChatCompletions,
        model,
        placeholder,
        "max_output_tokens",
        false,
    )?;
    // One answer per request; chat-only knobs do not apply.
    parsed.n = 1;
    parsed.best_of = 1;
    parsed.include_usage = false;
    parsed.logprobs = None;
    parsed.prompts = vec![Prompt::Text(template.render(&messages, true)?)];
    let echo = ResponsesEcho {
        instructions,
        max_output_tokens: parsed.max_tokens,
        temperature: f64::from(parsed.sampling.temperature),
        top_p: f64::from(parsed.sampling.top_p),
        metadata,
    };
    Ok((parsed, echo))
}

/// `input`: a string (one user message) or a list of message items.
fn input_messages(value: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    match value {
        None => Err(ApiError::bad_request("`input` is required", Some("input"))),
        Some(Value::String(s)) if s.is_empty() => {
            Err(invalid("input", "`input` must not be empty".to_owned()))
        }
        Some(Value::String(s)) => Ok(vec![ChatMessage {
            role: "user".into(),
            content: s.clone(),
        }]),
        Some(Value::Array(items)) if items.is_empty() => {
            Err(invalid("input", "`input` must not be empty".to_owned()))
        }
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| input_item(i, item))
            .collect(),
        Some(_) => Err(wrong_type("input", "a string or an array of input items")),
    }
}

/// One `{role, content}` item (optionally `type: "message"`).
fn input_item(i: usize, item: &Value) -> Result<ChatMessage, ApiError> {
    let at = format!("input[{i}]");
    let f = Fields::new(item).map_err(|_| wrong_type(&at, "an object"))?;
    match f.string("type") {
        Ok(None | Some("message")) => {}
        Ok(Some(other)) => {
            return Err(invalid(
                &at,
                format!("input item type `{other}` in `{at}` is not supported; only `message` is"),
            ));
        }
        Err(_) => return Err(wrong_type(&format!("{at}.type"), "a string")),
    }
    let role_field = format!("{at}.role");
    let role = f
        .string("role")
        .map_err(|_| wrong_type(&role_field, "a string"))?
        .ok_or_else(|| invalid(&role_field, format!("`{role_field}` is required")))?;
    if !ROLES.contains(&role) || role == "tool" {
        return Err(invalid(
            &role_field,
            format!(
                "unsupported role `{role}` in `{role_field}`; expected user, assistant, system or developer"
            ),
        ));
    }
    let content_field = format!("{at}.content");
    let content = match f.get("content") {
        Some(Value::String(s)) => s.clone(),
        // `output_text` parts are earlier assistant turns.
        Some(Value::Array(parts)) => text_parts(
            &content_field,
            parts,
            &["input_text", "output_text", "text"],
        )?,
        None => {
            return Err(invalid(
                &content_field,
                format!("`{content_field}` is required"),
            ));
        }
        Some(_) => {
            return Err(wrong_type(
                &content_field,
                "a string or an array of input_text parts",
            ));
        }
    };
    Ok(ChatMessage {
        role: role.to_owned(),
        content,
    })
}

/// Where a response stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseStatus {
    /// Still generating (the first stream events).
    InProgress,
    /// Ended at EOS or a stop string.
    Completed,
    /// Cut by `max_output_tokens` (or the context length).
    Incomplete,
}

impl ResponseStatus {
    fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
            Self::Incomplete => "incomplete",
        }
    }
}

/// One response's identity and echoed fields, shared by its object and every stream event.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseFrame {
    /// `resp_…`.
    pub id: String,
    /// `msg_…`: the one output message.
    pub item_id: String,
    /// Unix seconds.
    pub created_at: u64,
    /// The model name echoed back.
    pub model: String,
    /// Echoed request fields.
    pub echo: ResponsesEcho,
}

impl ResponseFrame {
    /// Fresh ids and the current time.
    pub fn new(model: impl Into<String>, echo: ResponsesEcho) -> Self {
        Self {
            id: format!("resp_{}", unique_hex()),
            item_id: format!("msg_{}", unique_hex()),
            created_at: unix_secs(),
            model: model.into(),
            echo,
        }
    }

    /// The output message item; `text` is its whole text.
    pub fn message(&self, status: ResponseStatus, text: Option<&str>) -> Value {
        let content = match text {
            Some(t) => vec![text_part(t)],
            None => Vec::new(),
        };
        json!({
            "type": "message",
            "id": self.item_id,
            "status": status.as_str(),
            "role": "assistant",
            "content": content,
        })
    }

    /// The `response` object. In progress it has no output and `usage: null`; finished, one
    /// message holding `text`.
    pub fn object(&self, status: ResponseStatus, text: &str, usage: Option<&Usage>) -> Value {
        let output = match status {
            ResponseStatus::InProgress => Vec::new(),
            s => vec![self.message(s, Some(text))],
        };
        let incomplete =
            (status == ResponseStatus::Incomplete).then(|| json!({"reason": "max_output_tokens"}));
        let usage = usage.map(|u| {
            json!({
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.prompt_tokens + u.completion_tokens,
            })
        });
        let e = &self.echo;
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status.as_str(),
            "error": null,
            "incomplete_details": incomplete,
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": false,
            "temperature": e.temperature,
            "top_p": e.top_p,
            "text": {"format": {"type": "text"}},
            "tool_choice": "none",
            "tools": [],
            "usage": usage,
            "metadata": e.metadata,
        })
    }

    /// The fields that locate a text delta or part within the response.
    pub fn part_location(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("item_id".into(), json!(self.item_id));
        m.insert("output_index".into(), json!(0));
        m.insert("content_index".into(), json!(0));
        m
    }
}

/// An `output_text` content part.
pub fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// One SSE event, `event: <kind>\ndata: {"type":kind,"sequence_number":seq,...fields}\n\n`.
pub fn sse_event(kind: &str, seq: u64, fields: Map<String, Value>) -> String {
    let mut m = Map::new();
    m.insert("type".into(), json!(kind));
    m.insert("sequence_number".into(), json!(seq));
    m.extend(fields);
    super::sse::named_event(kind, Value::Object(m))
}

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;
