//! The features of a request that change how an engine runs it (`n`, logprobs, tools,
//! `response_format`, image parts), as the gateway saw them in the validated request: kept in
//! the trace line (`features`) so a replay (`bench --replay`, `sim --replay`) sends them again,
//! also for a request no engine answered. Every member is a small bounded number or a named
//! type, never the client's text. Read only for traced requests, after validation.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Most alternatives per token a line records (the engine's own bound,
/// `infergate_engine::logprobs::MAX_TOP_LOGPROBS`; a larger ask is refused upstream anyway).
pub const MAX_TOP_LOGPROBS: u32 = infergate_engine::logprobs::MAX_TOP_LOGPROBS as u32;
/// Most tools a line records.
pub const MAX_TOOLS: u32 = 128;
/// Most image parts a line records.
pub const MAX_IMAGES: u32 = 64;
/// Most choices (OpenAI's bound on `n`, which `validate` enforces).
pub const MAX_N: u32 = 128;

/// The request's `response_format.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseFormat {
    /// `{"type": "text"}`.
    Text,
    /// `{"type": "json_object"}`.
    JsonObject,
    /// `{"type": "json_schema", ...}`.
    JsonSchema,
    /// Any other type (or none named).
    #[serde(other)]
    Other,
}

/// What a request asked for that changes the engine's execution path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TraceFeatures {
    /// Choices asked for (`n`; 1 when not given).
    pub n: u32,
    /// Logprobs asked for (chat `logprobs: true`, completions `logprobs: k`).
    pub logprobs: bool,
    /// Alternatives per token (chat `top_logprobs`, completions `logprobs`); 0 with none.
    pub top_logprobs: u32,
    /// Tools given (the length of `tools`).
    pub tools: u32,
    /// `response_format`'s type, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// Image (and other non-text) parts of the messages.
    pub images: u32,
}

impl Default for TraceFeatures {
    fn default() -> Self {
        Self {
            n: 1,
            logprobs: false,
            top_logprobs: 0,
            tools: 0,
            response_format: None,
            images: 0,
        }
    }
}

/// The body members read, as raw slices (everything else is skipped unread).
#[derive(Deserialize)]
struct Members<'a> {
    #[serde(default, borrow)]
    logprobs: Option<&'a RawValue>,
    #[serde(default, borrow)]
    top_logprobs: Option<&'a RawValue>,
    #[serde(default, borrow)]
    tools: Option<&'a RawValue>,
    #[serde(default, borrow)]
    response_format: Option<&'a RawValue>,
}

/// `response_format`'s `type`.
#[derive(Deserialize)]
struct Format<'a> {
    #[serde(default, borrow, rename = "type")]
    kind: Option<&'a str>,
}

/// A member's JSON, when given and not `null`.
fn raw(r: Option<&RawValue>) -> Option<&str> {
    r.map(RawValue::get).filter(|v| *v != "null")
}

/// A member that is a whole number, within the logprobs bound.
fn count(r: Option<&RawValue>) -> Option<u32> {
    let k = serde_json::from_str::<u64>(raw(r)?).ok()?;
    Some(u32::try_from(k).unwrap_or(u32::MAX).min(MAX_TOP_LOGPROBS))
}

impl TraceFeatures {
    /// The features of a validated request's `body` (the client's bytes), whose `n` and
    /// non-text parts `validate` already counted. A member of an unexpected type counts as
    /// not given (the engine, not the trace, judges it).
    pub fn of_body(body: &[u8], n: u32, images: u32) -> Self {
        let mut f = Self {
            n: n.clamp(1, MAX_N),
            images: images.min(MAX_IMAGES),
            ..Self::default()
        };
        let Ok(m) = serde_json::from_slice::<Members>(body) else {
            return f;
        };

        // Chat: a boolean and `top_logprobs`; completions: the count itself.
        match raw(m.logprobs) {
            Some("true") => {
                f.logprobs = true;
                f.top_logprobs = count(m.top_logprobs).unwrap_or(0);
            }
            Some(_) => {
                if let Some(k) = count(m.logprobs) {
                    f.logprobs = true;
                    f.top_logprobs = k;
                }
            }
            None => {}
        }
        if let Some(tools) =
            raw(m.tools).and_then(|t| serde_json::from_str::<Vec<serde::de::IgnoredAny>>(t).ok())
        {
            f.tools = u32::try_from(tools.len())
                .unwrap_or(u32::MAX)
                .min(MAX_TOOLS);
        }
        f.response_format = raw(m.response_format).map(|r| {
            match serde_json::from_str::<Format>(r).ok().and_then(|x| x.kind) {
                Some("text") => ResponseFormat::Text,
                Some("json_object") => ResponseFormat::JsonObject,
                Some("json_schema") => ResponseFormat::JsonSchema,
                _ => ResponseFormat::Other,
            }
        });
        f
    }

    /// Whether the request asked for none of them (one choice, no logprobs, tools, format
    /// or images): a replay sends it as a plain request.
    pub fn is_plain(&self) -> bool {
        *self == Self::default()
    }

    /// These features, each within its bound (a trace file may have been edited).
    pub fn bounded(self) -> Self {
        Self {
            n: self.n.clamp(1, MAX_N),
            top_logprobs: self.top_logprobs.min(MAX_TOP_LOGPROBS),
            tools: self.tools.min(MAX_TOOLS),
            images: self.images.min(MAX_IMAGES),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(body: &str) -> TraceFeatures {
        TraceFeatures::of_body(body.as_bytes(), 1, 0)
    }

    #[test]
    fn chat_and_completions_features_are_read_from_the_body() {
        let chat = of(r#"{"model":"m","logprobs":true,"top_logprobs":3,
            "tools":[{"type":"function"},{"type":"function"}],"response_format":{"type":"json_object"},
            "messages":[{"role":"user","content":"hi"}]}"#);
        assert!(chat.logprobs);
        assert_eq!((chat.top_logprobs, chat.tools), (3, 2));
        assert_eq!(chat.response_format, Some(ResponseFormat::JsonObject));
        let completion = of(r#"{"model":"m","prompt":"x","logprobs":5}"#);
        assert!(completion.logprobs);
        assert_eq!(completion.top_logprobs, 5);
        assert!(of(r#"{"model":"m","prompt":"x"}"#).is_plain());
        assert!(of(r#"{"logprobs":false,"tools":[],"response_format":null}"#).is_plain());
        let off = of(r#"{"logprobs":false,"tools":null}"#);
        assert!(off.is_plain(), "{off:?}");
        let schema = of(r#"{"response_format":{"type":"json_schema","json_schema":{}}}"#);
        assert_eq!(schema.response_format, Some(ResponseFormat::JsonSchema));
        let odd = of(r#"{"response_format":{"type":7}}"#);
        assert_eq!(odd.response_format, Some(ResponseFormat::Other));
    }

    #[test]
    fn counts_are_bounded_and_odd_members_ignored() {
        let big = TraceFeatures::of_body(br#"{"logprobs":true,"top_logprobs":99999}"#, 500, 900);
        assert_eq!(
            (big.n, big.images, big.top_logprobs),
            (MAX_N, MAX_IMAGES, MAX_TOP_LOGPROBS)
        );
        let odd = of(r#"{"logprobs":"yes","tools":{"a":1},"top_logprobs":-1}"#);
        assert!(odd.is_plain(), "{odd:?}");
        let plain = TraceFeatures {
            n: 2,
            images: 1,
            ..TraceFeatures::default()
        };
        assert_eq!(TraceFeatures::of_body(b"not json", 2, 1), plain);
        let edited = TraceFeatures {
            n: 0,
            tools: 10_000,
            ..TraceFeatures::default()
        }
        .bounded();
        assert_eq!((edited.n, edited.tools), (1, MAX_TOOLS));
    }

    #[test]
    fn a_line_member_round_trips_and_old_lines_default() {
        let f = TraceFeatures {
            n: 2,
            logprobs: true,
            top_logprobs: 2,
            tools: 1,
            response_format: Some(ResponseFormat::JsonObject),
            images: 1,
        };
        let json = serde_json::to_string(&f).unwrap();
        assert!(
            json.contains(r#""response_format":"json_object""#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<TraceFeatures>(&json).unwrap(), f);
        let old: TraceFeatures = serde_json::from_str(r#"{"response_format":"xml"}"#).unwrap();
        assert_eq!(old.response_format, Some(ResponseFormat::Other));
        assert_eq!(old.n, 1);
    }
}
