//! Shadow: a sampled share of a model's requests is mirrored to its shadow model's pool; the
//! client never waits for it, and the two answers are compared into metrics.

use std::sync::Arc;

use crate::gateway::{Gateway, Live};
use crate::pipeline::validate::request::{Endpoint, ValidRequest};

/// Starts the shadow copy of a request when its model has a shadow and the request is sampled;
/// returns where to report the client's own outcome. Any failure here only skips the shadow.
pub(super) fn mirror(
    gw: &Arc<Gateway>,
    live: &Live,
    valid: &ValidRequest,
    endpoint: Endpoint,
    request_id: &str,
) -> Option<tokio::sync::oneshot::Sender<crate::shadow::PrimaryOutcome>> {
    let shadow = live.shadows.get(&valid.model)?;
    if !shadow.sampled(request_id) {
        return None;
    }
    let route = live.snapshot.model(&shadow.spec.model)?;
    let pool = live.pools.get(route.pool)?.clone();
    let model = serde_json::Value::from(route.upstream_name()).to_string();
    // Read whole: the comparison needs the usage, not the stream.
    let mut edits = vec![("model", model), ("stream", "false".to_string())];
    if valid.body.has("stream_options") {
        edits.push(("stream_options", "null".to_string()));
    }
    let body = valid.body.bytes_with(&edits);
    shadow.mirror(
        gw.client.clone(),
        pool,
        body,
        endpoint.path(),
        gw.metrics.clone(),
        valid.model.clone(),
    )
}
