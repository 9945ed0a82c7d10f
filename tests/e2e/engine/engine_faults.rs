//! End-to-end tests of the engine under pressure and failure: a full waiting queue answers 503
//! with Retry-After, injected errors answer 500, an injected crash ends the process, and a model
//! too large for the GPU is refused at start with advice.

use crate::common;

use std::time::Duration;

use common::{Engine, assert_error, open_stream, post_json, run_to_exit, stream};
use hyper::StatusCode;
use serde_json::{Value, json};

const MODEL: &str = "llama-3-8b";

fn small(max_tokens: u64) -> Value {
    json!({"model": MODEL, "prompt": "Hello", "max_tokens": max_tokens, "ignore_eos": true})
}

#[tokio::test]
async fn full_waiting_queue_answers_503_with_retry_after() {
    let e = Engine::start(&[
        "--gpu",
        "h100",
        "--max-num-seqs",
        "1",
        "--max-waiting-requests",
        "1",
        "--fault-latency-multiplier",
        "20",
    ])
    .await;
    let url = e.at("/v1/completions");

    // One long request holds the only sequence slot.
    let mut long = small(1_000);
    long["stream"] = json!(true);
    let mut running = open_stream(&url, &long).await;
    assert_eq!(running.status, StatusCode::OK);
    running.next_event().await.expect("first chunk");
    // Gauges update at the end of the engine step that produced the chunk: poll for them.
    e.wait_metric("vllm:num_requests_running", Duration::from_secs(5), |v| {
        v == 1.0
    })
    .await;

    // A second one waits: the queue (of one) is now full.
    let waiting = tokio::spawn({
        let url = url.clone();
        async move { post_json(&url, &small(2)).await }
    });
    e.wait_metric("vllm:num_requests_waiting", Duration::from_secs(5), |v| {
        v == 1.0
    })
    .await;

    // Further requests are refused at once, concurrently or not.
    let refused: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { post_json(&url, &small(2)).await })
        })
        .collect();
    for task in refused {
        let (status, headers, res) = task.await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{res}");
        let retry: u64 = headers
            .get("retry-after")
            .expect("Retry-After header")
            .to_str()
            .unwrap()
            .parse()
            .expect("Retry-After in whole seconds");
        assert!(retry >= 1, "Retry-After {retry}");
        let err = assert_error(status, &res, &["queue"]);
        assert_eq!(err["type"], "service_unavailable");
    }
    assert_eq!(
        e.metric("infergate_engine_rejected_total{reason=\"queue_full\"}")
            .await,
        3.0
    );

    // Once the long request's client goes away, the waiting one runs to completion.
    drop(running);
    let (status, _, res) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting request ran once the slot was free")
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{res}");
    assert_eq!(res["usage"]["completion_tokens"], 2);
}

#[tokio::test]
async fn injected_errors_answer_500() {
    let e = Engine::start(&["--gpu", "h100", "--fault-error-rate", "1.0"]).await;
    let url = e.at("/v1/completions");
    let (status, _, res) = post_json(&url, &small(2)).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{res}");
    let err = assert_error(status, &res, &["fault"]);
    assert_eq!(err["type"], "server_error");

    let mut body = small(2);
    body["stream"] = json!(true);
    let s = stream(&url, &body).await;
    assert_eq!(s.status, StatusCode::INTERNAL_SERVER_ERROR);

    // Validation still comes first: a bad request is a 400, not an injected 500.
    let (status, _, res) = post_json(&url, &json!({"model": MODEL, "prompt": ""})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{res}");
    assert_eq!(e.metric("vllm:generation_tokens_total").await, 0.0);
}

#[tokio::test]
async fn injected_crash_ends_the_process() {
    let mut e = Engine::start(&["--gpu", "h100", "--fault-crash-after", "2"]).await;
    let url = e.at("/v1/completions");
    let (status, _, res) = post_json(&url, &small(2)).await;
    assert_eq!(status, StatusCode::OK, "the first request is served: {res}");

    let second = common::request(hyper::Method::POST, &url, Some(small(2).to_string().into()));
    let answer = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second request ends (the connection drops)");
    assert!(answer.is_err(), "got an answer from a crashing engine");

    let exit = e.wait_exit(Duration::from_secs(10)).await;
    assert!(!exit.success(), "exit status {exit}");
}

#[tokio::test]
async fn model_too_large_for_gpu_is_refused_at_start() {
    let (status, stdout, stderr) = run_to_exit(
        &["--model", "llama-3-70b", "--gpu", "h100"],
        Duration::from_secs(20),
    )
    .await;
    assert!(!status.success(), "started anyway: {stdout}");
    assert!(!stdout.contains("listening"), "{stdout}");
    let gib_numbers = stderr
        .split(" GiB")
        .filter(|before| {
            before
                .rsplit(|c: char| !(c.is_ascii_digit() || c == '.'))
                .next()
                .is_some_and(|n| n.parse::<f64>().is_ok_and(|v| v > 0.0))
        })
        .count();
    assert!(gib_numbers >= 2, "expected sizes in GiB: {stderr}");
    assert!(stderr.contains("--tensor-parallel-size"), "{stderr}");
    assert!(stderr.contains("llama-3-70b"), "{stderr}");
}
