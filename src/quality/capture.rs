//! The answer text of a sampled request, collected as the relay passes it: the content of the
//! first choice (chat `message.content` or streamed `delta.content`, completions `text`), its
//! `finish_reason` and its tool calls' `arguments`, each bounded, so that a long answer costs at
//! most [`MAX_TEXT`] bytes of memory. Responses API answers are read alike: `output_text` parts
//! (or `response.output_text.delta` events), `function_call` items' `arguments` (or their delta
//! events), and the status as a finish reason (`incomplete` for `max_output_tokens` is `length`).
//! Scored later, off the request's path ([`super::signals`]).

use serde::Deserialize;

use super::signals::{Answer, Asked};

/// Most answer text kept (a loop, a refusal or an empty answer shows in its head).
pub const MAX_TEXT: usize = 64 * 1024;
/// Most tool calls kept.
const MAX_TOOL_CALLS: usize = 16;
/// Most bytes of one tool call's arguments kept.
const MAX_TOOL_ARGS: usize = 16 * 1024;

/// What a sampled answer said, bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capture {
    text: String,
    finish_reason: Option<String>,
    tool_args: Vec<String>,
    /// Responses API streams: the output index of each tool call slot, in order.
    call_items: Vec<usize>,
    /// Text or arguments were cut at their bound: JSON checks of them would be wrong.
    cut: bool,
}

/// One body or stream chunk, as far as the capture reads it (the rest is skipped).
#[derive(Deserialize)]
struct Chunk {
    choices: Option<Vec<Choice>>,
    /// Responses API: a streamed event's type (`response.output_text.delta`, ...).
    #[serde(rename = "type")]
    kind: Option<String>,
    /// Responses API: a streamed event's text or arguments.
    delta: Option<String>,
    /// Responses API: the output item a streamed event belongs to.
    output_index: Option<usize>,
    /// Responses API: the response of a `response.completed` or `response.incomplete` event.
    response: Option<ResponseStatus>,
    /// Responses API, a whole answer: its output items, status and why it is incomplete.
    output: Option<Vec<OutputItem>>,
    status: Option<String>,
    incomplete_details: Option<Incomplete>,
}

/// A Responses API answer's status, as a finish reason.
#[derive(Deserialize, Default)]
struct ResponseStatus {
    status: Option<String>,
    incomplete_details: Option<Incomplete>,
}

#[derive(Deserialize)]
struct Incomplete {
    reason: Option<String>,
}

impl ResponseStatus {
    /// The chat `finish_reason` the status means.
    fn finish_reason(&self) -> Option<String> {
        finish_of(self.status.as_deref(), self.incomplete_details.as_ref())
    }
}

/// The chat `finish_reason` a Responses API status means: `stop` when completed, `length` when
/// the output budget (`max_output_tokens`) ran out, else the incomplete reason.
fn finish_of(status: Option<&str>, incomplete: Option<&Incomplete>) -> Option<String> {
    match status? {
        "completed" => Some("stop".into()),
        "incomplete" => Some(match incomplete.and_then(|d| d.reason.as_deref()) {
            Some("max_output_tokens") => "length".into(),
            Some(other) => other.into(),
            None => "incomplete".into(),
        }),
        _ => None,
    }
}

/// One item of a Responses API answer's `output`.
#[derive(Deserialize)]
struct OutputItem {
    #[serde(rename = "type")]
    kind: Option<String>,
    content: Option<Vec<ContentPart>>,
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: Option<String>,
    text: Option<String>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: u32,
    text: Option<String>,
    delta: Option<Message>,
    message: Option<Message>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    content: Option<String>,
    tool_calls: Option<Vec<ToolCall>>,
}

#[derive(Deserialize)]
struct ToolCall {
    /// Streamed calls name their slot; whole ones come in order.
    index: Option<usize>,
    function: Option<Function>,
}

#[derive(Deserialize)]
struct Function {
    arguments: Option<String>,
}

impl Capture {
    /// Reads one SSE data payload of a chat or completions stream (others are ignored).
    pub fn sse_payload(&mut self, payload: &[u8]) {
        if let Ok(chunk) = serde_json::from_slice::<Chunk>(payload) {
            self.add(chunk, true);
        }
    }

    /// Reads a whole (non-streamed) JSON answer.
    pub fn json_body(&mut self, body: &[u8]) {
        if let Ok(chunk) = serde_json::from_slice::<Chunk>(body) {
            self.add(chunk, false);
        }
    }

    fn add(&mut self, chunk: Chunk, streamed: bool) {
        self.add_response(&chunk, streamed);
        for choice in chunk.choices.into_iter().flatten() {
            if choice.index != 0 {
                continue;
            }
            if let Some(t) = &choice.text {
                self.push_text(t);
            }
            for m in [&choice.delta, &choice.message].into_iter().flatten() {
                if let Some(t) = &m.content {
                    self.push_text(t);
                }
                for (i, call) in m.tool_calls.iter().flatten().enumerate() {
                    let slot = if streamed { call.index.unwrap_or(0) } else { i };
                    let args = call.function.as_ref().and_then(|f| f.arguments.as_deref());
                    self.push_args(slot, args.unwrap_or_default());
                }
            }
            if let Some(r) = choice.finish_reason {
                self.finish_reason = Some(r);
            }
        }
    }

    /// The Responses API's shapes: streamed events, or a whole answer's output items.
    fn add_response(&mut self, chunk: &Chunk, streamed: bool) {
        match (chunk.kind.as_deref(), &chunk.delta) {
            (Some("response.output_text.delta"), Some(d)) => self.push_text(d),
            (Some("response.function_call_arguments.delta"), Some(d)) => {
                let item = chunk.output_index.unwrap_or(0);
                // The worker names the item: only the first MAX_TOOL_CALLS get a slot.
                let slot = match self.call_items.iter().position(|&i| i == item) {
                    Some(slot) => Some(slot),
                    None if self.call_items.len() < MAX_TOOL_CALLS => {
                        self.call_items.push(item);
                        Some(self.call_items.len() - 1)
                    }
                    None => None,
                };
                match slot {
                    Some(slot) => self.push_args(slot, d),
                    None => self.cut = true,
                }
            }
            _ => {}
        }
        if let Some(r) = chunk
            .response
            .as_ref()
            .and_then(ResponseStatus::finish_reason)
        {
            self.finish_reason = Some(r);
        }
        if streamed {
            return;
        }
        let mut calls = 0;
        for item in chunk.output.iter().flatten() {
            match item.kind.as_deref() {
                Some("message") => {
                    for part in item.content.iter().flatten() {
                        if let (Some("output_text"), Some(t)) = (part.kind.as_deref(), &part.text) {
                            self.push_text(t);
                        }
                    }
                }
                Some("function_call") => {
                    self.push_args(calls, item.arguments.as_deref().unwrap_or_default());
                    calls += 1;
                }
                _ => {}
            }
        }
        if chunk.output.is_some()
            && let Some(r) = finish_of(chunk.status.as_deref(), chunk.incomplete_details.as_ref())
        {
            self.finish_reason = Some(r);
        }
    }

    fn push_text(&mut self, text: &str) {
        self.cut |= !push_bounded(&mut self.text, text, MAX_TEXT);
    }

    fn push_args(&mut self, slot: usize, args: &str) {
        if slot >= MAX_TOOL_CALLS {
            self.cut = true;
            return;
        }
        if self.tool_args.len() <= slot {
            self.tool_args.resize(slot + 1, String::new());
        }
        self.cut |= !push_bounded(&mut self.tool_args[slot], args, MAX_TOOL_ARGS);
    }

    /// The answer to score.
    pub fn answer(&self) -> Answer<'_> {
        Answer {
            text: &self.text,
            finish_reason: self.finish_reason.as_deref(),
            tool_arguments: &self.tool_args,
        }
    }

    /// What may fairly be checked of `asked`: nothing JSON-shaped of an answer cut at its bound.
    pub fn checkable(&self, asked: Asked) -> Asked {
        if self.cut { Asked::default() } else { asked }
    }

    /// The `finish_reason` of the first choice, when the worker gave one.
    pub fn finish_reason(&self) -> Option<&str> {
        self.finish_reason.as_deref()
    }
}

/// Appends `add` to `to` up to `max` bytes in all (cut at a character boundary); false when
/// something was left out.
fn push_bounded(to: &mut String, add: &str, max: usize) -> bool {
    let room = max.saturating_sub(to.len());
    if add.len() <= room {
        to.push_str(add);
        return true;
    }
    let mut end = room;
    while !add.is_char_boundary(end) {
        end -= 1;
    }
    to.push_str(&add[..end]);
    false
}

/// What a request body asked of its answer's shape: JSON (`response_format` of type
/// `json_object` or `json_schema`) and tools (a non-empty `tools`). Read only for sampled
/// requests.
pub fn asked_of(body: &[u8]) -> Asked {
    #[derive(Deserialize)]
    struct Format<'a> {
        #[serde(borrow, rename = "type")]
        kind: Option<&'a str>,
    }
    /// The Responses API's `text: {format: {type}}`.
    #[derive(Deserialize)]
    struct Text<'a> {
        #[serde(borrow)]
        format: Option<Format<'a>>,
    }
    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(borrow)]
        response_format: Option<Format<'a>>,
        #[serde(borrow)]
        text: Option<Text<'a>>,
        tools: Option<Vec<serde::de::IgnoredAny>>,
    }
    let Ok(b) = serde_json::from_slice::<Body>(body) else {
        return Asked::default();
    };
    let format = b
        .response_format
        .or_else(|| b.text.and_then(|t| t.format))
        .and_then(|f| f.kind);
    Asked {
        json: matches!(format, Some("json_object" | "json_schema")),
        tools: b.tools.is_some_and(|t| !t.is_empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_stream_is_joined_with_its_tool_arguments_and_finish_reason() {
        let mut c = Capture::default();
        for p in [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":1,"delta":{"content":"other choice"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{\"a\""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":1}}"#,
            "not json",
        ] {
            c.sse_payload(p.as_bytes());
        }
        let a = c.answer();
        assert_eq!(a.text, "Hello");
        assert_eq!(a.finish_reason, Some("tool_calls"));
        assert_eq!(a.tool_arguments, ["{\"a\":1}".to_string()]);
    }

    #[test]
    fn whole_chat_and_completion_answers_are_read() {
        let mut chat = Capture::default();
        chat.json_body(
            br#"{"choices":[{"index":0,"message":{"content":"Hi there","tool_calls":null},"finish_reason":"stop"}]}"#,
        );
        assert_eq!(
            (chat.answer().text, chat.finish_reason()),
            ("Hi there", Some("stop"))
        );
        let mut completion = Capture::default();
        completion
            .json_body(br#"{"choices":[{"index":0,"text":"a b c","finish_reason":"length"}]}"#);
        assert_eq!(completion.answer().text, "a b c");
        assert_eq!(completion.finish_reason(), Some("length"));
    }

    #[test]
    fn text_is_bounded_and_a_cut_answer_is_not_checked_as_json() {
        let mut c = Capture::default();
        let big = format!(
            r#"{{"choices":[{{"index":0,"delta":{{"content":"{}"}}}}]}}"#,
            "é".repeat(MAX_TEXT)
        );
        c.sse_payload(big.as_bytes());
        c.sse_payload(big.as_bytes());
        assert!(c.answer().text.len() <= MAX_TEXT);
        let json = Asked {
            json: true,
            tools: true,
        };
        assert_eq!(c.checkable(json), Asked::default());
        assert_eq!(Capture::default().checkable(json), json);
    }

    #[test]
    fn the_request_says_what_it_asked_for() {
        let asked = asked_of(
            br#"{"model":"m","response_format":{"type":"json_object"},"tools":[{"type":"function"}]}"#,
        );
        assert!(asked.json && asked.tools);
        let plain = asked_of(br#"{"model":"m","response_format":{"type":"text"},"tools":[]}"#);
        assert_eq!(plain, Asked::default());
        assert_eq!(asked_of(b"[]"), Asked::default());
    }

    #[test]
    fn a_responses_stream_is_read_from_its_events() {
        let mut c = Capture::default();
        for p in [
            r#"{"type":"response.created","response":{"status":"in_progress"}}"#,
            r#"{"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":"Hel"}"#,
            r#"{"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":"lo"}"#,
            r#"{"type":"response.function_call_arguments.delta","output_index":1,"delta":"{\"a\""}"#,
            r#"{"type":"response.function_call_arguments.delta","output_index":1,"delta":":1}"}"#,
            r#"{"type":"response.output_text.done","output_index":0,"text":"Hello"}"#,
            r#"{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"message","content":[{"type":"output_text","text":"Hello"}]}]}}"#,
        ] {
            c.sse_payload(p.as_bytes());
        }
        let a = c.answer();
        // The final event's copy of the text is not added twice.
        assert_eq!(a.text, "Hello");
        assert_eq!(a.finish_reason, Some("length"));
        assert_eq!(a.tool_arguments, ["{\"a\":1}".to_string()]);
    }

    #[test]
    fn a_whole_responses_answer_is_read_from_its_output_items() {
        let mut c = Capture::default();
        c.json_body(
            br#"{"object":"response","status":"completed","output":[
                {"type":"reasoning","summary":[]},
                {"type":"message","role":"assistant","content":[{"type":"output_text","text":"I'm sorry"},{"type":"refusal","refusal":"no"}]},
                {"type":"function_call","name":"f","arguments":"{\"x\": 2"}]}"#,
        );
        let a = c.answer();
        assert_eq!(a.text, "I'm sorry");
        assert_eq!(a.finish_reason, Some("stop"));
        assert_eq!(a.tool_arguments, ["{\"x\": 2".to_string()]);
        let json = asked_of(br#"{"model":"m","input":"hi","text":{"format":{"type":"json_schema","name":"s","schema":{}}}}"#);
        assert!(json.json && !json.tools, "{json:?}");
    }

    /// A worker naming a new output item in every event cannot grow the capture: past the
    /// tool-call bound the answer is marked cut (not checked as JSON).
    #[test]
    fn a_worker_naming_endless_output_items_is_bounded() {
        let mut c = Capture::default();
        for i in 0..10_000 {
            let p = format!(
                r#"{{"type":"response.function_call_arguments.delta","output_index":{i},"delta":"{{}}"}}"#
            );
            c.sse_payload(p.as_bytes());
        }
        assert_eq!(c.call_items.len(), MAX_TOOL_CALLS);
        assert_eq!(c.tool_args.len(), MAX_TOOL_CALLS);
        assert_eq!(
            c.checkable(Asked {
                json: true,
                tools: true
            }),
            Asked::default()
        );
    }
}
