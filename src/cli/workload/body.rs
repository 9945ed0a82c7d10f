//! The OpenAI request body a planned request becomes on the wire: what `infergate bench` sends,
//! and what the simulator's gateway stage validates, so both are checked on the same bytes.

use serde_json::{Value, json};

use super::model::PlannedRequest;
use super::plan::prompt_text;

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
    if chat {
        body["messages"] = json!([{"role": "user", "content": text}]);
    } else {
        body["prompt"] = json!(text);
    }
    body
}
