//! The gateway in front of real models on the CPU: the shipped config's `infergate-tiny` pool
//! (the generated default model) through `infergate up`, and a pool serving SmolLM2-135M-Instruct
//! from GGUF that answers a factual question, streamed and not, identically.

use crate::common;

use common::gateway::{Gateway, TempDir, stream_with};
use common::post_as;
use hyper::StatusCode;
use serde_json::{Value, json};

/// `POST url` with `key` (if any): status and the JSON answer.
async fn post(url: &str, key: Option<&str>, body: &Value) -> (StatusCode, Value) {
    let reply = post_as(url, key, body).await;
    (reply.status, reply.json())
}

#[tokio::test]
async fn up_serves_the_default_cpu_model_through_the_gateway() {
    let _machine = crate::common::machine::whole_machine().await;
    let cache = std::env::temp_dir().join(format!("infergate-gw-cpu-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let gw = Gateway::up_with(None, &[("INFERGATE_CACHE_DIR", cache.to_str().unwrap())]).await;
    let key = gw.api_key.clone();
    let body = json!({
        "model": "infergate-tiny",
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": true,
    });
    let (status, res) = post(&gw.at("/v1/chat/completions"), key.as_deref(), &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    assert_eq!(res["model"], "infergate-tiny");
    assert_eq!(res["usage"]["completion_tokens"], 8, "{res}");
    assert!(res["usage"]["prompt_tokens"].as_u64().unwrap() > 5, "{res}");
    assert!(
        cache.join("models").is_dir(),
        "default model not generated in the cache"
    );
    drop(gw);
    let _ = std::fs::remove_dir_all(cache);
}

#[tokio::test]
async fn a_gguf_cpu_pool_answers_through_the_gateway() {
    let _machine = crate::common::machine::whole_machine().await;
    let Some(path) = common::smollm2_gguf(false) else {
        return;
    };
    let dir = TempDir::new("gw-cpu-smol");
    std::fs::create_dir_all(dir.path.join("policies")).unwrap();
    dir.write_routing("pools:\n  cpu:\n    policy: least_load\n");
    dir.write_config(&format!(
        "listen: \"127.0.0.1:0\"\n\
         admin:\n  listen: \"127.0.0.1:0\"\n\
         policies: policies\n\
         models:\n  - name: smollm2\n    pool: cpu\n    max_context: 8192\n\
         pools:\n  - name: cpu\n    workers:\n      - spawn: {{count: 1, args: [\"--backend\", \"cpu\", \"--model\", \"{path}\", \"--served-model-name\", \"smollm2\"]}}\n"
    ));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let body = json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 24,
        "temperature": 0,
    });
    let url = gw.at("/v1/chat/completions");
    let (status, res) = post(&url, None, &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let text = res["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(text.contains("Paris"), "{text:?}");

    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let s = stream_with(&url, &[], &streamed_body).await;
    let streamed: String = s
        .chunks()
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(
        streamed, text,
        "streamed != non-streamed through the gateway"
    );
    // The gateway metered the real usage the engine reported.
    assert!(
        res["usage"]["completion_tokens"].as_u64().unwrap() >= 2,
        "{res}"
    );
}

#[tokio::test]
async fn a_spawn_model_path_resolves_against_the_config_file() {
    let _machine = crate::common::machine::whole_machine().await;
    // The model sits beside the config as `./tiny`; the gateway runs from another directory.
    let dir = TempDir::new("gw-cpu-relative");
    let elsewhere = TempDir::new("gw-cpu-elsewhere");
    std::fs::create_dir_all(&elsewhere.path).unwrap();
    let built = infergate_engine::model::default_model::ensure(&dir.path.join("cache")).unwrap();
    std::fs::rename(&built, dir.path.join("tiny")).unwrap();
    std::fs::create_dir_all(dir.path.join("policies")).unwrap();
    dir.write_routing("pools:\n  cpu:\n    policy: least_load\n");
    dir.write_config(
        "listen: \"127.0.0.1:0\"\n\
         admin:\n  listen: \"127.0.0.1:0\"\n\
         policies: policies\n\
         models:\n  - name: tiny\n    pool: cpu\n    max_context: 2048\n\
         pools:\n  - name: cpu\n    workers:\n      - spawn: {count: 1, args: [\"--backend\", \"cpu\", \"--model\", \"./tiny\", \"--served-model-name\", \"tiny\"]}\n",
    );
    let gw = Gateway::start_in(Some(&elsewhere.path), &dir.config(), &[]).await;
    let body = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "ignore_eos": true,
    });
    let (status, res) = post(&gw.at("/v1/chat/completions"), None, &body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    assert_eq!(res["usage"]["completion_tokens"], 4, "{res}");
}
