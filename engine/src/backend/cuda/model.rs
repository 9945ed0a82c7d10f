//! The Llama-family forward pass on one GPU: fp16 weights, an fp32 residual stream, cuBLAS
//! GEMMs for every linear layer (prefill and decode alike; decode GEMMs are skinny), the
//! kernels of `kernels.cu` for the rest, over a paged fp16 KV cache laid out as the cpu
//! backend's. Logits come back to the host in fp32 and the cpu sampler picks the token (first
//! version: no on-device sampling).
//!
//! Every per-step input lives in a device buffer allocated once at its largest size, so a
//! captured CUDA graph (decode batches of a capture size) replays with the same addresses:
//! each step only copies its rows into those buffers.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, DevicePtr,
    DevicePtrMut, LaunchConfig, PushKernelArg,
};
use half::f16;

use super::kernels;
use crate::backend::step_plan::StepPlan;
use crate::model::config::ModelConfig;
use crate::model::ops::Rope;
use crate::model::weights::{Linear, ModelWeights};

/// cuBLAS workspace, set explicitly so that graph capture never allocates.
const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// Threads per block of the row kernels.
const ROW_THREADS: u32 = 256;

/// An error of the GPU runtime, as text (the engine reports step failures as text).
fn gpu_err<E: std::fmt::Debug>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e:?}")
}

/// One linear layer, `[out × in]` row-major as in the checkpoint.
struct GpuLinear {
    weight: CudaSlice<f16>,
    bias: Option<CudaSlice<f32>>,
    out_features: usize,
    in_features: usize,
}

struct GpuLayer {
    input_norm: CudaSlice<f32>,
    q_proj: GpuLinear,
    k_proj: GpuLinear,
    v_proj: GpuLinear,
    o_proj: GpuLinear,
    post_attention_norm: CudaSlice<f32>,
    gate_proj: GpuLinear,
    up_proj: GpuLinear,
    down_proj: GpuLinear,
}

/// The loaded kernels.
struct Kernels {
    embed_rows: CudaFunction,
    rms_norm_rows: CudaFunction,
    add_bias: CudaFunction,
    rope: CudaFunction,
    kv_write: CudaFunction,
    paged_attention: CudaFunction,
    add_residual: CudaFunction,
    silu_mul: CudaFunction,
}

impl Kernels {
    fn load(module: &Arc<CudaModule>) -> Result<Self, String> {
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| format!("loading kernel {name}: {e:?}"))
        };
        Ok(Self {
            embed_rows: f("embed_rows")?,
            rms_norm_rows: f("rms_norm_rows")?,
            add_bias: f("add_bias")?,
            rope: f("rope")?,
            kv_write: f("kv_write")?,
            paged_attention: f("paged_attention")?,
            add_residual: f("add_residual")?,
            silu_mul: f("silu_mul")?,
        })
    }
}

/// Per-step inputs, at their largest size.
struct Inputs {
    tokens: CudaSlice<u32>,
    pos: CudaSlice<i32>,
    slots: CudaSlice<i64>,
    seq_of: CudaSlice<i32>,
    block_tables: CudaSlice<i32>,
    /// Rows the head computes logits for (eager steps).
    rows: CudaSlice<i32>,
    /// 0, 1, 2, ...: the rows of a graph step, whose head covers every (padded) row.
    identity: CudaSlice<i32>,
}

/// Activations, at their largest size.
struct Activations {
    x: CudaSlice<f32>,
    normed: CudaSlice<f16>,
    q: CudaSlice<f16>,
    k: CudaSlice<f16>,
    v: CudaSlice<f16>,
    attn: CudaSlice<f16>,
    proj: CudaSlice<f16>,
    gate: CudaSlice<f16>,
    up: CudaSlice<f16>,
    head_in: CudaSlice<f16>,
    logits: CudaSlice<f32>,
}

/// Sizes the buffers are allocated for.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most tokens in one step (`--max-num-batched-tokens`, at least the largest capture size).
    pub max_tokens: usize,
    /// Most sequences in one step.
    pub max_seqs: usize,
    /// Most logits rows one head call computes.
    pub max_rows: usize,
    /// Block-table width: blocks of a sequence of the full context.
    pub max_blocks_per_seq: usize,
    /// Tokens per KV block.
    pub block_size: usize,
}

/// A model resident on the GPU, with its KV cache and captured graphs.
pub struct GpuModel {
    /// Shape.
    pub config: ModelConfig,
    limits: Limits,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    _workspace: CudaSlice<u8>,
    k: Kernels,
    embed: CudaSlice<f16>,
    layers: Vec<GpuLayer>,
    norm: CudaSlice<f32>,
    lm_head: Option<GpuLinear>,
    inv_freq: CudaSlice<f32>,
    inputs: Inputs,
    act: Activations,
    cache: CudaSlice<f16>,
    num_blocks: usize,
    graphs: BTreeMap<usize, OwnedGraph>,
}

/// A captured graph, owned by one backend: moved to the engine's core thread once and used
/// only there.
struct OwnedGraph(CudaGraph);

// SAFETY: a CUDA graph may be used from any thread that binds its context (cudarc binds it
// on every call); it must not be used from two threads at once, and this one never is: it is
// owned by the backend, which the engine moves to its core thread and never shares.
unsafe impl Send for OwnedGraph {}

/// Elements of the KV cache per block: K and V for every layer.
fn block_elems(config: &ModelConfig, block_size: usize) -> usize {
    2 * config.num_layers * block_size * config.kv_dim()
}

/// Bytes one KV block takes in fp16.
pub fn block_bytes(config: &ModelConfig, block_size: usize) -> usize {
    block_elems(config, block_size) * std::mem::size_of::<f16>()
}

/// Checks that the kernels handle `config`'s shape.
pub fn check_shape(config: &ModelConfig) -> Result<(), String> {
    let d = config.head_dim;
    if !d.is_multiple_of(32) || d > kernels::MAX_HEAD_DIM {
        return Err(format!(
            "the cuda backend's attention needs a head width that is a multiple of 32 and at most {}; this model's is {d}",
            kernels::MAX_HEAD_DIM
        ));
    }
    if config.num_kv_heads == 0 || !config.num_heads.is_multiple_of(config.num_kv_heads) {
        return Err(format!(
            "{} query heads do not split into groups of {} key/value heads",
            config.num_heads, config.num_kv_heads
        ));
    }
    Ok(())
}

fn upload_f16(stream: &Arc<CudaStream>, v: &[f32]) -> Result<CudaSlice<f16>, String> {
    let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
    stream.clone_htod(&h).map_err(gpu_err("uploading weights"))
}

fn upload_linear(stream: &Arc<CudaStream>, l: &Linear) -> Result<GpuLinear, String> {
    Ok(GpuLinear {
        weight: upload_f16(stream, &l.weight)?,
        bias: match &l.bias {
            Some(b) => Some(stream.clone_htod(b).map_err(gpu_err("uploading biases"))?),
            None => None,
        },
        out_features: l.out_features,
        in_features: l.in_features,
    })
}

fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    n: usize,
) -> Result<CudaSlice<T>, String> {
    stream
        .alloc_zeros::<T>(n.max(1))
        .map_err(gpu_err("allocating device memory"))
}

/// `y[n × out] = x[n × in] · Wᵀ` (+ bias), fp16 in and out, fp32 accumulation.
fn linear(
    blas: &CudaBlas,
    stream: &Arc<CudaStream>,
    add_bias: &CudaFunction,
    l: &GpuLinear,
    x: &CudaSlice<f16>,
    y: &mut CudaSlice<f16>,
    n: usize,
) -> Result<(), String> {
    let (m, k) = (l.out_features, l.in_features);
    let cfg = GemmConfig {
        transa: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T,
        transb: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        alpha: f16::ONE,
        lda: k as i32,
        ldb: k as i32,
        beta: f16::ZERO,
        ldc: m as i32,
    };
    // SAFETY: W is m×k, x holds at least n×k and y at least n×m elements (buffers are
    // sized for the largest step).
    unsafe { blas.gemm(cfg, &l.weight, &x.slice(..n * k), &mut y.slice_mut(..n * m)) }
        .map_err(gpu_err("cuBLAS GEMM"))?;
    if let Some(bias) = &l.bias {
        let total = (n * m) as i32;
        let width = m as i32;
        let mut b = stream.launch_builder(add_bias);
        b.arg(&mut *y).arg(bias).arg(&width).arg(&total);
        // SAFETY: the kernel reads `total` elements of y and `width` of bias.
        unsafe { b.launch(elementwise(n * m)) }.map_err(gpu_err("add_bias"))?;
    }
    Ok(())
}

/// `out[r] = rms_norm(x[rows[r]]) * weight` for the first `n` rows of `rows`.
fn rms_norm(
    s: &CudaStream,
    f: &CudaFunction,
    (x, rows, weight): (&CudaSlice<f32>, &CudaSlice<i32>, &CudaSlice<f32>),
    out: &mut CudaSlice<f16>,
    (hidden, eps): (i32, f32),
    n: usize,
) -> Result<(), String> {
    let mut b = s.launch_builder(f);
    b.arg(x)
        .arg(rows)
        .arg(weight)
        .arg(out)
        .arg(&hidden)
        .arg(&eps);
    // SAFETY: `rows` holds at least n indices of rows of x; out has room for n rows.
    unsafe { b.launch(grid(n, ROW_THREADS)) }.map_err(gpu_err("rms_norm_rows"))?;
    Ok(())
}

/// `x += y` over `total` elements (the fp32 residual stream plus an fp16 projection).
fn add_residual(
    s: &CudaStream,
    f: &CudaFunction,
    x: &mut CudaSlice<f32>,
    y: &CudaSlice<f16>,
    total: usize,
) -> Result<(), String> {
    let count = total as i32;
    let mut b = s.launch_builder(f);
    b.arg(x).arg(y).arg(&count);
    // SAFETY: both hold at least `total` elements.
    unsafe { b.launch(elementwise(total)) }.map_err(gpu_err("add_residual"))?;
    Ok(())
}

fn grid(n: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u32).max(1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn elementwise(total: usize) -> LaunchConfig {
    grid(total.div_ceil(ROW_THREADS as usize), ROW_THREADS)
}

impl GpuModel {
    /// Uploads `weights` (as fp16) on `ctx`, compiles or loads the kernels, allocates the step
    /// buffers for `limits` and runs one pass of `limits.max_tokens` tokens so that every
    /// workspace exists before the KV cache is sized. The cache is empty until
    /// [`allocate_cache`](Self::allocate_cache).
    pub fn load(
        ctx: Arc<CudaContext>,
        config: ModelConfig,
        weights: &ModelWeights,
        limits: Limits,
        kernel_cache: &std::path::Path,
    ) -> Result<Self, String> {
        check_shape(&config)?;
        let widest = config
            .intermediate_size
            .max(config.q_dim())
            .max(config.hidden_size);
        if limits.max_tokens.saturating_mul(widest) >= i32::MAX as usize
            || limits
                .max_rows
                .max(limits.max_seqs)
                .saturating_mul(config.vocab_size)
                >= i32::MAX as usize
        {
            return Err(format!(
                "a step of {} tokens is too large for the cuda kernels' 32-bit element counts with this model: lower --max-num-batched-tokens (or --max-model-len without chunked prefill)",
                limits.max_tokens
            ));
        }
        // One stream, one thread: cudarc's per-buffer events only cost time here, and they
        // would be recorded into captured graphs.
        // SAFETY: every buffer is used on `stream` alone.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(gpu_err("creating a stream"))?;
        let arch = ctx
            .compute_capability()
            .map_err(gpu_err("reading the compute capability"))?;
        let started = Instant::now();
        let (cubin, cached) = kernels::load_or_compile(kernel_cache, arch)?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .map_err(gpu_err("loading the kernels"))?;
        tracing::info!(
            arch = format!("sm_{}{}", arch.0, arch.1),
            cached,
            seconds = started.elapsed().as_secs_f64(),
            "kernels ready"
        );
        let k = Kernels::load(&module)?;

        let blas = CudaBlas::new(stream.clone()).map_err(gpu_err("creating a cuBLAS handle"))?;
        // fp32 split-K reductions too, so that a row's result moves less with the batch shape.
        // SAFETY: a live handle and a valid mode.
        unsafe {
            cudarc::cublas::sys::cublasSetMathMode(
                *blas.handle(),
                cudarc::cublas::sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
            )
        }
        .result()
        .map_err(gpu_err("setting the cuBLAS math mode"))?;
        let mut workspace = zeros::<u8>(&stream, CUBLAS_WORKSPACE_BYTES)?;
        {
            let (ptr, _sync) = workspace.device_ptr_mut(&stream);
            // SAFETY: the workspace outlives the handle (both are fields of this model, and
            // the handle is dropped first).
            unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ptr as *mut c_void,
                    CUBLAS_WORKSPACE_BYTES,
                )
            }
            .result()
            .map_err(gpu_err("setting the cuBLAS workspace"))?;
        }

        let c = &config;
        let layers = weights
            .layers
            .iter()
            .map(|l| {
                Ok(GpuLayer {
                    input_norm: stream
                        .clone_htod(&l.input_norm)
                        .map_err(gpu_err("uploading norms"))?,
                    q_proj: upload_linear(&stream, &l.q_proj)?,
                    k_proj: upload_linear(&stream, &l.k_proj)?,
                    v_proj: upload_linear(&stream, &l.v_proj)?,
                    o_proj: upload_linear(&stream, &l.o_proj)?,
                    post_attention_norm: stream
                        .clone_htod(&l.post_attention_norm)
                        .map_err(gpu_err("uploading norms"))?,
                    gate_proj: upload_linear(&stream, &l.gate_proj)?,
                    up_proj: upload_linear(&stream, &l.up_proj)?,
                    down_proj: upload_linear(&stream, &l.down_proj)?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let rope = Rope::new(c.head_dim, c.rope_theta, c.rope_scaling);
        let t = limits.max_tokens;
        let r = limits.max_rows;
        let s = limits.max_seqs;
        let identity: Vec<i32> = (0..t.max(r) as i32).collect();
        let inputs = Inputs {
            tokens: zeros(&stream, t)?,
            pos: zeros(&stream, t)?,
            slots: zeros(&stream, t)?,
            seq_of: zeros(&stream, t)?,
            block_tables: zeros(&stream, s * limits.max_blocks_per_seq)?,
            rows: zeros(&stream, r)?,
            identity: stream
                .clone_htod(&identity)
                .map_err(gpu_err("uploading row indices"))?,
        };
        let act = Activations {
            x: zeros(&stream, t * c.hidden_size)?,
            normed: zeros(&stream, t * c.hidden_size)?,
            q: zeros(&stream, t * c.q_dim())?,
            k: zeros(&stream, t * c.kv_dim())?,
            v: zeros(&stream, t * c.kv_dim())?,
            attn: zeros(&stream, t * c.q_dim())?,
            proj: zeros(&stream, t * c.hidden_size)?,
            gate: zeros(&stream, t * c.intermediate_size)?,
            up: zeros(&stream, t * c.intermediate_size)?,
            head_in: zeros(&stream, r.max(s) * c.hidden_size)?,
            logits: zeros(&stream, r.max(s) * c.vocab_size)?,
        };
        let mut model = Self {
            embed: upload_f16(&stream, &weights.embed_tokens)?,
            norm: stream
                .clone_htod(&weights.norm)
                .map_err(gpu_err("uploading norms"))?,
            lm_head: match &weights.lm_head {
                Some(l) => Some(upload_linear(&stream, l)?),
                None => None,
            },
            inv_freq: stream
                .clone_htod(rope.inv_freq())
                .map_err(gpu_err("uploading RoPE frequencies"))?,
            layers,
            config,
            limits,
            ctx,
            blas,
            _workspace: workspace,
            k,
            inputs,
            act,
            // Never touched by the profiling pass: its rows are all padding.
            cache: zeros(&stream, 1)?,
            num_blocks: 0,
            graphs: BTreeMap::new(),
            stream,
        };
        // The profiling pass: the largest step, padding rows only (no KV read or written).
        let padding = StepPlan::new(&[], limits.block_size, limits.max_blocks_per_seq, t, 1)?;
        model.upload(&padding)?;
        model.layers_pass(t)?;
        model.head_pass(r.min(t), false)?;
        model.sync()?;
        Ok(model)
    }

    /// `(free, total)` device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize), String> {
        self.ctx.mem_get_info().map_err(gpu_err("reading memory"))
    }

    /// Allocates a zeroed cache of `num_blocks` blocks.
    pub fn allocate_cache(&mut self, num_blocks: usize) -> Result<(), String> {
        let elems = block_elems(&self.config, self.limits.block_size)
            .checked_mul(num_blocks)
            .ok_or("the KV cache size overflows")?;
        self.cache = zeros(&self.stream, elems)?;
        self.num_blocks = num_blocks;
        self.sync()
    }

    /// Captures one decode graph per size in `sizes` (after the cache exists), logging the
    /// time and memory each took.
    pub fn capture_graphs(&mut self, sizes: &[usize]) -> Result<(), String> {
        for &size in sizes {
            self.capture_graph(size)?;
        }
        Ok(())
    }

    /// Captures the decode graph of batch size `size` (after the cache exists), logging the
    /// time and memory it took; returns the device bytes it keeps.
    pub fn capture_graph(&mut self, size: usize) -> Result<u64, String> {
        {
            let (free_before, _) = self.memory()?;
            let started = Instant::now();
            let padding = StepPlan::new(
                &[],
                self.limits.block_size,
                self.limits.max_blocks_per_seq,
                size,
                1,
            )?;
            self.upload(&padding)?;
            // A warm-up run first, so that nothing is allocated lazily inside the capture.
            self.layers_pass(size)?;
            self.head_pass(size, true)?;
            self.sync()?;
            self.stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(gpu_err("beginning a graph capture"))?;
            let body = self
                .layers_pass(size)
                .and_then(|()| self.head_pass(size, true));
            let graph = self.stream.end_capture(CUgraphInstantiate_flags(0));
            // A failed launch inside the capture is the cause; ending the capture then fails too.
            body?;
            let graph = graph.map_err(gpu_err("ending a graph capture"))?;
            let graph =
                graph.ok_or_else(|| format!("capturing batch size {size} made no graph"))?;
            graph.upload().map_err(gpu_err("uploading a graph"))?;
            self.sync()?;
            let (free_after, _) = self.memory()?;
            tracing::info!(
                batch_size = size,
                seconds = started.elapsed().as_secs_f64(),
                bytes = free_before.saturating_sub(free_after),
                "captured CUDA graph"
            );
            self.graphs.insert(size, OwnedGraph(graph));
            Ok(free_before.saturating_sub(free_after) as u64)
        }
    }

    /// Whether a graph was captured for `size`.
    pub fn has_graph(&self, size: usize) -> bool {
        self.graphs.contains_key(&size)
    }

    /// Runs a step eagerly: the layers over every row of `plan`, then the head over `rows`
    /// (flattened row indices), at most `max_rows` at a time, handing each block's logits to
    /// `on_block(first row index, logits)`.
    pub fn run_eager(
        &mut self,
        plan: &StepPlan,
        rows: &[usize],
        on_block: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), String> {
        self.check_fits(plan)?;
        if plan.is_empty() {
            return Ok(());
        }
        self.upload(plan)?;
        self.layers_pass(plan.len())?;
        for (b, block) in rows.chunks(self.limits.max_rows).enumerate() {
            let idx: Vec<i32> = block.iter().map(|&r| r as i32).collect();
            self.stream
                .memcpy_htod(&idx, &mut self.inputs.rows)
                .map_err(gpu_err("copying rows"))?;
            self.head_pass(block.len(), false)?;
            let logits = self.download_logits(block.len())?;
            on_block(b * self.limits.max_rows, &logits);
        }
        Ok(())
    }

    /// Replays the graph captured for `size` over `plan` (padded to `size` rows) and returns
    /// the logits of every row, `size × vocab`.
    pub fn run_graph(&mut self, plan: &StepPlan, size: usize) -> Result<Vec<f32>, String> {
        if plan.len() != size {
            return Err(format!(
                "a graph of batch size {size} was given {} rows",
                plan.len()
            ));
        }
        self.check_fits(plan)?;
        self.upload(plan)?;
        let graph = self
            .graphs
            .get(&size)
            .ok_or_else(|| format!("no CUDA graph was captured for batch size {size}"))?;
        graph
            .0
            .launch()
            .map_err(gpu_err("launching a CUDA graph"))?;
        self.download_logits(size)
    }

    /// Whether the step buffers hold `plan`: its rows and its block tables.
    fn check_fits(&self, plan: &StepPlan) -> Result<(), String> {
        let seqs = plan.block_tables.len() / plan.width.max(1);
        if plan.len() > self.limits.max_tokens || seqs > self.limits.max_seqs {
            return Err(format!(
                "a step of {} tokens over {seqs} sequences exceeds the {} tokens and {} sequences the cuda buffers hold",
                plan.len(),
                self.limits.max_tokens,
                self.limits.max_seqs
            ));
        }
        if plan.width != self.limits.max_blocks_per_seq {
            return Err(format!(
                "block tables {} wide, the kernels expect {}",
                plan.width, self.limits.max_blocks_per_seq
            ));
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), String> {
        self.stream.synchronize().map_err(gpu_err("synchronizing"))
    }

    fn download_logits(&self, rows: usize) -> Result<Vec<f32>, String> {
        let n = rows * self.config.vocab_size;
        let mut host = vec![0.0f32; n];
        self.stream
            .memcpy_dtoh(&self.act.logits.slice(..n), &mut host)
            .map_err(gpu_err("copying logits"))?;
        self.sync()?;
        Ok(host)
    }

    /// Copies `plan`'s rows into the input buffers (their first `plan.len()` entries).
    fn upload(&mut self, plan: &StepPlan) -> Result<(), String> {
        let n = plan.len();
        let s = &self.stream;
        let i = &mut self.inputs;
        let e = gpu_err("copying step inputs");
        s.memcpy_htod(&plan.tokens, &mut i.tokens.slice_mut(..n))
            .and_then(|()| s.memcpy_htod(&plan.pos, &mut i.pos.slice_mut(..n)))
            .and_then(|()| s.memcpy_htod(&plan.slots, &mut i.slots.slice_mut(..n)))
            .and_then(|()| s.memcpy_htod(&plan.seq_of, &mut i.seq_of.slice_mut(..n)))
            .and_then(|()| {
                if plan.block_tables.is_empty() {
                    Ok(())
                } else {
                    s.memcpy_htod(
                        &plan.block_tables,
                        &mut i.block_tables.slice_mut(..plan.block_tables.len()),
                    )
                }
            })
            .map_err(e)
    }

    /// Every decoder layer over the first `n` rows of the inputs; the residual stream ends in
    /// `act.x`.
    fn layers_pass(&mut self, n: usize) -> Result<(), String> {
        let c = &self.config;
        let h = c.hidden_size as i32;
        let eps = c.rms_norm_eps;
        let (heads, kv_heads, d) = (c.num_heads as i32, c.num_kv_heads as i32, c.head_dim as i32);
        let (num_layers, bs) = (c.num_layers as i32, self.limits.block_size as i32);
        let kv_dim = c.kv_dim() as i32;
        let width = self.limits.max_blocks_per_seq as i32;
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let inter_total = (n * c.intermediate_size) as i32;
        let Self {
            stream: s,
            blas,
            k,
            inputs: i,
            act: a,
            layers,
            cache,
            embed,
            inv_freq,
            ..
        } = self;
        let lin = |l: &GpuLinear, x: &CudaSlice<f16>, y: &mut CudaSlice<f16>| {
            linear(blas, s, &k.add_bias, l, x, y, n)
        };
        {
            let mut b = s.launch_builder(&k.embed_rows);
            b.arg(&*embed).arg(&i.tokens).arg(&mut a.x).arg(&h);
            // SAFETY: n rows of `hidden` values; token ids were checked against the vocabulary.
            unsafe { b.launch(grid(n, ROW_THREADS)) }.map_err(gpu_err("embed_rows"))?;
            for (li, layer) in layers.iter().enumerate() {
                let li = li as i32;
                let norm_in = (&a.x, &i.identity, &layer.input_norm);
                rms_norm(s, &k.rms_norm_rows, norm_in, &mut a.normed, (h, eps), n)?;
                lin(&layer.q_proj, &a.normed, &mut a.q)?;
                lin(&layer.k_proj, &a.normed, &mut a.k)?;
                lin(&layer.v_proj, &a.normed, &mut a.v)?;
                let mut b = s.launch_builder(&k.rope);
                b.arg(&mut a.q)
                    .arg(&mut a.k)
                    .arg(&i.pos)
                    .arg(&*inv_freq)
                    .arg(&heads)
                    .arg(&kv_heads)
                    .arg(&d);
                // SAFETY: n rows of q and k heads; inv_freq has head_dim / 2 entries.
                unsafe { b.launch(grid(n, 128)) }.map_err(gpu_err("rope"))?;
                let mut b = s.launch_builder(&k.kv_write);
                b.arg(&a.k)
                    .arg(&a.v)
                    .arg(&mut *cache)
                    .arg(&i.slots)
                    .arg(&li)
                    .arg(&num_layers)
                    .arg(&bs)
                    .arg(&kv_dim);
                // SAFETY: slots come from block tables of blocks inside the cache.
                unsafe { b.launch(grid(n, 128)) }.map_err(gpu_err("kv_write"))?;
                let mut b = s.launch_builder(&k.paged_attention);
                b.arg(&a.q)
                    .arg(&*cache)
                    .arg(&i.block_tables)
                    .arg(&width)
                    .arg(&i.seq_of)
                    .arg(&i.pos)
                    .arg(&mut a.attn)
                    .arg(&li)
                    .arg(&num_layers)
                    .arg(&bs)
                    .arg(&heads)
                    .arg(&kv_heads)
                    .arg(&d)
                    .arg(&scale);
                let cfg = LaunchConfig {
                    grid_dim: ((n as u32).max(1), heads as u32, 1),
                    block_dim: (32 * kernels::ATTN_WARPS, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: positions 0..=pos of each row are in its sequence's blocks.
                unsafe { b.launch(cfg) }.map_err(gpu_err("paged_attention"))?;
                lin(&layer.o_proj, &a.attn, &mut a.proj)?;
                add_residual(s, &k.add_residual, &mut a.x, &a.proj, n * c.hidden_size)?;

                let norm_in = (&a.x, &i.identity, &layer.post_attention_norm);
                rms_norm(s, &k.rms_norm_rows, norm_in, &mut a.normed, (h, eps), n)?;
                lin(&layer.gate_proj, &a.normed, &mut a.gate)?;
                lin(&layer.up_proj, &a.normed, &mut a.up)?;
                let mut b = s.launch_builder(&k.silu_mul);
                b.arg(&mut a.gate).arg(&a.up).arg(&inter_total);
                // SAFETY: n × intermediate elements.
                unsafe { b.launch(elementwise(n * c.intermediate_size)) }
                    .map_err(gpu_err("silu_mul"))?;
                lin(&layer.down_proj, &a.gate, &mut a.proj)?;
                add_residual(s, &k.add_residual, &mut a.x, &a.proj, n * c.hidden_size)?;
            }
        }
        Ok(())
    }

    /// Final norm and LM head over `rows` rows into `act.logits` (fp32): the identity rows on
    /// a graph step, `inputs.rows` otherwise.
    fn head_pass(&mut self, rows: usize, identity: bool) -> Result<(), String> {
        let c = &self.config;
        let h = c.hidden_size as i32;
        let eps = c.rms_norm_eps;
        let idx = if identity {
            &self.inputs.identity
        } else {
            &self.inputs.rows
        };
        rms_norm(
            &self.stream,
            &self.k.rms_norm_rows,
            (&self.act.x, idx, &self.norm),
            &mut self.act.head_in,
            (h, eps),
            rows,
        )?;
        let (weight, m) = match &self.lm_head {
            Some(l) => (&l.weight, l.out_features),
            None => (&self.embed, c.vocab_size),
        };
        let k = c.hidden_size;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (w, _w) = weight.device_ptr(&self.stream);
        let (x, _x) = self.act.head_in.device_ptr(&self.stream);
        let (y, _y) = self.act.logits.device_ptr_mut(&self.stream);
        use cudarc::cublas::sys::{
            cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
        };
        // SAFETY: W is vocab×hidden, head_in holds rows×hidden and logits rows×vocab values;
        // logits are written in fp32 so that they keep fp32 precision.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                m as i32,
                rows as i32,
                k as i32,
                (&alpha) as *const f32 as *const c_void,
                w as *const c_void,
                cudaDataType_t::CUDA_R_16F,
                k as i32,
                x as *const c_void,
                cudaDataType_t::CUDA_R_16F,
                k as i32,
                (&beta) as *const f32 as *const c_void,
                y as *mut c_void,
                cudaDataType_t::CUDA_R_32F,
                m as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(gpu_err("cuBLAS LM head"))
    }
}
