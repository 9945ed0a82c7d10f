//! Builds a running engine from its flags: presets → KV budget → scheduler and backend → core
//! thread. Refuses configurations that cannot work (unknown preset, model too large) up front.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;

use crate::args::{BackendKind, EngineArgs};
use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::backend::sim::SimBackend;
use crate::block_manager::BlockManager;
use crate::clock::RealClock;
use crate::core::{EngineCore, run_engine_loop, warm_up_then_run};
use crate::embeddings::Embedder;
use crate::exec_path::{CaptureSizes, CudagraphMode};
use crate::host_time::HostCost;
use crate::kv_events::KvEventHub;
use crate::metrics::{CacheSettings, EngineMetrics};
use crate::model::forward::Model;
use crate::openai::ChatTemplate;
use crate::presets;
use crate::roofline::{RooflineConfig, RooflineModel, kv_block_budget};
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::sequence::NewRequest;
use crate::tokenizer::{EngineTokenizer, SimTokenizer};
use crate::warmup::{WarmupPlan, WarmupState};

/// Fault injection knobs for tests of the layers above.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// Share of requests answered 500.
    pub error_rate: f64,
    /// Exit when this request number arrives.
    pub crash_after: Option<u64>,
    /// Seed of the error draw.
    pub seed: u64,
}

impl Faults {
    /// Whether request number `n` is failed on purpose (deterministic in seed and `n`).
    pub fn should_fail(&self, n: u64) -> bool {
        if self.error_rate <= 0.0 {
            return false;
        }
        let h = xxhash_rust::xxh3::xxh3_64_with_seed(&n.to_le_bytes(), self.seed);
        ((h >> 11) as f64 / (1u64 << 53) as f64) < self.error_rate
    }
}

/// A started engine, as the HTTP layer sees it.
pub struct Engine {
    /// Names the model answers to; the first is the primary.
    pub served_names: Vec<String>,
    /// KV blocks in the cache.
    pub num_blocks: usize,
    /// Context length in tokens.
    pub max_model_len: usize,
    /// Most sequences per batch.
    pub max_num_seqs: usize,
    /// Exported metrics.
    pub metrics: Arc<EngineMetrics>,
    /// Injected faults.
    pub faults: Faults,
    /// Injected quality faults (answers that are worse on purpose).
    pub misbehave: crate::misbehave::Misbehave,
    /// Prompt tokenizer.
    pub tokenizer: EngineTokenizer,
    /// Token ids below this are valid in prompts.
    pub vocab_size: usize,
    /// Chat template for `/v1/chat/completions`.
    pub chat_template: ChatTemplate,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Requests submitted but not yet admitted.
    pub pending: Arc<AtomicUsize>,
    /// Bound on `pending`.
    pub max_waiting: usize,
    /// Queue into the core thread: each message is one prompt's sequences (`n` or `best_of`).
    pub submit: mpsc::Sender<Vec<NewRequest>>,
    /// KV events for `/kv/events`; `None` with `--no-kv-events` or without prefix caching.
    pub kv_events: Option<Arc<KvEventHub>>,
    /// What `/v1/embeddings` runs.
    pub embedder: Embedder,
    /// The engine's part of every flight record (backend, capture sizes).
    pub flight: Arc<crate::flight::EngineInfo>,
    /// Warm-up progress and readiness (`/ready`, and generation refused until ready).
    pub warmup: Arc<WarmupState>,
}

impl Engine {
    /// Seconds a refused client should wait: the time the engine needs to admit `pending`
    /// requests, from the observed mean request latency and the batch width.
    pub fn retry_after_secs(&self, pending: usize) -> u64 {
        let count = self.metrics.e2e.get_sample_count();
        let mean = if count == 0 {
            1.0
        } else {
            self.metrics.e2e.get_sample_sum() / count as f64
        };
        let secs = pending as f64 * mean / self.max_num_seqs.max(1) as f64;
        secs.ceil().max(1.0) as u64
    }
}

/// What a backend brings to the engine besides its forward pass.
struct BackendParts {
    backend: Box<dyn Backend>,
    default_name: String,
    num_blocks: usize,
    max_model_len: usize,
    tokenizer: EngineTokenizer,
    vocab_size: usize,
    chat_template: ChatTemplate,
    embedder: Embedder,
    /// What warm-up runs before the engine reports ready.
    warmup: WarmupPlan,
}

/// The template named by `--chat-template`, if any.
fn chat_template_flag(args: &EngineArgs) -> Result<Option<ChatTemplate>, String> {
    let Some(path) = &args.chat_template else {
        return Ok(None);
    };
    if path.is_dir() || path.ends_with("tokenizer_config.json") {
        // A Hugging Face model directory (or its tokenizer_config.json): use its template.
        let config = if path.is_dir() {
            path.join("tokenizer_config.json")
        } else {
            path.clone()
        };
        return ChatTemplate::from_tokenizer_config(&config)
            .map_err(|e| format!("--chat-template {}: {e}", config.display()))?
            .ok_or_else(|| format!("{} has no chat_template", config.display()))
            .map(Some);
    }
    let src = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read --chat-template {}: {e}", path.display()))?;
    ChatTemplate::from_source(&src, "", "<|endoftext|>")
        .map_err(|e| format!("--chat-template {}: {e}", path.display()))
        .map(Some)
}

fn build_sim(args: &EngineArgs) -> Result<BackendParts, String> {
    let name = args.model.clone().unwrap_or_else(|| "llama-3-8b".into());
    let gpu = presets::gpu(&args.gpu).ok_or_else(|| {
        format!(
            "unknown --gpu {:?}; known: {}",
            args.gpu,
            presets::gpu_names().join(", ")
        )
    })?;
    let model = presets::model(&name).ok_or_else(|| {
        format!(
            "unknown --model {:?}; known: {}",
            name,
            presets::model_names().join(", ")
        )
    })?;
    let max_model_len = args.max_model_len.unwrap_or(model.max_model_len);
    if max_model_len == 0 || max_model_len > model.max_model_len {
        return Err(format!(
            "--max-model-len {max_model_len} must be between 1 and {}'s context of {}",
            model.name, model.max_model_len
        ));
    }
    let budget = kv_block_budget(
        gpu,
        model,
        args.tensor_parallel_size,
        args.gpu_memory_utilization,
        args.block_size,
    )
    .map_err(|e| e.to_string())?;
    let num_blocks = args.num_gpu_blocks_override.unwrap_or(budget.num_blocks);
    let tokenizer = SimTokenizer::shared()?;
    let roofline = RooflineModel::new(
        gpu,
        model,
        RooflineConfig {
            tensor_parallel_size: args.tensor_parallel_size,
            max_num_seqs: args.max_num_seqs,
            latency_multiplier: args.fault_latency_multiplier,
            ..RooflineConfig::default()
        },
    )
    .with_capture_sizes(capture_sizes(args)?);
    let warmup = WarmupPlan {
        sizes: roofline.capture_cost().sizes,
    };
    let host = HostCost::from_micros(
        args.sim_host_us_per_step,
        args.sim_host_us_per_seq,
        args.sim_host_us_per_prompt_token,
        args.sim_host_us_per_output_token,
    );
    host.check()?;
    let backend = SimBackend::new(
        roofline,
        tokenizer.word_tokens().to_vec(),
        tokenizer.eos(),
        args.sim_mean_output_tokens,
        args.block_size,
    )
    .with_host_cost(host)
    .with_capture_time_scale(crate::warmup::check_scale(args.sim_capture_time_scale)?);
    Ok(BackendParts {
        backend: Box::new(backend),
        default_name: name,
        num_blocks,
        max_model_len,
        tokenizer: EngineTokenizer::Sim(tokenizer),
        vocab_size: tokenizer.eos() as usize + 1,
        chat_template: chat_template_flag(args)?.unwrap_or_else(ChatTemplate::default_chatml),
        embedder: Embedder::Sim {
            dim: model.hidden_size,
        },
        warmup,
    })
}

/// The serving clock: real time, or for the sim backend slowed by `--sim-slowdown`.
fn serving_clock(args: &EngineArgs) -> Result<RealClock, String> {
    let k = args.sim_slowdown;
    if !(k.is_finite() && k > 0.0) {
        return Err(format!("--sim-slowdown must be a number > 0, not {k}"));
    }
    if k != 1.0 && !matches!(args.backend, BackendKind::Sim) {
        return Err(
            "--sim-slowdown applies to --backend sim only (real backends run in real time)".into(),
        );
    }
    Ok(RealClock::slowed(k))
}

/// The CUDA-graph capture sizes of `--cuda-graph-sizes` and `--enforce-eager`, under
/// `--cudagraph-mode` (piecewise graphs are modelled by the sim backend alone).
fn capture_sizes(args: &EngineArgs) -> Result<CaptureSizes, String> {
    if args.cudagraph_mode != CudagraphMode::FullDecodeOnly
        && !matches!(args.backend, BackendKind::Sim)
    {
        return Err(
            "--cudagraph-mode full-and-piecewise is modelled by --backend sim only (cuda captures decode graphs alone)"
                .into(),
        );
    }
    Ok(CaptureSizes::from_flags(
        &args.cuda_graph_sizes,
        args.enforce_eager,
        args.max_num_seqs,
    )?
    .with_mode(args.cudagraph_mode))
}

/// A real model loaded for the cpu or cuda backend, with its context length and template.
struct RealModel {
    loaded: crate::model::LoadedModel,
    max_model_len: usize,
    chat_template: ChatTemplate,
}

/// Loads `--model` (or the generated default model) and checks `--max-model-len` against it.
fn load_real_model(args: &EngineArgs, backend: &str) -> Result<RealModel, String> {
    if args.tensor_parallel_size != 1 {
        return Err(format!(
            "the {backend} backend runs on one device: --tensor-parallel-size must be 1"
        ));
    }
    let path = match &args.model {
        Some(m) => std::path::PathBuf::from(m),
        None => crate::model::default_model::ensure(&crate::model::default_model::models_dir())?,
    };
    let started = std::time::Instant::now();
    let loaded =
        crate::model::load(&path).map_err(|e| format!("--model {}: {e}", path.display()))?;
    let model_len = loaded.config.max_position_embeddings;
    let max_model_len = args.max_model_len.unwrap_or(model_len);
    if max_model_len == 0 || max_model_len > model_len {
        return Err(format!(
            "--max-model-len {max_model_len} must be between 1 and the model's context of {model_len}"
        ));
    }
    let chat_template = match chat_template_flag(args)? {
        Some(t) => t,
        None => match &loaded.chat_template {
            Some(src) => ChatTemplate::from_source(src, &loaded.bos_token, &loaded.eos_token)
                .map_err(|e| format!("the chat template of {}: {e}", path.display()))?,
            None => ChatTemplate::default_chatml(),
        },
    };
    tracing::info!(
        model = %path.display(),
        parameters = loaded.config.num_parameters(),
        layers = loaded.config.num_layers,
        load_seconds = started.elapsed().as_secs_f64(),
        "loaded model"
    );
    Ok(RealModel {
        loaded,
        max_model_len,
        chat_template,
    })
}

/// A single request must fit in the cache, or the scheduler could never finish it.
fn check_fits(
    num_blocks: usize,
    args: &EngineArgs,
    max_model_len: usize,
    raise: &str,
) -> Result<(), String> {
    let needed = max_model_len.div_ceil(args.block_size);
    if num_blocks < needed {
        return Err(format!(
            "the KV cache holds {num_blocks} blocks of {} tokens but one {max_model_len}-token sequence needs {needed}: raise {raise} or lower --max-model-len",
            args.block_size
        ));
    }
    Ok(())
}

fn build_cpu(args: &EngineArgs) -> Result<BackendParts, String> {
    let RealModel {
        loaded,
        max_model_len,
        chat_template,
    } = load_real_model(args, "cpu")?;
    let config = loaded.config;
    let per_block = crate::model::kv_cache::KvCache::block_bytes(
        args.block_size,
        config.num_layers,
        config.kv_dim(),
    );
    if args.cpu_kv_cache_space.is_nan() || args.cpu_kv_cache_space <= 0.0 {
        return Err("--cpu-kv-cache-space must be positive".into());
    }
    let space = args.cpu_kv_cache_space * f64::from(1u32 << 30);
    let num_blocks = args
        .num_gpu_blocks_override
        .unwrap_or((space / per_block as f64) as usize);
    check_fits(num_blocks, args, max_model_len, "--cpu-kv-cache-space")?;
    tracing::info!(kv_blocks = num_blocks, "sized the KV cache");
    let vocab_size = config.vocab_size;
    let model = Arc::new(Model::new(config, loaded.weights));
    Ok(BackendParts {
        backend: Box::new(CpuBackend::new(model.clone(), num_blocks, args.block_size)),
        embedder: Embedder::cpu(model),
        // As vLLM does: served under the --model string unless named otherwise.
        default_name: args.model.clone().unwrap_or(loaded.name),
        num_blocks,
        max_model_len,
        tokenizer: EngineTokenizer::Model(std::sync::Arc::new(loaded.tokenizer)),
        vocab_size,
        chat_template,
        // No graphs on cpu: only sizes named by --cuda-graph-sizes get a warm-up pass (the
        // default set would add 35 passes to every start for nothing to capture).
        warmup: if args.cuda_graph_sizes.is_empty() {
            WarmupPlan::unpriced(&[])
        } else {
            WarmupPlan::unpriced(capture_sizes(args)?.as_slice())
        },
    })
}

#[cfg(feature = "cuda")]
fn build_cuda(args: &EngineArgs) -> Result<BackendParts, String> {
    use crate::backend::cuda::{self, CudaBackend, CudaOptions};
    // The libraries and the device first, before time is spent loading the model.
    let ctx = cuda::probe::open_device(0)?;
    let RealModel {
        loaded,
        max_model_len,
        chat_template,
    } = load_real_model(args, "cuda")?;
    let config = loaded.config;
    cuda::model::check_shape(&config)?;
    let sizes = capture_sizes(args)?;
    let batched = args.max_num_batched_tokens.unwrap_or(8192);
    let opts = CudaOptions {
        gpu_memory_utilization: args.gpu_memory_utilization,
        num_gpu_blocks_override: args.num_gpu_blocks_override,
        limits: cuda::limits(
            if args.no_chunked_prefill {
                batched.max(max_model_len)
            } else {
                batched
            },
            args.max_num_seqs,
            max_model_len,
            args.block_size,
            &sizes,
        ),
        capture_sizes: sizes.clone(),
        kernel_cache: crate::model::default_model::cache_root().join("kernels"),
    };
    let vocab_size = config.vocab_size;
    let hidden = config.hidden_size;
    let (backend, num_blocks) = CudaBackend::start(ctx, config, &loaded.weights, &opts)?;
    check_fits(num_blocks, args, max_model_len, "--gpu-memory-utilization")?;
    Ok(BackendParts {
        backend: Box::new(backend),
        embedder: Embedder::Unavailable {
            dim: hidden,
            backend: "cuda",
        },
        default_name: args.model.clone().unwrap_or(loaded.name),
        num_blocks,
        max_model_len,
        tokenizer: EngineTokenizer::Model(std::sync::Arc::new(loaded.tokenizer)),
        vocab_size,
        chat_template,
        // Each size's graph is captured by warm-up; time and bytes are measured there.
        warmup: WarmupPlan::unpriced(sizes.as_slice()),
    })
}

#[cfg(not(feature = "cuda"))]
fn build_cuda(_args: &EngineArgs) -> Result<BackendParts, String> {
    Err("--backend cuda: this infergate was built without the cuda backend; rebuild it with `cargo build --release --features cuda` (it builds without CUDA, and needs an NVIDIA GPU and driver to run)".into())
}

/// Validates the flags, loads or models the backend, sizes the KV cache and starts the core
/// thread.
pub fn build_engine(args: &EngineArgs) -> Result<Engine, String> {
    if args.block_size == 0 || args.max_num_seqs == 0 || args.tensor_parallel_size == 0 {
        return Err(
            "--block-size, --max-num-seqs and --tensor-parallel-size must be at least 1".into(),
        );
    }
    if !(args.gpu_memory_utilization > 0.0 && args.gpu_memory_utilization <= 1.0) {
        return Err("--gpu-memory-utilization must be in (0, 1]".into());
    }
    let parts = match args.backend {
        BackendKind::Sim => build_sim(args)?,
        BackendKind::Cpu => build_cpu(args)?,
        BackendKind::Cuda => build_cuda(args)?,
    };
    let (num_blocks, max_model_len) = (parts.num_blocks, parts.max_model_len);
    if num_blocks == 0 {
        return Err("the KV cache would have no blocks".into());
    }
    let chunked = !args.no_chunked_prefill;
    let mut batched = args.max_num_batched_tokens.unwrap_or(8192);
    if !chunked {
        // Whole prompts only: the budget must hold the longest one (as vLLM requires).
        batched = batched.max(max_model_len);
    }
    if batched == 0 {
        return Err("--max-num-batched-tokens must be at least 1".into());
    }
    if !(0.0..=1.0).contains(&args.kv_protected_fraction) {
        return Err("--kv-protected-fraction must be between 0 and 1".into());
    }

    let misbehave = crate::misbehave::Misbehave::new(
        crate::misbehave::MisbehaveRates {
            repeat: args.fault_repeat_rate,
            empty: args.fault_empty_rate,
            refusal: args.fault_refusal_rate,
            broken_json: args.fault_broken_json_rate,
            longer_answers: args.fault_longer_answers,
        },
        args.fault_seed,
        &parts.tokenizer,
    )?;
    let served_names = if args.served_model_name.is_empty() {
        vec![parts.default_name.clone()]
    } else {
        args.served_model_name.clone()
    };
    let metrics = Arc::new(
        EngineMetrics::with_max_model_len(&served_names[0], max_model_len)
            .map_err(|e| e.to_string())?,
    );
    let mut kv = BlockManager::new(num_blocks, args.block_size, !args.no_prefix_caching);
    kv.set_protected_fraction(args.kv_protected_fraction);
    metrics.set_cache_config(
        &kv,
        &CacheSettings {
            gpu_memory_utilization: args.gpu_memory_utilization,
            num_gpu_blocks_override: args.num_gpu_blocks_override,
        },
    );
    let kv_events = (!args.no_kv_events && !args.no_prefix_caching).then(|| {
        kv.enable_events();
        Arc::new(KvEventHub::new())
    });
    let sched = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: args.max_num_seqs,
            max_num_batched_tokens: batched,
            chunked_prefill: chunked,
        },
        kv,
    );
    let pending = Arc::new(AtomicUsize::new(0));
    let mut core = EngineCore::new(
        sched,
        parts.backend,
        Arc::new(serving_clock(args)?),
        metrics.clone(),
        pending.clone(),
    );
    if let Some(hub) = &kv_events {
        core.publish_kv_events(hub.clone());
    }
    if let Some(endpoint) = &args.kv_events_zmq {
        if args.no_prefix_caching {
            return Err("--kv-events-zmq needs prefix caching (drop --no-prefix-caching)".into());
        }
        let (publisher, bound) = crate::vllm_kv_events::VllmPublisher::start(
            endpoint,
            &args.kv_events_topic,
            args.block_size,
        )?;
        tracing::info!(endpoint = %bound, topic = %args.kv_events_topic, "kv events published in vLLM's format");
        core.publish_vllm_events(publisher);
    }
    // The cpu backend runs every step eagerly, whatever the flags say.
    let (backend_name, captured) = match args.backend {
        BackendKind::Sim => ("sim", capture_sizes(args)?),
        BackendKind::Cpu => ("cpu", CaptureSizes::none()),
        BackendKind::Cuda => ("cuda", capture_sizes(args)?),
    };
    let flight = Arc::new(
        crate::flight::EngineInfo::new(backend_name, captured.as_slice())
            .with_piecewise(captured.is_piecewise()),
    );
    let (submit, requests) = mpsc::channel();
    let warmup = Arc::new(WarmupState::new());
    let (plan, state) = (parts.warmup, warmup.clone());
    if plan.is_empty() {
        // Nothing to warm: ready before the server listens.
        warmup.finish(0.0);
    } else {
        tracing::info!(
            sizes = plan.sizes.len(),
            modelled_seconds = plan.scaled_seconds(1.0),
            "warming up before reporting ready"
        );
    }
    std::thread::Builder::new()
        .name("engine-core".into())
        .spawn(move || {
            if plan.is_empty() {
                run_engine_loop(core, requests);
            } else {
                warm_up_then_run(core, &plan, &state, requests);
            }
        })
        .map_err(|e| format!("cannot start the engine thread: {e}"))?;

    Ok(Engine {
        served_names,
        num_blocks,
        max_model_len,
        max_num_seqs: args.max_num_seqs,
        metrics,
        faults: Faults {
            error_rate: args.fault_error_rate,
            crash_after: args.fault_crash_after,
            seed: args.fault_seed,
        },
        misbehave,
        tokenizer: parts.tokenizer,
        vocab_size: parts.vocab_size,
        chat_template: parts.chat_template,
        max_body_bytes: args.max_body_bytes,
        pending,
        max_waiting: args.max_waiting_requests,
        kv_events,
        submit,
        embedder: parts.embedder,
        flight,
        warmup,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The engine's flags, as a command line parses them.
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: EngineArgs,
    }

    fn args(flags: &[&str]) -> EngineArgs {
        Cli::try_parse_from(std::iter::once("engine").chain(flags.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn the_sim_only_flags_are_refused_on_real_backends() {
        let sim = args(&["--cudagraph-mode", "full-and-piecewise"]);
        assert!(capture_sizes(&sim).unwrap().is_piecewise());
        assert!(!capture_sizes(&args(&[])).unwrap().is_piecewise());
        let cuda = args(&[
            "--backend",
            "cuda",
            "--cudagraph-mode",
            "full-and-piecewise",
        ]);
        assert!(capture_sizes(&cuda).unwrap_err().contains("sim only"));

        assert!(serving_clock(&args(&["--sim-slowdown", "4"])).is_ok());
        let cpu = args(&["--backend", "cpu", "--sim-slowdown", "4"]);
        assert!(serving_clock(&cpu).unwrap_err().contains("sim only"));
        for bad in ["0", "-1", "NaN"] {
            let a = args(&[&format!("--sim-slowdown={bad}")]);
            assert!(serving_clock(&a).unwrap_err().contains("> 0"), "{bad}");
        }
    }
}
