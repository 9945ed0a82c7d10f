//! Replayed regression prompts end to end: a real gateway with a canary split whose stable
//! version answers well and whose canary refuses, `quality.regression` replaying two prompts
//! every 200 ms. The refusal counter moves for the canary and not for stable, both versions'
//! runs are counted `ok`, and none of it reaches a tenant: one client request beside the replays
//! leaves exactly one ledger row, one tenant request and one canary sample.

use std::time::Duration;

use hyper::{Method, StatusCode};
use serde_json::json;

use crate::common;
use common::TempDir;
use common::gateway::{FAST_HEALTH, Gateway, MODEL, chat, eventually, send};

/// A worker answering every request with the same whole chat answer `text`.
async fn answering(text: &'static str) -> String {
    common::stand_in_worker(move |_, _| {
        let body = json!({
            "id": "c", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21},
        });
        (StatusCode::OK, body.to_string())
    })
    .await
}

/// The sum of every series of the metric `name` in `text`.
fn total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn replayed_prompts_count_the_refusing_version_and_bill_no_tenant() {
    let stable = answering("Paris is the capital of France.").await;
    let canary = answering("I'm sorry, but I can't help with that.").await;
    let dir = TempDir::new("regression");
    dir.write(
        "prompts.jsonl",
        "{\"id\": \"capital\", \"messages\": [{\"role\": \"user\", \"content\": \"Capital of France?\"}], \"max_tokens\": 16}\n\
         {\"id\": \"plain\", \"prompt\": \"Name a river.\", \"max_tokens\": 8}\n",
    );
    dir.write_config(&format!(
        "listen: \"127.0.0.1:0\"\n\
         admin:\n  listen: \"127.0.0.1:0\"\n\
         policies: policies\n\
         {FAST_HEALTH}\
         ledger: {{path: usage.sqlite}}\n\
         quality:\n  sample_share: 1.0\n  regression: {{prompts: prompts.jsonl, interval: 200ms}}\n\
         models:\n  \
           - {{name: {MODEL}, pool: stable}}\n  \
           - {{name: {MODEL}-canary, pool: canary, upstream_model: {MODEL}}}\n\
         pools:\n  \
           - name: stable\n    workers:\n      - url: {stable}\n  \
           - name: canary\n    workers:\n      - url: {canary}\n"
    ));
    // Wide latency ratios and a large minimum: the analysis never acts on this test's traffic.
    dir.write_routing(&format!(
        "models:\n  {MODEL}:\n    versions:\n      \
           - {{name: stable, model: {MODEL}, weight: 50}}\n      \
           - {{name: canary, model: {MODEL}-canary, weight: 50}}\n    \
         stable: stable\n    analysis:\n      window: 60s\n      min_samples: 1000\n"
    ));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let series = |name: &str, version: &str, last: &str| {
        format!("{name}{{model=\"{MODEL}\",version=\"{version}\",{last}}}")
    };
    let runs = |version: &str| {
        series(
            "infergate_quality_regression_runs_total",
            version,
            "result=\"ok\"",
        )
    };
    let refusals = |version: &str| {
        series(
            "infergate_quality_regression_total",
            version,
            "signal=\"refusal\"",
        )
    };
    // Two prompts a round: two rounds at least on each version.
    let within = Duration::from_secs(10);
    for version in ["stable", "canary"] {
        let done = gw.settle_metric(&runs(version), within, |v| v >= 4.0).await;
        assert!(done >= 4.0, "{version}: {done} replays");
    }
    let metrics = gw.metrics().await;
    let canary_refusals = common::find_metric(&metrics, &refusals("canary")).unwrap_or(0.0);
    assert!(canary_refusals >= 4.0, "canary refusals {canary_refusals}");
    for version in ["stable", "canary"] {
        let failed = series(
            "infergate_quality_regression_runs_total",
            version,
            "result=\"error\"",
        );
        assert_eq!(common::find_metric(&metrics, &failed), None, "{failed}");
    }
    assert!(
        !metrics
            .contains("infergate_quality_regression_total{model=\"llama-3-8b\",version=\"stable\""),
        "the healthy version raised a signal"
    );
    assert!(
        !metrics.contains("sorry") && !metrics.contains("Capital of France"),
        "prompt or answer text in /metrics"
    );
    // Nothing tenant-side came from the replays (they ran for a while already).
    for tenant_side in [
        "infergate_tenant_requests_total",
        "infergate_quality_sampled_total",
        "infergate_version_requests_total",
    ] {
        assert_eq!(total(&metrics, tenant_side), 0.0, "{tenant_side}");
    }

    // One client request beside the replays: the ledger, the tenant counter and the canary's
    // samples hold it, and only it.
    let body = chat("Be brief.", "Capital of France?", 16, false).to_string();
    let (status, headers, text) = send(
        Method::POST,
        &gw.at("/v1/chat/completions"),
        &[("x-request-id", "client-1")],
        Some(body),
    )
    .await
    .expect("ask");
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(headers.contains_key("x-infergate-version"));
    let rows = eventually("the client's ledger row", within, || async {
        let (status, csv) = common::get(&gw.admin_at("/admin/usage.csv")).await;
        assert_eq!(status, StatusCode::OK, "{csv}");
        let rows: Vec<String> = csv.lines().skip(1).map(str::to_owned).collect();
        (!rows.is_empty()).then_some(rows)
    })
    .await;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert!(rows[0].contains("client-1"), "{rows:#?}");
    let metrics = gw.metrics().await;
    assert_eq!(total(&metrics, "infergate_tenant_requests_total"), 1.0);
    assert_eq!(total(&metrics, "infergate_version_requests_total"), 1.0);
    assert!(
        common::find_metric(&metrics, &runs("canary")).unwrap_or(0.0) > canary_refusals / 2.0,
        "replays went on meanwhile"
    );
}
