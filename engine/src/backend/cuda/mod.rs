//! `cuda` backend (cargo feature `cuda`): the same engine (scheduler, paged KV blocks, prefix
//! cache, server) with the forward pass on an NVIDIA GPU through cudarc. The CUDA libraries
//! are loaded at run time, so this builds on any machine; `--backend cuda` checks for them and
//! a device at start and names what is missing.
//!
//! Decode-only steps whose batch pads to a capture size (see [`crate::exec_path`]) replay a
//! CUDA graph captured at start, before the engine reports ready; every other step runs the
//! kernels eagerly. Each step reports its path as the sim backend does.

pub mod kernels;
pub mod model;
pub mod probe;

use std::time::Instant;

use crate::backend::step_logits::{self, StepLogits};
use crate::backend::step_plan::StepPlan;
use crate::backend::{Backend, Sampled};
use crate::exec_path::{CaptureSizes, ExecPath};
use crate::model::forward::EXTRA_ROWS_BLOCK;
use crate::roofline::StepCost;
use crate::scheduler::Batch;
use crate::sequence::Sequence;
use model::{GpuModel, Limits};

/// The forward pass on the GPU.
pub struct CudaBackend {
    model: GpuModel,
    sizes: CaptureSizes,
    block_size: usize,
    max_blocks_per_seq: usize,
    logits: StepLogits,
}

/// How the engine asked for the GPU to be used.
#[derive(Debug, Clone)]
pub struct CudaOptions {
    /// `--gpu-memory-utilization`: the share of the device's memory this engine may hold.
    pub gpu_memory_utilization: f64,
    /// `--num-gpu-blocks-override`.
    pub num_gpu_blocks_override: Option<usize>,
    /// Graph capture sizes (none with `--enforce-eager`).
    pub capture_sizes: CaptureSizes,
    /// Sizes of the step buffers.
    pub limits: Limits,
    /// Where compiled kernels are cached.
    pub kernel_cache: std::path::PathBuf,
}

impl CudaBackend {
    /// Uploads the model to the device of `ctx` (from [`probe::open_device`]), sizes the KV
    /// cache from the memory left after a profiling pass (as vLLM does: `total × utilization −
    /// used`), and captures the graphs. Returns the backend and its number of KV blocks.
    pub fn start(
        ctx: std::sync::Arc<cudarc::driver::CudaContext>,
        config: crate::model::config::ModelConfig,
        weights: &crate::model::weights::ModelWeights,
        opts: &CudaOptions,
    ) -> Result<(Self, usize), String> {
        let name = ctx.name().unwrap_or_else(|_| "unknown".into());
        let eos = config.eos_token_ids.clone();
        let mut model = GpuModel::load(ctx, config, weights, opts.limits, &opts.kernel_cache)?;
        let (free, total) = model.memory()?;
        let used = total.saturating_sub(free);
        let per_block = model::block_bytes(&model.config, opts.limits.block_size);
        let budget = (total as f64 * opts.gpu_memory_utilization) as usize;
        let num_blocks = match opts.num_gpu_blocks_override {
            Some(n) => n,
            None => budget.saturating_sub(used) / per_block.max(1),
        };
        if num_blocks < opts.limits.max_blocks_per_seq {
            return Err(format!(
                "the KV cache would hold {num_blocks} blocks but one sequence of the context length needs {}: {} GiB of {} GiB are in use after loading the model; raise --gpu-memory-utilization or lower --max-model-len",
                opts.limits.max_blocks_per_seq,
                used as f64 / f64::from(1u32 << 30),
                total as f64 / f64::from(1u32 << 30)
            ));
        }
        model.allocate_cache(num_blocks)?;
        tracing::info!(
            device = %name,
            total_bytes = total,
            used_bytes = used,
            kv_blocks = num_blocks,
            kv_bytes = num_blocks * per_block,
            "sized the KV cache"
        );
        // The graphs are captured by warm-up (`Backend::warm_up`), after the server listens:
        // `/health` answers meanwhile and `/ready` says when they are done.
        Ok((
            Self {
                model,
                sizes: opts.capture_sizes.clone(),
                block_size: opts.limits.block_size,
                max_blocks_per_seq: opts.limits.max_blocks_per_seq,
                logits: StepLogits::new(eos),
            },
            num_blocks,
        ))
    }

    /// Runs the step on its path and keeps its logits for sampling.
    fn run(
        &mut self,
        batch: &Batch,
        running: &[Sequence],
        path: ExecPath,
        padded: usize,
    ) -> Result<(), String> {
        let rows = self.logits.begin_step(batch, running);
        let chunks = step_logits::chunks(batch, running);
        let vocab = self.model.config.vocab_size;
        let pad_to = if path == ExecPath::Graph { padded } else { 0 };
        let plan = StepPlan::new(
            &chunks,
            self.block_size,
            self.max_blocks_per_seq,
            pad_to,
            vocab,
        )?;
        let all = if path == ExecPath::Graph {
            let logits = self.model.run_graph(&plan, padded)?;
            plan.last_rows
                .iter()
                .map(|&r| logits[r * vocab..(r + 1) * vocab].to_vec())
                .collect()
        } else {
            // Flattened rows: each chunk's last token, then the prompt-logprob rows.
            let mut flat = plan.last_rows.clone();
            for &(i, p) in &rows {
                let row = plan
                    .row_of(i, p)
                    .ok_or_else(|| format!("logits row ({i}, {p}) is outside the step"))?;
                flat.push(row);
            }
            let wanted = plan.last_rows.len();
            let mut all = Vec::with_capacity(wanted);
            let logits = &mut self.logits;
            self.model
                .run_eager(&plan, &flat, &mut |first_row, block| {
                    for (j, row) in block.chunks_exact(vocab).enumerate() {
                        let r = first_row + j;
                        if r < wanted {
                            all.push(row.to_vec());
                        } else {
                            logits.on_row(r - wanted, row);
                        }
                    }
                })?;
            all
        };
        self.logits.finish(batch, running, &chunks, all);
        Ok(())
    }
}

impl Backend for CudaBackend {
    fn capture_budget(&self) -> Option<usize> {
        self.sizes.as_slice().last().copied()
    }

    /// Captures the size's CUDA graph; the bytes are measured on the device.
    fn warm_up(
        &mut self,
        cost: &crate::capture_cost::SizeCost,
    ) -> Result<crate::warmup::Warmed, String> {
        let bytes = self.model.capture_graph(cost.size).map_err(|e| {
            format!("{e} (capturing CUDA graphs; --enforce-eager runs without them)")
        })?;
        Ok(crate::warmup::Warmed {
            bytes,
            charge_seconds: 0.0,
        })
    }

    fn execute(&mut self, batch: &Batch, running: &[Sequence]) -> StepCost {
        let started = Instant::now();
        let (mut path, mut padded) = self.sizes.pick(&batch.shape);
        // Prompt logprobs need rows a graph does not compute.
        let wants_prompt_rows = batch.seqs.iter().any(|s| {
            let seq = &running[s.index];
            seq.params.prompt_logprobs.is_some() && seq.needs_prompt_logprobs()
        });
        // A graph computes one token per sequence.
        let one_token_each = batch.seqs.iter().all(|s| s.num_tokens == 1);
        if path == ExecPath::Graph
            && (wants_prompt_rows || !one_token_each || !self.model.has_graph(padded))
        {
            (path, padded) = (ExecPath::Eager, batch.seqs.len());
        }
        if let Err(e) = self.run(batch, running, path, padded) {
            self.logits.failed(&e);
        }
        StepCost {
            seconds: started.elapsed().as_secs_f64(),
            path,
            padded_batch: padded,
        }
    }

    fn sample(&mut self, seq: &mut Sequence) -> Sampled {
        self.logits.sample(seq)
    }

    fn prompt_logprobs(&mut self, seq: &mut Sequence) {
        self.logits.prompt_logprobs(seq);
    }

    fn eos_token(&self) -> u32 {
        self.logits.eos_token()
    }

    fn is_eos(&self, token: u32) -> bool {
        self.logits.is_eos(token)
    }
}

/// Step-buffer sizes for an engine of these limits: at least the largest capture size in
/// tokens, and [`EXTRA_ROWS_BLOCK`] logits rows per head call, as the cpu backend.
pub fn limits(
    max_num_batched_tokens: usize,
    max_num_seqs: usize,
    max_model_len: usize,
    block_size: usize,
    sizes: &CaptureSizes,
) -> Limits {
    Limits {
        max_tokens: max_num_batched_tokens.max(sizes.largest()).max(1),
        max_seqs: max_num_seqs.max(sizes.largest()).max(1),
        max_rows: EXTRA_ROWS_BLOCK.max(max_num_seqs),
        max_blocks_per_seq: max_model_len.div_ceil(block_size.max(1)),
        block_size,
    }
}
