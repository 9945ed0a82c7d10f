//! Shape classes (issue 43, item 5): routing.yaml sends prompts of 2,000 tokens and more to a
//! pool of their own (one slow worker, one request at a time) with a 200 ms deadline. Short
//! requests keep their model's pool and are answered while a long one holds its pool; a second
//! long request is refused at once with a 429 naming the deadline and a Retry-After from its own
//! pool's queue; the metrics count each class by pool and time it by execution path; and
//! `config check` places a class's mistakes at their line in routing.yaml.

use crate::common;
use crate::tools_support;

use std::time::{Duration, Instant};

use common::Engine;
use common::gateway::{Gateway, MODEL, TempDir, chat, line_of, send};
use hyper::{Method, StatusCode};
use tools_support::infergate;

/// routing.yaml: both pools by load, and the class.
const ROUTING: &str = "\
pools:
  main: {policy: least_load}
  long: {policy: least_load}
shape_classes:
  - name: long-prompt
    match: {prompt_tokens: {min: 2000}}
    pool: long
    deadline: 200ms
";

fn config(main: &str, long: &str) -> String {
    format!(
        "listen: \"127.0.0.1:0\"\nadmin: {{listen: \"127.0.0.1:0\"}}\ndebug_headers: true\n\
         policies: policies\nmodels:\n  - {{name: {MODEL}, pool: main}}\npools:\n  - name: main\n    \
         workers: [{{url: \"{main}\"}}]\n  - name: long\n    workers: [{{url: \"{long}\"}}]\n    \
         admission: {{max_in_flight_per_worker: 1, max_queue: 50, max_wait: 60s}}\n"
    )
}

/// A chat request with a user message of about `words` tokens.
fn request(words: usize, max_tokens: u64) -> String {
    chat("Be brief.", &"hello ".repeat(words), max_tokens, false).to_string()
}

/// POSTs `body`: status, the worker that answered, Retry-After and the body.
async fn post(url: &str, body: String) -> (StatusCode, String, Option<u64>, String) {
    let (status, headers, text) = send(Method::POST, url, &[], Some(body))
        .await
        .expect("an answer");
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let worker = header("x-infergate-worker").unwrap_or("").to_owned();
    let retry = header("retry-after").and_then(|v| v.parse().ok());
    (status, worker, retry, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_goes_to_its_class_pool_and_its_deadline_is_told_at_once() {
    let _machine = tools_support::shared_machine().await;
    // An L4 decodes llama-3-8b at ~70 ms a token: a long request holds its pool for seconds.
    let (main, long) = tokio::join!(Engine::start(&[]), Engine::start(&["--gpu", "l4"]));
    let dir = TempDir::new("shape-classes");
    dir.write_config(&config(&main.url, &long.url));
    dir.write_routing(ROUTING);
    let gw = Gateway::start(&dir.config(), &[]).await;
    let url = gw.at("/v1/chat/completions");

    let (status, worker, _, text) = post(&url, request(20, 4)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(worker.starts_with(&main.url), "short went to {worker}");

    let occupier = tokio::spawn({
        let url = url.clone();
        async move { post(&url, request(2500, 40)).await }
    });
    long.wait_metric("vllm:num_requests_running", Duration::from_secs(10), |v| {
        v == 1.0
    })
    .await;

    // Its pool's one slot is held: the wait it predicts is past the class's 200 ms.
    let t0 = Instant::now();
    let (status, _, retry, text) = post(&url, request(2500, 40)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
    assert!(text.contains("deadline"), "{text}");
    assert!(retry.is_some_and(|s| s >= 1), "Retry-After: {retry:?}");
    assert!(t0.elapsed() < Duration::from_secs(1), "told at once");

    // The common class is not behind it.
    let (status, worker, _, text) = post(&url, request(20, 4)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(worker.starts_with(&main.url), "short went to {worker}");
    assert!(
        !occupier.is_finished(),
        "the long request still holds its pool"
    );

    let (status, worker, _, text) = occupier.await.expect("occupier");
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(worker.starts_with(&long.url), "long went to {worker}");

    let metrics = gw.metrics().await;
    let value = |sel: &str| common::find_metric(&metrics, sel).unwrap_or(0.0);
    assert_eq!(
        value("infergate_shape_class_requests_total{class=\"long-prompt\",pool=\"long\"}"),
        2.0,
        "{metrics}"
    );
    assert_eq!(
        value("infergate_shape_class_requests_total{class=\"unclassified\",pool=\"main\"}"),
        2.0,
        "{metrics}"
    );
    // Timed by the path the engine's record names (a 2,500-token prefill is past the budget).
    let timed = |class: &str| -> f64 {
        ["graph", "mixed", "eager"]
            .iter()
            .map(|p| {
                value(&format!(
                    "infergate_shape_class_e2e_seconds_count{{class=\"{class}\",path=\"{p}\"}}"
                ))
            })
            .sum()
    };
    assert_eq!(timed("long-prompt"), 1.0, "{metrics}");
    assert_eq!(timed("unclassified"), 2.0, "{metrics}");
    assert_eq!(
        value("infergate_shape_class_e2e_seconds_count{class=\"long-prompt\",path=\"mixed\"}"),
        1.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn config_check_places_a_class_mistake_at_its_line() {
    let dir = TempDir::new("shape-classes-check");
    dir.write_config(&config("http://127.0.0.1:9", "http://127.0.0.1:9"));
    let bad = ROUTING
        .replace("pool: long\n    deadline", "pool: longest\n    deadline")
        .replace("{min: 2000}", "{min: 2000, max: 10}");
    dir.write_routing(&bad);
    let config = dir.config().to_string_lossy().into_owned();
    let run = infergate(
        &["config", "check", "--config", &config],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let out = format!("{}{}", run.stdout, run.stderr);
    let pool_line = line_of(&bad, "pool: longest");
    let range_line = line_of(&bad, "prompt_tokens");
    assert!(
        out.contains(&format!("routing.yaml:{pool_line}:"))
            && out.contains("pool `longest` is not a pool of the config"),
        "{out}"
    );
    assert!(
        out.contains(&format!("routing.yaml:{range_line}:"))
            && out.contains("min 2000 is above max 10"),
        "{out}"
    );
}
