//! The validate phase: turns a raw body into a `ValidRequest` that carries what later phases need
//! (target pool, stream flag, routing features). Only a `ValidRequest` can be routed. Cheap checks
//! only; engines validate sampling parameters themselves and their 400s pass through.

use hyper::HeaderMap;
use hyper::body::Bytes;
use serde_json::Value;

use crate::config::Snapshot;
use crate::error::GatewayError;
use crate::routing::RequestFeatures;
use crate::routing::features::{
    DEFAULT_BLOCK_BYTES, canonical_chat, canonical_completion, prefix_hashes, session_hash,
};

/// Most prefix blocks hashed per request (64 KiB of prompt at the default block size).
const MAX_PREFIX_BLOCKS: usize = 256;

/// Which OpenAI endpoint a request targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    ChatCompletions,
}

impl Endpoint {
    /// The path to call on the worker.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::ChatCompletions => "/v1/chat/completions",
        }
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
    /// Body to send upstream (model renamed when the route says so).
    pub body: Bytes,
    /// Routing inputs.
    pub features: RequestFeatures,
}

/// Validates `body` for `endpoint` against the snapshot's models.
pub fn validate(
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Bytes,
    snapshot: &Snapshot,
) -> Result<ValidRequest, GatewayError> {
    let mut json: Value = serde_json::from_slice(&body)
        .map_err(|e| GatewayError::bad_request(format!("invalid JSON body: {e}"), None))?;
    let obj = json
        .as_object_mut()
        .ok_or_else(|| GatewayError::bad_request("the body must be a JSON object", None))?;
    let model = match obj.get("model") {
        Some(Value::String(m)) => m.clone(),
        Some(_) => {
            return Err(GatewayError::bad_request(
                "`model` must be a string",
                Some("model"),
            ));
        }
        None => {
            return Err(GatewayError::bad_request(
                "`model` is required",
                Some("model"),
            ));
        }
    };
    let route = snapshot
        .model(&model)
        .ok_or_else(|| GatewayError::NotFound(format!("The model `{model}` does not exist.")))?;
    let stream = matches!(obj.get("stream"), Some(Value::Bool(true)));
    let canonical = match endpoint {
        Endpoint::ChatCompletions => {
            let messages = obj
                .get("messages")
                .and_then(Value::as_array)
                .ok_or_else(|| {
                    GatewayError::bad_request(
                        "`messages` must be a non-empty array",
                        Some("messages"),
                    )
                })?;
            let flat: Vec<(String, String)> = messages
                .iter()
                .map(|m| {
                    let role = m
                        .get("role")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    (role, content_text(m.get("content")))
                })
                .collect();
            let pairs: Vec<(&str, &str)> =
                flat.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
            canonical_chat(&pairs)
        }
        Endpoint::Completions => match obj.get("prompt") {
            Some(Value::String(p)) => canonical_completion(p),
            Some(Value::Array(items)) => {
                // A token-id prompt: hash the ids' decimal text so equal prompts still match.
                let text = items
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(" ");
                canonical_completion(&text)
            }
            _ => {
                return Err(GatewayError::bad_request(
                    "`prompt` must be a string or an array",
                    Some("prompt"),
                ));
            }
        },
    };
    let session = headers
        .get("x-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| obj.get("user").and_then(Value::as_str).map(str::to_owned));
    let features = RequestFeatures {
        prefix_hashes: prefix_hashes(&canonical, DEFAULT_BLOCK_BYTES, MAX_PREFIX_BLOCKS),
        session_key: session.as_deref().map(session_hash),
    };
    let pool = route.pool;
    let body = match route.upstream_model.as_deref() {
        Some(up) if up != model => {
            obj.insert("model".into(), Value::String(up.to_string()));
            Bytes::from(
                serde_json::to_vec(&json).map_err(|e| GatewayError::Internal(e.to_string()))?,
            )
        }
        _ => body,
    };
    Ok(ValidRequest {
        endpoint,
        model,
        pool,
        stream,
        body,
        features,
    })
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
