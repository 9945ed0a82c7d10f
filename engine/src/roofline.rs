//! Roofline step-time model for the sim backend: how long one forward pass of a batch takes on a
//! given GPU, and how many KV blocks fit in its memory.
//!
//! A step costs `max(compute time, memory time)` plus tensor-parallel all-reduces plus a host-side
//! launch overhead that depends on whether the step replays a captured CUDA graph or runs eagerly.
//! `engine/README.md` has the formula and a sanity table against published measurements.

use std::fmt;

use crate::capture_cost::{CaptureCost, CaptureCostModel};
use crate::presets::{GpuPreset, ModelPreset};

/// Bytes per element of BF16 activations, weights and KV cache.
const BF16_BYTES: f64 = 2.0;
/// Fixed cost of replaying a captured CUDA graph (one launch plus input copies), in seconds.
const GRAPH_LAUNCH_S: f64 = 30e-6;
/// Host-side cost of launching one kernel eagerly (CUDA launch plus framework dispatch), in seconds.
const EAGER_KERNEL_LAUNCH_S: f64 = 5e-6;
/// Kernels per decoder layer in eager mode: 2 norms, QKV GEMM, rotary, KV-cache write, attention,
/// O GEMM, gate-up GEMM, activation, down GEMM, 2 residual adds.
const EAGER_KERNELS_PER_LAYER: f64 = 12.0;
/// Launches per decoder layer of a piecewise-graph step: the layer's captured piece, and its
/// attention, which runs outside the graphs (vLLM V1's `full-and-piecewise`).
const PIECEWISE_LAUNCHES_PER_LAYER: f64 = 2.0;
/// Extra host work of a step that contains prefill (building attention metadata for ragged
/// sequences, slot mappings and sampling inputs), in seconds. Decode-only steps reuse most of it.
const PREFILL_PREP_S: f64 = 1e-3;
/// Fixed latency of one NCCL all-reduce launch and synchronisation, in seconds.
const ALLREDUCE_LATENCY_S: f64 = 8e-6;
/// All-reduces per decoder layer under tensor parallelism (after attention and after the MLP).
const ALLREDUCES_PER_LAYER: f64 = 2.0;
/// Per-GPU runtime reserve outside weights and KV: CUDA context, cuBLAS/NCCL workspaces, allocator slack.
const RUNTIME_RESERVE_BYTES: u64 = 1 << 30;
/// Tokens in the largest forward pass profiled for activation memory (a chunked-prefill budget).
const PEAK_ACTIVATION_TOKENS: u64 = 8192;
/// One gibibyte, for messages.
const GIB: f64 = (1u64 << 30) as f64;

/// Summary of one engine step's batch, filled in by the scheduler.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BatchShape {
    /// Sequences in the step.
    pub num_seqs: usize,
    /// Of which are decoding exactly one token.
    pub num_decode_seqs: usize,
    /// Tokens computed this step (sum over sequences).
    pub new_tokens: usize,
    /// Sum over sequences of the context length after this step (KV read by attention).
    pub kv_tokens_read: usize,
    /// Sum over sequences of new_tokens x context length (attention work).
    pub attn_token_pairs: u64,
}

impl BatchShape {
    /// Whether every sequence decodes exactly one token: only such a step can replay a graph.
    pub fn is_decode_only(&self) -> bool {
        self.num_seqs > 0 && self.num_decode_seqs >= self.num_seqs
    }
}

use crate::exec_path::CaptureSizes;
pub use crate::exec_path::ExecPath;

/// Modelled cost of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// Wall time of the step in seconds (already scaled by the latency multiplier).
    pub seconds: f64,
    /// Whether the step replayed a CUDA graph or ran eagerly.
    pub path: ExecPath,
    /// Batch size the linear layers ran at (the capture size on the graph path, else `num_seqs`).
    pub padded_batch: usize,
}

/// Knobs of the step-time model.
#[derive(Debug, Clone, PartialEq)]
pub struct RooflineConfig {
    /// GPUs the model is sharded over with tensor parallelism (at least 1).
    pub tensor_parallel_size: usize,
    /// Most sequences in one step; bounds the CUDA-graph capture sizes.
    pub max_num_seqs: usize,
    /// Fraction of peak BF16 FLOP/s that large GEMMs and attention reach.
    pub compute_efficiency: f64,
    /// Fraction of peak HBM bandwidth that weight and KV streaming reach.
    pub bandwidth_efficiency: f64,
    /// Multiplies every step time (fault injection: 2.0 makes the GPU twice as slow).
    pub latency_multiplier: f64,
}

impl Default for RooflineConfig {
    /// TP 1, 256 sequences (vLLM's default `max_num_seqs`), 60% of peak FLOP/s (what cuBLAS BF16
    /// GEMMs of prefill shapes reach on H100) and 70% of peak bandwidth (vLLM's measured batch-1
    /// decode of Llama-3-8B on H100, which also absorbs the per-step CPU work of the engine).
    fn default() -> Self {
        RooflineConfig {
            tensor_parallel_size: 1,
            max_num_seqs: 256,
            compute_efficiency: 0.6,
            bandwidth_efficiency: 0.7,
            latency_multiplier: 1.0,
        }
    }
}

/// Step-time model of one model on one GPU type, with per-GPU quantities precomputed.
#[derive(Debug, Clone)]
pub struct RooflineModel {
    cfg: RooflineConfig,
    capture_sizes: CaptureSizes,
    /// What capturing a size costs on this model and GPU.
    capture_cost: CaptureCostModel,
    /// Parameters of the decoder layers (everything but the embedding table and LM head), per GPU.
    body_params: f64,
    /// Parameters of the LM head, per GPU (vocab-parallel).
    lm_head_params: f64,
    /// Weight bytes streamed from HBM each step, per GPU (the embedding table is only gathered).
    weight_read_bytes: f64,
    /// KV-cache bytes one token occupies on one GPU.
    kv_bytes_per_token: f64,
    /// Attention FLOPs per (new token, context token) pair, per GPU: QK^T and PV over all layers.
    attn_flops_per_pair: f64,
    /// Bytes one token contributes to one all-reduce (hidden state in BF16).
    allreduce_bytes_per_token: f64,
    /// Achievable FLOP/s per GPU.
    flops_per_s: f64,
    /// Achievable HBM bytes/s per GPU.
    bytes_per_s: f64,
    /// Per-direction interconnect bytes/s.
    interconnect_bytes_per_s: f64,
    /// Decoder layers.
    num_layers: f64,
}

impl RooflineModel {
    /// Builds the model; `tensor_parallel_size` and `max_num_seqs` below 1 are treated as 1.
    pub fn new(gpu: &'static GpuPreset, model: &'static ModelPreset, cfg: RooflineConfig) -> Self {
        let cfg = RooflineConfig {
            tensor_parallel_size: cfg.tensor_parallel_size.max(1),
            max_num_seqs: cfg.max_num_seqs.max(1),
            compute_efficiency: positive_or(cfg.compute_efficiency, 1.0),
            bandwidth_efficiency: positive_or(cfg.bandwidth_efficiency, 1.0),
            latency_multiplier: cfg.latency_multiplier.max(0.0),
        };
        let tp = cfg.tensor_parallel_size as f64;
        let vocab_matrix = model.vocab_matrix_params() as f64;
        let vocab_matrices = if model.tie_word_embeddings { 1.0 } else { 2.0 };
        let body = model.num_params as f64 - vocab_matrices * vocab_matrix;
        // Untied: the embedding table is only gathered (a few rows), the LM head is streamed.
        // Tied: the one matrix is streamed as the LM head.
        let streamed_params = body + vocab_matrix;
        RooflineModel {
            capture_sizes: CaptureSizes::vllm_default(cfg.max_num_seqs),
            capture_cost: CaptureCostModel::new(gpu, model, cfg.tensor_parallel_size),
            body_params: body / tp,
            lm_head_params: vocab_matrix / tp,
            weight_read_bytes: streamed_params * BF16_BYTES / tp,
            kv_bytes_per_token: kv_bytes_per_token_per_gpu(model, cfg.tensor_parallel_size) as f64,
            attn_flops_per_pair: 4.0 * (model.num_layers * model.num_heads * model.head_dim) as f64
                / tp,
            allreduce_bytes_per_token: model.hidden_size as f64 * BF16_BYTES,
            flops_per_s: gpu.bf16_flops_per_s * cfg.compute_efficiency,
            bytes_per_s: gpu.hbm_bytes_per_s * cfg.bandwidth_efficiency,
            interconnect_bytes_per_s: gpu.interconnect_bytes_per_s,
            num_layers: model.num_layers as f64,
            cfg,
        }
    }

    /// The configuration in effect (after clamping).
    pub fn config(&self) -> &RooflineConfig {
        &self.cfg
    }

    /// Batch sizes with a captured CUDA graph, ascending (by default 1, 2, 4, then multiples
    /// of 8; see [`CaptureSizes`]).
    pub fn capture_sizes(&self) -> &[usize] {
        self.capture_sizes.as_slice()
    }

    /// Memory and start-up time of capturing [`capture_sizes`](Self::capture_sizes): twice
    /// over with piecewise graphs (a full decode graph and a piecewise one of each size).
    pub fn capture_cost(&self) -> CaptureCost {
        let cost = self.capture_cost.of(self.capture_sizes.as_slice());
        if self.capture_sizes.is_piecewise() {
            cost.twice()
        } else {
            cost
        }
    }

    /// Whether steps with prefill replay piecewise graphs (`--cudagraph-mode`).
    pub fn is_piecewise(&self) -> bool {
        self.capture_sizes.is_piecewise()
    }

    /// This model with `sizes` as its capture sizes (`--cuda-graph-sizes`, `--enforce-eager`).
    pub fn with_capture_sizes(mut self, sizes: CaptureSizes) -> Self {
        self.capture_sizes = sizes;
        self
    }

    /// Cost of one step of `shape`. Pure and allocation-free; an empty shape costs nothing.
    pub fn step_cost(&self, shape: &BatchShape) -> StepCost {
        if shape.num_seqs == 0 && shape.new_tokens == 0 {
            return StepCost {
                seconds: 0.0,
                path: ExecPath::Eager,
                padded_batch: 0,
            };
        }
        let (path, padded_batch) = self.capture_sizes.pick(shape);
        let piecewise = path == ExecPath::Graph && !shape.is_decode_only();
        // On the graph path the linear layers run over the padded batch; padding slots have no
        // context, so attention and KV traffic stay those of the real sequences.
        let linear_tokens = match path {
            ExecPath::Graph => padded_batch.max(shape.new_tokens),
            ExecPath::Eager => shape.new_tokens,
        } as f64;
        // Logits are only computed for each sequence's last token (a piecewise step's padding
        // is in tokens, not sequences).
        let logit_rows = if piecewise {
            shape.num_seqs
        } else {
            padded_batch
        } as f64;

        let flops = 2.0 * self.body_params * linear_tokens
            + 2.0 * self.lm_head_params * logit_rows
            + self.attn_flops_per_pair * shape.attn_token_pairs as f64;
        let kv_tokens = shape.kv_tokens_read as f64 + shape.new_tokens as f64;
        let bytes = self.weight_read_bytes + self.kv_bytes_per_token * kv_tokens;
        let gpu_s = (flops / self.flops_per_s).max(bytes / self.bytes_per_s);

        let prep = if shape.num_decode_seqs < shape.num_seqs {
            PREFILL_PREP_S
        } else {
            0.0
        };
        let overhead_s = match path {
            ExecPath::Graph if piecewise => {
                GRAPH_LAUNCH_S
                    + EAGER_KERNEL_LAUNCH_S * PIECEWISE_LAUNCHES_PER_LAYER * self.num_layers
                    + prep
            }
            ExecPath::Graph => GRAPH_LAUNCH_S,
            ExecPath::Eager => {
                EAGER_KERNEL_LAUNCH_S * EAGER_KERNELS_PER_LAYER * self.num_layers + prep
            }
        };

        let seconds =
            (gpu_s + self.allreduce_s(linear_tokens) + overhead_s) * self.cfg.latency_multiplier;
        StepCost {
            seconds,
            path,
            padded_batch,
        }
    }

    /// Time of the tensor-parallel all-reduces of one step over `tokens` tokens (ring algorithm).
    fn allreduce_s(&self, tokens: f64) -> f64 {
        let n = self.cfg.tensor_parallel_size as f64;
        if self.cfg.tensor_parallel_size <= 1 {
            return 0.0;
        }
        let bytes = tokens * self.allreduce_bytes_per_token;
        let one = 2.0 * (n - 1.0) / n * bytes / self.interconnect_bytes_per_s + ALLREDUCE_LATENCY_S;
        ALLREDUCES_PER_LAYER * self.num_layers * one
    }
}

/// `x` when it is a positive finite number, else `fallback`.
fn positive_or(x: f64, fallback: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        fallback
    }
}

/// KV bytes one token occupies on one GPU: KV heads are split over the TP group, and replicated
/// when the group is larger than the number of KV heads (as vLLM does).
fn kv_bytes_per_token_per_gpu(model: &ModelPreset, tensor_parallel_size: usize) -> u64 {
    let heads_per_gpu = (model.num_kv_heads / tensor_parallel_size.max(1)).max(1) as u64;
    2 * model.num_layers as u64 * heads_per_gpu * model.head_dim as u64 * BF16_BYTES as u64
}

/// Memory left for the KV cache and how many blocks it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct KvBudget {
    /// Blocks of `block_size` tokens the KV cache holds.
    pub num_blocks: usize,
    /// Bytes given to the KV cache, summed over the tensor-parallel group.
    pub kv_bytes: u64,
    /// Weight bytes held by each GPU.
    pub weight_bytes_per_gpu: u64,
}

/// The model does not fit: its weights (plus the runtime reserve) exceed a GPU's usable memory.
#[derive(Debug, Clone, PartialEq)]
pub struct DoesNotFit {
    /// Model preset name.
    pub model: &'static str,
    /// GPU preset name.
    pub gpu: &'static str,
    /// Tensor-parallel size that was tried.
    pub tensor_parallel_size: usize,
    /// Weight bytes each GPU would hold.
    pub weight_bytes_per_gpu: u64,
    /// Activation and runtime reserve per GPU.
    pub reserve_bytes_per_gpu: u64,
    /// GPU memory in bytes.
    pub memory_bytes: u64,
    /// Fraction of GPU memory the engine may use.
    pub gpu_memory_utilization: f64,
    /// Smallest power-of-two tensor-parallel size up to 8 that would fit, if any.
    pub suggested_tensor_parallel_size: Option<usize>,
}

impl fmt::Display for DoesNotFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let usable = self.memory_bytes as f64 * self.gpu_memory_utilization;
        let weights = self.weight_bytes_per_gpu as f64;
        write!(
            f,
            "{} needs {:.1} GiB of weights per GPU at tensor parallel {}",
            self.model,
            weights / GIB,
            self.tensor_parallel_size
        )?;
        if weights < usable {
            write!(
                f,
                " plus {:.1} GiB of activation and runtime reserve, leaving no room for KV cache,",
                self.reserve_bytes_per_gpu as f64 / GIB
            )?;
        }
        write!(
            f,
            " but {} has {:.1} GiB usable ({:.1} GiB x {:.2}); ",
            self.gpu,
            usable / GIB,
            self.memory_bytes as f64 / GIB,
            self.gpu_memory_utilization
        )?;
        match self.suggested_tensor_parallel_size {
            Some(tp) => write!(f, "use --tensor-parallel-size {tp} or more"),
            None => write!(
                f,
                "use a GPU with more memory, raise --gpu-memory-utilization or use a smaller model"
            ),
        }
    }
}

impl std::error::Error for DoesNotFit {}

/// Splits GPU memory between weights, a reserve and the KV cache (vLLM's `gpu_memory_utilization`
/// accounting), returning the number of KV blocks of `block_size` tokens.
///
/// Per GPU: usable = memory x utilization; weights = bf16 weights / TP; reserve = 1 GiB runtime
/// (CUDA context, cuBLAS and NCCL workspaces) + the peak activations of an 8,192-token forward pass
/// (residual and normed hidden states, the MLP's gate-up output and its activation, all bf16).
/// What is left holds KV. Fails when weights plus reserve leave no room for a single block.
pub fn kv_block_budget(
    gpu: &GpuPreset,
    model: &ModelPreset,
    tensor_parallel_size: usize,
    gpu_memory_utilization: f64,
    block_size: usize,
) -> Result<KvBudget, DoesNotFit> {
    let util = if gpu_memory_utilization.is_finite() {
        gpu_memory_utilization.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let block_size = block_size.max(1);
    budget_at(gpu, model, tensor_parallel_size.max(1), util, block_size).map_err(|mut err| {
        err.suggested_tensor_parallel_size = [2, 4, 8]
            .into_iter()
            .filter(|&tp| tp > err.tensor_parallel_size)
            .find(|&tp| budget_at(gpu, model, tp, util, block_size).is_ok());
        err
    })
}

/// `kv_block_budget` for already-validated arguments, without a suggestion in the error.
fn budget_at(
    gpu: &GpuPreset,
    model: &ModelPreset,
    tp: usize,
    util: f64,
    block_size: usize,
) -> Result<KvBudget, DoesNotFit> {
    let tp64 = tp as u64;
    let usable = (gpu.memory_bytes as f64 * util) as u64;
    let weight_bytes_per_gpu = model.weight_bytes().div_ceil(tp64);
    let activation_elems_per_token =
        3 * model.intermediate_size as u64 / tp64 + 2 * model.hidden_size as u64;
    let reserve = RUNTIME_RESERVE_BYTES
        + PEAK_ACTIVATION_TOKENS * activation_elems_per_token * BF16_BYTES as u64;
    let block_bytes = block_size as u64 * kv_bytes_per_token_per_gpu(model, tp);
    let kv_per_gpu = usable.saturating_sub(weight_bytes_per_gpu + reserve);
    let num_blocks = kv_per_gpu / block_bytes.max(1);
    if num_blocks == 0 {
        return Err(DoesNotFit {
            model: model_name(model),
            gpu: gpu_name(gpu),
            tensor_parallel_size: tp,
            weight_bytes_per_gpu,
            reserve_bytes_per_gpu: reserve,
            memory_bytes: gpu.memory_bytes,
            gpu_memory_utilization: util,
            suggested_tensor_parallel_size: None,
        });
    }
    Ok(KvBudget {
        num_blocks: usize::try_from(num_blocks).unwrap_or(usize::MAX),
        kv_bytes: kv_per_gpu * tp64,
        weight_bytes_per_gpu,
    })
}

/// The model's preset name.
fn model_name(model: &ModelPreset) -> &'static str {
    model.name
}

/// The GPU's preset name.
fn gpu_name(gpu: &GpuPreset) -> &'static str {
    gpu.name
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    fn llama8b_h100(cfg: RooflineConfig) -> RooflineModel {
        let gpu = presets::gpu("h100").unwrap();
        let model = presets::model("llama-3-8b").unwrap();
        RooflineModel::new(gpu, model, cfg)
    }

    /// `batch` sequences each decoding one token with `ctx` tokens of context after the step.
    fn decode(batch: usize, ctx: usize) -> BatchShape {
        BatchShape {
            num_seqs: batch,
            num_decode_seqs: batch,
            new_tokens: batch,
            kv_tokens_read: batch * ctx,
            attn_token_pairs: (batch * ctx) as u64,
        }
    }

    /// One sequence prefilling `tokens` prompt tokens from an empty cache.
    fn prefill(tokens: usize) -> BatchShape {
        BatchShape {
            num_seqs: 1,
            num_decode_seqs: 0,
            new_tokens: tokens,
            kv_tokens_read: tokens,
            attn_token_pairs: (tokens * tokens) as u64,
        }
    }

    fn ms(model: &RooflineModel, shape: BatchShape) -> f64 {
        model.step_cost(&shape).seconds * 1e3
    }

    #[test]
    fn calibrated_against_llama3_8b_on_h100() {
        let m = llama8b_h100(RooflineConfig::default());
        let b1 = ms(&m, decode(1, 1024));
        let b32 = ms(&m, decode(32, 1024));
        let b128 = ms(&m, decode(128, 1024));
        let pf = ms(&m, prefill(2048));
        println!("llama-3-8b h100: decode b1 {b1:.2} ms, b32 {b32:.2} ms, b128 {b128:.2} ms");
        println!("llama-3-8b h100: prefill 2048 {pf:.2} ms");
        assert!((6.0..=8.0).contains(&b1), "batch 1: {b1}");
        assert!((7.0..=10.0).contains(&b32), "batch 32: {b32}");
        assert!((10.0..=16.0).contains(&b128), "batch 128: {b128}");
        assert!((45.0..=90.0).contains(&pf), "prefill 2048: {pf}");
    }

    /// vLLM's CI latency test: batch 8, 32 prompt tokens, 128 output tokens, end to end.
    fn vllm_ci_latency_ms(gpu: &str) -> f64 {
        let gpu = presets::gpu(gpu).unwrap();
        let model = presets::model("llama-3-8b").unwrap();
        let m = RooflineModel::new(gpu, model, RooflineConfig::default());
        let (batch, prompt, output) = (8, 32, 128);
        let first = BatchShape {
            num_seqs: batch,
            num_decode_seqs: 0,
            new_tokens: batch * prompt,
            kv_tokens_read: batch * prompt,
            attn_token_pairs: (batch * prompt * prompt) as u64,
        };
        let mut total = m.step_cost(&first).seconds;
        for step in 1..output {
            total += m.step_cost(&decode(batch, prompt + step)).seconds;
        }
        total * 1e3
    }

    /// Prints the rows of the sanity table in engine/README.md (`--nocapture` to see them).
    #[test]
    fn sanity_table() {
        let m = llama8b_h100(RooflineConfig::default());
        for batch in [1, 32, 128] {
            println!(
                "h100 decode b{batch} ctx1024: {:.2} ms",
                ms(&m, decode(batch, 1024))
            );
        }
        println!("h100 prefill 2048: {:.2} ms", ms(&m, prefill(2048)));
        for gpu in ["h100", "h200", "a100"] {
            println!(
                "{gpu} vllm-ci latency b8 32/128: {:.1} ms",
                vllm_ci_latency_ms(gpu)
            );
        }
        assert!(vllm_ci_latency_ms("h200") < vllm_ci_latency_ms("a100"));
    }

    #[test]
    fn capture_sizes_follow_vllm() {
        let m = llama8b_h100(RooflineConfig::default());
        let sizes = m.capture_sizes();
        assert_eq!(&sizes[..5], &[1, 2, 4, 8, 16]);
        assert_eq!(sizes.last(), Some(&256));
        assert_eq!(sizes.len(), 3 + 32);
        let small = llama8b_h100(RooflineConfig {
            max_num_seqs: 3,
            ..RooflineConfig::default()
        });
        assert_eq!(small.capture_sizes(), &[1, 2, 4, 8]);
        let big = llama8b_h100(RooflineConfig {
            max_num_seqs: 1000,
            ..RooflineConfig::default()
        });
        assert_eq!(big.capture_sizes().last(), Some(&512));
        // Fewer sizes cost less memory and start-up time (engine/src/capture_cost.rs).
        let (all, few) = (big.capture_cost(), small.capture_cost());
        assert_eq!(all.sizes.len(), 67);
        assert!(few.bytes < all.bytes && few.seconds < all.seconds);
        let eager = big.with_capture_sizes(CaptureSizes::none()).capture_cost();
        assert_eq!((eager.bytes, eager.seconds), (0, 0.0));
    }

    #[test]
    fn decode_only_batches_use_padded_graphs() {
        let m = llama8b_h100(RooflineConfig::default());
        let c = m.step_cost(&decode(3, 100));
        assert_eq!((c.path, c.padded_batch), (ExecPath::Graph, 4));
        let c = m.step_cost(&decode(9, 100));
        assert_eq!((c.path, c.padded_batch), (ExecPath::Graph, 16));
        let c = m.step_cost(&decode(256, 100));
        assert_eq!((c.path, c.padded_batch), (ExecPath::Graph, 256));
        // Beyond the largest capture size the step runs eagerly at its real size.
        let c = m.step_cost(&decode(257, 100));
        assert_eq!((c.path, c.padded_batch), (ExecPath::Eager, 257));
        // Any prefill in the batch makes it eager.
        let mut mixed = decode(8, 100);
        mixed.num_decode_seqs = 7;
        mixed.new_tokens += 99;
        let c = m.step_cost(&mixed);
        assert_eq!((c.path, c.padded_batch), (ExecPath::Eager, 8));
        assert_eq!(ExecPath::Graph.as_str(), "graph");
        assert_eq!(ExecPath::Eager.as_str(), "eager");
    }

    #[test]
    fn padding_costs_like_the_padded_batch_in_the_linear_layers() {
        // Compute-bound regime (tiny bandwidth share) so padding shows: 129 seqs pad to 136.
        let m = llama8b_h100(RooflineConfig {
            bandwidth_efficiency: 100.0,
            ..RooflineConfig::default()
        });
        let padded = m.step_cost(&decode(129, 1)).seconds;
        let exact = m.step_cost(&decode(136, 1)).seconds;
        assert!((padded / exact - 1.0).abs() < 0.01, "{padded} vs {exact}");
    }

    #[test]
    fn graph_is_cheaper_than_eager_for_the_same_work() {
        let m = llama8b_h100(RooflineConfig::default());
        let graph = m.step_cost(&decode(8, 512)).seconds;
        let mut eager_shape = decode(8, 512);
        eager_shape.num_decode_seqs = 7; // one sequence counted as prefill forces the eager path
        let eager = m.step_cost(&eager_shape).seconds;
        assert!(eager > graph + 1.5e-3, "eager {eager} graph {graph}");
    }

    #[test]
    fn a_piecewise_prefill_step_costs_between_a_decode_graph_and_an_eager_step() {
        use crate::exec_path::CudagraphMode;
        let sizes = CaptureSizes::from_flags(&[8, 16, 32, 64], false, 64).unwrap();
        let eager = llama8b_h100(RooflineConfig::default()).with_capture_sizes(sizes.clone());
        let pw = llama8b_h100(RooflineConfig::default())
            .with_capture_sizes(sizes.with_mode(CudagraphMode::FullAndPiecewise));
        // Eight decodes beside a 24-token prefill chunk: 32 tokens.
        let mixed = BatchShape {
            num_seqs: 9,
            num_decode_seqs: 8,
            new_tokens: 32,
            kv_tokens_read: 8 * 512 + 24,
            attn_token_pairs: 8 * 512 + 24 * 24,
        };
        let (e, p) = (eager.step_cost(&mixed), pw.step_cost(&mixed));
        assert_eq!((e.path, p.path), (ExecPath::Eager, ExecPath::Graph));
        assert_eq!(p.padded_batch, 32);
        let d = pw.step_cost(&decode(8, 512)).seconds;
        assert!(
            d < p.seconds && p.seconds + 1e-3 < e.seconds,
            "{d} {p:?} {e:?}"
        );
        // Past the largest size it is eager in both modes.
        let big = BatchShape {
            new_tokens: 200,
            ..mixed
        };
        assert_eq!(pw.step_cost(&big).path, ExecPath::Eager);
        // Capturing both graphs of each size costs twice the memory and start-up.
        let (one, two) = (eager.capture_cost(), pw.capture_cost());
        assert_eq!(two.bytes, 2 * one.bytes);
        assert!((two.seconds - 2.0 * one.seconds).abs() < 1e-9);
    }

    #[test]
    fn tensor_parallel_two_roughly_halves_decode_but_pays_all_reduce() {
        let tp1 = llama8b_h100(RooflineConfig::default());
        let tp2 = llama8b_h100(RooflineConfig {
            tensor_parallel_size: 2,
            ..RooflineConfig::default()
        });
        let (a, b) = (ms(&tp1, decode(1, 1024)), ms(&tp2, decode(1, 1024)));
        assert!(
            b > a / 2.0 + 0.3,
            "tp2 {b} ms must pay all-reduce over tp1 {a} ms / 2"
        );
        assert!(b < a * 0.65, "tp2 {b} ms should be near half of tp1 {a} ms");
    }

    #[test]
    fn latency_multiplier_scales_time() {
        let base = llama8b_h100(RooflineConfig::default());
        let slow = llama8b_h100(RooflineConfig {
            latency_multiplier: 3.0,
            ..RooflineConfig::default()
        });
        for shape in [decode(1, 10), decode(64, 2000), prefill(512)] {
            let (a, b) = (base.step_cost(&shape), slow.step_cost(&shape));
            assert!((b.seconds / a.seconds - 3.0).abs() < 1e-9);
            assert_eq!((a.path, a.padded_batch), (b.path, b.padded_batch));
        }
    }

    #[test]
    fn step_time_is_monotonic_in_batch_size() {
        let m = llama8b_h100(RooflineConfig::default());
        let mut last = 0.0;
        for batch in 1..=600 {
            let t = m.step_cost(&decode(batch, 700)).seconds;
            assert!(t >= last, "batch {batch}: {t} < {last}");
            last = t;
        }
        let mut last = 0.0;
        for tokens in (1..=8192).step_by(97) {
            let t = m.step_cost(&prefill(tokens)).seconds;
            assert!(t >= last, "prefill {tokens}: {t} < {last}");
            last = t;
        }
    }

    #[test]
    fn empty_step_is_free() {
        let m = llama8b_h100(RooflineConfig::default());
        let c = m.step_cost(&BatchShape::default());
        assert_eq!(c.seconds, 0.0);
        assert_eq!(c.padded_batch, 0);
    }

    #[test]
    fn llama_70b_is_refused_on_one_h100_with_both_numbers() {
        let gpu = presets::gpu("h100").unwrap();
        let model = presets::model("llama-3-70b").unwrap();
        let err = kv_block_budget(gpu, model, 1, 0.9, 16).unwrap_err();
        let msg = err.to_string();
        println!("{msg}");
        assert!(msg.contains("131.4 GiB"), "{msg}");
        assert!(msg.contains("72.0 GiB usable (80.0 GiB x 0.90)"), "{msg}");
        assert!(msg.contains("--tensor-parallel-size 2"), "{msg}");
        assert_eq!(err.suggested_tensor_parallel_size, Some(2));
    }

    #[test]
    fn llama_70b_fits_tightly_on_two_h100s_and_comfortably_on_four() {
        let gpu = presets::gpu("h100").unwrap();
        let model = presets::model("llama-3-70b").unwrap();
        let two = kv_block_budget(gpu, model, 2, 0.9, 16).unwrap();
        let four = kv_block_budget(gpu, model, 4, 0.9, 16).unwrap();
        let tokens = |b: &KvBudget| b.num_blocks * 16;
        println!(
            "70b tp2 {} tokens, tp4 {} tokens",
            tokens(&two),
            tokens(&four)
        );
        // 65.7 GiB of weights per GPU leaves under 5 GiB of KV each on two GPUs.
        assert!((20_000..40_000).contains(&tokens(&two)), "{two:?}");
        assert!(tokens(&four) > 5 * tokens(&two), "{four:?}");
        assert_eq!(four.weight_bytes_per_gpu, model.weight_bytes() / 4);
        // At a low utilization two GPUs are refused with the reserve named.
        let err = kv_block_budget(gpu, model, 2, 0.84, 16).unwrap_err();
        assert!(err.to_string().contains("reserve"), "{err}");
        assert_eq!(err.suggested_tensor_parallel_size, Some(4));
    }

    #[test]
    fn llama_8b_budget_on_one_h100() {
        let gpu = presets::gpu("h100").unwrap();
        let model = presets::model("llama-3-8b").unwrap();
        let b = kv_block_budget(gpu, model, 1, 0.9, 16).unwrap();
        let tokens = b.num_blocks * 16;
        println!(
            "8b tp1 {tokens} tokens, {:.1} GiB KV",
            b.kv_bytes as f64 / GIB
        );
        // 72 GiB - 15.0 GiB weights - 1.8 GiB reserve = 55 GiB, about 450k tokens of 128 KiB.
        assert!((400_000..500_000).contains(&tokens), "{b:?}");
        assert_eq!(
            b.num_blocks as u64,
            b.kv_bytes / (16 * model.kv_bytes_per_token())
        );
    }

    #[test]
    fn nothing_fits_at_zero_utilization_and_no_tp_helps() {
        let gpu = presets::gpu("l4").unwrap();
        let model = presets::model("qwen2.5-0.5b").unwrap();
        let err = kv_block_budget(gpu, model, 1, 0.0, 16).unwrap_err();
        assert_eq!(err.suggested_tensor_parallel_size, None);
        assert!(kv_block_budget(gpu, model, 1, 0.9, 16).is_ok());
    }
}
