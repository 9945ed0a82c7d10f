//! Shadow traffic end to end: a shadow pool that is slow and failing changes nothing for clients
//! (status, body, latency), while its answers are compared into metrics and excess copies are
//! dropped at the concurrency bound.

use crate::common;

use std::time::{Duration, Instant};

use common::gateway::{Gateway, TempDir, chat, eventually};
use common::{Engine, find_metric, post_json};
use hyper::StatusCode;

#[tokio::test]
async fn a_slow_failing_shadow_changes_nothing_for_clients() {
    let primary = Engine::start(&["--gpu", "h100"]).await;
    // Half the shadow answers are immediate 500s; the others take seconds (20x an L4's steps).
    let shadow = Engine::start(&[
        "--gpu",
        "l4",
        "--fault-error-rate",
        "0.5",
        "--fault-latency-multiplier",
        "20",
    ])
    .await;
    let dir = TempDir::new("shadow");
    dir.write_config(&format!(
        "listen: \"127.0.0.1:0\"\nadmin:\n  listen: \"127.0.0.1:0\"\ndebug_headers: true\npolicies: policies\n\
         models:\n  - {{name: llama-3-8b, pool: main}}\n  - {{name: llama-3-8b-shadow, pool: shadow, upstream_model: llama-3-8b}}\n\
         pools:\n  - name: main\n    workers: [{{url: \"{}\"}}]\n  - name: shadow\n    workers: [{{url: \"{}\"}}]\n",
        primary.url, shadow.url
    ));
    dir.write_routing(
        "pools:\n  main: {policy: least_load}\n  shadow: {policy: least_load}\n\
         shadows:\n  llama-3-8b: {model: llama-3-8b-shadow, share: 1.0, max_concurrency: 2}\n",
    );
    let gw = Gateway::start(&dir.config(), &[]).await;

    let n = 8;
    for i in 0..n {
        let started = Instant::now();
        let (status, headers, res) = post_json(
            &gw.at("/v1/chat/completions"),
            &chat("You are terse.", &format!("question {i}"), 4, false),
        )
        .await;
        let took = started.elapsed();
        assert_eq!(status, StatusCode::OK, "{res}");
        assert_eq!(res["usage"]["completion_tokens"], 4, "{res}");
        assert_eq!(
            headers["x-infergate-worker"].to_str().unwrap(),
            primary.url,
            "the client is always answered by the primary pool"
        );
        // An H100 answers 4 tokens in ~30 ms; the shadow needs seconds. Never wait for it.
        assert!(
            took < Duration::from_millis(1_000),
            "request {i} took {took:?}"
        );
    }

    // Every copy is accounted for: answered (and compared) or dropped at the bound of 2.
    let text = eventually(
        "the shadow copies to finish",
        Duration::from_secs(30),
        || async {
            let text = gw.metrics().await;
            let get = |sel: &str| find_metric(&text, sel).unwrap_or(0.0);
            let ok = get("infergate_shadow_requests_total{model=\"llama-3-8b\",outcome=\"ok\"}");
            let dropped =
                get("infergate_shadow_requests_total{model=\"llama-3-8b\",outcome=\"dropped\"}");
            let errors =
                get("infergate_shadow_requests_total{model=\"llama-3-8b\",outcome=\"error\"}");
            let compared =
                get("infergate_shadow_status_match_total{match=\"false\",model=\"llama-3-8b\"}")
                    + get(
                        "infergate_shadow_status_match_total{match=\"true\",model=\"llama-3-8b\"}",
                    );
            (ok + dropped + errors == f64::from(n) && compared == ok).then_some(text)
        },
    )
    .await;
    let dropped = find_metric(
        &text,
        "infergate_shadow_requests_total{model=\"llama-3-8b\",outcome=\"dropped\"}",
    );
    assert!(
        dropped.unwrap_or(0.0) >= 1.0,
        "the bound of 2 must drop copies:\n{text}"
    );
    let mismatched = find_metric(
        &text,
        "infergate_shadow_status_match_total{match=\"false\",model=\"llama-3-8b\"}",
    );
    assert!(
        mismatched.unwrap_or(0.0) >= 1.0,
        "500s differ from the client's 200s:\n{text}"
    );
    assert!(
        find_metric(
            &text,
            "infergate_shadow_latency_ratio_count{model=\"llama-3-8b\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{text}"
    );
}
