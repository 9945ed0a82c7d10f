//! End-to-end tests of the engine's `cpu` backend: a real model (the generated default model, and
//! SmolLM2-135M-Instruct from GGUF when present) served over real HTTP by a real process.
//! Greedy output must not depend on streaming, prefix caching, batch company or preemption.

use crate::common;

use std::path::PathBuf;

use common::{Engine, assert_error, metric, post_json, run_backend_to_exit, stream};
use hyper::StatusCode;
use serde_json::{Value, json};

/// A cpu engine on the default model, generated into a fresh cache directory for `test`.
async fn default_engine(test: &str, args: &[&str]) -> (Engine, PathBuf) {
    let (e, dir, _) = common::cpu_default(test, args).await;
    (e, dir)
}

fn smollm2() -> Option<String> {
    common::smollm2_gguf(false)
}

fn chat_body(model: &str, content: &str, max_tokens: u64) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

fn message(res: &Value) -> String {
    res["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no message content in {res}"))
        .to_owned()
}

/// The concatenated deltas of a streamed chat completion.
async fn streamed_chat(url: &str, body: &Value) -> String {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let s = stream(url, &body).await;
    s.chunks()
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test]
async fn default_model_is_generated_loaded_and_served() {
    let _machine = crate::common::machine::whole_machine().await;
    let (e, dir) = default_engine("default", &[]).await;
    let (status, models) = common::get(&e.at("/v1/models")).await;
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(status, StatusCode::OK);
    let name = models["data"][0]["id"].as_str().unwrap().to_owned();
    assert!(name.starts_with("infergate-tiny"), "{models}");
    // The model was written in Hugging Face format into the cache directory.
    let model_dir = std::fs::read_dir(dir.join("models"))
        .unwrap()
        .flatten()
        .find(|d| {
            d.file_name()
                .to_string_lossy()
                .starts_with("infergate-tiny")
        })
        .expect("default model directory")
        .path();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(
            model_dir.join(f).is_file(),
            "{f} missing in {}",
            model_dir.display()
        );
    }

    let url = e.at("/v1/chat/completions");
    let body = chat_body(&name, "Tell me about rivers and stones.", 24);
    let (status, _, res) = post_json(&url, &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let usage = &res["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=24).contains(&completion), "{usage}");
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 5, "{usage}");
    let text = message(&res);
    assert_eq!(
        streamed_chat(&url, &body).await,
        text,
        "streamed != non-streamed"
    );
    // Greedy is reproducible.
    let (_, _, again) = post_json(&url, &body).await;
    assert_eq!(message(&again), text);
    // Real sampling with a seed is reproducible too, and differs from greedy somewhere.
    let mut seeded = body.clone();
    seeded["temperature"] = json!(1.0);
    seeded["seed"] = json!(7);
    let (_, _, a) = post_json(&url, &seeded).await;
    let (_, _, b) = post_json(&url, &seeded).await;
    assert_eq!(message(&a), message(&b));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn smollm2_answers_the_capital_of_france() {
    let _machine = crate::common::machine::whole_machine().await;
    let Some(path) = smollm2() else { return };
    let e = Engine::start_with(
        "cpu",
        &["--model", &path, "--served-model-name", "smollm2"],
        &[],
    )
    .await;
    let url = e.at("/v1/chat/completions");
    let body = chat_body("smollm2", "What is the capital of France?", 24);
    let (status, _, res) = post_json(&url, &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let text = message(&res);
    assert!(text.contains("Paris"), "{text:?}");
    assert_eq!(
        streamed_chat(&url, &body).await,
        text,
        "streamed != non-streamed"
    );

    let (status, _, res) = post_json(
        &e.at("/v1/completions"),
        &json!({"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let text = res["choices"][0]["text"].as_str().unwrap();
    assert!(text.contains("Paris"), "{text:?}");

    // The same greedy answers, token counts included, as Hugging Face transformers gives for the
    // same file (engine/tests/reference/smollm2_greedy.py).
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(crate::common::REPO)
                .join("engine/tests/fixtures/reference/smollm2_greedy.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let max_tokens = fixture["max_new_tokens"].as_u64().unwrap();
    for case in fixture["cases"].as_array().unwrap() {
        let q = case["question"].as_str().unwrap();
        let (status, _, res) = post_json(&url, &chat_body("smollm2", q, max_tokens)).await;
        assert_eq!(status, StatusCode::OK, "{res}");
        assert_eq!(message(&res), case["text"].as_str().unwrap(), "{q}");
        assert_eq!(res["usage"]["prompt_tokens"], case["prompt_tokens"], "{q}");
    }
}

/// Prompts sharing a long prefix, so prefix caching has something to reuse.
fn shared_prefix_prompts() -> Vec<String> {
    let prefix = "You are a careful assistant. Answer briefly and precisely. ".repeat(6);
    [
        "rivers", "stones", "light", "gardens", "windows", "paper", "silver", "markets",
    ]
    .iter()
    .map(|w| format!("{prefix}Write about {w}."))
    .collect()
}

async fn greedy_answers(
    e: &Engine,
    model: &str,
    prompts: &[String],
    concurrent: bool,
) -> Vec<String> {
    let url = e.at("/v1/chat/completions");
    let bodies: Vec<Value> = prompts.iter().map(|p| chat_body(model, p, 20)).collect();
    let results: Vec<Value> = if concurrent {
        let handles: Vec<_> = bodies
            .into_iter()
            .map(|b| {
                let url = url.clone();
                tokio::spawn(async move { post_json(&url, &b).await })
            })
            .collect();
        let mut out = Vec::new();
        for h in handles {
            let (status, _, v) = h.await.unwrap();
            assert_eq!(status, StatusCode::OK, "{v}");
            out.push(v);
        }
        out
    } else {
        let mut out = Vec::new();
        for b in &bodies {
            out.push(post_json(&url, b).await.2);
        }
        out
    };
    results.iter().map(message).collect()
}

/// Which model the invariance tests run: SmolLM2 when present (real text), else the default.
async fn invariance_engine(test: &str, args: &[&str]) -> (Engine, String) {
    match smollm2_quiet() {
        Some(path) => {
            let mut all = vec!["--model", path.as_str(), "--served-model-name", "m"];
            all.extend_from_slice(args);
            (Engine::start_with("cpu", &all, &[]).await, "m".into())
        }
        None => {
            let mut all = vec!["--served-model-name", "m"];
            all.extend_from_slice(args);
            (default_engine(test, &all).await.0, "m".into())
        }
    }
}

fn smollm2_quiet() -> Option<String> {
    common::smollm2_gguf(true)
}

#[tokio::test]
async fn greedy_output_is_the_same_with_prefix_caching_on_and_off() {
    let _machine = crate::common::machine::whole_machine().await;
    let prompts = shared_prefix_prompts();
    let (on, model) = invariance_engine("cache-on", &[]).await;
    let with_cache = greedy_answers(&on, &model, &prompts, false).await;
    let hits = metric(&on.at("/metrics"), "vllm:prefix_cache_hits_total").await;
    assert!(hits > 0.0, "prefix caching never hit");
    drop(on);
    let (off, model) = invariance_engine("cache-off", &["--no-prefix-caching"]).await;
    let without = greedy_answers(&off, &model, &prompts, false).await;
    assert_eq!(with_cache, without);
}

/// Short prompts with long answers, so that decoding (not admission) runs out of KV blocks.
async fn greedy_completions(e: &Engine, model: &str, concurrent: bool) -> Vec<String> {
    let url = e.at("/v1/completions");
    let bodies: Vec<Value> = [
        "rivers", "stones", "light", "gardens", "windows", "paper", "silver", "markets",
    ]
    .iter()
    .map(|w| {
        json!({"model": model, "prompt": format!("A short story about {w}:"), "max_tokens": 24,
                   "temperature": 0, "ignore_eos": true})
    })
    .collect();
    let mut handles = Vec::new();
    let mut out = Vec::new();
    for b in bodies {
        let url = url.clone();
        let h = tokio::spawn(async move { post_json(&url, &b).await });
        if concurrent {
            handles.push(h);
        } else {
            out.push(h.await.unwrap());
        }
    }
    for h in handles {
        out.push(h.await.unwrap());
    }
    out.into_iter()
        .map(|(status, _, v)| {
            assert_eq!(status, StatusCode::OK, "{v}");
            v["choices"][0]["text"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[tokio::test]
async fn greedy_output_is_the_same_alone_and_in_a_preempted_batch_of_8() {
    let _machine = crate::common::machine::whole_machine().await;
    let (solo, model) = invariance_engine("solo", &[]).await;
    let alone = greedy_completions(&solo, &model, false).await;
    drop(solo);
    // 8 sequences of ~32 tokens in 8 blocks of 16: all are admitted with one block each, and
    // every decode that needs a second block preempts the newest.
    let (tight, model) = invariance_engine(
        "tight",
        &["--num-gpu-blocks-override", "8", "--max-model-len", "128"],
    )
    .await;
    let batched = greedy_completions(&tight, &model, true).await;
    let preempted = metric(&tight.at("/metrics"), "vllm:num_preemptions_total").await;
    assert!(preempted > 0.0, "no preemption happened");
    assert_eq!(alone, batched);
}

#[tokio::test]
async fn bad_models_and_bad_prompts_get_clear_errors() {
    let _machine = crate::common::machine::whole_machine().await;
    let within = std::time::Duration::from_secs(60);
    let (status, _, err) =
        run_backend_to_exit("cpu", &["--model", "/nonexistent/model"], within).await;
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("/nonexistent/model does not exist"), "{err}");

    // A model directory whose config.json is broken, and one with an unsupported architecture.
    let dir = common::cache_dir("broken");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        "{\"architectures\": [\"LlamaForCausalLM\"], ",
    )
    .unwrap();
    let (status, _, err) =
        run_backend_to_exit("cpu", &["--model", dir.to_str().unwrap()], within).await;
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("config.json"), "{err}");
    std::fs::write(
        dir.join("config.json"),
        r#"{"architectures": ["GPT2LMHeadModel"]}"#,
    )
    .unwrap();
    let (status, _, err) =
        run_backend_to_exit("cpu", &["--model", dir.to_str().unwrap()], within).await;
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("GPT2LMHeadModel"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);

    // A context the KV cache cannot hold is refused up front.
    let (status, _, err) = run_backend_to_exit(
        "cpu",
        &["--num-gpu-blocks-override", "4", "--max-model-len", "1024"],
        within,
    )
    .await;
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("needs 64"), "{err}");

    // Token ids past the model's vocabulary are a 400, not a crash.
    let (e, dir) = default_engine("bad-prompt", &["--served-model-name", "m"]).await;
    let (status, _, res) = post_json(
        &e.at("/v1/completions"),
        &json!({"model": "m", "prompt": [1, 2, 100000], "max_tokens": 2}),
    )
    .await;
    assert_error(status, &res, &["100000", "vocabulary"]);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, res) = post_json(
        &e.at("/v1/completions"),
        &json!({"model": "m", "prompt": [1, 2, 3], "max_tokens": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The random-weight default model emits lone byte tokens (bytes of no complete character) all
/// the time; neither a streamed delta nor the whole answer may show them as U+FFFD.
#[tokio::test]
async fn streamed_text_never_contains_replacement_characters() {
    let _machine = crate::common::machine::whole_machine().await;
    let (e, dir) = default_engine("utf8", &["--served-model-name", "m"]).await;
    let url = e.at("/v1/completions");
    let prompts = [
        "Once there was a quiet village near the sea.",
        "The gateway sits in front of many workers.",
        "Numbers are everywhere: 7 days, 12 months.",
        "Tell me about rivers and stones.",
    ];
    for (i, prompt) in prompts.iter().enumerate() {
        // Greedy and sampled: sampling from random logits reaches the byte tokens most often.
        for (temperature, seed) in [(0.0, 0), (1.0, i)] {
            let mut body = json!({
                "model": "m", "prompt": prompt, "max_tokens": 96, "ignore_eos": true,
                "temperature": temperature, "seed": seed,
                "stream": true, "stream_options": {"include_usage": true},
            });
            let s = stream(&url, &body).await;
            assert_eq!(s.status, StatusCode::OK);
            let mut streamed = String::new();
            let mut usage = None;
            for c in s.chunks() {
                if let Some(delta) = c["choices"][0]["text"].as_str() {
                    assert!(!delta.contains('\u{FFFD}'), "{prompt:?}: delta {delta:?}");
                    streamed += delta;
                }
                if let Some(n) = c["usage"]["completion_tokens"].as_u64() {
                    usage = Some(n);
                }
            }
            // Held-back bytes still count as generated tokens.
            assert_eq!(usage, Some(96), "{prompt:?}");
            body["stream"] = json!(false);
            body.as_object_mut().map(|b| b.remove("stream_options"));
            let (status, _, res) = post_json(&url, &body).await;
            assert_eq!(status, StatusCode::OK, "{res}");
            let text = res["choices"][0]["text"].as_str().unwrap();
            assert!(!text.contains('\u{FFFD}'), "{prompt:?}: {text:?}");
            assert_eq!(streamed, text, "{prompt:?}: streamed != non-streamed");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
