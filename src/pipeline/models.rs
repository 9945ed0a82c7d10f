//! `GET /v1/models` and `GET /v1/models/{model}`: the models this gateway routes, in OpenAI's
//! shapes.

use hyper::{Response, StatusCode};

use crate::error::{GatewayError, ResBody, json_response};
use crate::gateway::{Gateway, Live};

/// The models clients may name, in OpenAI's model shape. A model that only serves as another
/// model's non-stable version is reached through the split, not asked for directly (unless the
/// config says `direct: true`): it is neither listed nor retrievable.
fn listed_models(live: &Live) -> impl Iterator<Item = serde_json::Value> + '_ {
    let created = crate::utc::now_ms() / 1000;
    live.snapshot
        .models
        .iter()
        .filter(|m| m.direct || !live.snapshot.is_version_only(&m.name))
        .map(move |m| {
            serde_json::json!({
                "id": m.name, "object": "model", "created": created, "owned_by": "infergate",
            })
        })
}

/// `GET /v1/models/{model}`: one model in OpenAI's shape; 404 in OpenAI's error shape for a model
/// that is not listed.
pub(super) fn model(gw: &Gateway, id: &str) -> Result<Response<ResBody>, GatewayError> {
    let live = gw.live();
    let found = listed_models(&live).find(|m| m["id"] == id);
    match found {
        Some(m) => Ok(json_response(StatusCode::OK, m.to_string())),
        None => Err(GatewayError::NotFound(format!(
            "The model `{id}` does not exist or you do not have access to it."
        ))),
    }
}

/// `GET /v1/models`: the models this gateway routes, in OpenAI's list shape.
pub(super) fn models(gw: &Gateway) -> Response<ResBody> {
    let live = gw.live();
    let data: Vec<serde_json::Value> = listed_models(&live).collect();
    json_response(
        StatusCode::OK,
        serde_json::json!({"object": "list", "data": data}).to_string(),
    )
}
