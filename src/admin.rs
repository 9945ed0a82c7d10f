//! Admin endpoints on their own listener (loopback by default, or behind an admin key):
//! `GET /admin/status` (config, reload outcome, workers) and `POST /admin/reload`.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use crate::error::{GatewayError, ResBody, json_response};
use crate::gateway::Gateway;

/// Serves one admin request.
pub async fn handle(gw: Arc<Gateway>, req: Request<Incoming>) -> Response<ResBody> {
    let live = gw.live();
    if let Some(key) = &live.snapshot.admin.api_key {
        let given = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
            return json_response(
                StatusCode::UNAUTHORIZED,
                json!({"error": {"message": "admin key required", "type": "authentication_error", "param": null, "code": 401}}).to_string(),
            );
        }
    }
    drop(live);
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/admin/status") => status(&gw),
        (&Method::POST, "/admin/reload") => match gw.reload().await {
            Ok(()) => json_response(StatusCode::OK, json!({"reloaded": true}).to_string()),
            Err(errors) => json_response(
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({"reloaded": false, "errors": errors.0.iter().map(|e| e.to_string()).collect::<Vec<_>>()}).to_string(),
            ),
        },
        (&Method::POST, "/admin/drain") => {
            gw.start_drain();
            json_response(StatusCode::OK, json!({"draining": true}).to_string())
        }
        _ => GatewayError::NotFound("unknown admin route".into()).into_response(),
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
            json!({"name": p.name, "policy": format!("{:?}", p.policy().config), "workers": workers})
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
