//! The engine's flight record, end to end: two sim engines behind the gateway with a trace file
//! (`trace: {path}`); a whole answer and a stream each leave one JSON line with the engine's
//! paths, steps, batch sizes and tokens and the gateway's tenant, pool, worker, model, status and
//! timings. The client sees neither the `x-infergate-flight` header nor the `: flight` comment
//! unless `debug_headers` is on. A rogue worker beside a healthy engine sending a huge or
//! malformed record breaks nothing: its records are ignored and counted.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::gateway::{Gateway, MODEL, POOL, TempDir, chat, config_yaml, routing_yaml, send};
use common::rogue::{IDLE_VLLM_METRICS, Rogue, RogueRequest, Step, answer, chat_chunk, sse_data};
use common::{Engine, Streamed, eventually, stream_with};
use hyper::body::Bytes;
use hyper::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};

/// The config of `workers` with a trace file and `debug_headers` as given.
fn config(workers: &[&str], debug_headers: bool) -> String {
    config_yaml(
        workers,
        "trace: {path: trace.jsonl, sample: 1, max_bytes: 1048576, keep: 2}\n",
    )
    .replace(
        "debug_headers: true",
        &format!("debug_headers: {debug_headers}"),
    )
}

/// The trace file's lines, parsed.
fn trace_lines(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("trace.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("trace line {l:?}: {e}")))
        .collect()
}

/// Waits until the trace file holds a line for each of `ids`; returns them in that order.
async fn lines_for(dir: &Path, ids: &[&str]) -> Vec<Value> {
    eventually("trace lines", Duration::from_secs(10), || async {
        let lines = trace_lines(dir);
        ids.iter()
            .map(|id| lines.iter().find(|l| l["request_id"] == *id).cloned())
            .collect::<Option<Vec<_>>>()
    })
    .await
}

/// The `: flight` comments a stream carried.
fn flight_comments(s: &Streamed) -> Vec<&String> {
    s.events
        .iter()
        .flat_map(|e| &e.comments)
        .filter(|c| c.trim_start().starts_with("flight"))
        .collect()
}

async fn whole(url: &str, id: &str, tokens: u64) -> HeaderMap {
    let body = chat("Be brief.", "Say something.", tokens, false).to_string();
    let (status, headers, text) = send(Method::POST, url, &[("x-request-id", id)], Some(body))
        .await
        .expect("whole answer");
    assert_eq!(status, StatusCode::OK, "{text}");
    headers
}

/// Checks the engine's record in `line` for a request of `tokens` generated tokens.
fn check_engine_record(line: &Value, tokens: u64, stream: bool, engines: &[&str]) {
    assert_eq!(line["flight_status"], "ok", "{line}");
    let f = &line["flight"];
    assert_eq!(f["v"], infergate_engine::flight::FORMAT_VERSION);
    assert_eq!(f["backend"], "sim");
    assert!(!f["capture"].as_array().unwrap().is_empty(), "{f}");
    let (graph, eager) = (
        f["steps"]["graph"].as_u64().unwrap(),
        f["steps"]["eager"].as_u64().unwrap(),
    );
    let off_path = f["off_path"].as_u64().unwrap();
    assert!(
        f["eager_shared"].as_u64().unwrap() <= off_path && off_path <= eager,
        "{f}"
    );
    // The prefill step is eager; the decode steps of a lone request replay the size-1 graph.
    assert!(eager >= 1, "{f}");
    assert_eq!(graph + eager, tokens, "one step per token: {f}");
    // The same steps by batch size, decode-only apart from prefill.
    let hist_steps = |kind: &str| -> u64 {
        f["batch_hist"][kind]["bins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|bin| bin[1].as_u64().unwrap())
            .sum()
    };
    assert_eq!(hist_steps("decode") + hist_steps("mixed"), tokens, "{f}");
    assert!(
        hist_steps("mixed") >= 1 && hist_steps("decode") >= graph,
        "{f}"
    );
    let (min, max, mean) = (
        f["batch"]["min"].as_u64().unwrap(),
        f["batch"]["max"].as_u64().unwrap(),
        f["batch"]["mean"].as_f64().unwrap(),
    );
    assert!(
        min >= 1 && min <= max && (min as f64) <= mean && mean <= max as f64,
        "{f}"
    );
    assert!(f["tokens"]["prompt"].as_u64().unwrap() > 0, "{f}");
    assert_eq!(f["tokens"]["decode"], tokens);
    assert_eq!(f["features"]["stream"], stream);
    assert_eq!(f["features"]["n"], 1);
    assert!(f["decode_ms"].as_f64().unwrap() > 0.0, "{f}");
    // The gateway's own fields.
    assert_eq!(line["status"], 200);
    assert_eq!(line["stream"], stream);
    assert_eq!(line["model"], MODEL);
    assert_eq!(line["pool"], POOL);
    assert!(!line["tenant"].as_str().unwrap().is_empty(), "{line}");
    assert!(
        engines.contains(&line["worker"].as_str().unwrap()),
        "{line}"
    );
    assert_eq!(line["completion_tokens"], tokens);
    let (ttft, total) = (
        line["ttft_ms"].as_f64().unwrap(),
        line["total_ms"].as_f64().unwrap(),
    );
    assert!(ttft > 0.0 && ttft <= total, "{line}");
}

#[tokio::test]
async fn each_request_leaves_one_trace_line_with_the_engines_record() {
    let engines = [
        Engine::start(&["--gpu", "l4"]).await,
        Engine::start(&["--gpu", "l4"]).await,
    ];
    let urls = [engines[0].url.as_str(), engines[1].url.as_str()];
    let dir = TempDir::new("flight");
    dir.write_config(&config(&urls, false));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let url = gw.at("/v1/chat/completions");

    let headers = whole(&url, "flight-whole", 4).await;
    assert!(!headers.contains_key("x-infergate-flight"), "{headers:?}");
    let s = stream_with(
        &url,
        &[("x-request-id", "flight-stream")],
        &chat("Be brief.", "Say more.", 6, true),
    )
    .await;
    assert_eq!(s.status, StatusCode::OK);
    assert_eq!(s.last_data(), "[DONE]");
    assert!(flight_comments(&s).is_empty(), "{:?}", s.events);

    let lines = lines_for(&dir.path, &["flight-whole", "flight-stream"]).await;
    check_engine_record(&lines[0], 4, false, &urls);
    check_engine_record(&lines[1], 6, true, &urls);
    assert_eq!(trace_lines(&dir.path).len(), 2, "one line per request");
    assert_eq!(
        gw.metric("infergate_flight_records_total{result=\"ok\"}")
            .await,
        2.0
    );
    // The writer thread counts a line after appending it, so the file can show it first.
    let written = gw
        .settle_metric(
            "infergate_trace_lines_total{result=\"written\"}",
            Duration::from_secs(5),
            |v| v >= 2.0,
        )
        .await;
    assert_eq!(written, 2.0);

    // With debug headers on, the client sees the record too.
    let dir2 = TempDir::new("flight-debug");
    dir2.write_config(&config(&urls, true));
    dir2.write_routing(&routing_yaml("round_robin", &[]));
    let gw2 = Gateway::start(&dir2.config(), &[]).await;
    let url2 = gw2.at("/v1/chat/completions");
    let headers = whole(&url2, "flight-debug-whole", 3).await;
    let raw = headers["x-infergate-flight"].to_str().unwrap();
    let record: Value = serde_json::from_str(raw).unwrap();
    assert_eq!(record["tokens"]["decode"], 3);
    let s = stream_with(&url2, &[], &chat("Be brief.", "More.", 3, true)).await;
    assert_eq!(flight_comments(&s).len(), 1, "{:?}", s.events);
    assert_eq!(s.last_data(), "[DONE]");
}

/// A worker whose records are broken: a 100 KB record on streams, a malformed header on whole
/// answers, everything else well formed.
fn broken_records(req: &RogueRequest) -> Vec<Step> {
    if req.method == "GET" {
        return answer(200, "text/plain", IDLE_VLLM_METRICS);
    }
    let body = req.json();
    let usage = json!({"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14});
    if body["stream"] == json!(true) {
        let huge = format!(
            ": flight {{\"v\":1,\"engine\":\"{}\"}}\n\n",
            "x".repeat(100_000)
        );
        let usage_chunk = json!({"id": "x", "object": "chat.completion.chunk", "created": 0,
            "model": MODEL, "choices": [], "usage": usage});
        return vec![
            Step::Send(Bytes::from_static(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
            )),
            sse_data(&chat_chunk(MODEL, "one")),
            sse_data(&chat_chunk(MODEL, " two")),
            sse_data(&usage_chunk.to_string()),
            Step::Send(Bytes::from(huge)),
            sse_data("[DONE]"),
            Step::Close,
        ];
    }
    let answer_body = json!({
        "id": "chatcmpl-rogue", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "one two"},
                     "finish_reason": "stop"}],
        "usage": usage,
    })
    .to_string();
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-infergate-flight: {{\"v\":1,\"steps\":{{\"graph\":-5}}\r\ncontent-length: {}\r\n\r\n",
        answer_body.len()
    );
    vec![
        Step::Send(Bytes::from(head)),
        Step::Send(Bytes::from(answer_body)),
    ]
}

#[tokio::test]
async fn a_rogue_workers_broken_records_are_ignored_and_counted() {
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let rogue = Rogue::start(broken_records).await;
    let urls = [engine.url.as_str(), rogue.url.as_str()];
    let dir = TempDir::new("flight-rogue");
    dir.write_config(&config(&urls, false));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let url = gw.at("/v1/chat/completions");

    let mut ids = Vec::new();
    for i in 0..8 {
        let id = format!("rogue-{i}");
        if i % 4 < 2 {
            whole(&url, &id, 2).await;
        } else {
            let s = stream_with(
                &url,
                &[("x-request-id", &id)],
                &chat("Be brief.", "Two words.", 2, true),
            )
            .await;
            assert_eq!(s.status, StatusCode::OK);
            assert_eq!(s.last_data(), "[DONE]");
            assert!(flight_comments(&s).is_empty(), "{:?}", s.events);
        }
        ids.push(id);
    }
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let lines = lines_for(&dir.path, &id_refs).await;
    let (mut from_rogue, mut from_engine) = (0, 0);
    for line in &lines {
        assert_eq!(line["status"], 200, "{line}");
        if line["worker"] == rogue.url.as_str() {
            from_rogue += 1;
            assert_eq!(line["flight_status"], "invalid", "{line}");
            assert!(line["flight"].is_null(), "{line}");
        } else {
            from_engine += 1;
            check_engine_record(line, 2, line["stream"] == true, &urls);
        }
    }
    assert!(from_rogue >= 2 && from_engine >= 2, "{lines:?}");
    assert_eq!(
        gw.metric("infergate_flight_records_total{result=\"invalid\"}")
            .await,
        from_rogue as f64
    );
    assert!(rogue.requests() >= 2);
}
