//! Per-tenant rate limits end to end: a requests-per-minute tier whose `Retry-After` is enough and
//! not a second more, a tokens-per-minute tier that throttles long prompts but not short ones,
//! and reconciliation that refunds the unused part of a `max_tokens` reservation, also for a
//! stream its worker breaks off (which counts as the failure it is).

use crate::common;
use crate::tenant_support;

use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde_json::{Value, json};
use tenant_support::{Gw, MODEL, Reply, Setup, completion, key_of, post, prompt_tokens};
use tokio::task::JoinSet;

use common::Engine;

/// Fires `n` copies of `body` at once and returns the answers in completion order.
async fn burst(url: &str, key: &str, body: &Value, n: usize) -> Vec<Reply> {
    let mut set = JoinSet::new();
    for _ in 0..n {
        let (url, key, body) = (url.to_owned(), key.to_owned(), body.clone());
        set.spawn(async move { post(&url, Some(&key), &body).await });
    }
    set.join_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpm_burst_passes_and_retry_after_is_enough_but_not_a_second_more() {
    let engine = Engine::start(&[]).await;
    let tiers = "tiers:\n  rpm30: {priority: 1, requests_per_minute: 30, max_tokens: 16}\n";
    let gw = Gw::start(&Setup {
        workers: &[&engine.url],
        tenants: &[("rpm", "rpm30")],
        tiers,
        ..Setup::default()
    })
    .await;
    let (url, key) = (gw.at("/v1/completions"), key_of("rpm"));
    let body = completion("hello there", 1);

    // 31 at once: the whole burst of 30 passes and exactly one is refused.
    let replies = burst(&url, &key, &body, 31).await;
    let (ok, refused): (Vec<&Reply>, Vec<&Reply>) =
        replies.iter().partition(|r| r.status == StatusCode::OK);
    assert_eq!(
        (ok.len(), refused.len()),
        (30, 1),
        "statuses: {:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    // Each admitted request saw one less remaining than the one before it: 29, 28, ..., 0.
    let mut remaining: Vec<u64> = ok
        .iter()
        .map(|r| r.header_u64("x-ratelimit-remaining-requests"))
        .collect();
    remaining.sort_unstable();
    assert_eq!(remaining, (0..30).collect::<Vec<u64>>());

    let r = refused[0];
    let refused_at = r.at;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    assert_eq!(r.header_u64("x-ratelimit-limit-requests"), 30);
    assert_eq!(r.header_u64("x-ratelimit-remaining-requests"), 0);
    assert!(
        r.header("x-ratelimit-reset-requests").is_some(),
        "{:?}",
        r.headers
    );
    let retry_after = r.header_u64("retry-after");
    // One request refills every 2 s and the burst took a fraction of that.
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    let err = common::assert_error(StatusCode::TOO_MANY_REQUESTS, &r.json(), &["requests"]);
    assert_eq!(err["type"], "rate_limit_error");

    // One second before Retry-After is up: still refused (nothing of the budget came back yet).
    let early = refused_at + Duration::from_secs(retry_after - 1);
    tokio::time::sleep_until(early.into()).await;
    let too_early = post(&url, Some(&key), &body).await;
    assert_eq!(
        too_early.status,
        StatusCode::TOO_MANY_REQUESTS,
        "a retry 1 s before Retry-After {retry_after} passed: {}",
        too_early.text
    );
    assert_eq!(too_early.header_u64("x-ratelimit-remaining-requests"), 0);

    // Honouring Retry-After: the retry passes.
    tokio::time::sleep_until((refused_at + Duration::from_secs(retry_after)).into()).await;
    let retry = post(&url, Some(&key), &body).await;
    assert_eq!(
        retry.status,
        StatusCode::OK,
        "retry after {retry_after}s: {}",
        retry.text
    );
    assert_eq!(retry.header_u64("x-ratelimit-remaining-requests"), 0);

    let rejections = gw
        .metric("infergate_rejections_total{tenant=\"rpm\",reason=\"rate\"}")
        .await;
    assert_eq!(rejections, 2.0);
    gw.expect_metric(
        "infergate_tenant_requests_total{tenant=\"rpm\",outcome=\"ok\"}",
        31.0,
        Duration::from_secs(5),
    )
    .await;
}

/// Tokens the engine reported for a non-streamed answer: `(prompt, completion)`.
fn usage(reply: &Reply) -> (u64, u64) {
    let v = reply.json();
    let u = &v["usage"];
    match (u["prompt_tokens"].as_u64(), u["completion_tokens"].as_u64()) {
        (Some(p), Some(c)) => (p, c),
        _ => panic!("no usage in {v}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpm_throttles_long_prompts_and_leaves_short_prompts_alone() {
    let engine = Engine::start(&[]).await;
    let tiers = "tiers:\n  tpm6k: {priority: 1, requests_per_minute: 600, tokens_per_minute: 6000, max_tokens: 64}\n";
    let gw = Gw::start(&Setup {
        workers: &[&engine.url],
        tenants: &[("tpm-a", "tpm6k"), ("tpm-b", "tpm6k")],
        tiers,
        ..Setup::default()
    })
    .await;
    let url = gw.at("/v1/completions");
    let (key_a, key_b) = (key_of("tpm-a"), key_of("tpm-b"));

    // Tenant A: ~1,490 prompt tokens, topped up with max_tokens to reserve exactly 1,500.
    let long = common::words(1490, 1);
    let long_tokens = prompt_tokens(&long);
    assert!((1400..1500).contains(&long_tokens), "{long_tokens}");
    let body_a = completion(&long, 1500 - long_tokens);
    let short = "what is the capital of france";
    let reserve_b = prompt_tokens(short) + 8;
    let body_b = completion(short, 8);

    // Same request rate: one request of each tenant per round, back to back.
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..8 {
        a.push(post(&url, Some(&key_a), &body_a).await);
        b.push(post(&url, Some(&key_b), &body_b).await);
    }
    let statuses = |v: &[Reply]| v.iter().map(|r| r.status.as_u16()).collect::<Vec<_>>();
    // 4 × 1,500 = the whole 6,000 burst; 100 tokens/s come back, far from another 1,500.
    assert_eq!(
        statuses(&a),
        [200, 200, 200, 200, 429, 429, 429, 429],
        "{}",
        a[4].text
    );
    assert_eq!(statuses(&b), [200; 8], "tenant B was refused");

    let first_refusal = &a[4];
    assert_eq!(first_refusal.header_u64("x-ratelimit-limit-tokens"), 6000);
    let left = first_refusal.header_u64("x-ratelimit-remaining-tokens");
    assert!(left < 1500, "remaining {left} would have let 1,500 pass");
    // The budget refills at 100 tokens/s: the missing tokens take (1500 - left) / 100 s.
    let expected = (1500 - left) as f64 / 100.0;
    let retry_after = first_refusal.header_u64("retry-after") as f64;
    assert!(
        retry_after >= expected - 0.01 && retry_after < expected + 1.0,
        "Retry-After {retry_after} for {left} tokens left"
    );
    common::assert_error(
        StatusCode::TOO_MANY_REQUESTS,
        &first_refusal.json(),
        &["tokens", "1500"],
    );
    // B's budget is its own: nearly all of it is left after 8 short requests.
    let b_left = b[7].header_u64("x-ratelimit-remaining-tokens");
    assert!(b_left >= 6000 - 8 * reserve_b, "B has {b_left} tokens left");
    for r in &a[..4] {
        assert_eq!(usage(r), (long_tokens, 1500 - long_tokens));
    }

    assert_eq!(
        gw.metric("infergate_rejections_total{tenant=\"tpm-a\",reason=\"rate\"}")
            .await,
        4.0
    );
    assert_eq!(
        gw.metric("infergate_rejections_total{tenant=\"tpm-b\"}")
            .await,
        0.0
    );
    gw.expect_metric(
        "infergate_tenant_requests_total{tenant=\"tpm-b\",outcome=\"ok\"}",
        8.0,
        Duration::from_secs(5),
    )
    .await;
    gw.expect_metric(
        "infergate_tenant_tokens_total{tenant=\"tpm-a\",kind=\"prompt\"}",
        (4 * long_tokens) as f64,
        Duration::from_secs(5),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_refunds_unused_max_tokens() {
    // Every completion stops right after `min_tokens` (a mean output of 1 token makes the end of
    // sequence certain once allowed): 5 of the 2,000 reserved tokens are used, the rest refunded.
    let engine = Engine::start(&["--sim-mean-output-tokens", "1"]).await;
    let tiers = "tiers:\n  recon: {priority: 1, tokens_per_minute: 3000, max_tokens: 2000}\n";
    let gw = Gw::start(&Setup {
        workers: &[&engine.url],
        tenants: &[("recon", "recon")],
        tiers,
        ..Setup::default()
    })
    .await;
    let (url, key) = (gw.at("/v1/completions"), key_of("recon"));
    let prompt = "tell me a story about a river";
    let prompt_len = prompt_tokens(prompt);
    let reserve = prompt_len + 2000;
    let started = Instant::now();
    let (mut prompt_sum, mut completion_sum) = (0u64, 0u64);
    let n = 6;
    for i in 0..n {
        // Alternate plain and streamed answers: both report usage to reconcile with.
        let stream = i % 2 == 1;
        let mut body =
            json!({"model": MODEL, "prompt": prompt, "max_tokens": 2000, "min_tokens": 5});
        if stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        let reply = post(&url, Some(&key), &body).await;
        assert_eq!(reply.status, StatusCode::OK, "request {i}: {}", reply.text);
        // What is left after this reservation: the full budget less this request and the real
        // usage of the earlier ones (their unused max_tokens came back), plus a little refill.
        let left = reply.header_u64("x-ratelimit-remaining-tokens");
        let floor = 3000 - reserve - (prompt_sum + completion_sum);
        assert!(
            left + 1 >= floor && left <= 3000 - reserve,
            "request {i}: {left} tokens left, expected about {floor}"
        );
        let used = if stream {
            stream_usage(&reply.text)
        } else {
            usage(&reply)
        };
        assert_eq!(used, (prompt_len, 5), "request {i} (stream: {stream})");
        prompt_sum += used.0;
        completion_sum += used.1;
    }
    // Without refunds the budget (3,000 plus 50 tokens/s of refill) holds this many reservations.
    let without_refunds = (3000.0 + 50.0 * started.elapsed().as_secs_f64()) / reserve as f64;
    assert!(
        (n as f64) > without_refunds + 2.0,
        "{n} requests would have fitted without refunds ({without_refunds:.1})"
    );
    // The per-tenant token counters hold what the worker reported, streamed or not.
    gw.expect_metric(
        "infergate_tenant_tokens_total{tenant=\"recon\",kind=\"prompt\"}",
        prompt_sum as f64,
        Duration::from_secs(5),
    )
    .await;
    gw.expect_metric(
        "infergate_tenant_tokens_total{tenant=\"recon\",kind=\"completion\"}",
        completion_sum as f64,
        Duration::from_secs(5),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_its_worker_breaks_off_counts_as_an_error_and_refunds_what_it_did_not_use() {
    // Slow GPUs, so the stream is still running at the kill; answers end after about a token
    // unless told to ignore the end of sequence (the stream is).
    let args = ["--gpu", "l4", "--sim-mean-output-tokens", "1"];
    let engines = [Engine::start(&args).await, Engine::start(&args).await];
    // 3,000 tokens a minute: two 2,000-token reservations fit only if the first is refunded.
    let tiers = "tiers:\n  recon: {priority: 1, tokens_per_minute: 3000, max_tokens: 2000}\n";
    let gw = Gw::start(&Setup {
        workers: &[&engines[0].url, &engines[1].url],
        extra: "debug_headers: true\nforward: {retries: 2, connect_timeout: 1s}\n",
        tenants: &[("broken", "recon")],
        tiers,
        ..Setup::default()
    })
    .await;
    let (url, key) = (gw.at("/v1/completions"), key_of("broken"));
    let auth = format!("Bearer {key}");
    let prompt = "tell me a very long story about a river";
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 2000, "stream": true,
                      "ignore_eos": true});
    let mut s = common::open_stream_with(&url, &[("authorization", &auth)], &body).await;
    assert_eq!(s.status, StatusCode::OK);
    let worker = s.headers["x-infergate-worker"]
        .to_str()
        .expect("worker header")
        .to_string();
    for _ in 0..3 {
        s.next_event().await.expect("events before the kill");
    }
    let [e0, e1] = engines;
    let (victim, _other) = if e0.url == worker { (e0, e1) } else { (e1, e0) };
    drop(victim); // SIGKILL, mid-stream
    let mut events = 3u64;
    while s.next_event().await.is_some() {
        events += 1;
    }

    // Counted as an upstream failure, for the tenant and in the request count: not as the 200
    // its headers said.
    gw.expect_metric(
        "infergate_tenant_requests_total{tenant=\"broken\",outcome=\"upstream_error\"}",
        1.0,
        Duration::from_secs(5),
    )
    .await;
    let ok = "infergate_tenant_requests_total{tenant=\"broken\",outcome=\"ok\"}";
    assert_eq!(gw.metric(ok).await, 0.0);
    let broken = format!("infergate_requests_total{{model=\"{MODEL}\",status=\"502\"}}");
    assert_eq!(gw.metric(&broken).await, 1.0);
    // Settled on what was streamed (one token per content chunk), not the 2,000 reserved.
    let completion_tokens = gw
        .metric("infergate_tenant_tokens_total{tenant=\"broken\",kind=\"completion\"}")
        .await;
    assert!(
        (3.0..=events as f64).contains(&completion_tokens),
        "{completion_tokens} completion tokens counted for {events} events"
    );
    // So a second 2,000-token reservation fits the 3,000-token minute (on the live worker).
    let second = json!({"model": MODEL, "prompt": "and another one", "max_tokens": 2000});
    let again = post(&url, Some(&key), &second).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    let left = again.header_u64("x-ratelimit-remaining-tokens");
    let used = prompt_tokens(prompt) + completion_tokens as u64;
    let reserve = prompt_tokens("and another one") + 2000;
    assert!(
        left + 10 >= 3000 - used - reserve,
        "{left} tokens left; {used} used and {reserve} reserved of 3000"
    );
}

/// Usage from the final usage chunk of an SSE answer.
fn stream_usage(text: &str) -> (u64, u64) {
    let usage = text
        .split("\n\n")
        .filter_map(|block| block.trim().strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v.get("usage").filter(|u| !u.is_null()).cloned())
        .last()
        .unwrap_or_else(|| panic!("no usage chunk in {text:?}"));
    (
        usage["prompt_tokens"].as_u64().expect("prompt_tokens"),
        usage["completion_tokens"]
            .as_u64()
            .expect("completion_tokens"),
    )
}
