//! `--backend cuda` and the execution-path flags it shares with the sim backend, through the
//! real `infergate engine` process: on a machine without CUDA (or a build without the `cuda`
//! feature) the cuda backend exits 1 naming what is missing, and `--cuda-graph-sizes` /
//! `--enforce-eager` decide each step's path (`x-infergate-exec-path`,
//! `infergate_engine_steps_total{path}`) by the rule both backends use.

use crate::common;

use std::time::Duration;

use common::{Engine, parse_exec_path, post_json, run_backend_to_exit, run_to_exit};
use hyper::StatusCode;
use serde_json::json;

/// A request whose prompt is one step and whose 6 tokens then decode one per step.
fn six_tokens() -> serde_json::Value {
    json!({
        "model": "llama-3-8b",
        "prompt": "The capital of France is",
        "max_tokens": 6,
        "ignore_eos": true
    })
}

#[tokio::test]
async fn the_cuda_backend_without_cuda_exits_1_naming_what_is_missing() {
    #[cfg(feature = "cuda")]
    if infergate_engine::backend::cuda::probe::missing_libraries().is_empty() {
        // A CUDA machine: the GPU tests (engine/tests/cuda_parity.rs) cover the start.
        common::skip::skipped("the cuda refusal test: this machine has the CUDA libraries");
        return;
    }
    let (status, _, stderr) = run_backend_to_exit(
        "cuda",
        &["--model", "/nonexistent/model.gguf"],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    if cfg!(feature = "cuda") {
        // The libraries are checked before the model is read, and every missing one named.
        assert!(
            stderr.contains(
                "--backend cuda cannot start: missing the NVIDIA driver library libcuda.so.1"
            ),
            "{stderr}"
        );
        assert!(!stderr.contains("/nonexistent"), "{stderr}");
    } else {
        assert!(
            stderr.contains("built without the cuda backend") && stderr.contains("--features cuda"),
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn enforce_eager_runs_every_step_eagerly() {
    let e = Engine::start(&["--enforce-eager"]).await;
    let (status, headers, res) = post_json(&e.at("/v1/completions"), &six_tokens()).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let path = headers["x-infergate-exec-path"].to_str().unwrap();
    assert_eq!(parse_exec_path(path), (0, 6), "{path}");
    assert_eq!(
        e.metric_or_zero("infergate_engine_steps_total{path=\"graph\"}")
            .await,
        0.0
    );
}

#[tokio::test]
async fn decode_steps_replay_graphs_only_of_the_configured_sizes() {
    // Capture size 2 only: a lone request's decode steps (batch 1) pad to 2 and replay it.
    let e = Engine::start(&["--cuda-graph-sizes", "2"]).await;
    let (status, headers, res) = post_json(&e.at("/v1/completions"), &six_tokens()).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    let path = headers["x-infergate-exec-path"].to_str().unwrap();
    // The first step (prefill, which samples the first token) is eager, the 5 decodes graphs.
    assert_eq!(parse_exec_path(path), (5, 1), "{path}");
    drop(e);

    // `n: 3` decodes three sequences per step: above the largest size 2, so eager; with a
    // size 4 they pad to it and replay its graph.
    let three = json!({
        "model": "llama-3-8b",
        "prompt": "The capital of France is",
        "max_tokens": 6,
        "ignore_eos": true,
        "n": 3
    });
    // The header counts each choice's steps: 3 × (1 prefill + 5 decodes).
    for (sizes, want) in [("1,2", (0, 18)), ("4", (15, 3))] {
        let e = Engine::start(&["--cuda-graph-sizes", sizes]).await;
        let (status, headers, res) = post_json(&e.at("/v1/completions"), &three).await;
        assert_eq!(status, StatusCode::OK, "{res}");
        assert_eq!(res["choices"].as_array().map(Vec::len), Some(3), "{res}");
        let path = headers["x-infergate-exec-path"].to_str().unwrap();
        assert_eq!(parse_exec_path(path), want, "sizes {sizes}: {path}");
    }
}

#[tokio::test]
async fn bad_graph_sizes_are_refused_at_start() {
    let (status, _, stderr) =
        run_to_exit(&["--cuda-graph-sizes", "0,4"], Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--cuda-graph-sizes: 0 is not a batch size"),
        "{stderr}"
    );
    let (status, _, stderr) = run_to_exit(
        &["--cuda-graph-sizes", "64", "--max-num-seqs", "8"],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--max-num-seqs 8"), "{stderr}");
}
