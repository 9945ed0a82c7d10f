//! Log-probabilities on the wire: the legacy completions shape (`tokens`, `token_logprobs`,
//! `top_logprobs`, `text_offset`) and the chat shape (`content: [{token, logprob, bytes,
//! top_logprobs}]`), from per-token entries that already carry their text.

use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};

/// What OpenAI and vLLM send for a log-probability of `-inf`, which JSON cannot carry.
const FLOOR: f32 = -9999.0;

/// One alternative at a position.
#[derive(Debug, Clone, PartialEq)]
pub struct TopEntry {
    /// The token's text (lossy where it is part of a UTF-8 character).
    pub token: String,
    /// The token's exact bytes.
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
}

/// The log-probability of one token of a choice (prompt or generated).
#[derive(Debug, Clone, PartialEq)]
pub struct LogprobEntry {
    /// The token's text (lossy where it is part of a UTF-8 character).
    pub token: String,
    /// The token's exact bytes.
    pub bytes: Vec<u8>,
    /// Its log-probability; `None` for the first prompt token, which has no context.
    pub logprob: Option<f32>,
    /// The most likely tokens at this position, most likely first.
    pub top: Vec<TopEntry>,
    /// Offset in characters of this token's text in the choice's text.
    pub text_offset: usize,
}

/// A finite number JSON can carry: `-inf` and NaN become OpenAI's floor of -9999.
fn wire(x: f32) -> f32 {
    if x.is_finite() { x.max(FLOOR) } else { FLOOR }
}

/// `choice.logprobs` of `/v1/completions`.
pub struct CompletionLogprobs<'a>(pub &'a [LogprobEntry]);

/// One `top_logprobs` map: token text → logprob, most likely first (JSON objects keep the
/// order they are written in). Two tokens with the same text keep the likelier one.
struct TopMap<'a>(&'a [TopEntry]);

impl Serialize for TopMap<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seen: Vec<&str> = Vec::with_capacity(self.0.len());
        let mut map = s.serialize_map(None)?;
        for t in self.0 {
            if seen.contains(&t.token.as_str()) {
                continue;
            }
            seen.push(&t.token);
            map.serialize_entry(&t.token, &wire(t.logprob))?;
        }
        map.end()
    }
}

impl Serialize for CompletionLogprobs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let entries = self.0;
        let offsets: Vec<usize> = entries.iter().map(|e| e.text_offset).collect();
        let logprobs: Vec<Option<f32>> = entries.iter().map(|e| e.logprob.map(wire)).collect();
        let tokens: Vec<&str> = entries.iter().map(|e| e.token.as_str()).collect();
        // The first prompt token has no distribution, so no alternatives either.
        let tops: Vec<Option<TopMap<'_>>> = entries
            .iter()
            .map(|e| e.logprob.map(|_| TopMap(&e.top)))
            .collect();
        let mut st = s.serialize_struct("CompletionLogprobs", 4)?;
        st.serialize_field("text_offset", &offsets)?;
        st.serialize_field("token_logprobs", &logprobs)?;
        st.serialize_field("tokens", &tokens)?;
        st.serialize_field("top_logprobs", &tops)?;
        st.end()
    }
}

/// `choice.logprobs` of `/v1/chat/completions`.
pub struct ChatLogprobs<'a>(pub &'a [LogprobEntry]);

#[derive(Serialize)]
struct ChatTop<'a> {
    token: &'a str,
    logprob: f32,
    bytes: &'a [u8],
}

#[derive(Serialize)]
struct ChatToken<'a> {
    token: &'a str,
    logprob: f32,
    bytes: &'a [u8],
    top_logprobs: Vec<ChatTop<'a>>,
}

#[derive(Serialize)]
struct ChatContent<'a> {
    content: Vec<ChatToken<'a>>,
}

impl Serialize for ChatLogprobs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let content = self
            .0
            .iter()
            .map(|e| ChatToken {
                token: &e.token,
                logprob: e.logprob.map_or(FLOOR, wire),
                bytes: &e.bytes,
                top_logprobs: e
                    .top
                    .iter()
                    .map(|t| ChatTop {
                        token: &t.token,
                        logprob: wire(t.logprob),
                        bytes: &t.bytes,
                    })
                    .collect(),
            })
            .collect();
        ChatContent { content }.serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn entry(
        token: &str,
        logprob: Option<f32>,
        top: &[(&str, f32)],
        offset: usize,
    ) -> LogprobEntry {
        LogprobEntry {
            token: token.to_owned(),
            bytes: token.as_bytes().to_vec(),
            logprob,
            top: top
                .iter()
                .map(|&(t, l)| TopEntry {
                    token: t.to_owned(),
                    bytes: t.as_bytes().to_vec(),
                    logprob: l,
                })
                .collect(),
            text_offset: offset,
        }
    }

    #[test]
    fn completions_shape_keeps_order_and_floors_minus_infinity() {
        let entries = [
            entry("The", None, &[], 0),
            entry(" cat", Some(-1.5), &[(" dog", -0.5), (" cat", -1.5)], 3),
            entry(
                " sat",
                Some(f32::NEG_INFINITY),
                &[(" a", -0.1), (" a", -0.2)],
                7,
            ),
        ];
        let text = serde_json::to_string(&CompletionLogprobs(&entries)).unwrap();
        // Written most likely first, not alphabetically.
        assert!(text.contains(r#"{" dog":-0.5," cat":-1.5}"#), "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["tokens"], json!(["The", " cat", " sat"]));
        assert_eq!(v["text_offset"], json!([0, 3, 7]));
        assert_eq!(v["token_logprobs"], json!([null, -1.5, -9999.0]));
        assert!(v["top_logprobs"][0].is_null());
        assert_eq!(
            v["top_logprobs"][2],
            json!({" a": -0.1}),
            "duplicates keep the first"
        );
    }

    #[test]
    fn chat_shape_has_bytes_and_top_lists() {
        let entries = [entry("Hi", Some(-0.25), &[("Hi", -0.25), ("Hey", -2.0)], 0)];
        let v = serde_json::to_value(ChatLogprobs(&entries)).unwrap();
        let c = &v["content"][0];
        assert_eq!(c["token"], "Hi");
        assert_eq!(c["logprob"], -0.25);
        assert_eq!(c["bytes"], json!([72, 105]));
        assert_eq!(c["top_logprobs"][1]["token"], "Hey");
        assert_eq!(c["top_logprobs"][1]["bytes"], json!([72, 101, 121]));
        assert_eq!(v.as_object().unwrap().len(), 1);
    }
}
