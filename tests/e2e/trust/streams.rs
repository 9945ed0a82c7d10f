//! An error inside an answer is an error, and a worker that fails real requests is ejected.
//!
//! - A 200 stream that then carries `data: {"error": ...}` (as SGLang sends), a stream cut
//!   before its `[DONE]`, and a whole answer shorter than its Content-Length: the client gets the
//!   gateway's OpenAI-shaped error event (or a 502), never a clean 200; the request counts as a
//!   502 upstream error for `infergate_requests_total`, the tenant's outcome and the ledger's
//!   reason, and only what reached the client is billed. A stream whose chunked framing breaks
//!   ends the same way.
//! - An answer head that breaks HTTP/1.1 (a bad or conflicting Content-Length, a head past
//!   64 KiB): a failed send, retried on the healthy engine.
//! - A worker whose `/metrics` is fine but which hangs on every request is ejected after
//!   `outlier.eject_after` first-byte timeouts (clients are retried on the healthy engine), gets
//!   one probe when its ejection time is up, and a failed probe ejects it again.
//!
//! Each case runs the rogue beside a healthy engine in one round-robin pool.

use crate::tenant_support;

use std::collections::HashMap;
use std::time::Duration;

use hyper::StatusCode;
use hyper::body::Bytes;
use serde_json::Value;

use crate::common::gateway::{Gateway, chat, config_yaml, routing_yaml, worker_of};
use crate::common::rogue::{
    IDLE_VLLM_METRICS, Rogue, RogueRequest, Step, answer, chat_chunk, sse_data, sse_head,
};
use crate::common::{Engine, SseEvent, TempDir, open_stream_with};
use tenant_support::{Gw, MODEL, POOL, Setup, key_of, post, wait_rows};

/// The tenant every request here is sent as.
const TENANT: &str = "acme";
/// How long the ledger may take to hold a test's rows (it flushes every second).
const FLUSHED: Duration = Duration::from_secs(30);
/// What the rogue says in its own error event: the client must not see it.
const ROGUE_ERROR: &str =
    r#"{"error":{"message":"rogue: CUDA out of memory","type":"InternalServerError","code":500}}"#;

/// A rogue that looks healthy to the poller and answers every other request with `steps`.
async fn rogue(steps: fn() -> Vec<Step>) -> Rogue {
    Rogue::start(move |req: &RogueRequest| {
        if req.path.starts_with("/metrics") {
            answer(200, "text/plain", IDLE_VLLM_METRICS)
        } else {
            steps()
        }
    })
    .await
}

/// A gateway with tenant [`TENANT`] and a ledger, round robin over the rogue and the engine;
/// the rogue stays in the pool whatever it does (a high `outlier.eject_after`).
async fn tenant_gateway(dir: &TempDir, workers: &[&str]) -> Gw {
    let setup = Setup {
        workers,
        extra: "ledger: {path: usage.sqlite}\ndebug_headers: true\noutlier: {eject_after: 1000}\n",
        tenants: &[(TENANT, "full")],
        tiers: "tiers:\n  full: {priority: 1}\n",
        ..Setup::default()
    };
    let config = setup.write(dir);
    dir.write(
        "policies/routing.yaml",
        &format!("pools:\n  {POOL}:\n    policy: round_robin\n"),
    );
    Gw::launch(&["gateway", "--config", &config.to_string_lossy()]).await
}

/// The ledger's rows (CSV export) by request id.
async fn ledger_rows(gw: &Gateway) -> HashMap<String, HashMap<String, String>> {
    let (status, text) = crate::common::get(&format!("{}/admin/usage.csv", gw.admin)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a CSV header").split(',').collect();
    lines
        .map(|l| {
            let row: HashMap<String, String> = header
                .iter()
                .zip(l.split(','))
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect();
            (row["request_id"].clone(), row)
        })
        .collect()
}

/// One streamed chat request as [`TENANT`] with request id `id`: the serving worker and the
/// events (read to the end of the body, which must end cleanly).
async fn stream_as_tenant(gw: &Gateway, id: &str) -> (String, Vec<SseEvent>) {
    let auth = format!("Bearer {}", key_of(TENANT));
    let mut s = open_stream_with(
        &gw.at("/v1/chat/completions"),
        &[("authorization", &auth), ("x-request-id", id)],
        &chat("Be brief.", &format!("Question {id}."), 4, true),
    )
    .await;
    assert_eq!(s.status, StatusCode::OK, "{id}");
    let worker = worker_of(&s.headers);
    let mut events = Vec::new();
    while let Some(ev) = s.next_event().await {
        events.push(ev);
    }
    (worker, events)
}

/// The content chunks of a stream (JSON events with `choices`).
fn content_chunks(events: &[SseEvent]) -> usize {
    events
        .iter()
        .filter_map(SseEvent::json)
        .filter(|c| {
            c["choices"]
                .as_array()
                .is_some_and(|choices| !choices.is_empty())
        })
        .count()
}

/// Asserts that a stream the rogue broke ended with the gateway's error event and `[DONE]`,
/// after exactly `content` content chunks, and without the rogue's own error.
fn assert_ends_in_gateway_error(events: &[SseEvent], content: usize) {
    let json: Vec<Value> = events.iter().filter_map(SseEvent::json).collect();
    assert_eq!(content_chunks(events), content, "{events:?}");
    let last = json.last().expect("JSON events");
    let error = &last["error"];
    assert!(
        error["message"].is_string(),
        "last event is no error: {events:?}"
    );
    assert_eq!(error["type"], "server_error", "{error}");
    assert!(
        !events
            .iter()
            .any(|e| e.data.as_deref().is_some_and(|d| d.contains("CUDA"))),
        "the rogue's own error event reached the client: {events:?}"
    );
    assert_eq!(
        events.last().and_then(|e| e.data.as_deref()),
        Some("[DONE]")
    );
    assert_eq!(
        json.iter().filter(|c| c.get("error").is_some()).count(),
        1,
        "{events:?}"
    );
}

/// The gateway's counts of a case where the rogue broke `broken` requests of `kind`, and the
/// engine served `served`.
async fn assert_counted(gw: &Gateway, broken: usize, served: usize, kind: &str) {
    let requests = |status: &str| {
        format!("infergate_requests_total{{model=\"{MODEL}\",pool=\"{POOL}\",status=\"{status}\"}}")
    };
    let outcome =
        |o: &str| format!("infergate_tenant_requests_total{{tenant=\"{TENANT}\",outcome=\"{o}\"}}");
    let errors = format!("infergate_upstream_errors_total{{pool=\"{POOL}\",kind=\"{kind}\"}}");
    gw.wait_metric(&requests("502"), |v| v == broken as f64)
        .await;
    assert_eq!(gw.metric(&requests("200")).await, served as f64);
    assert_eq!(gw.metric(&outcome("upstream_error")).await, broken as f64);
    assert_eq!(gw.metric(&outcome("ok")).await, served as f64);
    assert_eq!(gw.metric(&errors).await, broken as f64);
}

/// Runs four streamed requests through a gateway over a rogue answering `steps` and an engine,
/// and checks each: the rogue's end in the gateway's error event after `content` chunks, counted
/// as upstream errors of `kind`, ledger rows with the reason set and `content` completion tokens
/// billed; the engine's complete and clean.
async fn broken_stream_case(name: &str, steps: fn() -> Vec<Step>, content: usize, kind: &str) {
    let rogue = rogue(steps).await;
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let dir = TempDir::new(name);
    let gw = tenant_gateway(&dir, &[&rogue.url, &engine.url]).await;
    let mut by_worker: HashMap<String, Vec<String>> = HashMap::new();
    for i in 0..4 {
        let id = format!("{name}-{i}");
        let (worker, events) = stream_as_tenant(&gw, &id).await;
        if worker == rogue.url {
            assert_ends_in_gateway_error(&events, content);
        } else {
            assert_eq!(worker, engine.url);
            assert!(content_chunks(&events) >= 4, "{events:?}");
            assert!(
                events
                    .iter()
                    .filter_map(SseEvent::json)
                    .all(|c| c.get("error").is_none()),
                "{events:?}"
            );
            assert_eq!(
                events.last().and_then(|e| e.data.as_deref()),
                Some("[DONE]")
            );
        }
        by_worker.entry(worker).or_default().push(id);
    }
    let broken = by_worker.get(&rogue.url).cloned().unwrap_or_default();
    let served = by_worker.get(&engine.url).cloned().unwrap_or_default();
    assert_eq!(
        (broken.len(), served.len()),
        (2, 2),
        "round robin: {by_worker:?}"
    );
    assert_eq!(rogue.requests(), 2);
    assert_counted(&gw, broken.len(), served.len(), kind).await;

    wait_rows(&gw, 4, FLUSHED).await;
    let rows = ledger_rows(&gw).await;
    for id in &broken {
        let row = &rows[id];
        assert_eq!(row["reason"], "upstream_failed", "{row:?}");
        assert_eq!(row["status"], "200", "the worker's head said 200: {row:?}");
        assert_eq!(row["worker"], rogue.url);
        assert_eq!(
            row["completion_tokens"],
            content.to_string(),
            "billed only the content that reached the client: {row:?}"
        );
    }
    for id in &served {
        let row = &rows[id];
        assert_eq!(row["reason"], "", "{row:?}");
        assert_eq!(row["completion_tokens"], "4", "{row:?}");
    }
}

fn content_then_error() -> Vec<Step> {
    vec![
        sse_head(),
        sse_data(&chat_chunk(MODEL, "One")),
        sse_data(&chat_chunk(MODEL, " two")),
        sse_data(&chat_chunk(MODEL, " three")),
        // SGLang's way to fail after its 200, then the end it still sends.
        sse_data(ROGUE_ERROR),
        sse_data("[DONE]"),
        Step::Close,
    ]
}

fn cut_before_done() -> Vec<Step> {
    vec![
        sse_head(),
        sse_data(&chat_chunk(MODEL, "One")),
        sse_data(&chat_chunk(MODEL, " two")),
        // A close-delimited body: the connection's end looks like a clean end of the stream.
        Step::Close,
    ]
}

#[tokio::test]
async fn an_error_event_after_a_200_is_an_upstream_error_billed_for_what_was_sent() {
    broken_stream_case("stream-error-event", content_then_error, 3, "error_event").await;
}

#[tokio::test]
async fn a_stream_cut_before_done_is_an_upstream_error() {
    broken_stream_case("stream-no-done", cut_before_done, 2, "no_done").await;
}

fn short_body() -> Vec<Step> {
    let body = br#"{"id":"chatcmpl-rogue","object":"chat.completion","model":"llama-3-8b","choices":[{"index":0,"message":{"role":"assistant","content":"One two"#;
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len() + 200
    );
    vec![
        Step::Send(Bytes::from(head)),
        Step::Send(Bytes::from_static(body)),
        Step::Close,
    ]
}

#[tokio::test]
async fn a_body_shorter_than_its_content_length_is_a_502_never_a_clean_200() {
    let rogue = rogue(short_body).await;
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let dir = TempDir::new("short-body");
    let gw = tenant_gateway(&dir, &[&rogue.url, &engine.url]).await;
    let url = gw.at("/v1/chat/completions");
    let (mut broken, mut served) = (Vec::new(), Vec::new());
    for i in 0..4 {
        // `post` fails the test on a body that breaks off: the answer must be whole.
        let reply = post(
            &url,
            Some(&key_of(TENANT)),
            &chat("Be brief.", &format!("Question {i}."), 4, false),
        )
        .await;
        let id = reply
            .header("x-request-id")
            .expect("x-request-id")
            .to_owned();
        match reply.status {
            StatusCode::BAD_GATEWAY => {
                let error = &reply.json()["error"];
                assert_eq!(error["type"], "server_error", "{}", reply.text);
                broken.push(id);
            }
            StatusCode::OK => {
                assert_eq!(worker_of(&reply.headers), engine.url);
                assert_eq!(reply.json()["usage"]["completion_tokens"], 4);
                served.push(id);
            }
            other => panic!("{other}: {}", reply.text),
        }
    }
    assert_eq!((broken.len(), served.len()), (2, 2), "round robin");
    assert_eq!(rogue.requests(), 2);
    assert_counted(&gw, 2, 2, "mid_stream").await;

    wait_rows(&gw, 4, FLUSHED).await;
    let rows = ledger_rows(&gw).await;
    for id in &broken {
        let row = &rows[id];
        assert_eq!(row["reason"], "upstream_failed", "{row:?}");
        assert_eq!(row["status"], "502", "{row:?}");
        // Nothing reached the client: nothing is billed.
        assert_eq!(
            (
                row["prompt_tokens"].as_str(),
                row["completion_tokens"].as_str()
            ),
            ("0", "0"),
            "{row:?}"
        );
    }
    for id in &served {
        assert_eq!(rows[id]["reason"], "", "{:?}", rows[id]);
    }
}

fn hang() -> Vec<Step> {
    vec![Step::Hang]
}

#[tokio::test]
async fn a_worker_that_hangs_on_requests_is_ejected_probed_once_and_ejected_again() {
    let rogue = rogue(hang).await;
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let dir = TempDir::new("hang-outlier");
    // Polls every 100 ms (the rogue answers them well); 300 ms to a first byte, then another
    // worker; 3 failed requests in a row eject, for 3 s, then 6 s.
    dir.write_config(&config_yaml(
        &[&rogue.url, &engine.url],
        "health: {poll_interval: 100ms, timeout: 1s, eject_after: 2, readmit_after: 2}\n\
         forward: {first_byte_timeout: 300ms, retries: 2}\n\
         outlier: {eject_after: 3, base_ejection_time: 3s, max_ejection_time: 20s}\n",
    ));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let url = gw.at("/v1/chat/completions");
    let ask = |i: usize| {
        let url = url.clone();
        async move {
            let (status, headers, body) = crate::common::post_json(
                &url,
                &chat("Be brief.", &format!("Question {i}."), 2, false),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            worker_of(&headers)
        }
    };
    let pool = crate::common::gateway::POOL;
    let ejected = |kind: &str| {
        format!("infergate_worker_outlier_ejections_total{{pool=\"{pool}\",kind=\"{kind}\"}}")
    };

    // Every client gets its 200 from the engine, those sent to the rogue after a retry, until
    // the rogue's third timeout in a row ejects it; its good polls meanwhile change nothing.
    let mut i = 0;
    while rogue.requests() < 3 {
        assert!(i < 20, "the rogue got {} requests of {i}", rogue.requests());
        assert_eq!(ask(i).await, engine.url);
        i += 1;
    }
    assert!(rogue.metrics_polls() > 0);
    gw.wait_metric(&ejected("first_byte_timeout"), |v| v == 1.0)
        .await;
    gw.wait_health(&rogue.url, false, Duration::from_secs(2))
        .await;
    let timeouts = gw
        .metric(&format!(
            "infergate_upstream_errors_total{{pool=\"{pool}\",kind=\"first_byte_timeout\"}}"
        ))
        .await;
    assert_eq!(timeouts, 3.0);
    // Ejected: nothing reaches it.
    for _ in 0..3 {
        assert_eq!(ask(i).await, engine.url);
        i += 1;
    }
    assert_eq!(rogue.requests(), 3);

    // Its time up, it may take one probe, and only one: of four requests at once, one goes to
    // it (and on to the engine after its timeout), the others to the engine.
    gw.wait_health(&rogue.url, true, Duration::from_secs(10))
        .await;
    let burst: Vec<_> = (0..4).map(|k| tokio::spawn(ask(i + k))).collect();
    i += 4;
    for task in burst {
        assert_eq!(task.await.expect("request task"), engine.url);
    }
    assert_eq!(rogue.requests(), 4, "one probe");
    gw.wait_metric(
        &format!("infergate_worker_probes_total{{pool=\"{pool}\",result=\"failed\"}}"),
        |v| v == 1.0,
    )
    .await;
    // The failed probe ejected it again, at once (not after three more failures).
    assert_eq!(
        gw.metric(&format!(
            "infergate_worker_ejections_total{{pool=\"{pool}\"}}"
        ))
        .await,
        2.0
    );
    assert_eq!(gw.worker_status(&rogue.url).await["ejections"], 2);
    for _ in 0..3 {
        assert_eq!(ask(i).await, engine.url);
        i += 1;
    }
    assert_eq!(rogue.requests(), 4);
}

/// One HTTP/1.1 chunk holding `data`.
fn chunk(data: &str) -> Step {
    Step::Send(Bytes::from(format!("{:x}\r\n{data}\r\n", data.len())))
}

fn chunked_then_junk() -> Vec<Step> {
    vec![
        Step::Send(Bytes::from_static(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
        )),
        chunk(&format!("data: {}\n\n", chat_chunk(MODEL, "One"))),
        chunk(&format!("data: {}\n\n", chat_chunk(MODEL, " two"))),
        // Not a chunk size; the connection stays open, so only the framing can end the stream.
        Step::Send(Bytes::from_static(b"zz\r\n")),
        Step::Hang,
    ]
}

#[tokio::test]
async fn a_stream_whose_chunked_framing_breaks_ends_in_the_gateways_error_event() {
    broken_stream_case("stream-bad-chunk", chunked_then_junk, 2, "mid_stream").await;
}

/// The heads the rogue of the next test answers with, in turn: each breaks HTTP/1.1 or a bound.
static BROKEN_HEADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn broken_head() -> Vec<Step> {
    let n = BROKEN_HEADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let head = match n % 3 {
        0 => "HTTP/1.1 200 OK\r\ncontent-length: 12x\r\n\r\n".to_string(),
        1 => "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}".to_string(),
        // A head past the gateway's 64 KiB bound, never ended.
        _ => format!("HTTP/1.1 200 OK\r\nx-pad: {}", "a".repeat(70 * 1024)),
    };
    vec![Step::Send(Bytes::from(head)), Step::Hang]
}

#[tokio::test]
async fn an_answer_head_that_breaks_http_is_retried_on_another_worker() {
    let rogue = rogue(broken_head).await;
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let dir = TempDir::new("broken-head");
    let gw = tenant_gateway(&dir, &[&rogue.url, &engine.url]).await;
    let url = gw.at("/v1/chat/completions");
    for i in 0..6 {
        let reply = post(
            &url,
            Some(&key_of(TENANT)),
            &chat("Be brief.", &format!("Question {i}."), 4, false),
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        assert_eq!(worker_of(&reply.headers), engine.url);
        assert_eq!(reply.json()["usage"]["completion_tokens"], 4);
    }
    // Round robin sent the rogue its share first; each of its broken heads was a failed send.
    let broken = rogue.requests();
    assert!(broken >= 3, "the rogue got {broken} requests");
    let sends = format!("infergate_upstream_errors_total{{pool=\"{POOL}\",kind=\"send\"}}");
    assert_eq!(gw.metric(&sends).await, broken as f64);
    let retries = format!("infergate_retries_total{{pool=\"{POOL}\"}}");
    assert_eq!(gw.metric(&retries).await, broken as f64);
}
