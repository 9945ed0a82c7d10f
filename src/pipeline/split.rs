//! Split: when the model has versions (a canary), one is picked by the sticky key and the
//! request is pointed at that version's model and pool.

use std::sync::Arc;
use std::time::Instant;

use crate::error::GatewayError;
use crate::gateway::Live;
use crate::pipeline::validate::request::ValidRequest;

/// The version a request was split to, and where to report how it went.
#[derive(Clone)]
pub(super) struct VersionChoice {
    pub(super) model: String,
    /// The model name of the version (its price is looked up first).
    pub(super) served_model: String,
    pub(super) index: usize,
    pub(super) name: String,
    pub(super) canary: Arc<std::sync::Mutex<crate::canary::Canary>>,
}

impl VersionChoice {
    pub(super) fn count(&self, metrics: &crate::metrics::GatewayMetrics, outcome: &str) {
        metrics
            .version_requests
            .with_label_values(&[&self.model, &self.name, outcome])
            .inc();
    }

    pub(super) fn record(
        &self,
        metrics: &crate::metrics::GatewayMetrics,
        ok: bool,
        ttft: Option<std::time::Duration>,
        max_itl: Option<std::time::Duration>,
    ) {
        self.count(metrics, if ok { "ok" } else { "error" });
        if let Ok(mut c) = self.canary.lock() {
            c.record(self.index, ok, ttft, max_itl, Instant::now());
        }
    }
}

/// Split: when the model has versions, picks one by the sticky key (session, else user, else
/// the request itself; or as the spec says) and points the request at that version's model and
/// pool.
pub(super) fn split(
    live: &Live,
    valid: &mut ValidRequest,
    (tenant, request_id): (&str, &str),
) -> Result<Option<VersionChoice>, GatewayError> {
    let (Some(spec), Some(canary)) = (
        live.snapshot.canaries.get(&valid.model),
        live.canaries.get(&valid.model),
    ) else {
        return Ok(None);
    };
    let sticky = spec.sticky.pick(
        (valid.session_id.as_deref(), valid.user.as_deref()),
        Some(request_id),
        Some(tenant),
    );
    let key = crate::canary::key_of(sticky.unwrap_or(tenant));
    let (index, name, model) = {
        let c = canary
            .lock()
            .map_err(|_| GatewayError::Internal("canary state poisoned".into()))?;
        let index = c.choose(key);
        (
            index,
            c.name(index).unwrap_or_default().to_string(),
            c.model(index).unwrap_or_default().to_string(),
        )
    };
    let route = live
        .snapshot
        .model(&model)
        .ok_or_else(|| GatewayError::Internal(format!("version model `{model}` missing")))?;
    if route.upstream_name() != valid.model || route.pool != valid.pool {
        valid.body.set_string("model", route.upstream_name());
        valid.pool = route.pool;
    }
    let choice = VersionChoice {
        model: valid.model.clone(),
        served_model: model,
        index,
        name,
        canary: canary.clone(),
    };
    Ok(Some(choice))
}
