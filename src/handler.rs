//! The request path, phase by phase: accept → parse and validate → route and forward → account.
//! Each phase either passes the request on or answers it; accounting runs once, whatever happened.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};

use crate::account::{Account, Usage};
use crate::admission::Refusal;
use crate::config::TenantSpec;
use crate::degrade::Verdict;
use crate::error::{GatewayError, ResBody, json_response};
use crate::gateway::Gateway;
use crate::gateway::Live;
use crate::ledger::UsageRow;
use crate::limits::{ConcurrencySlot, Rejection, TierLimits};
use crate::proxy::forward::{ForwardSettings, Outbound, forward};
use crate::request::{Endpoint, PromptSize, ValidRequest, check_context, validate};
use crate::request_body::{BodyLimits, read_body};
use crate::tenants::bearer;

static REQUEST_SEQ: AtomicU64 = AtomicU64::new(1);

/// Per-request context shared by the phases.
struct RequestCtx {
    request_id: String,
    started: Instant,
    /// Arrival, Unix ms (for the usage ledger).
    started_ms: i64,
    model: String,
    pool: String,
    tenant: String,
    /// Short id of the caller's API key.
    key_id: String,
    /// The version (canary arm) the split chose.
    version: String,
    /// Time waited in the admission queue.
    queue_ms: Option<u64>,
    /// The ledger, once the caller is known; with `row_owned` false at drop, the client left
    /// before any answer (hyper dropped the request) and the row is written here.
    ledger: Option<Arc<crate::ledger::UsageLedger>>,
    /// An answer or error exists: its row is written by the body's account or by [`account`].
    row_owned: bool,
    /// A worker's answer is being relayed: its request count and tenant outcome are recorded
    /// when its body ends, when the outcome is known (a stream can still fail after its 200).
    counted_at_end: bool,
}

impl Drop for RequestCtx {
    fn drop(&mut self) {
        if self.row_owned || self.tenant.is_empty() {
            return;
        }
        if let Some(ledger) = &self.ledger {
            // nginx's code for a client that closed the connection before the answer.
            ledger.record(self.ended_row(499, "client_gone"));
        }
    }
}

impl RequestCtx {
    /// The usage-ledger row of this request as far as the phases got.
    fn usage_row(&self) -> UsageRow {
        UsageRow {
            request_id: self.request_id.clone(),
            start_ms: self.started_ms,
            tenant: self.tenant.clone(),
            key_id: self.key_id.clone(),
            model: self.model.clone(),
            version: self.version.clone(),
            pool: self.pool.clone(),
            queue_ms: self.queue_ms,
            ..UsageRow::default()
        }
    }

    /// The row of a request that ends here, without an answer from a worker.
    fn ended_row(&self, status: u16, reason: &str) -> UsageRow {
        UsageRow {
            end_ms: crate::utc::now_ms(),
            status,
            reason: reason.to_string(),
            total_ms: self.started.elapsed().as_millis() as u64,
            ..self.usage_row()
        }
    }
}

/// Serves one request on the public listener.
pub async fn handle(gw: Arc<Gateway>, req: Request<Incoming>) -> Response<ResBody> {
    let mut ctx = accept(&req);
    let path = req.uri().path().to_string();
    let res = match hygiene(&req) {
        Err(e) => Err(e),
        Ok(()) => route(&gw, req, &path, &mut ctx).await,
    };
    ctx.row_owned = true;
    let (mut res, err) = match res {
        Ok(r) => (r, None),
        Err(e) => (e.into_response(), Some(e)),
    };
    account(&gw, &ctx, &res, err.as_ref());
    if let Ok(v) = HeaderValue::from_str(&ctx.request_id) {
        res.headers_mut().insert("x-request-id", v);
    }
    res
}

/// Requests no well-behaved client sends, refused before any work: HTTP/1.1 without `Host`
/// (RFC 9112 §3.2) and more than one `Authorization` header (which one would count?).
fn hygiene(req: &Request<Incoming>) -> Result<(), GatewayError> {
    if req.version() == hyper::Version::HTTP_11 && !req.headers().contains_key(hyper::header::HOST)
    {
        return Err(GatewayError::bad_request(
            "an HTTP/1.1 request must carry a Host header",
            None,
        ));
    }
    if req
        .headers()
        .get_all(hyper::header::AUTHORIZATION)
        .iter()
        .nth(1)
        .is_some()
    {
        return Err(GatewayError::bad_request(
            "more than one Authorization header",
            None,
        ));
    }
    Ok(())
}

/// Whether a `traceparent` is well-formed W3C Trace Context (`00-<32 hex>-<16 hex>-<2 hex>`,
/// ids not all zero; a later version may append fields). A malformed one is not forwarded.
fn valid_traceparent(v: &[u8]) -> bool {
    let hex = |b: &[u8]| !b.is_empty() && b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let nonzero = |b: &[u8]| b.iter().any(|&c| c != b'0');
    if v.len() < 55 || (v.len() > 55 && (v[..2] == *b"00" || v[55] != b'-')) {
        return false;
    }
    let (version, trace, parent, flags) = (&v[0..2], &v[3..35], &v[36..52], &v[53..55]);
    v[2] == b'-'
        && v[35] == b'-'
        && v[52] == b'-'
        && hex(version)
        && version != b"ff"
        && hex(trace)
        && nonzero(trace)
        && hex(parent)
        && nonzero(parent)
        && hex(flags)
}

/// Routes a request that passed [`hygiene`].
async fn route(
    gw: &Arc<Gateway>,
    req: Request<Incoming>,
    path: &str,
    ctx: &mut RequestCtx,
) -> Result<Response<ResBody>, GatewayError> {
    match (req.method(), path) {
        (&Method::POST, "/v1/chat/completions") => {
            proxy(gw, req, Endpoint::ChatCompletions, ctx).await
        }
        (&Method::POST, "/v1/completions") => proxy(gw, req, Endpoint::Completions, ctx).await,
        (&Method::POST, "/v1/embeddings") => proxy(gw, req, Endpoint::Embeddings, ctx).await,
        (&Method::POST, "/v1/responses") => proxy(gw, req, Endpoint::Responses, ctx).await,
        (&Method::GET, "/v1/models") => Ok(models(gw)),
        (&Method::GET, p) if p.starts_with("/v1/models/") => model(gw, &p["/v1/models/".len()..]),
        (&Method::GET, "/healthz") => Ok(json_response(StatusCode::OK, "{\"status\":\"ok\"}")),
        // vLLM's, SGLang's and TGI's name for readiness, which tools such as guidellm check first.
        (&Method::GET, "/readyz" | "/health") => Ok(if gw.is_ready() {
            json_response(StatusCode::OK, "{\"ready\":true}")
        } else {
            json_response(StatusCode::SERVICE_UNAVAILABLE, "{\"ready\":false}")
        }),
        (&Method::GET, "/metrics") if gw.live().snapshot.metrics_public => {
            let mut r = json_response(StatusCode::OK, gw.render_metrics());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            Ok(r)
        }
        (
            _,
            "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/embeddings"
            | "/v1/responses"
            | "/v1/models",
        ) => Err(GatewayError::MethodNotAllowed),
        (_, p) if p.starts_with("/v1/") => Err(GatewayError::NotFound(format!(
            "no route for {p}: this gateway serves POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, POST /v1/responses, GET /v1/models and GET /v1/models/{{model}}"
        ))),
        _ => Err(GatewayError::NotFound(format!("no route for {path}"))),
    }
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
        started_ms: crate::utc::now_ms(),
        model: String::new(),
        pool: String::new(),
        tenant: String::new(),
        key_id: String::new(),
        version: String::new(),
        queue_ms: None,
        ledger: None,
        row_owned: false,
        counted_at_end: false,
    }
}

/// Authenticate → read → validate → meter → admit → route and forward. The ledger created at
/// metering settles once: when the response body ends, or with a full refund if it never starts.
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

    // Authenticate before reading the body: an unknown caller costs nothing more.
    let (tenant, key_id) = authenticate(&live, &parts.headers)?;
    ctx.tenant = tenant.name.clone();
    ctx.key_id = key_id;
    ctx.ledger = gw.ledger.clone();
    let tier = snapshot
        .tier(&tenant.tier)
        .ok_or_else(|| GatewayError::Internal(format!("tier `{}` missing", tenant.tier)))?;

    let limits = TierLimits {
        requests_per_minute: tier.requests_per_minute,
        tokens_per_minute: tier.tokens_per_minute,
        max_concurrent: tier.max_concurrent,
    };
    // The tenant's concurrency slot before its body: unfinished uploads count against it.
    let slot = ConcurrencySlot::take(gw.limiter.clone(), &tenant.name, &limits)
        .map_err(|r| rejection_error(r, 0))?;
    let declared = parts
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let (body, body_hold) = read_body(body, declared, BodyLimits::of(snapshot), &gw.body_budget)
        .await
        .inspect_err(|e| {
            if let GatewayError::BodyTimeout(_) = e {
                gw.metrics
                    .client_timeouts
                    .with_label_values(&["body_read"])
                    .inc();
            }
        })?;
    let valid = validate(endpoint, &parts.headers, body, snapshot, tier)?;
    ctx.model = valid.model.clone();
    let pool = live
        .pools
        .get(valid.pool)
        .ok_or_else(|| GatewayError::Internal("model routes to a missing pool".into()))?;
    ctx.pool = pool.name.clone();

    // Meter: estimate the prompt with a real tokenizer (off the reactor when long). When no
    // token budget, context check or degradation limit can use the number, four bytes a token
    // is enough for the accounting fallback and saves the tokenizer's cost.
    let exact_needed = tier.tokens_per_minute.is_some()
        || valid.max_context.is_some()
        || snapshot.degradation.contains_key(&ctx.pool);
    let prompt_tokens = match &valid.prompt {
        PromptSize::Tokens(n) => *n,
        PromptSize::Text(t) if !exact_needed => (t.len() as u64).div_ceil(4),
        PromptSize::Text(t) if t.len() < 4096 => valid.estimator.count(t),
        PromptSize::Text(t) => {
            let (est, text) = (valid.estimator, t.clone());
            tokio::task::spawn_blocking(move || est.count(&text))
                .await
                .map_err(|e| GatewayError::Internal(format!("token estimate failed: {e}")))?
        }
    };
    check_context(&valid, prompt_tokens)?;
    // Degrade: the pool's current level decides what this tier gets.
    let (valid, degraded) = degrade(gw, &live, valid, &tier.name, prompt_tokens, ctx)?;
    let pool = live
        .pools
        .get(valid.pool)
        .ok_or_else(|| GatewayError::Internal("model routes to a missing pool".into()))?;
    ctx.pool = pool.name.clone();
    // Split: the model version, sticky per session (stable or canary).
    let (valid, version) = split(&live, valid, (&tenant.name, &ctx.request_id))?;
    let pool = live
        .pools
        .get(valid.pool)
        .ok_or_else(|| GatewayError::Internal("model version routes to a missing pool".into()))?;
    ctx.pool = pool.name.clone();
    let served_model = version
        .as_ref()
        .map_or_else(|| ctx.model.clone(), |v| v.served_model.clone());
    if let Some(v) = &version {
        ctx.version = v.name.clone();
    }
    // Budgets: what the tenant spent plus what its requests in flight may cost, before this one.
    let budgets = snapshot.budgets_of(&tenant.name, tier);
    let budget_estimate = if budgets.is_empty() {
        0
    } else {
        let reserved = crate::pricing::TokenCounts {
            prompt: prompt_tokens,
            cached: 0,
            completion: valid.max_tokens,
        };
        let cost = snapshot
            .prices
            .cost(&served_model, &ctx.model, &tier.name, reserved);
        cost.nano_usd
    };
    let check = gw
        .budgets
        .admit(&tenant.name, budgets, budget_estimate, crate::utc::now_ms())
        .map_err(|refusal| GatewayError::BudgetExceeded {
            message: refusal.message(&tenant.name),
            retry_after_secs: u64::try_from(refusal.retry_after_ms)
                .unwrap_or(0)
                .div_ceil(1000)
                .max(1),
        })?;
    for (over, spent) in &check.soft_first {
        tracing::warn!(
            tenant = %tenant.name,
            period = over.period.as_str(),
            limit = %crate::pricing::format_usd_cents(over.limit_nano),
            spent = %crate::pricing::format_usd_cents(*spent),
            "tenant is over its soft budget (requests still pass)"
        );
    }
    for over in &check.soft_over {
        gw.metrics
            .budget_soft_exceeded
            .with_label_values(&[&tenant.name, over.period.as_str()])
            .inc();
    }
    let budget_periods = crate::budgets::periods(budgets);
    let usage = Usage {
        // Without a ledger only the model (the metrics' label) is needed.
        row: if gw.ledger.is_some() {
            ctx.usage_row()
        } else {
            UsageRow {
                model: ctx.model.clone(),
                ..UsageRow::default()
            }
        },
        prices: snapshot.prices.clone(),
        served_model,
        tier: tier.name.clone(),
        ledger: gw.ledger.clone(),
        budgets: gw.budgets.clone(),
        budget_periods: budget_periods.clone(),
        budget_estimate,
    };
    let reserve = prompt_tokens + valid.max_tokens;
    // Fleet mode: one round trip to Redis for the tenant's shared rate and concurrency.
    let acquired = match &gw.shared {
        Some(shared) => shared
            .acquire(&tenant.name, &limits, reserve)
            .await
            .map(|(r, held)| (r, Some(held))),
        None => gw
            .limiter
            .acquire(&tenant.name, &limits, reserve, Instant::now())
            .map(|r| (r, None)),
    };
    let (reservation, held) = match acquired {
        Ok(r) => r,
        Err(r) => {
            // Refused after the budget reserved: release it.
            gw.budgets.settle(
                &tenant.name,
                &budget_periods,
                budget_estimate,
                0,
                crate::utc::now_ms(),
            );
            return Err(rejection_error(r, reserve));
        }
    };
    let mut ledger = Account::new(
        gw.limiter.clone(),
        gw.metrics.clone(),
        &tenant.name,
        (reserve, prompt_tokens),
        (slot, body_hold),
        usage,
        ctx.started,
    );
    if let (Some(shared), Some(held)) = (&gw.shared, held) {
        ledger.shared_by(shared.clone(), limits, held);
    }

    // Admit: wait in the pool's bounded priority queue (leaving it at once if the client goes).
    let (_, queue) = &pool.admission;
    gw.metrics
        .queue_depth
        .with_label_values(&[&pool.name])
        .set(queue.depth() as f64 + 1.0);
    let permit = queue.admit(tier.priority, Instant::now()).await;
    gw.metrics
        .queue_depth
        .with_label_values(&[&pool.name])
        .set(queue.depth() as f64);
    let permit = permit.map_err(|refusal| {
        let secs = crate::limits::retry_after_secs(refusal.retry_after());
        match refusal {
            Refusal::Draining { .. } => GatewayError::Draining,
            other => GatewayError::TooManyRequests {
                message: format!("pool `{}`: {other}", pool.name),
                retry_after_secs: secs,
                headers: Vec::new(),
                reason: other.reason(),
            },
        }
    })?;
    gw.metrics
        .queue_wait
        .with_label_values(&[&pool.name])
        .observe(permit.waited().as_secs_f64());
    pool.degrade.record_queue_wait(permit.waited());
    ctx.queue_ms = Some(permit.waited().as_millis() as u64);
    ledger.hold(permit);

    let f = &snapshot.forward;
    let settings = ForwardSettings {
        first_byte_timeout: f.first_byte_timeout,
        idle_timeout: f.idle_timeout,
        total_timeout: f.total_timeout,
        retries: f.retries,
        eject_after: snapshot.health.eject_after,
        debug_headers: snapshot.debug_headers,
    };
    // Shadow: mirror a sampled share to the shadow model's pool; the client never waits for it.
    let shadow_tx = mirror(gw, &live, &valid, endpoint, &ctx.request_id);
    let started = ctx.started;
    let out = Outbound {
        path: endpoint.path(),
        body: valid.body.clone(),
        stream: valid.stream,
        by_load: !endpoint.generates(),
        features: &valid.features,
        request_id: &ctx.request_id,
        traceparent: parts
            .headers
            .get("traceparent")
            .filter(|v| valid_traceparent(v.as_bytes())),
        started: ctx.started,
        hide_usage_chunk: valid.stream && !valid.client_wants_usage,
        grace_over: gw.grace_over(),
        on_end: Some(Box::new({
            let version = version.clone();
            let metrics = gw.metrics.clone();
            let (model, pool_name, tenant) =
                (ctx.model.clone(), ctx.pool.clone(), ctx.tenant.clone());
            move |end| {
                let (status, outcome) = end_outcome(&end);
                metrics
                    .requests
                    .with_label_values(&[&model, &pool_name, &status])
                    .inc();
                if !tenant.is_empty() {
                    metrics
                        .tenant_requests
                        .with_label_values(&[&tenant, outcome])
                        .inc();
                }
                if let Some(tx) = shadow_tx {
                    let _ = tx.send(crate::shadow::PrimaryOutcome {
                        status: end.status,
                        output_tokens: end.usage.map_or(end.content_events, |u| u.completion),
                        latency: started.elapsed(),
                    });
                }
                // A client that hangs up says nothing about the version that served it: counted
                // as cancelled, kept out of the canary analysis.
                if let Some(v) = &version {
                    if end.client_gone {
                        v.count(&metrics, "cancelled");
                    } else {
                        let ok = end.completed && (200..300).contains(&end.status);
                        v.record(&metrics, ok, end.ttft, end.max_gap);
                    }
                }
                ledger.settle(end);
            }
        })),
    };
    let forwarded = forward(&gw.client, pool, out, settings, &gw.metrics).await;
    if let (Err(_), Some(v)) = (&forwarded, &version) {
        // No answer at all counts against the version too.
        v.record(&gw.metrics, false, None, None);
    }
    let mut res = forwarded?;
    ctx.counted_at_end = true;
    if let Some(v) = &version
        && let Ok(h) = HeaderValue::from_str(&v.name)
    {
        res.headers_mut().insert("x-infergate-version", h);
    }
    if !degraded.is_empty()
        && let Ok(v) = HeaderValue::from_str(&degraded.join(","))
    {
        res.headers_mut().insert("x-infergate-degraded", v);
    }
    for (name, value) in reservation.headers.header_pairs() {
        if let Ok(v) = HeaderValue::from_str(&value) {
            res.headers_mut().insert(name, v);
        }
    }
    Ok(res)
}

/// Applies the pool's degradation actions for `tier`: shed (429), refuse a long prompt (503),
/// cap `max_tokens`, or send to the fallback model. Returns the request as altered and the labels
/// of what changed it (for `x-infergate-degraded`).
fn degrade(
    gw: &Gateway,
    live: &Live,
    mut valid: ValidRequest,
    tier: &str,
    prompt_tokens: u64,
    ctx: &mut RequestCtx,
) -> Result<(ValidRequest, Vec<&'static str>), GatewayError> {
    let Some(pool) = live.pools.get(valid.pool) else {
        return Ok((valid, Vec::new()));
    };
    let (actions, state) = pool.degrade.for_tier(tier);
    let Some((level, name, retry)) = state else {
        return Ok((valid, Vec::new()));
    };
    let count = |action: &str| {
        gw.metrics
            .degraded
            .with_label_values(&[&pool.name, action])
            .inc();
    };
    let retry_after_secs = crate::limits::retry_after_secs(retry);
    let (cap, fallback) = match actions.verdict(&valid.model, prompt_tokens, valid.max_tokens) {
        Verdict::Shed => {
            count("shed");
            return Err(GatewayError::TooManyRequests {
                message: format!(
                    "pool `{}` is degraded (level {level} `{name}`): requests of tier `{tier}` are shed; retry later",
                    pool.name
                ),
                retry_after_secs,
                headers: vec![("x-infergate-degraded", "shed".to_string())],
                reason: "degraded",
            });
        }
        Verdict::RefuseLong { max_prompt_tokens } => {
            count("refuse_long_prompts");
            return Err(GatewayError::Degraded {
                message: format!(
                    "pool `{}` is degraded (level {level} `{name}`): prompts of tier `{tier}` are limited to {max_prompt_tokens} tokens and this one is about {prompt_tokens}",
                    pool.name
                ),
                retry_after_secs,
                action: "refuse_long_prompts",
            });
        }
        Verdict::Serve {
            cap_max_tokens,
            fallback_model,
        } => (cap_max_tokens, fallback_model),
    };
    let mut labels = Vec::new();
    let mut body: Option<serde_json::Value> = None;
    if let Some(cap) = cap {
        let json = body.get_or_insert(parse_body(&valid.body)?);
        // The client's own field keeps its name; every limit field is capped.
        let keys = valid.endpoint.limit_keys();
        for &key in keys {
            if json.get(key).is_some_and(|v| !v.is_null()) {
                json[key] = serde_json::Value::from(cap);
            }
        }
        if let Some(&last) = keys.last()
            && keys.iter().all(|k| json.get(*k).is_none())
        {
            json[last] = serde_json::Value::from(cap);
        }
        valid.max_tokens = u64::from(cap);
        labels.push("cap_max_tokens");
        count("cap_max_tokens");
    }
    // A fallback model missing from this snapshot leaves the request on its own model.
    if let Some(model) = fallback
        && let Some(route) = live.snapshot.model(model)
    {
        let json = body.get_or_insert(parse_body(&valid.body)?);
        json["model"] = serde_json::Value::from(route.upstream_name());
        valid.pool = route.pool;
        valid.model = model.to_string();
        ctx.model = model.to_string();
        labels.push("fallback");
        count("fallback");
    }
    if let Some(json) = body {
        valid.body = serde_json::to_vec(&json)
            .map_err(|e| GatewayError::Internal(e.to_string()))?
            .into();
    }
    Ok((valid, labels))
}

fn parse_body(body: &[u8]) -> Result<serde_json::Value, GatewayError> {
    serde_json::from_slice(body)
        .map_err(|e| GatewayError::Internal(format!("re-reading a validated body: {e}")))
}

/// Starts the shadow copy of a request when its model has a shadow and the request is sampled;
/// returns where to report the client's own outcome. Any failure here only skips the shadow.
fn mirror(
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
    let mut json: serde_json::Value = serde_json::from_slice(&valid.body).ok()?;
    let obj = json.as_object_mut()?;
    obj.insert("model".into(), route.upstream_name().into());
    // Read whole: the comparison needs the usage, not the stream.
    obj.insert("stream".into(), false.into());
    obj.remove("stream_options");
    let body = serde_json::to_vec(&json).ok()?;
    shadow.mirror(
        gw.client.clone(),
        pool,
        body.into(),
        endpoint.path(),
        gw.metrics.clone(),
        valid.model.clone(),
    )
}

/// The version a request was split to, and where to report how it went.
#[derive(Clone)]
struct VersionChoice {
    model: String,
    /// The model name of the version (its price is looked up first).
    served_model: String,
    index: usize,
    name: String,
    canary: Arc<std::sync::Mutex<crate::canary::Canary>>,
}

impl VersionChoice {
    fn count(&self, metrics: &crate::metrics::GatewayMetrics, outcome: &str) {
        metrics
            .version_requests
            .with_label_values(&[&self.model, &self.name, outcome])
            .inc();
    }

    fn record(
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
fn split(
    live: &Live,
    mut valid: ValidRequest,
    (tenant, request_id): (&str, &str),
) -> Result<(ValidRequest, Option<VersionChoice>), GatewayError> {
    let (Some(spec), Some(canary)) = (
        live.snapshot.canaries.get(&valid.model),
        live.canaries.get(&valid.model),
    ) else {
        return Ok((valid, None));
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
        let mut json = parse_body(&valid.body)?;
        json["model"] = serde_json::Value::from(route.upstream_name());
        valid.body = serde_json::to_vec(&json)
            .map_err(|e| GatewayError::Internal(e.to_string()))?
            .into();
        valid.pool = route.pool;
    }
    let choice = VersionChoice {
        model: valid.model.clone(),
        served_model: model,
        index,
        name,
        canary: canary.clone(),
    };
    Ok((valid, Some(choice)))
}

/// The caller's tenant and the short id of its key: the owner of the bearer key, or the
/// anonymous tenant (default tier, no key id) when the config declares no tenants at all.
fn authenticate(
    live: &Live,
    headers: &hyper::HeaderMap,
) -> Result<(TenantSpec, String), GatewayError> {
    let snapshot = &live.snapshot;
    if snapshot.tenants.is_empty() {
        let anonymous = TenantSpec {
            name: "anonymous".into(),
            tier: snapshot.default_tier.clone().unwrap_or_else(|| {
                snapshot
                    .tiers
                    .first()
                    .map(|t| t.name.clone())
                    .unwrap_or_default()
            }),
            key_hashes: Vec::new(),
        };
        return Ok((anonymous, String::new()));
    }
    let presented = bearer(
        headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
    .ok_or_else(|| {
        GatewayError::Unauthorized(
            "You didn't provide an API key: send `Authorization: Bearer YOUR_KEY`.".into(),
        )
    })?;
    let hash = crate::tenants::hash_key(presented);
    let index = live
        .keys
        .lookup_hash(&hash)
        .ok_or_else(|| GatewayError::Unauthorized("Incorrect API key provided.".into()))?;
    let tenant = snapshot
        .tenants
        .get(index)
        .cloned()
        .ok_or_else(|| GatewayError::Internal("key table out of date".into()))?;
    Ok((tenant, crate::tenants::key_id(&hash)))
}

/// A limiter refusal as the answer the client gets.
fn rejection_error(r: Rejection, reserve: u64) -> GatewayError {
    match r {
        Rejection::RateLimited {
            retry_after,
            which,
            headers,
        } => GatewayError::TooManyRequests {
            message: format!(
                "Rate limit reached for {} (this request needs {reserve} tokens). Try again in {}.",
                which.as_str(),
                crate::limits::format_reset(retry_after)
            ),
            retry_after_secs: crate::limits::retry_after_secs(retry_after),
            headers: headers.header_pairs(),
            reason: "rate",
        },
        Rejection::TooLarge { tokens, burst } => GatewayError::NeverFits(format!(
            "this request needs {tokens} tokens (prompt plus max_tokens) but your tier allows at most {burst} tokens per minute: it can never pass; lower max_tokens or shorten the prompt"
        )),
        Rejection::Concurrency { limit } => GatewayError::TooManyRequests {
            message: format!("too many requests in flight: your tier allows {limit} at once"),
            retry_after_secs: 1,
            headers: Vec::new(),
            reason: "rate",
        },
    }
}

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
fn model(gw: &Gateway, id: &str) -> Result<Response<ResBody>, GatewayError> {
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
fn models(gw: &Gateway) -> Response<ResBody> {
    let live = gw.live();
    let data: Vec<serde_json::Value> = listed_models(&live).collect();
    json_response(
        StatusCode::OK,
        serde_json::json!({"object": "list", "data": data}).to_string(),
    )
}

/// Account: count the request by model, pool and status, and per tenant (once per request).
fn account(gw: &Gateway, ctx: &RequestCtx, res: &Response<ResBody>, err: Option<&GatewayError>) {
    if ctx.counted_at_end && err.is_none() {
        return;
    }
    let status = res.status();
    if !ctx.model.is_empty() {
        gw.metrics
            .requests
            .with_label_values(&[&ctx.model, &ctx.pool, status.as_str()])
            .inc();
    }
    let tenant = if ctx.tenant.is_empty() {
        "unknown"
    } else {
        ctx.tenant.as_str()
    };
    // `upstream` and `internal` failures are not refusals of the caller.
    let reason = err.map(GatewayError::reason);
    let refused = reason.filter(|r| !matches!(*r, "upstream" | "internal"));
    if let Some(reason) = reason {
        if let Some(reason) = refused {
            gw.metrics
                .rejections
                .with_label_values(&[tenant, reason])
                .inc();
        }
        // A refusal of a known caller is a ledger row too (an unknown one is not: a flood of
        // bad keys must not fill the ledger).
        if let Some(ledger) = ctx.ledger.as_ref().filter(|_| !ctx.tenant.is_empty()) {
            let mut row = ctx.ended_row(status.as_u16(), reason);
            row.price_version = gw.live().snapshot.prices.version;
            ledger.record(row);
        }
    }
    if ctx.tenant.is_empty() && err.is_none() {
        return;
    }
    let outcome = match refused {
        Some(_) => "rejected",
        None => outcome_of(status.as_u16()),
    };
    gw.metrics
        .tenant_requests
        .with_label_values(&[tenant, outcome])
        .inc();
}

/// The `status` label and tenant outcome of a relayed answer, from how its body ended: a stream
/// the worker broke off is a 502 whatever status its headers had, and a client that left is
/// nginx's 499.
fn end_outcome(end: &crate::proxy::body::EndReport) -> (String, &'static str) {
    if end.client_gone {
        ("499".into(), "cancelled")
    } else if !end.completed {
        ("502".into(), "upstream_error")
    } else {
        (end.status.to_string(), outcome_of(end.status))
    }
}

/// The tenant outcome of an answer with HTTP `status`.
fn outcome_of(status: u16) -> &'static str {
    match status {
        200..=399 => "ok",
        400..=499 => "client_error",
        _ => "upstream_error",
    }
}

#[cfg(test)]
mod tests {
    use super::valid_traceparent;

    #[test]
    fn traceparent_is_checked_against_the_w3c_format() {
        let ok = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(valid_traceparent(ok));
        // A later version may append fields after a dash.
        assert!(valid_traceparent(
            b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
        ));
        for bad in [
            &b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"[..],
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            b"junk",
            &[b'a'; 8192][..],
        ] {
            assert!(
                !valid_traceparent(bad),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
