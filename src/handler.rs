//! The request path, phase by phase: accept → parse and validate → route and forward → account.
//! Each phase either passes the request on or answers it; accounting runs once, whatever happened.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};

use crate::error::{GatewayError, ResBody, json_response};
use crate::gateway::Gateway;
use crate::proxy::forward::{ForwardSettings, Outbound, forward};
use crate::request::{Endpoint, validate};

static REQUEST_SEQ: AtomicU64 = AtomicU64::new(1);

/// Per-request context shared by the phases.
struct RequestCtx {
    request_id: String,
    started: Instant,
    model: String,
    pool: String,
}

/// Serves one request on the public listener.
pub async fn handle(gw: Arc<Gateway>, req: Request<Incoming>) -> Response<ResBody> {
    let mut ctx = accept(&req);
    let path = req.uri().path().to_string();
    let mut res = match (req.method(), path.as_str()) {
        (&Method::POST, "/v1/chat/completions") => {
            proxy(&gw, req, Endpoint::ChatCompletions, &mut ctx).await
        }
        (&Method::POST, "/v1/completions") => {
            proxy(&gw, req, Endpoint::Completions, &mut ctx).await
        }
        (&Method::GET, "/v1/models") => Ok(models(&gw)),
        (&Method::GET, "/healthz") => Ok(json_response(StatusCode::OK, "{\"status\":\"ok\"}")),
        (&Method::GET, "/readyz") => Ok(if gw.is_ready() {
            json_response(StatusCode::OK, "{\"ready\":true}")
        } else {
            json_response(StatusCode::SERVICE_UNAVAILABLE, "{\"ready\":false}")
        }),
        (&Method::GET, "/metrics") => {
            let mut r = json_response(StatusCode::OK, gw.metrics.render());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            Ok(r)
        }
        (_, "/v1/chat/completions" | "/v1/completions" | "/v1/models") => {
            Err(GatewayError::MethodNotAllowed)
        }
        _ => Err(GatewayError::NotFound(format!("no route for {path}"))),
    }
    .unwrap_or_else(|e| e.into_response());
    account(&gw, &ctx, &res);
    if let Ok(v) = HeaderValue::from_str(&ctx.request_id) {
        res.headers_mut().insert("x-request-id", v);
    }
    res
}

/// Accept: a request id (the client's, or a fresh one) and the arrival time.
fn accept(req: &Request<Incoming>) -> RequestCtx {
    let request_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map(str::to_owned)
        .unwrap_or_else(|| {
            let n = REQUEST_SEQ.fetch_add(1, Ordering::Relaxed);
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            format!(
                "{:016x}{:016x}",
                t,
                xxhash_rust::xxh3::xxh3_64(&n.to_le_bytes())
            )
        });
    RequestCtx {
        request_id,
        started: Instant::now(),
        model: String::new(),
        pool: String::new(),
    }
}

/// Parse and validate, then route and forward.
async fn proxy(
    gw: &Arc<Gateway>,
    req: Request<Incoming>,
    endpoint: Endpoint,
    ctx: &mut RequestCtx,
) -> Result<Response<ResBody>, GatewayError> {
    if gw.is_draining() {
        return Err(GatewayError::Draining);
    }
    // The request finishes on the snapshot it started with, whatever reloads happen meanwhile.
    let live = gw.live();
    let snapshot = &live.snapshot;
    let (parts, body) = req.into_parts();
    let limit = snapshot.max_body_bytes;
    let body = Limited::new(body, limit)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                GatewayError::PayloadTooLarge(limit)
            } else {
                GatewayError::bad_request(format!("could not read the request body: {e}"), None)
            }
        })?
        .to_bytes();
    let valid = validate(endpoint, &parts.headers, body, snapshot)?;
    ctx.model = valid.model.clone();
    let pool = live
        .pools
        .get(valid.pool)
        .ok_or_else(|| GatewayError::Internal("model routes to a missing pool".into()))?;
    ctx.pool = pool.name.clone();
    let f = &snapshot.forward;
    let settings = ForwardSettings {
        first_byte_timeout: f.first_byte_timeout,
        idle_timeout: f.idle_timeout,
        total_timeout: f.total_timeout,
        retries: f.retries,
        eject_after: snapshot.health.eject_after,
    };
    let out = Outbound {
        path: endpoint.path(),
        body: valid.body.clone(),
        stream: valid.stream,
        features: &valid.features,
        request_id: &ctx.request_id,
        traceparent: parts.headers.get("traceparent"),
        started: ctx.started,
    };
    forward(&gw.client, pool, out, settings, &gw.metrics).await
}

/// `GET /v1/models`: the models this gateway routes, in OpenAI's list shape.
fn models(gw: &Gateway) -> Response<ResBody> {
    let live = gw.live();
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let data: Vec<serde_json::Value> = live
        .snapshot
        .models
        .iter()
        .map(|m| {
            serde_json::json!({
                "id": m.name, "object": "model", "created": created, "owned_by": "infergate",
            })
        })
        .collect();
    json_response(
        StatusCode::OK,
        serde_json::json!({"object": "list", "data": data}).to_string(),
    )
}

/// Account: count the request by model, pool and status (once per request).
fn account(gw: &Gateway, ctx: &RequestCtx, res: &Response<ResBody>) {
    if ctx.model.is_empty() && ctx.pool.is_empty() {
        return;
    }
    gw.metrics
        .requests
        .with_label_values(&[&ctx.model, &ctx.pool, res.status().as_str()])
        .inc();
}
