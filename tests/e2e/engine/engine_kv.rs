//! End-to-end tests of the engine's KV cache as clients and `/metrics` see it: prefix-cache reuse
//! (hits, cached tokens, faster first token), preemption under a tiny cache, and blocks freed when
//! a streaming client goes away.

use crate::common;

use std::time::Duration;

use common::{Engine, open_stream, post_json, stream, token_ids};
use hyper::StatusCode;
use serde_json::{Value, json};

const MODEL: &str = "llama-3-8b";
const HITS: &str = "vllm:prefix_cache_hits_total";

/// A prompt of token ids: a shared 1,000-token prefix and a short suffix chosen by `suffix`.
fn prefixed_prompt(suffix: u32) -> Vec<u32> {
    let mut prompt = token_ids(1_000, 1);
    prompt.extend(token_ids(8, 100 + suffix));
    prompt
}

fn streamed_body(prompt: &[u32]) -> Value {
    json!({
        "model": MODEL, "prompt": prompt, "max_tokens": 2, "ignore_eos": true,
        "stream": true, "stream_options": {"include_usage": true},
    })
}

#[tokio::test]
async fn shared_prefix_is_served_from_cache_and_first_token_comes_sooner() {
    // On l4 a 1,000-token prefill takes ~200 ms and a cached one ~55 ms: far apart from noise.
    let e = Engine::start(&["--gpu", "l4"]).await;
    let url = e.at("/v1/completions");
    assert_eq!(e.metric(HITS).await, 0.0);

    let first = stream(&url, &streamed_body(&prefixed_prompt(1))).await;
    assert_eq!(first.status, StatusCode::OK);
    let usage = first.chunks().pop().unwrap()["usage"].clone();
    assert_eq!(usage["prompt_tokens"], 1_008, "{usage}");
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], 0,
        "{usage}"
    );
    let hits_before = e.metric(HITS).await;

    let second = stream(&url, &streamed_body(&prefixed_prompt(2))).await;
    assert_eq!(second.status, StatusCode::OK);
    let usage = second.chunks().pop().unwrap()["usage"].clone();
    assert_eq!(usage["prompt_tokens"], 1_008, "{usage}");
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!((960..=1_000).contains(&cached), "{usage}");

    let hits = e.metric(HITS).await - hits_before;
    assert!(hits >= 960.0, "prefix cache hits rose by {hits}");
    assert!(e.metric("vllm:prefix_cache_queries_total").await >= 2_016.0);

    let (t1, t2) = (first.ttft(), second.ttft());
    assert!(
        t2 < t1,
        "cached prefix should shorten the first token: {t1:?} then {t2:?}"
    );
}

#[tokio::test]
async fn no_prefix_caching_means_no_hits() {
    let e = Engine::start(&["--gpu", "h100", "--no-prefix-caching"]).await;
    let url = e.at("/v1/completions");
    for suffix in [1, 2, 1] {
        let s = stream(&url, &streamed_body(&prefixed_prompt(suffix))).await;
        assert_eq!(s.status, StatusCode::OK);
        let usage = s.chunks().pop().unwrap()["usage"].clone();
        assert_eq!(
            usage["prompt_tokens_details"]["cached_tokens"], 0,
            "{usage}"
        );
    }
    assert_eq!(e.metric(HITS).await, 0.0);
}

#[tokio::test]
async fn tiny_cache_preempts_and_still_finishes_every_request() {
    // 40 blocks of 16 tokens = 640 tokens of KV; 8 requests grow to 160 tokens each.
    let e = Engine::start(&[
        "--gpu",
        "h100",
        "--num-gpu-blocks-override",
        "40",
        "--block-size",
        "16",
    ])
    .await;
    let url = e.at("/v1/completions");

    // A request that could never fit the whole cache is refused up front, naming the sizes.
    let huge = json!({"model": MODEL, "prompt": token_ids(60, 9), "max_tokens": 700});
    let (status, _, res) = post_json(&url, &huge).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{res}");
    common::assert_error(status, &res, &["48", "40", "700"]);

    let tasks: Vec<_> = (0..8u32)
        .map(|i| {
            let url = url.clone();
            let body = json!({
                "model": MODEL, "prompt": token_ids(60, 10 + i),
                "max_tokens": 100, "ignore_eos": true, "seed": i,
            });
            tokio::spawn(async move { post_json(&url, &body).await })
        })
        .collect();
    for task in tasks {
        let (status, _, res) = task.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{res}");
        assert_eq!(res["usage"]["completion_tokens"], 100, "{res}");
        assert_eq!(res["usage"]["prompt_tokens"], 60, "{res}");
        assert_eq!(res["choices"][0]["finish_reason"], "length", "{res}");
        let text = res["choices"][0]["text"].as_str().unwrap();
        assert_eq!(text.split_whitespace().count(), 100, "{text:?}");
    }
    let preemptions = e.metric("vllm:num_preemptions_total").await;
    assert!(preemptions > 0.0, "no preemption with 640 tokens of KV");
    assert_eq!(
        e.metric("vllm:request_success_total{finished_reason=\"length\"}")
            .await,
        8.0
    );
    assert_eq!(e.metric("vllm:generation_tokens_total").await, 800.0);
    e.wait_metric("vllm:kv_cache_usage_perc", Duration::from_secs(5), |v| {
        v == 0.0
    })
    .await;
    assert_eq!(e.metric("vllm:num_requests_running").await, 0.0);
    assert_eq!(e.metric("vllm:num_requests_waiting").await, 0.0);
}

#[tokio::test]
async fn dropped_stream_frees_its_blocks() {
    let e = Engine::start(&["--gpu", "l4"]).await;
    let body = json!({
        "model": MODEL, "prompt": "Write a very long essay", "max_tokens": 2000,
        "ignore_eos": true, "stream": true,
    });
    let mut s = open_stream(&e.at("/v1/completions"), &body).await;
    assert_eq!(s.status, StatusCode::OK);
    for _ in 0..2 {
        let ev = s.next_event().await.expect("a chunk");
        assert!(ev.json().is_some(), "{ev:?}");
    }
    assert_eq!(e.metric("vllm:num_requests_running").await, 1.0);
    assert!(e.metric("vllm:kv_cache_usage_perc").await > 0.0);

    drop(s);
    let within = Duration::from_secs(10);
    e.wait_metric("vllm:kv_cache_usage_perc", within, |v| v == 0.0)
        .await;
    e.wait_metric("vllm:num_requests_running", within, |v| v == 0.0)
        .await;
    assert_eq!(
        e.metric("vllm:request_success_total{finished_reason=\"abort\"}")
            .await,
        1.0
    );
    let generated = e.metric("vllm:generation_tokens_total").await;
    assert!(generated < 1_000.0, "kept generating: {generated}");
}

#[tokio::test]
async fn abandoned_non_streamed_request_frees_its_blocks() {
    let e = Engine::start(&["--gpu", "l4"]).await;
    let body = json!({
        "model": MODEL, "prompt": "Write a very long essay", "max_tokens": 2000,
        "ignore_eos": true,
    });
    let url = e.at("/v1/completions");
    let client = tokio::spawn(async move { post_json(&url, &body).await });
    let within = Duration::from_secs(10);
    e.wait_metric("vllm:generation_tokens_total", within, |v| v >= 2.0)
        .await;
    assert_eq!(e.metric("vllm:num_requests_running").await, 1.0);

    // Cancelling the client closes its connection mid-request.
    client.abort();
    assert!(client.await.unwrap_err().is_cancelled());
    e.wait_metric("vllm:kv_cache_usage_perc", within, |v| v == 0.0)
        .await;
    e.wait_metric("vllm:num_requests_running", within, |v| v == 0.0)
        .await;
    assert_eq!(
        e.metric("vllm:request_success_total{finished_reason=\"abort\"}")
            .await,
        1.0
    );
}
