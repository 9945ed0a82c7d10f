//! The OpenAI request body a planned request becomes on the wire: what `infergate bench` sends,
//! and what the simulator's gateway stage validates, so both are checked on the same bytes.
//!
//! A replayed request carries its recorded features ([`TraceFeatures`]) again: `n`, logprobs
//! (chat `logprobs` + `top_logprobs`, completions `logprobs: k`), that many small function
//! tools with `tool_choice: "none"` (the answer stays text of the planned length),
//! `response_format` of the recorded type, and on chat that many `image_url` parts with a tiny
//! data URL. Completions have no place for images, and an unknown format type is not sent.

use serde_json::{Map, Value, json};

use super::model::PlannedRequest;
use super::plan::prompt_text;
use infergate::trace::TraceFeatures;
use infergate::trace::features::ResponseFormat;

/// A 1×1 PNG: the smallest real image an image part can carry.
const TINY_PNG: &str = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

/// The streaming body of `req` for `model`: chat (one user message) when `chat`, else a
/// completions prompt; `max_tokens` is the planned answer length, generated past EOS.
pub fn request_body(req: &PlannedRequest, model: &str, chat: bool) -> Value {
    let text = prompt_text(req);
    let mut body = json!({
        "model": model,
        "max_tokens": req.output_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
    });
    let features = req.features.as_ref();
    let images = features.map_or(0, |f| image_parts(f, chat).len());
    if chat && images > 0 {
        let mut content = vec![json!({"type": "text", "text": text})];
        content.extend(features.map(|f| image_parts(f, chat)).unwrap_or_default());
        body["messages"] = json!([{"role": "user", "content": content}]);
    } else if chat {
        body["messages"] = json!([{"role": "user", "content": text}]);
    } else {
        body["prompt"] = json!(text);
    }
    if let (Some(f), Value::Object(members)) = (features, &mut body) {
        members.extend(feature_members(f, chat));
    }
    body
}

/// The top-level members a request's features add (all but its image parts).
pub fn feature_members(f: &TraceFeatures, chat: bool) -> Map<String, Value> {
    let mut m = Map::new();
    if f.n > 1 {
        m.insert("n".into(), json!(f.n));
    }
    if f.logprobs {
        if chat {
            m.insert("logprobs".into(), json!(true));
            if f.top_logprobs > 0 {
                m.insert("top_logprobs".into(), json!(f.top_logprobs));
            }
        } else {
            m.insert("logprobs".into(), json!(f.top_logprobs));
        }
    }
    if f.tools > 0 {
        let tools: Vec<Value> = (0..f.tools)
            .map(|i| {
                json!({"type": "function", "function": {
                    "name": format!("replay_tool_{i}"),
                    "parameters": {"type": "object", "properties": {}},
                }})
            })
            .collect();
        m.insert("tools".into(), Value::Array(tools));
        // The engine answers in text either way; "none" says so, keeping the planned length.
        m.insert("tool_choice".into(), json!("none"));
    }
    let format = match f.response_format {
        Some(ResponseFormat::Text) => Some(json!({"type": "text"})),
        Some(ResponseFormat::JsonObject) => Some(json!({"type": "json_object"})),
        Some(ResponseFormat::JsonSchema) => Some(json!({"type": "json_schema", "json_schema": {
            "name": "replay", "schema": {"type": "object"},
        }})),
        Some(ResponseFormat::Other) | None => None,
    };
    if let Some(format) = format {
        m.insert("response_format".into(), format);
    }
    m
}

/// The image parts of a chat request's message (none on completions).
pub fn image_parts(f: &TraceFeatures, chat: bool) -> Vec<Value> {
    if !chat {
        return Vec::new();
    }
    (0..f.images)
        .map(|_| json!({"type": "image_url", "image_url": {"url": TINY_PNG}}))
        .collect()
}

/// Bytes the features add to a body, at most (the simulator's gateway stage bounds a body's
/// size without building it).
pub fn feature_bytes(f: &TraceFeatures, chat: bool) -> usize {
    let members = Value::Object(feature_members(f, chat)).to_string().len();
    let parts = Value::Array(image_parts(f, chat)).to_string().len();
    // The text part's own wrapping, besides.
    members + parts + 64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn planned(features: Option<TraceFeatures>) -> PlannedRequest {
        PlannedRequest {
            id: 0,
            at: Duration::ZERO,
            tenant: None,
            class: None,
            session: None,
            group: None,
            prompt: vec![1, 2, 3],
            output_tokens: 5,
            features,
        }
    }

    fn all() -> TraceFeatures {
        TraceFeatures {
            n: 2,
            logprobs: true,
            top_logprobs: 3,
            tools: 2,
            response_format: Some(ResponseFormat::JsonObject),
            images: 1,
        }
    }

    #[test]
    fn a_plain_request_has_no_feature_members() {
        let plain = request_body(&planned(None), "m", true);
        let mut keys: Vec<&str> = plain
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "ignore_eos",
                "max_tokens",
                "messages",
                "model",
                "stream",
                "stream_options"
            ]
        );
        assert!(plain["messages"][0]["content"].is_string());
        let default = request_body(&planned(Some(TraceFeatures::default())), "m", true);
        assert_eq!(default, plain);
    }

    #[test]
    fn a_chat_request_carries_every_feature() {
        let b = request_body(&planned(Some(all())), "m", true);
        assert_eq!(b["n"], 2);
        assert_eq!(
            (&b["logprobs"], &b["top_logprobs"]),
            (&json!(true), &json!(3))
        );
        assert_eq!(b["tools"].as_array().map(Vec::len), Some(2));
        assert_eq!(b["tool_choice"], "none");
        assert_eq!(b["response_format"]["type"], "json_object");
        let content = b["messages"][0]["content"].as_array().unwrap();
        assert_eq!(content.len(), 2);
        assert_eq!(content[0]["type"], "text");
        assert_eq!(content[1]["type"], "image_url");
        // What the engine reads of it is what was recorded.
        let engine = infergate_engine::flight::Features::of(b.as_object().unwrap(), true);
        assert!(engine.tools && engine.response_format);
        assert_eq!(engine.images, 1);
        // And what the gateway would record again.
        let bytes = b.to_string();
        let again = TraceFeatures::of_body(bytes.as_bytes(), 2, 1);
        assert_eq!(again, all());
        assert!(
            feature_bytes(&all(), true)
                >= bytes.len() - request_body(&planned(None), "m", true).to_string().len()
        );
    }

    #[test]
    fn a_completion_counts_its_logprobs_and_has_no_images() {
        let b = request_body(&planned(Some(all())), "m", false);
        assert_eq!(b["logprobs"], 3);
        assert!(b.get("top_logprobs").is_none());
        assert!(b["prompt"].is_string());
        let schema = TraceFeatures {
            response_format: Some(ResponseFormat::JsonSchema),
            ..TraceFeatures::default()
        };
        let b = request_body(&planned(Some(schema)), "m", false);
        assert_eq!(b["response_format"]["type"], "json_schema");
        let other = TraceFeatures {
            response_format: Some(ResponseFormat::Other),
            ..TraceFeatures::default()
        };
        assert!(
            request_body(&planned(Some(other)), "m", false)
                .get("response_format")
                .is_none()
        );
    }
}
