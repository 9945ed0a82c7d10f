//! A worker killed during traffic: the stream in flight on it ends with an SSE error event (never
//! a silent truncation), requests that have not started are retried on the other worker, the
//! dead worker is ejected, and a new engine on its port is re-admitted and served again.

use crate::common;

use std::time::Duration;

use common::gateway::{
    Gateway, MODEL, POOL, TempDir, chat, config_yaml, port_of, routing_yaml, send, worker_of,
};
use common::{Engine, SseEvent, open_stream_with, post_json};
use hyper::{Method, StatusCode};

/// Polls each second, so ejection right after the kill comes from failed requests, not polls.
const HEALTH: &str = "health: {poll_interval: 1s, timeout: 500ms, eject_after: 2, readmit_after: 2}
forward: {retries: 2, connect_timeout: 1s}
";

/// The id the client gives the stream that breaks.
const STREAM_ID: &str = "failover-stream-7";

#[tokio::test]
async fn killed_worker_fails_its_stream_cleanly_is_ejected_and_readmitted() {
    let engines = [
        Engine::start(&["--gpu", "l4"]).await,
        Engine::start(&["--gpu", "l4"]).await,
    ];
    let dir = TempDir::new("failover");
    dir.write_config(&config_yaml(&[&engines[0].url, &engines[1].url], HEALTH));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let url = gw.at("/v1/chat/completions");

    // A long stream lands on some worker: that one is A, the victim.
    let body = chat(
        "You narrate slowly.",
        "A very long story, please.",
        200,
        true,
    );
    let mut s = open_stream_with(&url, &[("x-request-id", STREAM_ID)], &body).await;
    assert_eq!(s.status, StatusCode::OK);
    let a_url = worker_of(&s.headers);
    let mut events = Vec::new();
    while events.len() < 3 {
        events.push(s.next_event().await.expect("stream events before the kill"));
    }
    let [e0, e1] = engines;
    let (a, b) = if e0.url == a_url { (e0, e1) } else { (e1, e0) };
    let b_url = b.url.clone();
    let retries_before = gw
        .metric(&format!("infergate_retries_total{{pool=\"{POOL}\"}}"))
        .await;

    drop(a); // SIGKILL
    // Requests sent right after the kill: round robin sends about half to A, whose refused
    // connections are retried on B before any byte went to the client.
    let mut sent = Vec::new();
    for i in 0..6 {
        let (url, body) = (
            url.clone(),
            chat("Be brief.", &format!("Ping {i}."), 2, false),
        );
        sent.push(tokio::spawn(async move {
            send(Method::POST, &url, &[], Some(body.to_string())).await
        }));
    }
    for task in sent {
        let (status, headers, text) = task.await.unwrap().expect("request after the kill");
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(worker_of(&headers), b_url);
    }
    let retries = gw
        .metric(&format!("infergate_retries_total{{pool=\"{POOL}\"}}"))
        .await;
    assert!(retries > retries_before, "no retry counted ({retries})");
    // A refused connection counts as `connect`; a pooled keep-alive connection reset by the
    // dying worker as `send`. Either way it was retried before the first byte.
    let text = gw.metrics().await;
    let failed_sends: f64 = ["connect", "send"]
        .iter()
        .filter_map(|kind| {
            common::find_metric(
                &text,
                &format!("infergate_upstream_errors_total{{pool=\"{POOL}\",kind=\"{kind}\"}}"),
            )
        })
        .sum();
    assert!(failed_sends >= 1.0, "connect/send errors {failed_sends}");

    // The stream in flight on A ends with an error event and [DONE].
    while let Some(ev) = s.next_event().await {
        events.push(ev);
    }
    let chunks: Vec<serde_json::Value> = events.iter().filter_map(SseEvent::json).collect();
    let error = chunks
        .iter()
        .find_map(|c| c.get("error"))
        .unwrap_or_else(|| panic!("stream on the killed worker ended silently: {events:?}"));
    assert!(error["message"].is_string(), "{error}");
    assert!(
        chunks
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null()),
        "a finish chunk on a killed stream: {chunks:?}"
    );
    assert_eq!(events.last().unwrap().data.as_deref(), Some("[DONE]"));
    let last_json = chunks.last().expect("chunks");
    assert!(
        last_json.get("error").is_some(),
        "error is not the last event"
    );
    let mid_stream = gw
        .metric(&format!(
            "infergate_upstream_errors_total{{pool=\"{POOL}\",kind=\"mid_stream\"}}"
        ))
        .await;
    assert_eq!(mid_stream, 1.0);
    // The broken stream is counted as the failure it is, not as the 200 its headers said: one
    // 502, and every other request so far (the 6 sent after the kill) a 200.
    let requests = |status: &str| {
        format!("infergate_requests_total{{model=\"{MODEL}\",pool=\"{POOL}\",status=\"{status}\"}}")
    };
    gw.wait_metric(&requests("502"), |v| v == 1.0).await;
    assert_eq!(gw.metric(&requests("200")).await, 6.0);
    // The gateway's log line of the failure names the request, by the id its client gave.
    let line = common::eventually(
        "the mid-response failure logged",
        Duration::from_secs(5),
        || async {
            gw.stderr()
                .lines()
                .find(|l| l.contains("upstream failed mid-response"))
                .map(str::to_owned)
        },
    )
    .await;
    assert!(line.contains(STREAM_ID), "no request id in: {line}");

    // A is ejected; the gateway stays ready on B.
    gw.wait_health(&a_url, false, Duration::from_secs(5)).await;
    let ejections = gw
        .metric(&format!(
            "infergate_worker_ejections_total{{pool=\"{POOL}\"}}"
        ))
        .await;
    assert!(ejections >= 1.0, "ejections {ejections}");
    assert_eq!(gw.worker_status(&a_url).await["ejections"], 1);
    assert_eq!(common::get(&gw.at("/readyz")).await.0, StatusCode::OK);
    for i in 0..4 {
        let body = chat("Be brief.", &format!("While A is down {i}."), 2, false);
        let (status, headers, res) = post_json(&url, &body).await;
        assert_eq!(status, StatusCode::OK, "{res}");
        assert_eq!(worker_of(&headers), b_url);
    }

    // A new engine on A's port is re-admitted and takes its turn again.
    let _a2 = Engine::start_on(port_of(&a_url), &["--gpu", "l4"]).await;
    gw.wait_health(&a_url, true, Duration::from_secs(10)).await;
    let mut on_a = 0;
    for i in 0..4 {
        let body = chat("Be brief.", &format!("A is back {i}."), 2, false);
        let (status, headers, res) = post_json(&url, &body).await;
        assert_eq!(status, StatusCode::OK, "{res}");
        on_a += usize::from(worker_of(&headers) == a_url);
    }
    assert_eq!(on_a, 2, "round robin over two healthy workers");
}

/// A hung worker (SIGSTOP: it accepts nothing and answers nothing) is ejected by its failed
/// polls; the requests already waiting on it are retried on the other worker at once, long
/// before the 60 s first-byte timeout.
#[tokio::test]
async fn requests_waiting_on_a_hung_worker_move_when_it_is_ejected() {
    let a = Engine::start(&["--gpu", "h100"]).await;
    let b = Engine::start(&["--gpu", "h100"]).await;
    let dir = TempDir::new("hung");
    dir.write_config(&config_yaml(
        &[&a.url, &b.url],
        "health: {poll_interval: 100ms, timeout: 300ms, eject_after: 2, readmit_after: 2}\n\
         forward: {retries: 2, first_byte_timeout: 60s}\n",
    ));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    common::gateway::send_signal(a.pid(), "STOP");
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..4 {
        let url = gw.at("/v1/chat/completions");
        tasks.push(tokio::spawn(async move {
            post_json(&url, &chat("Be brief.", &format!("Question {i}"), 2, false)).await
        }));
    }
    let mut served_by = Vec::new();
    for t in tasks {
        let (status, headers, res) = t.await.expect("request task");
        assert_eq!(status, StatusCode::OK, "{res}");
        served_by.push(worker_of(&headers));
    }
    let took = started.elapsed();
    common::gateway::send_signal(a.pid(), "CONT");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert!(served_by.iter().all(|w| *w == b.url), "{served_by:?}");
    let moved = gw
        .metric(&format!(
            "infergate_upstream_errors_total{{pool=\"{POOL}\",kind=\"ejected\"}}"
        ))
        .await;
    assert!(
        moved >= 1.0,
        "{moved} requests moved off the ejected worker"
    );
}

/// A worker that is always overloaded: healthy to the poller, a 503 to every request.
struct Overloaded {
    url: String,
    posts: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl Overloaded {
    async fn start() -> Overloaded {
        let posts = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = posts.clone();
        let url = common::stand_in_worker(move |method, _| {
            if *method == Method::POST {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            (
                StatusCode::SERVICE_UNAVAILABLE,
                r#"{"error":{"message":"the worker is overloaded","type":"server_error"}}"#.into(),
            )
        })
        .await;
        Overloaded { url, posts }
    }

    fn posts(&self) -> u32 {
        self.posts.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_503_goes_to_another_worker_and_a_lone_workers_503_reaches_the_client() {
    let busy = Overloaded::start().await;
    let engine = Engine::start(&["--gpu", "l4"]).await;
    // High `eject_after`: the overloaded worker stays in the pool for every request.
    let health = "health: {poll_interval: 1s, timeout: 500ms, eject_after: 1000, readmit_after: 2}
forward: {retries: 2, connect_timeout: 1s}
";
    let dir = TempDir::new("retry-503");
    dir.write_config(&config_yaml(&[&busy.url, &engine.url], health));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let url = gw.at("/v1/chat/completions");
    for i in 0..4 {
        let body = chat("Be brief.", &format!("Ping {i}."), 2, false).to_string();
        let (status, headers, text) = send(Method::POST, &url, &[], Some(body)).await.unwrap();
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(worker_of(&headers), engine.url);
    }
    // Round robin sent some of the four to the overloaded worker first.
    assert!(busy.posts() >= 1, "the overloaded worker saw no request");
    assert!(
        gw.metric(&format!(
            "infergate_upstream_errors_total{{pool=\"{POOL}\",kind=\"status_503\"}}"
        ))
        .await
            >= 1.0
    );

    // Alone in its pool, with retries left but no other worker: its own 503 reaches the client
    // (not a 502 from the gateway), after one attempt.
    let lone = Overloaded::start().await;
    let dir = TempDir::new("retry-503-lone");
    dir.write_config(&config_yaml(&[&lone.url], health));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let body = chat("Be brief.", "Ping.", 2, false).to_string();
    let (status, _, text) = send(
        Method::POST,
        &gw.at("/v1/chat/completions"),
        &[],
        Some(body),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
    assert!(text.contains("the worker is overloaded"), "{text}");
    assert_eq!(lone.posts(), 1);
}
