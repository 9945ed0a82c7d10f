//! Quality signals and drift end to end: a real gateway sampling every answer (`sample_share:
//! 1.0`) in front of stand-in workers that misbehave on purpose — one refuses every request (a
//! whole JSON answer), one streams a repetition loop cut at the length limit, its prompt sizes
//! jumping halfway — and the counters and the drift gauge read back from `/metrics`, without the
//! answers' text ever in them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hyper::{Method, StatusCode};
use serde_json::json;

use crate::common;
use common::TempDir;
use common::gateway::{FAST_HEALTH, Gateway, MODEL, chat, eventually, send};

/// Answers per drift window in the test config.
const WINDOW: u32 = 10;

/// A worker refusing every request with a whole chat answer.
async fn refuser() -> String {
    common::stand_in_worker(|_, _| {
        let body = json!({
            "id": "c", "object": "chat.completion", "created": 0, "model": "refuser",
            "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "I'm sorry, but I can't help with that."}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21},
        });
        (StatusCode::OK, body.to_string())
    })
    .await
}

/// A worker streaming a loop until the length limit; its first [`WINDOW`] answers report
/// 40-token prompts, the later ones 3000-token prompts (a drift; the config's wide
/// `usage_check.prompt_ratio` lets the gateway believe them for the same short request).
async fn looper() -> String {
    let answered = Arc::new(AtomicU32::new(0));
    common::stand_in_worker(move |_, _| {
        let n = answered.fetch_add(1, Ordering::SeqCst);
        let prompt = if n < WINDOW { 40 } else { 3000 };
        let chunk = |delta: serde_json::Value, finish: Option<&str>| {
            let c = json!({"id": "c", "object": "chat.completion.chunk", "model": "looper",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
            format!("data: {c}\n\n")
        };
        let mut body = chunk(json!({"role": "assistant", "content": "Sure. "}), None);
        for _ in 0..12 {
            body.push_str(&chunk(
                json!({"content": "I will check that for you. "}),
                None,
            ));
        }
        body.push_str(&chunk(json!({}), Some("length")));
        let usage = json!({"id": "c", "object": "chat.completion.chunk", "model": "looper",
            "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": 64}});
        body.push_str(&format!("data: {usage}\n\ndata: [DONE]\n\n"));
        (StatusCode::OK, body)
    })
    .await
}

fn config(refuser: &str, looper: &str) -> String {
    format!(
        "listen: \"127.0.0.1:0\"\n\
         admin:\n  listen: \"127.0.0.1:0\"\n\
         policies: policies\n\
         usage_check: {{prompt_ratio: 1000}}\n\
         quality:\n  sample_share: 1.0\n  drift: {{window: {WINDOW}, min_count: 5, psi_threshold: 0.2}}\n\
         models:\n  - name: refuser\n    pool: a\n  - name: looper\n    pool: b\n\
         pools:\n  - name: a\n    workers:\n      - url: {refuser}\n\
         \x20 - name: b\n    workers:\n      - url: {looper}\n"
    )
}

/// Asks `model` once; the answer's text.
async fn ask(gw: &Gateway, model: &str, stream: bool) -> String {
    let mut body = chat("Be brief.", "Help me.", 64, stream);
    body["model"] = json!(model);
    // A stream the client asked no usage of: the gateway asks for it, hides the usage chunk,
    // and drops the stand-in's content-length, which would promise bytes that never come.
    let (status, _, text) = send(
        Method::POST,
        &gw.at("/v1/chat/completions"),
        &[],
        Some(body.to_string()),
    )
    .await
    .expect("the gateway answers");
    assert_eq!(status, StatusCode::OK, "{text}");
    text
}

#[tokio::test]
async fn sampled_answers_count_their_signals_and_a_prompt_shift_raises_the_drift_score() {
    let (refuser, looper) = (refuser().await, looper().await);
    let dir = TempDir::new("quality");
    dir.write_config(&config(&refuser, &looper));
    dir.write_routing("pools:\n  a:\n    policy: round_robin\n  b:\n    policy: round_robin\n");
    let gw = Gateway::start(&dir.config(), &[]).await;

    for _ in 0..3 {
        assert!(ask(&gw, "refuser", false).await.contains("sorry"));
    }
    for _ in 0..2 * WINDOW {
        assert!(ask(&gw, "looper", true).await.contains("[DONE]"));
    }
    let within = Duration::from_secs(5);
    let series = |model: &str, signal: Option<&str>| match signal {
        None => format!(
            "infergate_quality_sampled_total{{tenant=\"anonymous\",model=\"{model}\",version=\"default\"}}"
        ),
        Some(s) => format!(
            "infergate_quality_signal_total{{tenant=\"anonymous\",model=\"{model}\",version=\"default\",signal=\"{s}\"}}"
        ),
    };
    gw.expect_metric(&series("refuser", None), 3.0, within)
        .await;
    gw.expect_metric(&series("refuser", Some("refusal")), 3.0, within)
        .await;
    let looped = f64::from(2 * WINDOW);
    gw.expect_metric(&series("looper", None), looped, within)
        .await;
    for signal in ["repetition", "length_limit"] {
        gw.expect_metric(&series("looper", Some(signal)), looped, within)
            .await;
    }
    let metrics = gw.metrics().await;
    for absent in [
        series("refuser", Some("repetition")),
        series("looper", Some("refusal")),
        series("looper", Some("empty")),
    ] {
        assert!(!metrics.contains(&absent), "{absent} raised");
    }
    assert!(
        !metrics.contains("sorry") && !metrics.contains("check that"),
        "answer text in /metrics"
    );

    // The looper's second window moved every prompt from [32, 64) to [2048, 4096) tokens.
    let psi = gw
        .settle_metric(
            "infergate_drift_psi{model=\"looper\",version=\"default\",feature=\"prompt_tokens\"}",
            within,
            |v| v > 0.2,
        )
        .await;
    assert!(psi > 0.2, "prompt-length PSI {psi}");
    // The tenant's own windows (over both models) saw the same shift.
    let tenant = gw
        .settle_metric(
            "infergate_drift_tenant_psi{tenant=\"anonymous\",feature=\"prompt_tokens\"}",
            within,
            |v| v > 0.2,
        )
        .await;
    assert!(tenant > 0.2, "the tenant's prompt-length PSI {tenant}");
    let output = common::find_metric(
        &gw.metrics().await,
        "infergate_drift_psi{model=\"looper\",version=\"default\",feature=\"output_tokens\"}",
    );
    assert_eq!(output, Some(0.0), "output lengths did not move");
    assert_eq!(gw.metric("infergate_drift_psi_threshold").await, 0.2);
}

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

#[tokio::test]
async fn a_canary_that_refuses_is_rolled_back_with_a_reason_naming_the_refusals() {
    let stable = answering("Paris is the capital of France.").await;
    let canary = answering("I'm sorry, but I can't help with that.").await;
    let dir = TempDir::new("quality-canary");
    dir.write_config(&format!(
        "listen: \"127.0.0.1:0\"\n\
         admin:\n  listen: \"127.0.0.1:0\"\n\
         policies: policies\n\
         {FAST_HEALTH}\
         quality: {{sample_share: 1.0}}\n\
         models:\n  \
           - {{name: {MODEL}, pool: stable}}\n  \
           - {{name: {MODEL}-canary, pool: canary, upstream_model: {MODEL}}}\n\
         pools:\n  \
           - name: stable\n    workers:\n      - url: {stable}\n  \
           - name: canary\n    workers:\n      - url: {canary}\n"
    ));
    // Latency ratios so wide that two stand-ins answering in a fraction of a millisecond never
    // breach them: only quality can roll this canary back.
    dir.write_routing(&format!(
        "models:\n  {MODEL}:\n    versions:\n      \
           - {{name: stable, model: {MODEL}, weight: 50}}\n      \
           - {{name: canary, model: {MODEL}-canary, weight: 50}}\n    \
         stable: stable\n    sticky: session\n    analysis:\n      \
           window: 1s\n      min_samples: 20\n      max_error_rate_delta: 0.02\n      \
           max_ttft_p99_ratio: 1000\n      max_itl_p99_ratio: 1000\n      schedule: [50, 100]\n"
    ));
    let gw = Gateway::start(&dir.config(), &[]).await;
    // Paused, a window judged before enough answers were scored holds instead of promoting;
    // a breach still rolls back.
    let pause = json!({"model": MODEL}).to_string();
    let (status, _, text) = send(
        Method::POST,
        &gw.admin_at("/admin/canary/pause"),
        &[],
        Some(pause),
    )
    .await
    .expect("pause");
    assert_eq!(status, StatusCode::OK, "{text}");

    let url = gw.at("/v1/chat/completions");
    let body = chat("Be brief.", "Capital of France?", 16, false).to_string();
    let mut sent = 0u32;
    let reason = eventually("a rollback", Duration::from_secs(20), || {
        let (url, body) = (url.clone(), body.clone());
        sent += 1;
        let session = format!("s-{sent}");
        let gw = &gw;
        async move {
            for i in 0..10 {
                let headers = [("x-session-id", format!("{session}-{i}"))];
                let headers: Vec<(&str, &str)> =
                    headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let (status, _, text) = send(Method::POST, &url, &headers, Some(body.clone()))
                    .await
                    .expect("ask");
                assert_eq!(status, StatusCode::OK, "{text}");
            }
            let (_, _, state) = send(Method::GET, &gw.admin_at("/admin/canary"), &[], None)
                .await
                .expect("canary state");
            let state: serde_json::Value = serde_json::from_str(&state).expect("JSON");
            let d = &state["models"][MODEL]["last_decision"];
            (d["decision"] == "rollback")
                .then(|| d["reason"].as_str().unwrap_or_default().to_owned())
        }
    })
    .await;
    assert!(
        reason.starts_with("refusal rate 100.00% on canary vs 0.00% on stable"),
        "{reason}"
    );
    assert!(reason.contains("one-sided two-proportion z ="), "{reason}");
    let refusals = |version: &str| {
        format!(
            "infergate_quality_signal_total{{tenant=\"anonymous\",model=\"{MODEL}\",version=\"{version}\",signal=\"refusal\"}}"
        )
    };
    let metrics = gw.metrics().await;
    assert!(common::find_metric(&metrics, &refusals("canary")).is_some_and(|v| v >= 20.0));
    assert_eq!(common::find_metric(&metrics, &refusals("stable")), None);
}

/// Responses API answers are scored like chat answers: a real engine refusing every request
/// (`--fault-refusal-rate 1`) and one looping until its output budget (`--fault-repeat-rate 1`),
/// asked through `/v1/responses` whole and streamed, raise `refusal`, and `repetition` with
/// `length_limit` (the Responses `incomplete` status for `max_output_tokens`).
#[tokio::test]
async fn responses_api_answers_are_sampled_and_scored() {
    let (refusing, looping) = tokio::join!(
        common::Engine::start(&["--fault-refusal-rate", "1"]),
        common::Engine::start(&["--fault-repeat-rate", "1"]),
    );
    let dir = TempDir::new("quality-responses");
    dir.write_config(&format!(
        "listen: \"127.0.0.1:0\"\n\
         admin:\n  listen: \"127.0.0.1:0\"\n\
         policies: policies\n\
         quality: {{sample_share: 1.0}}\n\
         models:\n  - name: refuser\n    pool: a\n    upstream_model: llama-3-8b\n  \
         - name: looper\n    pool: b\n    upstream_model: llama-3-8b\n\
         pools:\n  - name: a\n    workers:\n      - url: {}\n\
         \x20 - name: b\n    workers:\n      - url: {}\n",
        refusing.url, looping.url
    ));
    dir.write_routing("pools:\n  a:\n    policy: round_robin\n  b:\n    policy: round_robin\n");
    let gw = Gateway::start(&dir.config(), &[]).await;
    for model in ["refuser", "looper"] {
        for stream in [false, true] {
            let body = json!({"model": model, "input": "Tell me about rivers.",
                "max_output_tokens": 24, "stream": stream});
            let (status, _, text) = send(
                Method::POST,
                &gw.at("/v1/responses"),
                &[],
                Some(body.to_string()),
            )
            .await
            .expect("the gateway answers");
            assert_eq!(status, StatusCode::OK, "{model} stream={stream}: {text}");
        }
    }
    let within = Duration::from_secs(5);
    let signal = |model: &str, s: &str| {
        format!(
            "infergate_quality_signal_total{{tenant=\"anonymous\",model=\"{model}\",version=\"default\",signal=\"{s}\"}}"
        )
    };
    for model in ["refuser", "looper"] {
        let sampled = format!(
            "infergate_quality_sampled_total{{tenant=\"anonymous\",model=\"{model}\",version=\"default\"}}"
        );
        gw.expect_metric(&sampled, 2.0, within).await;
    }
    gw.expect_metric(&signal("refuser", "refusal"), 2.0, within)
        .await;
    for s in ["repetition", "length_limit"] {
        gw.expect_metric(&signal("looper", s), 2.0, within).await;
    }
    let metrics = gw.metrics().await;
    for absent in [signal("refuser", "empty"), signal("looper", "refusal")] {
        assert!(!metrics.contains(&absent), "{absent} in\n{metrics}");
    }
}
