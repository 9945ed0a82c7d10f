//! `infergate plan`: back-of-the-envelope calculators over the engine's presets and roofline:
//! KV cache capacity (`plan kv`), speculative decoding (`plan spec`) and, by simulation, the
//! replicas a workload needs (`plan capacity`).
//!
//! Each calculator is a pure function from its flags to a report struct that renders as an
//! aligned table or as JSON; `run_kv` and `run_spec` pick the format from `--json`.

pub mod capacity;
mod kv;
pub mod spec;
mod spec_cost;
pub(crate) mod table;

pub use capacity::{CapacityArgs, CapacityPlan, Trial, capacity_plan, run_capacity};
pub use kv::{BurstRow, KvArgs, KvPlan, kv_plan};
pub use spec::{BatchRow, DEFAULT_DRAFT_COST, KRow, SpecArgs, SpecPlan, spec_plan};
pub use spec_cost::{expected_tokens, speedup_bound};

/// Runs `plan kv`: the table, or pretty JSON with `--json`.
pub fn run_kv(args: &KvArgs) -> Result<String, String> {
    let plan = kv_plan(args)?;
    render(args.json, plan.render_text(), || plan.to_json())
}

/// Runs `plan spec`: the table, or pretty JSON with `--json`.
pub fn run_spec(args: &SpecArgs) -> Result<String, String> {
    let plan = spec_plan(args)?;
    render(args.json, plan.render_text(), || plan.to_json())
}

/// `text`, or the JSON value pretty-printed with a trailing newline.
fn render(
    json: bool,
    text: String,
    value: impl FnOnce() -> serde_json::Value,
) -> Result<String, String> {
    if !json {
        return Ok(text);
    }
    serde_json::to_string_pretty(&value())
        .map(|s| s + "\n")
        .map_err(|e| format!("cannot encode the plan as JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_renders_text_or_json() {
        let text = run_kv(&KvArgs::default()).unwrap();
        assert!(text.starts_with("plan kv: llama-3-8b"), "{text}");
        let json = run_kv(&KvArgs {
            json: true,
            ..KvArgs::default()
        })
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["kv_bytes_per_token"], 131_072);

        let mut spec = SpecArgs::new(0.6, 4);
        assert!(run_spec(&spec).unwrap().contains("2.3056"));
        spec.json = true;
        let v: serde_json::Value = serde_json::from_str(&run_spec(&spec).unwrap()).unwrap();
        assert_eq!(v["k"], 4);
    }

    #[derive(clap::Parser)]
    struct KvCli {
        #[command(flatten)]
        args: KvArgs,
    }

    #[derive(clap::Parser)]
    struct SpecCli {
        #[command(flatten)]
        args: SpecArgs,
    }

    #[test]
    fn flags_parse_as_documented() {
        use clap::{CommandFactory, Parser};
        KvCli::command().debug_assert();
        SpecCli::command().debug_assert();
        let kv = KvCli::parse_from([
            "plan",
            "--model",
            "llama-3-8b",
            "--gpu",
            "mi300x",
            "--context",
            "32768",
            "--mean-context",
            "4100",
            "--tensor-parallel-size",
            "2",
            "--json",
        ])
        .args;
        assert_eq!(
            (kv.gpu.as_str(), kv.context, kv.mean_context),
            ("mi300x", Some(32_768), Some(4100))
        );
        assert_eq!(
            (kv.tensor_parallel_size, kv.block_size, kv.json),
            (2, 16, true)
        );
        assert_eq!(kv.gpu_memory_utilization, 0.9);
        let spec = SpecCli::parse_from(["plan", "--alpha", "0.6", "--k", "4"]).args;
        assert_eq!(
            (spec.alpha, spec.k, spec.batch, spec.context),
            (0.6, 4, 1, 1024)
        );
        assert_eq!((spec.draft_cost, spec.draft_model), (None, None));
        let spec = SpecCli::parse_from([
            "plan",
            "--alpha",
            "0.7",
            "--k",
            "3",
            "--draft-model",
            "qwen2.5-0.5b",
            "--batch",
            "64",
        ])
        .args;
        assert_eq!(
            (spec.batch, spec.draft_model.as_deref()),
            (64, Some("qwen2.5-0.5b"))
        );
    }
}
