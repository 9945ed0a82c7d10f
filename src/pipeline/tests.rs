//! The phases in-process: a gateway built from config text (no listener, no process), requests
//! as `Request<Full<Bytes>>`, and for forwarding a real hyper upstream on a loopback port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{HeaderMap, Request, StatusCode};

use super::*;
use crate::gateway::{ConfigSource, Gateway};
use crate::pipeline::validate::request::Endpoint;

const KEY: &str = "ig-test-key-acme";

/// The request heads an [`upstream`] received, in order.
type Seen = Arc<std::sync::Mutex<Vec<HeaderMap>>>;

/// A worker answering every chat completion at once with 7 completion tokens, keeping the
/// request heads it saw.
async fn upstream() -> (SocketAddr, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Seen::default();
    let seen = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            let (head, body) = req.into_parts();
                            let _ = body.collect().await;
                            seen.lock().unwrap().push(head.headers);
                            let body = r#"{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(body)))
                                    .unwrap(),
                            )
                        }
                    },
                );
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    (addr, calls)
}

/// A gateway over one pool `p` of `workers` serving model `m`; with `tiers`, the tenant `acme`
/// (key [`KEY`]) of tier `gold`; `routing` is routing.yaml, `degradation` degradation.yaml.
fn gateway(
    workers: &[String],
    tiers: Option<&str>,
    routing: Option<&str>,
    degradation: Option<&str>,
) -> Arc<Gateway> {
    gateway_with("", workers, tiers, (routing, degradation, None))
}

/// [`gateway`] with `extra` (whole top-level sections) at the head of the main config, and the
/// routing, degradation and prices policies.
fn gateway_with(
    extra: &str,
    workers: &[String],
    tiers: Option<&str>,
    (routing, degradation, prices): (Option<&str>, Option<&str>, Option<&str>),
) -> Arc<Gateway> {
    let mut config = String::from(extra);
    config.push_str(
        "listen: \"127.0.0.1:0\"\nadmin:\n  listen: \"127.0.0.1:0\"\nmodels:\n  - name: m\n    pool: p\n  - name: m-canary\n    pool: p\npools:\n  - name: p\n    workers:\n",
    );
    // A pool needs a worker; port 9 (discard) listens nowhere here, for tests that forward nothing.
    let none = ["http://127.0.0.1:9".to_string()];
    for w in if workers.is_empty() {
        &none[..]
    } else {
        workers
    } {
        config.push_str(&format!("      - url: {w}\n"));
    }
    if tiers.is_some() {
        let hash = crate::tenants::format_hash(&crate::tenants::hash_key(KEY));
        config.push_str(&format!(
            "tenants:\n  - {{name: acme, tier: gold, keys: [\"{hash}\"]}}\n"
        ));
    }
    let path = std::path::Path::new("/test/infergate.yaml");
    let file = |text: Option<&str>, name: &'static str| {
        text.map(|t| (t.to_string(), std::path::PathBuf::from(name)))
    };
    let (r, t, d, p) = (
        file(routing, "/test/routing.yaml"),
        file(tiers, "/test/tenants.yaml"),
        file(degradation, "/test/degradation.yaml"),
        file(prices, "/test/prices.yaml"),
    );
    let snapshot = crate::config::load_str_all(
        &config,
        path,
        r.as_ref().map(|(s, p)| (s.as_str(), p.as_path())),
        t.as_ref().map(|(s, p)| (s.as_str(), p.as_path())),
        d.as_ref().map(|(s, p)| (s.as_str(), p.as_path())),
        p.as_ref().map(|(s, p)| (s.as_str(), p.as_path())),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let gw = Gateway::new(
        snapshot,
        ConfigSource::Embedded,
        (Default::default(), Vec::new()),
        None,
    )
    .unwrap();
    // No poller runs here to find the stand-in workers warm (they serve no `/ready`).
    for pool in &gw.live().pools {
        for w in pool.workers().iter() {
            w.set_warmth(crate::workers::state::Warmth::Warm);
        }
    }
    gw
}

const GOLD: &str = "tiers:\n  gold:\n    priority: 5\n    requests_per_minute: 100\n    tokens_per_minute: 1000\n    max_tokens: 800\n    models: [\"*\"]\n";

/// `req` through the public listener's whole service (the edge layers, then the phases), in
/// process, with `tower::ServiceExt::oneshot`.
async fn serve(
    gw: &Arc<Gateway>,
    req: Request<Full<Bytes>>,
) -> hyper::Response<infergate_engine::edge::InFlightBody<crate::error::ResBody>> {
    use tower::ServiceExt;
    let Ok(res) = service(gw.clone()).oneshot(req).await;
    res
}

/// `body` under the snapshot's body limits, as the edge passes it on.
fn limited(
    body: Full<Bytes>,
    snapshot: &crate::config::Snapshot,
) -> infergate_engine::edge::LimitedBody<Full<Bytes>> {
    infergate_engine::edge::LimitedBody::new(body, None, crate::request_body::body_limits(snapshot))
}

fn chat(body: &str) -> Request<Full<Bytes>> {
    Request::post("/v1/chat/completions")
        .header("host", "gw")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {KEY}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

const HELLO: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":100}"#;

/// The sum of `name`'s samples whose labels include every `labels` pair.
fn metric(gw: &Gateway, name: &str, labels: &[(&str, &str)]) -> f64 {
    gw.render_metrics()
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn accept_takes_the_clients_request_id_or_makes_one() {
    use tower::{Layer, ServiceExt};
    let req = |id: Option<&str>| {
        let mut b = Request::get("/v1/models");
        if let Some(id) = id {
            b = b.header("x-request-id", id);
        }
        b.body(Full::new(Bytes::new())).unwrap()
    };
    // The id the accept phase records, behind the edge's request-id layer.
    let id = |r: Option<&str>| {
        let svc = infergate_engine::edge::RequestIdLayer.layer(tower::service_fn(
            |req: Request<Full<Bytes>>| async move {
                let mut res = hyper::Response::new(());
                res.extensions_mut()
                    .insert(ctx::accept(&req, &metrics()).request_id.clone());
                Ok::<_, std::convert::Infallible>(res)
            },
        ));
        let req = req(r);
        async move {
            let Ok(res) = svc.oneshot(req).await;
            res.extensions().get::<String>().unwrap().clone()
        }
    };
    assert_eq!(id(Some("abc")).await, "abc");
    let made = id(None).await;
    assert_eq!(made.len(), 32, "{made}");
    assert_ne!(made, id(None).await);
    // Too long to be an id: replaced.
    let long = "x".repeat(129);
    assert_ne!(id(Some(&long)).await, long);
}

#[tokio::test]
async fn accept_refuses_a_request_without_host_or_with_two_keys() {
    let gw = gateway(&[], None, None, None);
    let mut no_host = chat(HELLO);
    no_host.headers_mut().remove("host");
    let res = serve(&gw, no_host).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let mut two = chat(HELLO);
    two.headers_mut()
        .append("authorization", "Bearer other".parse().unwrap());
    let res = serve(&gw, two).await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(res.headers().contains_key("x-request-id"));
}

#[tokio::test]
async fn authenticate_names_the_tenant_of_a_key_and_refuses_others() {
    let gw = gateway(&[], Some(GOLD), None, None);
    let live = gw.live();
    let mut headers = HeaderMap::new();
    assert!(matches!(
        authenticate::authenticate(&live, &headers),
        Err(GatewayError::Unauthorized(_))
    ));
    headers.insert("authorization", "Bearer wrong".parse().unwrap());
    assert!(matches!(
        authenticate::authenticate(&live, &headers),
        Err(GatewayError::Unauthorized(_))
    ));
    headers.insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    let (tenant, key_id) = authenticate::authenticate(&live, &headers).unwrap();
    assert_eq!(
        (tenant.name.as_str(), tenant.tier.as_str()),
        ("acme", "gold")
    );
    assert_eq!(key_id.len(), 12);
    // No tenants at all: everyone is the anonymous tenant of the default tier.
    let open = gateway(&[], None, None, None);
    let open_live = open.live();
    let (tenant, key_id) = authenticate::authenticate(&open_live, &HeaderMap::new()).unwrap();
    assert_eq!((tenant.name.as_str(), key_id.as_str()), ("anonymous", ""));
}

#[tokio::test]
async fn validate_counts_the_prompt_and_refuses_bad_bodies() {
    let gw = gateway(&[], Some(GOLD), None, None);
    let live = gw.live();
    let tier = live.snapshot.tier("gold").unwrap();
    let run = |body: &str| {
        let (parts, body) = chat(body).into_parts();
        let gw = gw.clone();
        let snapshot = live.snapshot.clone();
        async move {
            let tier = snapshot.tier("gold").unwrap().clone();
            validate::read_and_validate(
                &gw,
                Endpoint::ChatCompletions,
                &parts.headers,
                limited(body, &snapshot),
                &snapshot,
                &tier,
            )
            .await
        }
    };
    let ok = run(HELLO).await.unwrap();
    assert_eq!(ok.valid.model, "m");
    assert_eq!(ok.valid.max_tokens, 100);
    // The tier has a token budget: the real tokenizer counts (a few tokens, not bytes / 4).
    assert!((2..=12).contains(&ok.prompt_tokens), "{}", ok.prompt_tokens);
    assert!(matches!(
        run("{not json").await,
        Err(GatewayError::BadRequest { .. })
    ));
    let unknown = run(r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#).await;
    assert!(
        matches!(unknown, Err(GatewayError::NotFound(_))),
        "{:?}",
        unknown.err()
    );
    let over =
        run(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":5000}"#).await;
    assert!(over.is_err(), "max_tokens above the tier's 800 passes");
    let _ = tier;
}

/// One validated chat request of `body` for the tenant, as the phases after validation get it.
async fn validated(gw: &Arc<Gateway>, body: &str) -> validate::Validated {
    let live = gw.live();
    let tier = live
        .snapshot
        .tier("gold")
        .or_else(|| live.snapshot.tiers.first())
        .unwrap()
        .clone();
    let (parts, body) = chat(body).into_parts();
    validate::read_and_validate(
        gw,
        Endpoint::ChatCompletions,
        &parts.headers,
        limited(body, &live.snapshot),
        &live.snapshot,
        &tier,
    )
    .await
    .unwrap()
}

const SHED_AT_2: &str = "pools:\n  p:\n    levels:\n      - name: cap\n        enter: {queue_depth: 1000}\n        exit: {queue_depth: 500}\n        actions:\n          - cap_max_tokens: {tiers: [gold], max_tokens: 16}\n      - name: shed\n        enter: {queue_depth: 2000}\n        exit: {queue_depth: 1500}\n        actions:\n          - shed: {tiers: [gold]}\n";

#[tokio::test]
async fn degrade_caps_at_level_1_and_sheds_at_level_2() {
    let gw = gateway(&[], Some(GOLD), None, Some(SHED_AT_2));
    let live = gw.live();
    let mut ctx = ctx::accept(&chat(HELLO), &gw.metrics);
    let mut v = validated(&gw, HELLO).await.valid;
    // Level 0: untouched.
    let labels = degrade::degrade(&gw, &live, &mut v, "gold", 3, &mut ctx).unwrap();
    assert!(labels.is_empty());
    assert_eq!(v.max_tokens, 100);
    live.pools[0].degrade.force(Some(1)).unwrap();
    let labels = degrade::degrade(&gw, &live, &mut v, "gold", 3, &mut ctx).unwrap();
    assert_eq!(labels, ["cap_max_tokens"]);
    assert_eq!(v.max_tokens, 16);
    let body: serde_json::Value = serde_json::from_slice(&v.body.bytes()).unwrap();
    assert_eq!(body["max_tokens"], 16, "the upstream body carries the cap");
    live.pools[0].degrade.force(Some(2)).unwrap();
    let shed = degrade::degrade(&gw, &live, &mut v, "gold", 3, &mut ctx);
    assert!(matches!(
        shed,
        Err(GatewayError::TooManyRequests {
            reason: "degraded",
            ..
        })
    ));
    assert_eq!(metric(&gw, "infergate_degraded_requests_total", &[]), 2.0);
}

const CANARY: &str = "models:\n  m:\n    versions:\n      - {name: stable, model: m, weight: 50}\n      - {name: canary, model: m-canary, weight: 50}\n";

#[tokio::test]
async fn split_keeps_a_session_on_its_version() {
    let gw = gateway(&[], None, Some(CANARY), None);
    let live = gw.live();
    let with_session = |id: &str| {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],"user":"{id}"}}"#
        );
        let gw = gw.clone();
        async move { validated(&gw, &body).await.valid }
    };
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..40 {
        let user = format!("user-{i}");
        let mut a = with_session(&user).await;
        let va = split::split(&live, &mut a, ("t", "r1")).unwrap();
        let vb = split::split(&live, &mut with_session(&user).await, ("t", "r2")).unwrap();
        let (va, vb) = (va.unwrap(), vb.unwrap());
        assert_eq!(va.name, vb.name, "{user} moved between versions");
        if va.name == "canary" {
            let body: serde_json::Value = serde_json::from_slice(&a.body.bytes()).unwrap();
            assert_eq!(body["model"], "m-canary");
        }
        seen.insert(va.name.clone());
    }
    assert_eq!(seen.len(), 2, "40 sessions at 50/50 all on one version");
}

#[tokio::test]
async fn meter_reserves_tokens_and_refuses_past_the_minute() {
    let gw = gateway(&[], Some(GOLD), None, None);
    let live = gw.live();
    let (tenant, _) = {
        let mut h = HeaderMap::new();
        h.insert("authorization", format!("Bearer {KEY}").parse().unwrap());
        authenticate::authenticate(&live, &h).unwrap()
    };
    let tier = live.snapshot.tier("gold").unwrap();
    let ctx = ctx::accept(&chat(HELLO), &gw.metrics);
    let body = r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":600}"#;
    let reserve = |v: validate::Validated| {
        let slot = crate::limits::ConcurrencySlot::take(gw.limiter.clone(), "acme", &tier.limits())
            .unwrap();
        let (gw, live, tenant, ctx) = (&gw, &live, &tenant, &ctx);
        async move {
            meter::meter(
                gw,
                &live.snapshot,
                (tenant, tier),
                &v.valid,
                v.prompt_tokens,
                (slot, v.body_hold),
                ctx,
            )
            .await
        }
    };
    let first = reserve(validated(&gw, body).await).await.unwrap();
    assert_eq!(
        first
            .reservation
            .headers
            .header_pairs()
            .iter()
            .find(|(k, _)| *k == "x-ratelimit-limit-tokens")
            .map(|(_, v)| v.as_str()),
        Some("1000")
    );
    // 600 + prompt more does not fit the 1,000-token minute while the first holds its share.
    let second = reserve(validated(&gw, body).await).await;
    assert!(
        matches!(
            second,
            Err(GatewayError::TooManyRequests { reason: "rate", .. })
        ),
        "{:?}",
        second.err()
    );
    // Dropped without an answer: the whole reservation comes back.
    drop(first);
    assert!(reserve(validated(&gw, body).await).await.is_ok());
}

#[tokio::test]
async fn admit_gives_a_permit_and_notes_the_wait() {
    let gw = gateway(&[], Some(GOLD), None, None);
    let live = gw.live();
    let tier = live.snapshot.tier("gold").unwrap();
    let mut ctx = ctx::accept(&chat(HELLO), &gw.metrics);
    let permit = admit::admit(
        &live.pools[0],
        (tier, "t"),
        ((10, 10), None, &[]),
        &gw.metrics,
        &mut ctx,
    )
    .await
    .unwrap();
    assert!(ctx.exit.queue_ms().is_some());
    assert!(permit.waited() < Duration::from_secs(5));
    assert_eq!(metric(&gw, "infergate_queue_wait_seconds_count", &[]), 1.0);
}

#[tokio::test]
async fn route_picks_a_healthy_worker_and_counts_why() {
    let gw = gateway(
        &["http://127.0.0.1:9".into(), "http://127.0.0.1:10".into()],
        None,
        None,
        None,
    );
    let live = gw.live();
    let pool = &live.pools[0];
    let v = validated(&gw, HELLO).await;
    let (first, _) = route::pick(pool, &v.valid.features, false, &gw.metrics).unwrap();
    let (second, _) = pool
        .pick(&v.valid.features, &[first.key], false, &gw.metrics)
        .unwrap();
    assert_ne!(first.key, second.key, "a retry goes to another worker");
    assert!(
        pool.pick(
            &v.valid.features,
            &[first.key, second.key],
            false,
            &gw.metrics
        )
        .is_none()
    );
    assert_eq!(metric(&gw, "infergate_routing_decisions_total", &[]), 2.0);
}

#[tokio::test]
async fn the_whole_pipeline_forwards_and_accounts_once_at_the_end() {
    let (addr, calls) = upstream().await;
    let gw = gateway(&[format!("http://{addr}")], Some(GOLD), None, None);
    let res = serve(&gw, chat(HELLO)).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().contains_key("x-request-id"));
    assert!(res.headers().contains_key("x-ratelimit-remaining-tokens"));
    // Counted when the body ends: a whole answer is held until its end, before its head goes
    // out (a body the worker breaks off is then a 502, not a truncated 200).
    assert_eq!(metric(&gw, "infergate_requests_total", &[]), 1.0);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["usage"]["completion_tokens"], 7);
    assert_eq!(calls.lock().unwrap().len(), 1);
    assert_eq!(
        metric(
            &gw,
            "infergate_requests_total",
            &[("model", "m"), ("status", "200")]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &gw,
            "infergate_tenant_requests_total",
            &[("tenant", "acme"), ("outcome", "ok")]
        ),
        1.0
    );

    // A refusal is accounted at once, by its reason, and never reaches the worker.
    let bad = serve(&gw, chat(r#"{"model":"nope","messages":[]}"#)).await;
    assert_eq!(bad.status(), StatusCode::NOT_FOUND);
    assert_eq!(calls.lock().unwrap().len(), 1);
    assert_eq!(
        metric(
            &gw,
            "infergate_tenant_requests_total",
            &[("tenant", "acme"), ("outcome", "rejected")]
        ),
        1.0
    );
}

#[tokio::test]
async fn metering_runs_before_the_split_and_the_account_prices_the_version_that_served() {
    let (addr, calls) = upstream().await;
    let all_canary = "models:\n  m:\n    versions:\n      - {name: stable, model: m, weight: 0}\n      - {name: canary, model: m-canary, weight: 100}\n";
    let prices = "version: 1\nmodels:\n  m: {input: 1.0, output: 1.0}\n  m-canary: {input: 10.0, output: 10.0}\n";
    let gw = gateway_with(
        "",
        &[format!("http://{addr}")],
        Some(GOLD),
        (Some(all_canary), None, Some(prices)),
    );
    let res = serve(&gw, chat(HELLO)).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-infergate-version"], "canary");
    let _ = res.into_body().collect().await.unwrap();
    assert_eq!(calls.lock().unwrap().len(), 1);
    // 5 prompt and 7 completion tokens at the canary's $10 per million, not the stable $1.
    assert_eq!(
        metric(
            &gw,
            "infergate_tenant_cost_nanousd_total",
            &[("tenant", "acme"), ("model", "m")]
        ),
        120_000.0
    );
}

/// A worker that reads each request and then keeps it waiting with the connection open: with
/// `head`, after a 200 and one SSE event; without, before any byte of the answer.
async fn stalling_upstream(head: bool) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                if stream.read(&mut buf).await.unwrap_or(0) == 0 {
                    return;
                }
                if head {
                    let event =
                        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                         transfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
                        event.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                }
                // Read on (and ignore) until the gateway closes the connection.
                while stream.read(&mut buf).await.unwrap_or(0) > 0 {}
            });
        }
    });
    addr
}

/// Forward timeouts as operators set them (tens of seconds), run on tokio's paused clock: the
/// clock jumps to each deadline, so the test takes milliseconds and sees the exact limits.
const TIMEOUTS: &str =
    "forward:\n  first_byte_timeout: 30s\n  idle_timeout: 20s\n  total_timeout: 10m\n";

/// A gateway with [`TIMEOUTS`] in front of one [`stalling_upstream`].
async fn stalled_gateway(head: bool) -> Arc<Gateway> {
    let addr = stalling_upstream(head).await;
    gateway_with(
        TIMEOUTS,
        &[format!("http://{addr}")],
        Some(GOLD),
        (None, None, None),
    )
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_never_answers_is_a_504_at_the_first_byte_timeout() {
    let gw = stalled_gateway(false).await;
    let start = tokio::time::Instant::now();
    let res = serve(&gw, chat(HELLO)).await;
    let waited = start.elapsed();
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(
        (Duration::from_secs(30)..Duration::from_secs(31)).contains(&waited),
        "{waited:?}"
    );
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(json["error"]["message"].is_string(), "{json}");
    let kind = [("kind", "first_byte_timeout")];
    assert_eq!(metric(&gw, "infergate_upstream_errors_total", &kind), 1.0);
    let failed = [("tenant", "acme"), ("outcome", "upstream_error")];
    assert_eq!(metric(&gw, "infergate_tenant_requests_total", &failed), 1.0);
    // The worker may still be running it: a timeout is not retried elsewhere.
    assert_eq!(metric(&gw, "infergate_retries_total", &[]), 0.0);
}

#[tokio::test(start_paused = true)]
async fn a_stream_the_worker_stops_feeding_ends_with_an_error_event_at_the_idle_timeout() {
    let gw = stalled_gateway(true).await;
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}"#;
    let res = serve(&gw, chat(body)).await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(first.starts_with(b"data: {\"choices\""), "{first:?}");
    let since_first = tokio::time::Instant::now();
    let mut rest = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            rest.extend_from_slice(&data);
        }
    }
    let waited = since_first.elapsed();
    assert!(
        (Duration::from_secs(20)..Duration::from_secs(21)).contains(&waited),
        "{waited:?}"
    );
    let rest = String::from_utf8(rest).unwrap();
    assert!(
        rest.starts_with("data: {\"error\"") && rest.ends_with("data: [DONE]\n\n"),
        "{rest:?}"
    );
    let kind = [("kind", "idle_timeout")];
    assert_eq!(metric(&gw, "infergate_upstream_errors_total", &kind), 1.0);
    // Counted when the stream ended, as the failure it was, not as its 200.
    let failed = [("model", "m"), ("status", "502")];
    assert_eq!(metric(&gw, "infergate_requests_total", &failed), 1.0);
    let ok = [("tenant", "acme"), ("outcome", "ok")];
    assert_eq!(metric(&gw, "infergate_tenant_requests_total", &ok), 0.0);
}

#[tokio::test]
async fn the_edge_gives_every_request_an_id_and_passes_only_well_formed_trace_context_on() {
    let (addr, seen) = upstream().await;
    let gw = gateway(&[format!("http://{addr}")], Some(GOLD), None, None);
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut traced = chat(HELLO);
    traced
        .headers_mut()
        .insert("traceparent", parent.parse().unwrap());
    traced
        .headers_mut()
        .insert("x-request-id", "client-7".parse().unwrap());
    let res = serve(&gw, traced).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-request-id"], "client-7");
    let _ = res.into_body().collect().await.unwrap();
    let mut malformed = chat(HELLO);
    malformed
        .headers_mut()
        .insert("traceparent", "00-not-a-trace".parse().unwrap());
    let res = serve(&gw, malformed).await;
    let fresh = res.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(fresh.len(), 32, "{fresh}");
    let _ = res.into_body().collect().await.unwrap();
    let heads = seen.lock().unwrap();
    assert_eq!(heads.len(), 2);
    assert_eq!(heads[0]["traceparent"], parent);
    assert_eq!(heads[0]["x-request-id"], "client-7");
    assert!(!heads[1].contains_key("traceparent"), "{:?}", heads[1]);
    assert_eq!(
        heads[1]["x-request-id"],
        fresh.as_str(),
        "the worker sees the same id"
    );
}

#[tokio::test]
async fn past_the_in_flight_cap_a_request_gets_503_until_an_answer_is_done() {
    let (addr, seen) = upstream().await;
    let gw = gateway_with(
        "limits: {max_requests_in_flight: 1}\n",
        &[format!("http://{addr}")],
        Some(GOLD),
        (None, None, None),
    );
    // The first answer's body is not read yet: it holds the one place.
    let first = serve(&gw, chat(HELLO)).await;
    assert_eq!(first.status(), StatusCode::OK);
    let shed = serve(&gw, chat(HELLO)).await;
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shed.headers()["retry-after"], "1");
    assert!(shed.headers().contains_key("x-request-id"));
    let body = shed.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"]["type"], "service_unavailable", "{json}");
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the refused one never reached the worker"
    );
    let models = serve(
        &gw,
        Request::get("/v1/models")
            .header("host", "gw")
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(models.status(), StatusCode::OK, "reads are not capped");
    let text = gw.render_metrics();
    assert!(text.contains("infergate_requests_shed_total 1"), "{text}");
    assert!(text.contains("infergate_requests_in_flight 1"), "{text}");
    let _ = first.into_body().collect().await.unwrap();
    let next = serve(&gw, chat(HELLO)).await;
    assert_eq!(
        next.status(),
        StatusCode::OK,
        "the finished answer gave its place back"
    );
}

/// Metrics of their own, for a context made without a gateway.
fn metrics() -> std::sync::Arc<crate::metrics::GatewayMetrics> {
    std::sync::Arc::new(crate::metrics::GatewayMetrics::new().unwrap())
}
