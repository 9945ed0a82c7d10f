//! Admin endpoints on their own listener (loopback by default, or behind an admin key):
//! `GET /admin/status` (config, reload outcome, workers) and `POST /admin/reload`.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use infergate_engine::edge::{BodyLimits, LimitedBody};
use serde_json::json;

use crate::error::{GatewayError, ResBody, json_response};
use crate::gateway::Gateway;
use crate::usage_api::UsageRoute;

/// `GET /healthz` and `GET /readyz` on the admin listener (no admin key: probes carry none),
/// answered without leaving the admin thread; `None` for every other route.
pub fn probe<B>(gw: &Gateway, req: &Request<B>) -> Option<Response<ResBody>> {
    if req.method() != Method::GET {
        return None;
    }
    match req.uri().path() {
        "/healthz" => Some(json_response(StatusCode::OK, "{\"status\":\"ok\"}")),
        "/readyz" => Some(if gw.is_ready() {
            json_response(StatusCode::OK, "{\"ready\":true}")
        } else {
            json_response(StatusCode::SERVICE_UNAVAILABLE, "{\"ready\":false}")
        }),
        _ => None,
    }
}

/// An admin request as the edge layers pass it on: its body bounded by [`body_limits`].
pub type AdminRequest = Request<LimitedBody<Incoming>>;

/// The bounds of an admin request's body: 64 KiB (every admin body is a small JSON object),
/// within the public listener's `limits.body_read_timeout`.
pub fn body_limits(gw: &Gateway) -> BodyLimits {
    BodyLimits {
        max_bytes: 64 * 1024,
        timeout: gw.live().snapshot.connections.body_read_timeout,
    }
}

/// Serves one admin request.
pub async fn handle(gw: Arc<Gateway>, req: AdminRequest) -> Response<ResBody> {
    // The dashboard page is static and holds no data: a browser cannot send the admin key on
    // navigation, so the page asks for it and sends it with every data call.
    if req.method() == Method::GET && req.uri().path() == "/admin/dashboard" {
        return crate::dashboard::page();
    }
    let live = gw.live();
    if let Some(key) = &live.snapshot.admin.api_key {
        let given = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
            return GatewayError::Unauthorized(
                "admin key required: send `Authorization: Bearer <admin key>`".into(),
            )
            .into_response();
        }
    }
    drop(live);
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/admin/status") => status(&gw),
        // Also here, so Prometheus can scrape the admin port (behind the admin key, if set).
        (&Method::GET, "/metrics") => {
            let mut r = json_response(StatusCode::OK, gw.render_metrics());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        (&Method::POST, "/admin/reload") => match gw.reload().await {
            Ok(()) => json_response(StatusCode::OK, json!({"reloaded": true}).to_string()),
            Err(errors) => json_response(
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({"reloaded": false, "errors": errors.0.iter().map(|e| e.to_string()).collect::<Vec<_>>()}).to_string(),
            ),
        },
        (&Method::GET, "/admin/usage") => {
            crate::usage_api::usage(&gw, UsageRoute::Json, req.uri().query()).await
        }
        (&Method::GET, "/admin/usage.csv") => {
            crate::usage_api::usage(&gw, UsageRoute::Csv, req.uri().query()).await
        }
        (&Method::GET, "/admin/usage/daily") => {
            crate::usage_api::usage(&gw, UsageRoute::Daily, req.uri().query()).await
        }
        (&Method::GET, "/admin/budgets") => crate::usage_api::budgets(&gw, req.uri().query()),
        (&Method::GET, "/admin/canary") => canary_status(&gw),
        (&Method::POST, path) if path.starts_with("/admin/canary/") => {
            let op = path.trim_start_matches("/admin/canary/").to_string();
            canary_op(&gw, req, &op).await
        }
        (&Method::GET, "/admin/degradation") => degradation_status(&gw),
        (&Method::POST, "/admin/degradation/force" | "/admin/degradation/release") => {
            let release = req.uri().path().ends_with("release");
            degradation_override(&gw, req, release).await
        }
        (&Method::POST, "/admin/drain") => {
            gw.start_drain();
            json_response(StatusCode::OK, json!({"draining": true}).to_string())
        }
        _ => GatewayError::NotFound("unknown admin route".into()).into_response(),
    }
}

fn canary_status(gw: &Gateway) -> Response<ResBody> {
    let live = gw.live();
    let models: serde_json::Map<String, serde_json::Value> = live
        .canaries
        .iter()
        .filter_map(|(model, c)| {
            let status = c.lock().ok()?.status();
            Some((model.clone(), serde_json::to_value(status).ok()?))
        })
        .collect();
    json_response(StatusCode::OK, json!({ "models": models }).to_string())
}

/// `POST /admin/canary/{weights|pause|resume|promote|rollback}` with `{"model", ...}`; the
/// kill switch (`rollback`) wins over the automated analysis until `resume` or `weights`.
async fn canary_op(gw: &Gateway, req: AdminRequest, op: &str) -> Response<ResBody> {
    let v = match read_json(req).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let Some(model) = v.get("model").and_then(|m| m.as_str()) else {
        return GatewayError::bad_request("`model` is required", Some("model")).into_response();
    };
    let live = gw.live();
    let Some(canary) = live.canaries.get(model) else {
        return GatewayError::NotFound(format!("model `{model}` has no versions")).into_response();
    };
    let decision = {
        let Ok(mut c) = canary.lock() else {
            return GatewayError::Internal("canary state poisoned".into()).into_response();
        };
        match op {
            "pause" => {
                c.pause();
                Ok(None)
            }
            "resume" => {
                c.resume();
                Ok(None)
            }
            "promote" => c.promote().map(Some),
            "rollback" => {
                let reason = v
                    .get("reason")
                    .and_then(|r| r.as_str())
                    .unwrap_or("admin kill switch");
                Ok(Some(c.rollback(reason)))
            }
            "weights" => {
                let weights: Vec<(String, u32)> = v
                    .get("weights")
                    .and_then(|w| w.as_object())
                    .map(|o| {
                        o.iter()
                            .filter_map(|(k, w)| {
                                Some((k.clone(), u32::try_from(w.as_u64()?).ok()?))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                c.set_weights(&weights).map(|()| None)
            }
            _ => {
                return GatewayError::NotFound(format!("unknown canary operation `{op}`"))
                    .into_response();
            }
        }
    };
    match decision {
        Ok(d) => {
            match &d {
                Some(d) => gw.record_decision(model, canary, d),
                None => gw.publish_weights(model, canary),
            }
            canary_status(gw)
        }
        Err(e) => GatewayError::bad_request(e, None).into_response(),
    }
}

async fn read_json(req: AdminRequest) -> Result<serde_json::Value, GatewayError> {
    let body = infergate_engine::edge::body_limit::read_to_bytes(req.into_body()).await?;
    serde_json::from_slice(&body)
        .map_err(|e| GatewayError::bad_request(format!("invalid JSON body: {e}"), None))
}

fn degradation_status(gw: &Gateway) -> Response<ResBody> {
    let live = gw.live();
    let pools: Vec<_> = live
        .pools
        .iter()
        .map(|p| {
            let st = p.degrade.status();
            let sig = &st.signals;
            json!({
                "pool": p.name, "level": st.level, "name": st.name, "forced": st.forced,
                "levels": st.levels, "transitions": st.transitions,
                "signals": {
                    "queue_depth": sig.queue_depth,
                    "queue_wait_p95_s": sig.queue_wait_p95.map(|d| d.as_secs_f64()),
                    "kv_usage": sig.kv_usage,
                    "ttft_p95_s": sig.ttft_p95.map(|d| d.as_secs_f64()),
                    "samples": sig.samples,
                },
            })
        })
        .collect();
    json_response(StatusCode::OK, json!({ "pools": pools }).to_string())
}

/// `POST /admin/degradation/force {"pool", "level"}` and `.../release {"pool"}`: the admin
/// override wins over the automation until released.
async fn degradation_override(gw: &Gateway, req: AdminRequest, release: bool) -> Response<ResBody> {
    let v = match read_json(req).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let Some(pool_name) = v.get("pool").and_then(|p| p.as_str()) else {
        return GatewayError::bad_request("`pool` is required", Some("pool")).into_response();
    };
    let level = if release {
        None
    } else {
        match v.get("level").and_then(|l| l.as_u64()) {
            Some(l) => Some(l as usize),
            None => {
                return GatewayError::bad_request(
                    "`level` (a whole number) is required",
                    Some("level"),
                )
                .into_response();
            }
        }
    };
    let live = gw.live();
    let Some(pool) = live.pools.iter().find(|p| p.name == pool_name) else {
        return GatewayError::NotFound(format!("no pool `{pool_name}`")).into_response();
    };
    match pool.degrade.force(level) {
        Ok(transition) => {
            if let Some(t) = &transition {
                gw.record_transition(&pool.name, t);
            }
            let st = pool.degrade.status();
            json_response(
                StatusCode::OK,
                json!({"pool": pool.name, "level": st.level, "forced": st.forced}).to_string(),
            )
        }
        Err(e) => GatewayError::bad_request(e, Some("level")).into_response(),
    }
}

fn status(gw: &Gateway) -> Response<ResBody> {
    let live = gw.live();
    let reload = gw.reload_status();
    let pools: Vec<_> = live
        .pools
        .iter()
        .map(|p| {
            let workers: Vec<_> = p
                .workers()
                .iter()
                .map(|w| {
                    let v = w.view();
                    json!({"url": w.url, "healthy": v.healthy, "in_flight": v.in_flight,
                           "waiting": v.waiting, "running": v.running, "kv_usage": v.kv_usage,
                           "ejections": w.ejections()})
                })
                .collect();
            json!({"name": p.name, "policy": format!("{:?}", p.policy().config), "workers": workers,
                   "admission": admission_status(&p.admission.1)})
        })
        .collect();
    let models: Vec<_> = live
        .snapshot
        .models
        .iter()
        .map(|m| json!({"name": m.name, "pool": live.snapshot.pools.get(m.pool).map(|p| p.name.clone())}))
        .collect();
    json_response(
        StatusCode::OK,
        json!({
            "ready": gw.is_ready(),
            "draining": gw.is_draining(),
            "reloads": {"ok": reload.ok, "failed": reload.failed, "last_error": reload.last_error},
            "models": models,
            "pools": pools,
        })
        .to_string(),
    )
}

/// A pool's queue for `/admin/status`: depth, slots held, Jain's index over the tenants it kept
/// waiting whole windows (`admission::jain`: the last window, mean and least) and, with fair
/// share, the weights and each backlogged tenant's weighted service (`counter`) and waiters,
/// least served first.
fn admission_status(queue: &crate::admission::AdmissionQueue) -> serde_json::Value {
    let fair = queue.fair_share().map(|w| {
        let backlogged: Vec<_> = queue
            .fair_backlog()
            .unwrap_or_default()
            .into_iter()
            .map(|(tenant, counter, waiting)| {
                json!({"tenant": tenant.as_ref(), "counter": counter, "waiting": waiting})
            })
            .collect();
        json!({"input_weight": w.input, "output_weight": w.output,
               "locality_window": w.locality_window, "backlogged": backlogged})
    });
    let jain = queue.jain();
    let jain = json!({
        "last": jain.last.map(|w| json!({"index": w.index, "tenants": w.tenants})),
        "windows": jain.windows,
        "mean": (jain.windows > 0).then_some(jain.mean),
        "min": (jain.windows > 0).then_some(jain.min),
    });
    json!({"depth": queue.depth(), "in_flight": queue.in_flight(), "fair_share": fair,
           "jain": jain})
}

/// Compares secrets without an early exit that would leak the matching prefix length.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn compares_whole_secrets() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
