//! Streaming through the gateway: chunks pass through as the worker generates them (no
//! buffering), and a SIGTERM during a stream lets the stream finish while readiness fails, new
//! connections are refused, and the process exits 0 within the drain grace.

use crate::common;

use std::time::{Duration, Instant};

use common::gateway::{Gateway, TempDir, config_yaml, eventually, routing_yaml, send, worker_of};
use common::{Engine, SseEvent, open_stream, stream};
use hyper::{Method, StatusCode};
use serde_json::Value;

/// The generated text pieces of a chat stream (chunks with non-empty `delta.content`).
fn content_chunks(events: &[SseEvent]) -> Vec<(Instant, String)> {
    events
        .iter()
        .filter_map(|e| {
            let c = e.json()?;
            let text = c["choices"][0]["delta"]["content"].as_str()?.to_owned();
            (!text.is_empty()).then_some((e.at, text))
        })
        .collect()
}

/// A gateway in front of one `--gpu l4` engine (~75 ms per token), with `extra` config.
async fn slow_setup(tag: &str, extra: &str) -> (Engine, TempDir, Gateway) {
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let dir = TempDir::new(tag);
    dir.write_config(&config_yaml(&[&engine.url], extra));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    (engine, dir, gw)
}

fn long_chat(tokens: u64) -> Value {
    common::gateway::chat(
        "You are a patient narrator.",
        "Tell a long story.",
        tokens,
        true,
    )
}

#[tokio::test]
async fn chunks_reach_the_client_while_the_worker_is_still_generating() {
    let (engine, _dir, gw) = slow_setup("unbuffered", "").await;
    let s = stream(&gw.at("/v1/chat/completions"), &long_chat(30)).await;
    assert_eq!(s.status, StatusCode::OK);
    assert_eq!(worker_of(&s.headers), engine.url);
    assert_eq!(s.last_data(), "[DONE]");
    let pieces = content_chunks(&s.events);
    assert_eq!(pieces.len(), 30, "{:?}", s.chunks());

    let first = s.ttft();
    let total = s.events.last().expect("events").at - s.started;
    assert!(
        total >= Duration::from_millis(30 * 50),
        "30 l4 tokens took only {total:?}"
    );
    assert!(
        first.as_secs_f64() < 0.5 * total.as_secs_f64(),
        "first chunk after {first:?} of {total:?}: the stream was buffered"
    );
    // Tokens arrive spread out, as generated, not in one burst at the end.
    let spread = pieces[29].0 - pieces[0].0;
    assert!(
        spread >= Duration::from_millis(29 * 40),
        "token arrivals spread over {spread:?} only"
    );
    let gaps = pieces
        .windows(2)
        .filter(|w| w[1].0 - w[0].0 >= Duration::from_millis(20))
        .count();
    assert!(gaps >= 25, "only {gaps} of 29 inter-token gaps ≥ 20 ms");
}

#[tokio::test]
async fn sigterm_lets_the_stream_in_flight_finish_and_exits_zero() {
    let (_engine, _dir, mut gw) = slow_setup("drain", "drain: {grace: 20s}\n").await;
    let mut s = open_stream(&gw.at("/v1/chat/completions"), &long_chat(40)).await;
    assert_eq!(s.status, StatusCode::OK);
    let first = s.next_event().await.expect("first event");
    // Read the rest concurrently, so arrival times are true while the checks below run.
    let reader = tokio::spawn(async move {
        let mut events = vec![first];
        while let Some(ev) = s.next_event().await {
            events.push(ev);
        }
        events
    });

    let signalled = Instant::now();
    gw.signal("TERM");
    // Readiness fails at once (503, or the listener is already gone) ...
    let ready = gw.at("/readyz");
    eventually("/readyz failing", Duration::from_secs(2), || async {
        match send(Method::GET, &ready, &[], None).await {
            Ok((StatusCode::OK, _, _)) => None,
            _ => Some(()),
        }
    })
    .await;
    // ... and new connections are refused, on both listeners, while the stream still runs.
    let (public, admin) = (gw.addr, gw.admin.trim_start_matches("http://").to_owned());
    eventually(
        "new connections refused",
        Duration::from_secs(2),
        || async {
            let p = tokio::net::TcpStream::connect(public).await;
            let a = tokio::net::TcpStream::connect(admin.as_str()).await;
            (p.is_err() && a.is_err()).then_some(())
        },
    )
    .await;
    let refused_after = signalled.elapsed();

    let events = match reader.await {
        Ok(events) => events,
        Err(e) => {
            let exit = gw.wait_exit(Duration::from_secs(20)).await;
            panic!(
                "the stream in flight broke during the drain ({e}); gateway {exit}; stderr:\n{}",
                gw.stderr()
            );
        }
    };
    let finished = events.last().expect("events").at;
    assert!(
        finished - signalled > refused_after,
        "the stream ended before the listeners closed"
    );
    let pieces = content_chunks(&events);
    assert_eq!(pieces.len(), 40, "stream cut short: {events:?}");
    let chunks: Vec<Value> = events.iter().filter_map(SseEvent::json).collect();
    assert!(
        chunks.iter().all(|c| c.get("error").is_none()),
        "{chunks:?}"
    );
    let last = chunks.last().expect("chunks");
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
    assert_eq!(events.last().unwrap().data.as_deref(), Some("[DONE]"));

    let exit = gw.wait_exit(Duration::from_secs(20)).await;
    assert!(
        exit.success(),
        "exit {exit} after SIGTERM; stderr:\n{}",
        gw.stderr()
    );
}

/// A stream longer than the drain's grace ends, at the grace, with an SSE error event and
/// `[DONE]` (never a bare EOF), and the gateway exits within the grace plus a second or two.
#[tokio::test]
async fn at_the_end_of_the_grace_a_stream_gets_an_error_event_and_done() {
    let (_engine, _dir, mut gw) = slow_setup("drain-cut", "drain: {grace: 1s}\n").await;
    let mut s = open_stream(&gw.at("/v1/chat/completions"), &long_chat(4000)).await;
    assert_eq!(s.status, StatusCode::OK);
    let first = s.next_event().await.expect("first event");
    let signalled = Instant::now();
    gw.signal("TERM");
    let mut events = vec![first];
    while let Some(ev) = s.next_event().await {
        events.push(ev);
    }
    let ended = signalled.elapsed();
    assert!(
        ended < Duration::from_secs(4),
        "the stream ran {ended:?} past SIGTERM"
    );
    let n = events.len();
    assert!(n >= 3, "{events:?}");
    assert_eq!(
        events[n - 1].data.as_deref(),
        Some("[DONE]"),
        "no [DONE]: {:?}",
        &events[n - 2..]
    );
    let err = events[n - 2].json().expect("the error event is JSON");
    let message = err["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("shutting down"), "{err}");
    let exit = gw.wait_exit(Duration::from_secs(5)).await;
    assert!(exit.success(), "{exit}");
    assert!(
        signalled.elapsed() < Duration::from_secs(4),
        "exited {:?} after SIGTERM",
        signalled.elapsed()
    );
}
