//! Command-line flags of `infergate engine`, named as vLLM names them where vLLM has the flag.

use std::path::PathBuf;

/// Which forward pass the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// Roofline time model of a GPU preset; everything else real.
    Sim,
    /// A real forward pass on this machine's CPU cores.
    Cpu,
    /// A real forward pass on an NVIDIA GPU (builds with the cargo feature `cuda`).
    Cuda,
}

/// Flags of one engine worker.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// Forward-pass backend.
    #[arg(long, value_enum, default_value = "sim")]
    pub backend: BackendKind,
    /// GPU preset the sim backend models (h100, h200, a100, l4, mi300x).
    #[arg(long, default_value = "h100")]
    pub gpu: String,
    /// sim: a model preset (llama-3-8b, llama-3-70b, mistral-7b, qwen2.5-0.5b) or its Hugging
    /// Face id, default llama-3-8b. cpu and cuda: a Hugging Face model directory or a `.gguf`
    /// file; without it a small default model is generated in the cache directory.
    #[arg(long)]
    pub model: Option<String>,
    /// cpu: GiB of memory for the KV cache (sizes the block count, like vLLM's
    /// VLLM_CPU_KVCACHE_SPACE).
    #[arg(long, default_value_t = 1.0)]
    pub cpu_kv_cache_space: f64,
    /// Names the model is served under (default: `--model`).
    #[arg(long, num_args = 1..)]
    pub served_model_name: Vec<String>,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0 picks a free one and prints it).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// GPUs the model is sharded over.
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel_size: usize,
    /// Most sequences in one batch.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Most tokens computed in one step (default 8192; at least the context without chunked prefill).
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Fraction of GPU memory the engine may use (weights, activations, KV cache).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Decode batch sizes that get a captured CUDA graph, e.g. `1,2,4,8` (default: vLLM's, 1, 2,
    /// 4 and multiples of 8 up to `--max-num-seqs`). Other batches run eagerly. sim costs the
    /// path; cuda captures and replays it.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub cuda_graph_sizes: Vec<usize>,
    /// Never use CUDA graphs: every step runs eagerly.
    #[arg(long)]
    pub enforce_eager: bool,
    /// Which steps replay graphs: `full-decode-only` (decode-only batches; steps with prefill
    /// run eagerly) or `full-and-piecewise` (also steps with prefill up to the largest size, in
    /// tokens, as vLLM V1 runs them). Sim only: cuda captures decode graphs alone.
    #[arg(long, value_enum, default_value_t = crate::exec_path::CudagraphMode::FullDecodeOnly)]
    pub cudagraph_mode: crate::exec_path::CudagraphMode,
    /// Context length (default: the model's).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Admit prompts only whole, never split across steps.
    #[arg(long)]
    pub no_chunked_prefill: bool,
    /// Disable reuse of cached KV blocks across requests.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Share of KV blocks (0..=1) that cached blocks reused at least once keep ahead of blocks
    /// used once; 0 is plain LRU eviction.
    #[arg(long, default_value_t = crate::block_manager::DEFAULT_PROTECTED_FRACTION)]
    pub kv_protected_fraction: f64,
    /// Do not serve `GET /kv/events` (routers fall back to their approximate index).
    #[arg(long)]
    pub no_kv_events: bool,
    /// Also publish KV-cache events as vLLM does (`--kv-events-config` with the zmq publisher):
    /// a ZMQ PUB socket bound at this `tcp://HOST:PORT` (port 0: any free port, logged).
    #[arg(long, value_name = "ENDPOINT")]
    pub kv_events_zmq: Option<String>,
    /// Topic of the `--kv-events-zmq` messages (vLLM's `KVEventsConfig.topic`).
    #[arg(long, default_value = "", value_name = "TOPIC")]
    pub kv_events_topic: String,
    /// Use exactly this many KV blocks instead of the memory-derived budget.
    #[arg(long)]
    pub num_gpu_blocks_override: Option<usize>,
    /// Sequences (a request's prompts × `best_of`) allowed to wait for admission before new
    /// requests get 503; a request with more is refused with 400.
    #[arg(long, default_value_t = 1024)]
    pub max_waiting_requests: usize,
    /// Chat template: a Jinja file, or a Hugging Face model directory / its
    /// `tokenizer_config.json` whose `chat_template` is used (default: ChatML).
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Seconds a client has to send a request's whole body once its headers are in (408 past
    /// it).
    #[arg(long, default_value_t = 30.0)]
    pub body_read_timeout: f64,
    /// Requests in flight (answers still streaming included) past which a new one gets 503 at
    /// once; reads (GET: health, metrics, models) are never capped. None by default (the
    /// scheduler's `--max-waiting-requests` bounds generation).
    #[arg(long)]
    pub max_in_flight_requests: Option<usize>,
    /// Sim: mean answer length in tokens when EOS may end a sequence.
    #[arg(long, default_value_t = 256.0)]
    pub sim_mean_output_tokens: f64,
    /// Sim: host microseconds before every step (the loop's fixed overhead), during which the
    /// modelled GPU idles. With the three below, simulates a host-bound engine; 0 = the host
    /// keeps up with the GPU.
    #[arg(long, default_value_t = 0.0)]
    pub sim_host_us_per_step: f64,
    /// Sim: host microseconds per sequence in a step (scheduling it, streaming its output).
    #[arg(long, default_value_t = 0.0)]
    pub sim_host_us_per_seq: f64,
    /// Sim: host microseconds per prompt token computed for the first time (tokenising it).
    #[arg(long, default_value_t = 0.0)]
    pub sim_host_us_per_prompt_token: f64,
    /// Sim: host microseconds per generated token (detokenising it).
    #[arg(long, default_value_t = 0.0)]
    pub sim_host_us_per_output_token: f64,
    /// Sim: share of the capture-cost model's start-up time (engine/src/capture_cost.rs) that
    /// warm-up waits per capture size before the engine reports ready. Default 0.01: about 18 ms
    /// for vLLM's default sizes on Llama-3-8B, so engines start fast; 1 is the modelled time.
    #[arg(long, default_value_t = crate::warmup::DEFAULT_SIM_CAPTURE_TIME_SCALE)]
    pub sim_capture_time_scale: f64,
    /// Sim: wall seconds per modelled second (default 1, real time). 10 runs every step, and
    /// the whole engine, ten times slower, so a small machine can carry a fast engine's token
    /// rate live; the engine's own figures (flight records, metrics) stay in modelled time.
    #[arg(long, default_value_t = 1.0)]
    pub sim_slowdown: f64,
    /// Fault: share of requests answered 500 before running (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub fault_error_rate: f64,
    /// Fault: multiply every step time by this.
    #[arg(long, default_value_t = 1.0)]
    pub fault_latency_multiplier: f64,
    /// Fault: exit the process abruptly when the Nth request arrives.
    #[arg(long)]
    pub fault_crash_after: Option<u64>,
    /// Fault: seed of the error-rate and misbehaviour draws.
    #[arg(long, default_value_t = 0)]
    pub fault_seed: u64,
    /// Quality fault: share of answers that loop over one short phrase until `max_tokens`
    /// (finish reason `length`).
    #[arg(long, default_value_t = 0.0)]
    pub fault_repeat_rate: f64,
    /// Quality fault: share of answers with no content (finish reason `stop`, 0 tokens).
    #[arg(long, default_value_t = 0.0)]
    pub fault_empty_rate: f64,
    /// Quality fault: share of answers that are a refusal ("I'm sorry, but I can't help ...").
    #[arg(long, default_value_t = 0.0)]
    pub fault_refusal_rate: f64,
    /// Quality fault: share of answers to requests giving `response_format` that are JSON cut
    /// off mid-object.
    #[arg(long, default_value_t = 0.0)]
    pub fault_broken_json_rate: f64,
    /// Quality fault: every answer ignores EOS and runs to `max_tokens`.
    #[arg(long)]
    pub fault_longer_answers: bool,
    /// Exit when standard input closes: set by a supervising gateway so that workers never
    /// outlive it, even when it is killed without a chance to stop them.
    #[arg(long, hide = true)]
    pub exit_with_stdin: bool,
}
