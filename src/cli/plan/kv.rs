//! `infergate plan kv`: how much KV cache a model gets on a GPU, how many sequences it holds at
//! mean and at full context, and what a burst of full-context requests does to everyone else.

use infergate_engine::presets::{self, GpuPreset, ModelPreset};
use infergate_engine::roofline::kv_block_budget;
use serde_json::{Value, json};

use super::table::{count, gib, key_values, thousands};

/// Flags of `infergate plan kv`.
#[derive(Debug, Clone, clap::Args)]
pub struct KvArgs {
    /// Model preset (llama-3-8b, llama-3-70b, mistral-7b, qwen2.5-0.5b) or its Hugging Face id.
    #[arg(long, default_value = "llama-3-8b")]
    pub model: String,
    /// GPU preset (h100, h200, a100, l4, mi300x).
    #[arg(long, default_value = "h100")]
    pub gpu: String,
    /// GPUs the model is sharded over.
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel_size: usize,
    /// Fraction of GPU memory the engine may use (weights, activations, KV cache), in (0, 1].
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Most tokens (prompt plus output) of one request (default: the model's max_model_len).
    #[arg(long)]
    pub context: Option<usize>,
    /// Mean tokens (prompt plus output) of one request (default: a quarter of --context).
    #[arg(long)]
    pub mean_context: Option<usize>,
    /// Print the plan as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl Default for KvArgs {
    /// The same defaults as the command line.
    fn default() -> Self {
        KvArgs {
            model: "llama-3-8b".to_string(),
            gpu: "h100".to_string(),
            tensor_parallel_size: 1,
            gpu_memory_utilization: 0.9,
            block_size: 16,
            context: None,
            mean_context: None,
            json: false,
        }
    }
}

/// While `full_requests` full-context requests hold their KV, how many mean-context sequences fit.
#[derive(Debug, Clone, PartialEq)]
pub struct BurstRow {
    /// Full-context requests resident at once.
    pub full_requests: usize,
    /// Mean-context sequences that still fit beside them.
    pub mean_seqs: usize,
}

/// The answer of `plan kv`.
#[derive(Debug, Clone, PartialEq)]
pub struct KvPlan {
    /// Model preset name.
    pub model: &'static str,
    /// GPU preset name.
    pub gpu: &'static str,
    /// GPUs the model is sharded over.
    pub tensor_parallel_size: usize,
    /// Fraction of GPU memory the engine may use.
    pub gpu_memory_utilization: f64,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Most tokens of one request.
    pub context: usize,
    /// Mean tokens of one request.
    pub mean_context: usize,
    /// KV bytes one token occupies on one GPU (its share of the KV heads).
    pub kv_bytes_per_token_per_gpu: u64,
    /// KV bytes one token occupies across the tensor-parallel group (heads replicated when TP
    /// exceeds the KV head count).
    pub kv_bytes_per_token: u64,
    /// Weight bytes each GPU holds.
    pub weight_bytes_per_gpu: u64,
    /// Bytes given to the KV cache, summed over the group.
    pub kv_cache_bytes: u64,
    /// KV blocks of `block_size` tokens.
    pub num_blocks: usize,
    /// Tokens of KV the cache holds (`num_blocks x block_size`).
    pub kv_tokens: usize,
    /// Blocks one mean-context sequence needs: ceil(mean_context / block_size).
    pub blocks_per_mean_seq: usize,
    /// Blocks one full-context sequence needs: ceil(context / block_size).
    pub blocks_per_full_seq: usize,
    /// Mean-context sequences that fit at once.
    pub seqs_at_mean: usize,
    /// Full-context sequences that fit at once.
    pub seqs_at_full: usize,
    /// Smallest number of full-context requests whose KV fills the whole cache.
    pub full_requests_to_exhaust: usize,
    /// Mean-context sequences one full-context request displaces (blocks full / blocks mean).
    pub displaced_per_full_request: f64,
    /// Mean-context room left while 0, 1, ... full-context requests are resident.
    pub burst: Vec<BurstRow>,
    /// Caveats about the inputs (e.g. a context beyond the model's max_model_len).
    pub notes: Vec<String>,
}

/// Computes the KV plan, or says why it cannot (bad flags, or a model that does not fit).
pub fn kv_plan(args: &KvArgs) -> Result<KvPlan, String> {
    let (gpu, model) = lookup(&args.gpu, &args.model);
    let context = args.context.or(model.map(|m| m.max_model_len));
    let mean_context = args.mean_context.or(context.map(|c| (c / 4).max(1)));
    let mut errors = Vec::new();
    if gpu.is_none() {
        errors.push(format!(
            "unknown --gpu {:?} (known: {})",
            args.gpu,
            presets::gpu_names().join(", ")
        ));
    }
    if model.is_none() {
        errors.push(format!(
            "unknown --model {:?} (known: {})",
            args.model,
            presets::model_names().join(", ")
        ));
    }
    if args.tensor_parallel_size == 0 {
        errors.push("--tensor-parallel-size must be at least 1".to_string());
    }
    let util = args.gpu_memory_utilization;
    if !(util.is_finite() && util > 0.0 && util <= 1.0) {
        errors.push(format!(
            "--gpu-memory-utilization must be in (0, 1], got {util}"
        ));
    }
    if args.block_size == 0 {
        errors.push("--block-size must be at least 1".to_string());
    }
    if context == Some(0) {
        errors.push("--context must be at least 1 token".to_string());
    }
    if mean_context == Some(0) {
        errors.push("--mean-context must be at least 1 token".to_string());
    }
    if let (Some(c), Some(m)) = (context, mean_context)
        && m > c
    {
        errors.push(format!(
            "--mean-context {m} exceeds --context {c}; the mean cannot exceed the most"
        ));
    }
    let (Some(gpu), Some(model), Some(context), Some(mean_context), true) =
        (gpu, model, context, mean_context, errors.is_empty())
    else {
        return Err(errors.join("; "));
    };
    let tp = args.tensor_parallel_size;
    let budget = kv_block_budget(gpu, model, tp, util, args.block_size)
        .map_err(|e| format!("does not fit: {e}"))?;

    let per_gpu = kv_bytes_per_token_per_gpu(model, tp);
    let caps = Capacity::new(budget.num_blocks, args.block_size, context, mean_context);
    let mut notes = Vec::new();
    if context > model.max_model_len {
        notes.push(format!(
            "--context {} exceeds {}'s max_model_len {}",
            thousands(context as u64),
            model.name,
            thousands(model.max_model_len as u64)
        ));
    }
    if caps.seqs_at_full == 0 {
        notes.push(format!(
            "one full-context request needs {} blocks but the cache holds {}: it can never run",
            count(caps.blocks_full),
            count(budget.num_blocks)
        ));
    }
    Ok(KvPlan {
        model: model.name,
        gpu: gpu.name,
        tensor_parallel_size: tp,
        gpu_memory_utilization: util,
        block_size: args.block_size,
        context,
        mean_context,
        kv_bytes_per_token_per_gpu: per_gpu,
        kv_bytes_per_token: per_gpu * tp as u64,
        weight_bytes_per_gpu: budget.weight_bytes_per_gpu,
        kv_cache_bytes: budget.kv_bytes,
        num_blocks: budget.num_blocks,
        kv_tokens: budget.num_blocks.saturating_mul(args.block_size),
        blocks_per_mean_seq: caps.blocks_mean,
        blocks_per_full_seq: caps.blocks_full,
        seqs_at_mean: caps.seqs_at_mean,
        seqs_at_full: caps.seqs_at_full,
        full_requests_to_exhaust: caps.full_to_exhaust,
        displaced_per_full_request: caps.blocks_full as f64 / caps.blocks_mean as f64,
        burst: caps.burst(),
        notes,
    })
}

/// Both presets looked up by name.
fn lookup(gpu: &str, model: &str) -> (Option<&'static GpuPreset>, Option<&'static ModelPreset>) {
    (presets::gpu(gpu), presets::model(model))
}

/// KV bytes per token on one GPU, as the engine splits heads: KV heads divided over the group,
/// replicated (at least one per GPU) when the group is larger than the KV head count.
fn kv_bytes_per_token_per_gpu(model: &ModelPreset, tp: usize) -> u64 {
    let heads_per_gpu = (model.num_kv_heads / tp.max(1)).max(1) as u64;
    2 * model.num_layers as u64 * heads_per_gpu * model.head_dim as u64 * 2
}

/// Pure block arithmetic of a cache of `num_blocks` blocks.
#[derive(Debug, Clone, PartialEq)]
struct Capacity {
    num_blocks: usize,
    blocks_mean: usize,
    blocks_full: usize,
    seqs_at_mean: usize,
    seqs_at_full: usize,
    full_to_exhaust: usize,
}

impl Capacity {
    /// Arithmetic for sequences of `context` and `mean_context` tokens (all arguments at least 1).
    fn new(num_blocks: usize, block_size: usize, context: usize, mean_context: usize) -> Self {
        let blocks_mean = mean_context.div_ceil(block_size).max(1);
        let blocks_full = context.div_ceil(block_size).max(1);
        Capacity {
            num_blocks,
            blocks_mean,
            blocks_full,
            seqs_at_mean: num_blocks / blocks_mean,
            seqs_at_full: num_blocks / blocks_full,
            full_to_exhaust: num_blocks.div_ceil(blocks_full).max(1),
        }
    }

    /// Mean-context sequences that fit beside `full` resident full-context requests.
    fn mean_seqs_beside(&self, full: usize) -> usize {
        self.num_blocks.saturating_sub(full * self.blocks_full) / self.blocks_mean
    }

    /// Rows for 0, 1, a quarter, half, three quarters and all of the full-context capacity.
    fn burst(&self) -> Vec<BurstRow> {
        let all = self.seqs_at_full;
        let mut points = vec![
            0,
            1,
            all.div_ceil(4),
            all.div_ceil(2),
            (3 * all).div_ceil(4),
            all,
        ];
        points.retain(|&n| n <= all);
        points.sort_unstable();
        points.dedup();
        points
            .into_iter()
            .map(|full_requests| BurstRow {
                full_requests,
                mean_seqs: self.mean_seqs_beside(full_requests),
            })
            .collect()
    }
}

impl KvPlan {
    /// The plan as an aligned human-readable table.
    pub fn render_text(&self) -> String {
        let gpus = if self.tensor_parallel_size == 1 {
            "1 GPU".to_string()
        } else {
            format!("{} GPUs", self.tensor_parallel_size)
        };
        let mut out = format!(
            "plan kv: {} on {} x {} (gpu-memory-utilization {:.2}), block size {}\n",
            self.model,
            self.tensor_parallel_size,
            self.gpu,
            self.gpu_memory_utilization,
            self.block_size
        );
        let (ctx, mean) = (
            thousands(self.context as u64),
            thousands(self.mean_context as u64),
        );
        let rows = vec![
            (
                "KV per token".to_string(),
                format!(
                    "{} B per GPU, {} B across {gpus}",
                    thousands(self.kv_bytes_per_token_per_gpu),
                    thousands(self.kv_bytes_per_token)
                ),
            ),
            (
                "weights per GPU".to_string(),
                gib(self.weight_bytes_per_gpu),
            ),
            (
                "KV cache".to_string(),
                format!(
                    "{} across {gpus} = {} blocks of {} tokens",
                    gib(self.kv_cache_bytes),
                    count(self.num_blocks),
                    self.block_size
                ),
            ),
            ("tokens of KV".to_string(), count(self.kv_tokens)),
            (
                format!("sequences at mean {mean}"),
                format!(
                    "{} ({} blocks each)",
                    count(self.seqs_at_mean),
                    count(self.blocks_per_mean_seq)
                ),
            ),
            (
                format!("sequences at full {ctx}"),
                format!(
                    "{} ({} blocks each)",
                    count(self.seqs_at_full),
                    count(self.blocks_per_full_seq)
                ),
            ),
        ];
        out.push_str(&key_values(&rows, 2));
        out.push_str(&format!(
            "burst: {} requests of {ctx} tokens take the whole cache; each one displaces ~{:.1} \
             mean-context sequences of {mean} tokens\n",
            count(self.full_requests_to_exhaust),
            self.displaced_per_full_request
        ));
        let burst: Vec<(String, String)> = self
            .burst
            .iter()
            .map(|r| {
                let share = 100.0 * r.mean_seqs as f64 / self.seqs_at_mean.max(1) as f64;
                (
                    format!("{} full-context resident", count(r.full_requests)),
                    format!(
                        "{} mean-context sequences fit ({share:.0}%)",
                        count(r.mean_seqs)
                    ),
                )
            })
            .collect();
        out.push_str(&key_values(&burst, 2));
        for note in &self.notes {
            out.push_str(&format!("note: {note}\n"));
        }
        out
    }

    /// The plan as JSON; byte fields are in bytes, lengths in tokens.
    pub fn to_json(&self) -> Value {
        let burst: Vec<Value> = self
            .burst
            .iter()
            .map(|r| json!({"full_requests": r.full_requests, "mean_seqs": r.mean_seqs}))
            .collect();
        json!({
            "model": self.model,
            "gpu": self.gpu,
            "tensor_parallel_size": self.tensor_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "block_size": self.block_size,
            "context": self.context,
            "mean_context": self.mean_context,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
            "kv_cache_bytes": self.kv_cache_bytes,
            "num_blocks": self.num_blocks,
            "kv_tokens": self.kv_tokens,
            "blocks_per_mean_seq": self.blocks_per_mean_seq,
            "blocks_per_full_seq": self.blocks_per_full_seq,
            "seqs_at_mean": self.seqs_at_mean,
            "seqs_at_full": self.seqs_at_full,
            "full_requests_to_exhaust": self.full_requests_to_exhaust,
            "displaced_per_full_request": self.displaced_per_full_request,
            "burst": burst,
            "notes": self.notes,
        })
    }
}

#[cfg(test)]
#[path = "kv_tests.rs"]
mod tests;
