//! Usage numbers a worker reports are believed only within what the request made possible: a
//! worker claiming 10^18 (or u64::MAX) completion tokens for an 8-token request, and more cached
//! tokens than prompt tokens, beside a healthy engine. The tenant is never locked out, its ledger
//! rows and sums stay sane, the usage API keeps answering, the counters never wrap, and each lie
//! is counted by reason.

use std::time::Duration;

use hyper::StatusCode;
use serde_json::json;

use crate::common::rogue::{
    IDLE_VLLM_METRICS, Rogue, RogueRequest, Step, answer, chat_chunk, json_answer, sse_data,
    sse_head,
};
use crate::common::{Engine, eventually};
use crate::tenant_support::{Gw, MODEL, POOL, Setup, TempDir, key_of, post, wait_rows};

/// Completion tokens each request allows.
const MAX_TOKENS: u64 = 8;

/// Answers like a worker whose usage accounting is broken: whole answers claim 10^18 completion
/// tokens, streams claim u64::MAX with more cached than prompt tokens.
fn lying_worker(req: &RogueRequest) -> Vec<Step> {
    if req.method == "GET" {
        return answer(200, "text/plain", IDLE_VLLM_METRICS);
    }
    let body = req.json();
    let usage_max = json!({"prompt_tokens": 12, "completion_tokens": u64::MAX,
        "total_tokens": u64::MAX, "prompt_tokens_details": {"cached_tokens": 4000}});
    if body["stream"] == json!(true) {
        let mut steps = vec![sse_head()];
        for word in ["one", " two", " three"] {
            steps.push(sse_data(&chat_chunk(MODEL, word)));
        }
        let usage_chunk = json!({"id": "x", "object": "chat.completion.chunk", "created": 0,
            "model": MODEL, "choices": [], "usage": usage_max});
        steps.push(sse_data(&usage_chunk.to_string()));
        steps.push(sse_data("[DONE]"));
        steps.push(Step::Close);
        return steps;
    }
    json_answer(&json!({
        "id": "cmpl-rogue", "object": "text_completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "text": "one two three", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 1_000_000_000_000_000_000u64,
                  "total_tokens": 1_000_000_000_000_000_012u64},
    }))
}

#[tokio::test]
async fn absurd_usage_neither_locks_a_tenant_out_nor_breaks_the_ledger() {
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let rogue = Rogue::start(lying_worker).await;
    let dir = TempDir::new("untrusted-usage");
    let setup = Setup {
        workers: &[&engine.url, &rogue.url],
        extra: "ledger: {path: usage.sqlite}\ndebug_headers: true\n",
        tenants: &[("acme", "metered")],
        // A lie believed would put the tenant years in debt against this budget.
        tiers: "tiers:\n  metered: {priority: 1, tokens_per_minute: 20000, max_tokens: 64}\n",
        ..Setup::default()
    };
    let config = setup.write(&dir);
    dir.write(
        "policies/routing.yaml",
        &format!("pools:\n  {POOL}:\n    policy: round_robin\n"),
    );
    std::fs::write(
        dir.path.join("policies/prices.yaml"),
        "version: 1\nmodels:\n  llama-3-8b: {input: 2.0, cached_input: 0.5, output: 8.0}\n",
    )
    .unwrap();
    let gw = Gw::launch(&["gateway", "--config", &config.to_string_lossy()]).await;
    let key = key_of("acme");
    let url = gw.at("/v1/completions");

    let (mut on_rogue, mut on_engine) = (0u64, 0u64);
    for i in 0..12u64 {
        let stream = i % 4 >= 2;
        let body = json!({"model": MODEL, "prompt": format!("Count to three, round {i}."),
            "max_tokens": MAX_TOKENS, "stream": stream});
        let reply = post(&url, Some(&key), &body).await;
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "request {i} after {on_rogue} lying answers: {}",
            reply.text
        );
        match reply.header("x-infergate-worker") {
            Some(w) if w == rogue.url => on_rogue += 1,
            Some(w) if w == engine.url => on_engine += 1,
            other => panic!("answered by {other:?}"),
        }
    }
    assert!(
        on_rogue >= 4 && on_engine >= 4,
        "round robin used both workers: {on_rogue} on the liar, {on_engine} on the engine"
    );

    // Every lie was counted, by reason.
    let counted = |reason: &str| {
        format!("infergate_upstream_usage_rejected_total{{pool=\"{POOL}\",reason=\"{reason}\"}}")
    };
    let completion_over = gw.metric(&counted("completion_over")).await;
    assert_eq!(completion_over, on_rogue as f64, "{}", gw.metrics().await);
    assert!(gw.metric(&counted("cached_over")).await >= 1.0);
    let log = eventually("the lie's log line", Duration::from_secs(5), || async {
        let err = gw.stderr();
        err.contains("a worker reported usage").then_some(err)
    })
    .await;
    assert_eq!(
        log.matches("a worker reported usage").count(),
        1,
        "logged once per worker:\n{log}"
    );

    // Billed no more than each request allowed: 12 requests × (prompt + 8).
    let tokens = |kind: &str| {
        format!("infergate_tenant_{kind}_tokens_total{{tenant=\"acme\",model=\"{MODEL}\"}}")
    };
    let completion = gw.metric(&tokens("completion")).await;
    assert!(
        completion <= (12 * MAX_TOKENS) as f64,
        "completion tokens billed: {completion}"
    );
    let cost = gw
        .metric(&format!(
            "infergate_tenant_cost_nanousd_total{{tenant=\"acme\",model=\"{MODEL}\"}}"
        ))
        .await;
    assert!(cost > 0.0 && cost < 1e7, "cost in nano-USD: {cost}");

    // The ledger holds every request, and its sums answer.
    let page = wait_rows(&gw, 12, Duration::from_secs(30)).await;
    let total_completion = page["totals"]["completion_tokens"].as_u64().unwrap();
    assert!(total_completion <= 12 * MAX_TOKENS, "{page}");
    let status = eventually(
        "the usage API by tenant",
        Duration::from_secs(5),
        || async {
            let (status, text) =
                crate::common::get(&gw.admin_at("/admin/usage?group_by=tenant")).await;
            (status == StatusCode::OK).then_some(text)
        },
    )
    .await;
    assert!(status.contains("acme"), "{status}");

    // Still admitted at once afterwards: no debt from the lies.
    let reply = post(
        &url,
        Some(&key),
        &json!({"model": MODEL, "prompt": "And once more.", "max_tokens": MAX_TOKENS}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
}
