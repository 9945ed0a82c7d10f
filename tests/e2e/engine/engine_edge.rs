//! The engine worker's edge, the tower layers it shares with the gateway's listeners: every
//! answer carries an `x-request-id` (the client's, or a fresh one), request bodies are bounded in
//! size (413) and in time (408, one deadline for the whole body), and requests in flight are
//! capped (503 with Retry-After) while reads still pass. A real engine process on loopback, raw
//! sockets for the slow client.

use crate::common;

use std::time::{Duration, Instant};

use common::{Conn, Engine, eventually, post_raw};
use hyper::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A small chat request the sim engine answers.
fn small_chat() -> String {
    r#"{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#
        .to_string()
}

#[tokio::test]
async fn every_answer_carries_a_request_id() {
    let engine = Engine::start(&[]).await;
    let mut conn = Conn::open(&engine.url).await.expect("connect");
    let res = conn
        .send_with(
            Method::GET,
            "/v1/models",
            &[("x-request-id", "client-1")],
            None,
        )
        .await
        .expect("models");
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-request-id"], "client-1");
    // A refusal made before any endpoint (a 404) carries a fresh one.
    let res = conn.send(Method::GET, "/nowhere", None).await.expect("404");
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let id = res.headers()["x-request-id"].to_str().expect("text");
    assert_eq!(id.len(), 32, "{id}");
    let (status, headers, body) = post_raw(&engine.at("/v1/chat/completions"), small_chat()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(headers.contains_key("x-request-id"), "{headers:?}");
}

/// Opens an upload that declares more bytes than it sends.
async fn unfinished_upload(engine: &Engine) -> TcpStream {
    let addr = engine.url.trim_start_matches("http://");
    let mut sock = TcpStream::connect(addr).await.expect("connect");
    sock.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"model\":",
    )
    .await
    .expect("write");
    sock
}

#[tokio::test]
async fn a_slow_upload_gets_408_and_holds_the_only_place_until_then() {
    let engine = Engine::start(&[
        "--body-read-timeout",
        "1.5",
        "--max-in-flight-requests",
        "1",
        "--max-body-bytes",
        "1000",
    ])
    .await;
    let started = Instant::now();
    let mut upload = unfinished_upload(&engine).await;
    // Once the engine has the upload's head, it holds the one place: a generation request is
    // refused at once, with the server's cap in the message; a read passes.
    eventually("the upload counted", Duration::from_secs(5), || async {
        let (_, text) = common::get(&engine.at("/metrics")).await;
        text.lines()
            .any(|l| l == "infergate_engine_requests_in_flight 1")
            .then_some(())
    })
    .await;
    let (status, headers, body) = post_raw(&engine.at("/v1/chat/completions"), small_chat()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("1 requests are in flight"), "{status} {body}");
    assert_eq!(headers["retry-after"], "1");
    assert!(headers.contains_key("x-request-id"));
    let mut conn = Conn::open(&engine.url).await.expect("connect");
    let res = conn
        .send(Method::GET, "/health", None)
        .await
        .expect("health");
    assert_eq!(res.status(), StatusCode::OK, "reads are never capped");
    // Past the body deadline the upload gets its 408 and the connection closes.
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), upload.read_to_end(&mut got))
        .await
        .expect("the upload's connection stayed open")
        .expect("read");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("did not arrive within"), "{text}");
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "answered after {:?}",
        started.elapsed()
    );
    // The place is free again.
    let (status, _, body) = post_raw(&engine.at("/v1/chat/completions"), small_chat()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, text) = common::get(&engine.at("/metrics")).await;
    assert!(
        text.lines()
            .any(|l| l == "infergate_engine_requests_shed_total 1"),
        "{text}"
    );
    // Over --max-body-bytes: 413 in the OpenAI shape.
    let big = format!(
        r#"{{"model":"llama-3-8b","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(2000)
    );
    let (status, _, body) = post_raw(&engine.at("/v1/chat/completions"), big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON error");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("exceeds 1000 bytes"),
        "{json}"
    );
}
