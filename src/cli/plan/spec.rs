//! `infergate plan spec`: what speculative decoding buys: expected tokens per target step, the
//! speedup bound for a draft cost, the speedup on the roofline at a batch size, the batch at which
//! it stops paying, and the best number of draft tokens.

use infergate_engine::presets::{self, GpuPreset, ModelPreset};
use infergate_engine::roofline::{RooflineModel, kv_block_budget};
use serde_json::{Value, json};

use super::spec_cost::{
    Draft, MAX_SCAN_BATCH, SpecCost, expected_tokens, roofline_config, speedup_bound,
};
use super::table::{columns, count, key_values, ms};

/// Draft cost relative to a target step when neither --draft-cost nor --draft-model is given.
pub const DEFAULT_DRAFT_COST: f64 = 0.05;
/// Draft token counts in the comparison table.
const K_TABLE: std::ops::RangeInclusive<usize> = 1..=8;
/// Batch sizes in the batch table.
const BATCH_TABLE: [usize; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];
/// Most draft tokens accepted on the command line.
const MAX_K: usize = 64;
/// Largest --batch accepted.
const MAX_BATCH: usize = 4096;

/// Flags of `infergate plan spec`.
#[derive(Debug, Clone, clap::Args)]
pub struct SpecArgs {
    /// Probability that the target accepts a draft token, in [0, 1].
    #[arg(long)]
    pub alpha: f64,
    /// Draft tokens proposed per step.
    #[arg(long)]
    pub k: usize,
    /// Cost of one draft pass relative to one target decode step (default 0.05; not with --draft-model).
    #[arg(long)]
    pub draft_cost: Option<f64>,
    /// Target decode batch size (sequences per step).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Tokens of context each sequence attends to (KV read per step).
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    /// Target model preset.
    #[arg(long, default_value = "llama-3-8b")]
    pub model: String,
    /// Draft model preset; its cost is derived on the roofline (decode step ratio at --batch).
    #[arg(long)]
    pub draft_model: Option<String>,
    /// GPU preset both models run on.
    #[arg(long, default_value = "h100")]
    pub gpu: String,
    /// Print the plan as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl SpecArgs {
    /// `alpha` and `k` with every other flag at its command-line default.
    pub fn new(alpha: f64, k: usize) -> Self {
        SpecArgs {
            alpha,
            k,
            draft_cost: None,
            batch: 1,
            context: 1024,
            model: "llama-3-8b".to_string(),
            draft_model: None,
            gpu: "h100".to_string(),
            json: false,
        }
    }
}

/// One row of the comparison over draft token counts, at the plan's batch.
#[derive(Debug, Clone, PartialEq)]
pub struct KRow {
    /// Draft tokens per step.
    pub k: usize,
    /// Expected tokens per target step.
    pub expected_tokens: f64,
    /// `E / (1 + k c)`.
    pub speedup_bound: f64,
    /// Speedup on the roofline.
    pub speedup: f64,
}

/// Speedup at one batch size, with the plan's k.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRow {
    /// Sequences per step.
    pub batch: usize,
    /// Verify step time over plain decode step time (1 when memory-bound, up to k + 1).
    pub verify_over_decode: f64,
    /// Speedup on the roofline.
    pub speedup: f64,
}

/// The answer of `plan spec`.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecPlan {
    /// Acceptance rate.
    pub alpha: f64,
    /// Draft tokens per step.
    pub k: usize,
    /// Target decode batch size.
    pub batch: usize,
    /// Tokens of context per sequence.
    pub context: usize,
    /// Target model preset name.
    pub model: &'static str,
    /// Draft model preset name, when the draft cost comes from the roofline.
    pub draft_model: Option<&'static str>,
    /// GPU preset name.
    pub gpu: &'static str,
    /// Draft pass cost relative to a target decode step at `batch`.
    pub draft_cost: f64,
    /// Where `draft_cost` came from: "flag", "default" or "roofline".
    pub draft_cost_source: &'static str,
    /// Expected tokens per target step, `(1 - alpha^(k+1)) / (1 - alpha)`.
    pub expected_tokens: f64,
    /// Cost of a speculative step in target steps when verifying is free: `1 + k c`.
    pub step_cost_ratio: f64,
    /// `expected_tokens / step_cost_ratio`.
    pub speedup_bound: f64,
    /// Target decode step at `batch`, seconds.
    pub target_step_s: f64,
    /// One draft pass at `batch`, seconds.
    pub draft_step_s: f64,
    /// Target verify step of `k + 1` tokens per sequence at `batch`, seconds.
    pub verify_step_s: f64,
    /// Speedup on the roofline at `batch`.
    pub speedup: f64,
    /// Smallest batch up to 512 at which the speedup is at most 1, if any.
    pub break_even_batch: Option<usize>,
    /// Speedup over draft token counts 1..=8 at `batch`.
    pub by_k: Vec<KRow>,
    /// The k of `by_k` with the highest roofline speedup.
    pub best_k: usize,
    /// Speedup over batch sizes with the plan's k.
    pub by_batch: Vec<BatchRow>,
    /// Sequences of `context` tokens the target's KV cache holds on one GPU at 0.90 utilization.
    pub kv_capacity_seqs: Option<usize>,
}

/// Computes the speculative decoding plan, or says which flags are wrong.
pub fn spec_plan(args: &SpecArgs) -> Result<SpecPlan, String> {
    let (gpu, model, draft_model, draft_cost) = validate(args)?;
    let cfg = roofline_config();
    let draft = match (draft_model, draft_cost) {
        (Some(d), _) => Draft::Model(RooflineModel::new(gpu, d, cfg.clone())),
        (None, c) => Draft::Relative(c.unwrap_or(DEFAULT_DRAFT_COST)),
    };
    let cost = SpecCost {
        target: RooflineModel::new(gpu, model, cfg),
        draft,
        context: args.context,
    };
    let (alpha, k, batch) = (args.alpha, args.k, args.batch);
    let t = cost.times(batch, k);
    let c = t.draft / t.target;
    let step_cost_ratio = 1.0 + k as f64 * c;
    let by_k: Vec<KRow> = K_TABLE
        .map(|k| KRow {
            k,
            expected_tokens: expected_tokens(alpha, k),
            speedup_bound: speedup_bound(alpha, k, c),
            speedup: cost.speedup(alpha, batch, k),
        })
        .collect();
    let best_k = by_k
        .iter()
        .max_by(|a, b| a.speedup.total_cmp(&b.speedup))
        .map_or(1, |r| r.k);
    let by_batch = BATCH_TABLE
        .iter()
        .map(|&b| {
            let tb = cost.times(b, k);
            BatchRow {
                batch: b,
                verify_over_decode: tb.verify / tb.target,
                speedup: cost.speedup(alpha, b, k),
            }
        })
        .collect();
    let kv_capacity_seqs = kv_block_budget(gpu, model, 1, 0.9, 16)
        .ok()
        .map(|b| b.num_blocks / args.context.div_ceil(16));
    Ok(SpecPlan {
        alpha,
        k,
        batch,
        context: args.context,
        model: model.name,
        draft_model: draft_model.map(|d| d.name),
        gpu: gpu.name,
        draft_cost: c,
        draft_cost_source: match (draft_model, draft_cost) {
            (Some(_), _) => "roofline",
            (None, Some(_)) => "flag",
            (None, None) => "default",
        },
        expected_tokens: expected_tokens(alpha, k),
        step_cost_ratio,
        speedup_bound: expected_tokens(alpha, k) / step_cost_ratio,
        target_step_s: t.target,
        draft_step_s: t.draft,
        verify_step_s: t.verify,
        speedup: expected_tokens(alpha, k) * t.target / (k as f64 * t.draft + t.verify),
        break_even_batch: cost.break_even_batch(alpha, k),
        by_k,
        best_k,
        by_batch,
        kv_capacity_seqs,
    })
}

/// The GPU, target and draft presets and the draft cost flag, once checked.
type Valid = (
    &'static GpuPreset,
    &'static ModelPreset,
    Option<&'static ModelPreset>,
    Option<f64>,
);

/// Looks up the presets and checks every flag, reporting all problems at once.
fn validate(args: &SpecArgs) -> Result<Valid, String> {
    let mut errors = Vec::new();
    let gpu = presets::gpu(&args.gpu);
    if gpu.is_none() {
        errors.push(format!(
            "unknown --gpu {:?} (known: {})",
            args.gpu,
            presets::gpu_names().join(", ")
        ));
    }
    let model = presets::model(&args.model);
    let known_models = presets::model_names().join(", ");
    if model.is_none() {
        errors.push(format!(
            "unknown --model {:?} (known: {known_models})",
            args.model
        ));
    }
    let draft = args.draft_model.as_deref().map(presets::model);
    if let (Some(name), Some(None)) = (&args.draft_model, draft) {
        errors.push(format!(
            "unknown --draft-model {name:?} (known: {known_models})"
        ));
    }
    if !(args.alpha.is_finite() && (0.0..=1.0).contains(&args.alpha)) {
        errors.push(format!("--alpha must be in [0, 1], got {}", args.alpha));
    }
    if !(1..=MAX_K).contains(&args.k) {
        errors.push(format!("--k must be in 1..={MAX_K}, got {}", args.k));
    }
    if !(1..=MAX_BATCH).contains(&args.batch) {
        errors.push(format!(
            "--batch must be in 1..={MAX_BATCH}, got {}",
            args.batch
        ));
    }
    if args.context == 0 {
        errors.push("--context must be at least 1 token".to_string());
    }
    match (args.draft_cost, &args.draft_model) {
        (Some(_), Some(_)) => errors.push(
            "give --draft-cost or --draft-model, not both (the model's cost is derived)"
                .to_string(),
        ),
        (Some(c), None) if !(c.is_finite() && c >= 0.0) => {
            errors.push(format!("--draft-cost must be a number >= 0, got {c}"));
        }
        _ => {}
    }
    match (gpu, model, draft.flatten(), errors.is_empty()) {
        (Some(g), Some(m), d, true) => Ok((g, m, d, args.draft_cost)),
        _ => Err(errors.join("; ")),
    }
}

impl SpecPlan {
    /// The plan as an aligned human-readable table.
    pub fn render_text(&self) -> String {
        let draft = match self.draft_model {
            Some(d) => format!(
                "{d} (roofline: draft step / target step at batch {})",
                self.batch
            ),
            None => format!("--draft-cost ({})", self.draft_cost_source),
        };
        let mut out = format!(
            "plan spec: alpha {} k {} on {} x {} at batch {}, context {}\n",
            self.alpha,
            self.k,
            self.model,
            self.gpu,
            count(self.batch),
            count(self.context)
        );
        let rows = vec![
            (
                "expected tokens per target step".to_string(),
                format!(
                    "{:.4}  (1 - alpha^(k+1)) / (1 - alpha)",
                    self.expected_tokens
                ),
            ),
            (
                "draft cost c".to_string(),
                format!("{:.4} of a target step, from {draft}", self.draft_cost),
            ),
            (
                "step cost 1 + k c".to_string(),
                format!("{:.4} target steps", self.step_cost_ratio),
            ),
            (
                "speedup bound E / (1 + k c)".to_string(),
                format!(
                    "{:.3}x (verify costing one decode step)",
                    self.speedup_bound
                ),
            ),
            (
                "roofline step times".to_string(),
                format!(
                    "decode {}, draft {}, verify of k+1 tokens {}",
                    ms(self.target_step_s),
                    ms(self.draft_step_s),
                    ms(self.verify_step_s)
                ),
            ),
            (
                "speedup on the roofline".to_string(),
                format!("{:.3}x  E x decode / (k x draft + verify)", self.speedup),
            ),
            ("stops paying".to_string(), self.break_even_text()),
        ];
        out.push_str(&key_values(&rows, 2));
        out.push_str(&format!("by k at batch {} (* best):\n", count(self.batch)));
        let mut k_rows = vec![vec![
            "k".to_string(),
            "E".to_string(),
            "bound".to_string(),
            "speedup".to_string(),
        ]];
        for r in &self.by_k {
            let mark = if r.k == self.best_k { " *" } else { "" };
            k_rows.push(vec![
                format!("{}{mark}", r.k),
                format!("{:.3}", r.expected_tokens),
                format!("{:.3}x", r.speedup_bound),
                format!("{:.3}x", r.speedup),
            ]);
        }
        out.push_str(&columns(&k_rows, 2));
        out.push_str(&format!("by batch at k {}:\n", self.k));
        let mut b_rows = vec![vec![
            "batch".to_string(),
            "verify/decode".to_string(),
            "speedup".to_string(),
        ]];
        for r in &self.by_batch {
            b_rows.push(vec![
                count(r.batch),
                format!("{:.2}", r.verify_over_decode),
                format!("{:.3}x", r.speedup),
            ]);
        }
        out.push_str(&columns(&b_rows, 2));
        if let Some(n) = self.kv_capacity_seqs {
            out.push_str(&format!(
                "note: {}'s KV cache on one {} (0.90) holds {} sequences of {} tokens\n",
                self.model,
                self.gpu,
                count(n),
                count(self.context)
            ));
        }
        out
    }

    /// When speculation stops paying, in words.
    fn break_even_text(&self) -> String {
        match self.break_even_batch {
            Some(b) => {
                let mut text = format!(
                    "at batch {} (speedup <= 1 there: verify turns compute-bound)",
                    count(b)
                );
                if let Some(n) = self.kv_capacity_seqs.filter(|&n| n < b) {
                    text.push_str(&format!(
                        ", beyond the {} sequences the KV cache holds",
                        count(n)
                    ));
                }
                text
            }
            None => format!(
                "not up to batch {MAX_SCAN_BATCH} at context {} (KV reads keep decode memory-bound)",
                count(self.context)
            ),
        }
    }

    /// The plan as JSON; times in seconds, speedups as ratios.
    pub fn to_json(&self) -> Value {
        let by_k: Vec<Value> = self
            .by_k
            .iter()
            .map(|r| {
                json!({"k": r.k, "expected_tokens": r.expected_tokens,
                       "speedup_bound": r.speedup_bound, "speedup": r.speedup})
            })
            .collect();
        let by_batch: Vec<Value> = self
            .by_batch
            .iter()
            .map(|r| {
                json!({"batch": r.batch, "verify_over_decode": r.verify_over_decode,
                       "speedup": r.speedup})
            })
            .collect();
        json!({
            "alpha": self.alpha,
            "k": self.k,
            "batch": self.batch,
            "context": self.context,
            "model": self.model,
            "draft_model": self.draft_model,
            "gpu": self.gpu,
            "draft_cost": self.draft_cost,
            "draft_cost_source": self.draft_cost_source,
            "expected_tokens": self.expected_tokens,
            "step_cost_ratio": self.step_cost_ratio,
            "speedup_bound": self.speedup_bound,
            "target_step_s": self.target_step_s,
            "draft_step_s": self.draft_step_s,
            "verify_step_s": self.verify_step_s,
            "speedup": self.speedup,
            "break_even_batch": self.break_even_batch,
            "max_scanned_batch": MAX_SCAN_BATCH,
            "by_k": by_k,
            "best_k": self.best_k,
            "by_batch": by_batch,
            "kv_capacity_seqs": self.kv_capacity_seqs,
        })
    }
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;
