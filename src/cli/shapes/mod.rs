//! `infergate shapes TRACE`: what shapes the traffic of a gateway trace file (`trace:` in its
//! config) took in the engine, and which CUDA-graph capture sizes it calls for.
//!
//! - `shapes TRACE [--json]`: the joint distribution ([`dist`]): engine steps by batch size and
//!   path, prompt x output length, features, cache state, path shares.
//! - `shapes TRACE --propose [--target-share 0.95] [--max-sizes 8] [--train-until F] [--holdout]`:
//!   capture sizes covering the target share of the decode-only steps of the training window
//!   (the first `F` of the requests by arrival), priced by the engine's capture-cost model
//!   (`infergate_engine::capture_cost`) for `--gpu`/`--model`; with `--holdout`, their coverage
//!   on the later window they were not chosen on too, and the engine flag that applies them.

pub mod dist;
pub mod propose;
mod render;
pub mod trace;

use std::path::PathBuf;

use infergate_engine::capture_cost::{CaptureCost, CaptureCostModel};
use infergate_engine::presets;
use serde::Serialize;

pub use dist::{Distribution, distribution};
pub use propose::Coverage;

/// Flags of `infergate shapes`.
#[derive(Debug, Clone, clap::Args)]
pub struct ShapesArgs {
    /// Trace files the gateway wrote (JSON lines; rotated files may be given together).
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Propose capture sizes from the trace instead of printing its distribution.
    #[arg(long)]
    pub propose: bool,
    /// Share of the training window's decode-only steps the proposal must cover, in (0, 1].
    #[arg(long, default_value_t = 0.95)]
    pub target_share: f64,
    /// Most capture sizes to propose.
    #[arg(long, default_value_t = 8)]
    pub max_sizes: usize,
    /// Share of the requests, by arrival, the proposal is chosen on (default: all, or 0.5 with
    /// --holdout).
    #[arg(long)]
    pub train_until: Option<f64>,
    /// Also evaluate the proposal on the requests after the training window.
    #[arg(long)]
    pub holdout: bool,
    /// GPU preset the capture cost is priced on (as `infergate engine --gpu`).
    #[arg(long, default_value = "h100")]
    pub gpu: String,
    /// Model preset the capture cost is priced for (as `infergate engine --model`).
    #[arg(long, default_value = "llama-3-8b")]
    pub model: String,
    /// GPUs the model is sharded over (as `infergate engine --tensor-parallel-size`).
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel_size: usize,
}

/// The memory and start-up time of a set of capture sizes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Cost {
    /// Device memory, bytes per GPU.
    pub bytes: u64,
    /// Start-up seconds.
    pub seconds: f64,
    /// Share of one GPU's memory.
    pub gpu_memory_share: f64,
    /// KV-cache tokens the memory would hold instead.
    pub kv_tokens: u64,
    /// Per size: `{size, bytes, seconds}`.
    pub per_size: Vec<SizeCostRow>,
}

/// One size's cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SizeCostRow {
    /// Capture size.
    pub size: u32,
    /// Bytes per GPU.
    pub bytes: u64,
    /// Start-up seconds.
    pub seconds: f64,
}

impl From<CaptureCost> for Cost {
    fn from(c: CaptureCost) -> Self {
        Self {
            bytes: c.bytes,
            seconds: dist::round3(c.seconds),
            gpu_memory_share: (c.gpu_memory_share * 1e6).round() / 1e6,
            kv_tokens: c.kv_tokens,
            per_size: c
                .sizes
                .iter()
                .map(|s| SizeCostRow {
                    size: u32::try_from(s.size).unwrap_or(u32::MAX),
                    bytes: s.bytes,
                    seconds: (s.seconds * 1e4).round() / 1e4,
                })
                .collect(),
        }
    }
}

/// A set of capture sizes: what it costs and covers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SizeSet {
    /// Capture sizes, ascending.
    pub sizes: Vec<u32>,
    /// Memory and start-up time.
    pub cost: Cost,
    /// On the training window.
    pub train: Coverage,
    /// On the held-out window (with `--holdout`).
    pub holdout: Option<Coverage>,
}

/// The presets a proposal is priced on.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Preset {
    /// GPU preset.
    pub gpu: String,
    /// Model preset.
    pub model: String,
    /// Tensor-parallel GPUs.
    pub tensor_parallel_size: usize,
}

/// What `shapes --propose` prints.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProposeReport {
    /// Share of the training window's decode-only steps to cover.
    pub target_share: f64,
    /// Most sizes.
    pub max_sizes: usize,
    /// Share of the requests, by arrival, in the training window.
    pub train_until: f64,
    /// Lines skipped as bad.
    pub bad_lines: u64,
    /// Presets the cost is priced on.
    pub preset: Preset,
    /// Whether the proposal covers the target on the training window.
    pub reached: bool,
    /// The engine flag that applies it (empty without decode steps).
    pub flag: String,
    /// The proposed sizes.
    pub proposed: SizeSet,
    /// The sizes the trace's engines ran with, on the same windows.
    pub current: SizeSet,
    /// Most of the trace's engines ran piecewise graphs too (`--cudagraph-mode
    /// full-and-piecewise`): each size is priced as two graphs.
    pub piecewise: bool,
}

/// Runs `infergate shapes`.
pub fn run(args: &ShapesArgs) -> Result<String, String> {
    let trace = trace::read(&args.traces)?;
    if !args.propose {
        let d = distribution(&trace);
        return if args.json {
            to_json(&d)
        } else {
            Ok(render::distribution(&d))
        };
    }
    let report = propose_report(args, &trace)?;
    if args.json {
        to_json(&report)
    } else {
        Ok(render::proposal(&report))
    }
}

/// The proposal for `trace` under `args`.
pub fn propose_report(args: &ShapesArgs, trace: &trace::Trace) -> Result<ProposeReport, String> {
    if !(args.target_share > 0.0 && args.target_share <= 1.0) {
        return Err(format!(
            "--target-share {} is not a share in (0, 1]",
            args.target_share
        ));
    }
    if args.max_sizes == 0 {
        return Err("--max-sizes must be at least 1".into());
    }
    let train_until = match (args.train_until, args.holdout) {
        (Some(f), true) if !(f > 0.0 && f < 1.0) => {
            return Err(format!(
                "--train-until {f} leaves no held-out window: give a share in (0, 1) with --holdout"
            ));
        }
        (Some(f), _) if !(f > 0.0 && f <= 1.0) => {
            return Err(format!("--train-until {f} is not a share in (0, 1]"));
        }
        (Some(f), _) => f,
        (None, true) => 0.5,
        (None, false) => 1.0,
    };
    let gpu = presets::gpu(&args.gpu).ok_or_else(|| {
        format!(
            "unknown --gpu {:?} (one of {})",
            args.gpu,
            presets::gpu_names().join(", ")
        )
    })?;
    let model = presets::model(&args.model).ok_or_else(|| {
        format!(
            "unknown --model {:?} (one of {})",
            args.model,
            presets::model_names().join(", ")
        )
    })?;
    let cost_model = CaptureCostModel::new(gpu, model, args.tensor_parallel_size);
    let piecewise = trace.piecewise * 2 > trace.requests.len() as u64;
    let (train, later) = propose::split(&trace.requests, train_until);
    let train_steps = dist::decode_steps(train);
    let later_steps = args.holdout.then(|| dist::decode_steps(later));
    let proposal = propose::propose(&train_steps, args.target_share, args.max_sizes);
    let set = |sizes: Vec<u32>| {
        let as_usize: Vec<usize> = sizes.iter().map(|&s| s as usize).collect();
        SizeSet {
            cost: if piecewise {
                cost_model.of(&as_usize).twice()
            } else {
                cost_model.of(&as_usize)
            }
            .into(),
            train: propose::coverage(&train_steps, &sizes, train.len()),
            holdout: later_steps
                .as_ref()
                .map(|s| propose::coverage(s, &sizes, later.len())),
            sizes,
        }
    };
    let flag = if proposal.sizes.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = proposal.sizes.iter().map(u32::to_string).collect();
        format!("--cuda-graph-sizes {}", list.join(","))
    };
    Ok(ProposeReport {
        target_share: args.target_share,
        max_sizes: args.max_sizes,
        train_until,
        bad_lines: trace.bad_lines,
        preset: Preset {
            gpu: gpu.name.to_owned(),
            model: model.name.to_owned(),
            tensor_parallel_size: args.tensor_parallel_size.max(1),
        },
        reached: proposal.reached,
        flag,
        proposed: set(proposal.sizes),
        current: set(trace.usual_capture().to_vec()),
        piecewise,
    })
}

/// `value` as pretty JSON with a trailing newline.
fn to_json(value: &impl Serialize) -> Result<String, String> {
    serde_json::to_string_pretty(value)
        .map(|s| s + "\n")
        .map_err(|e| format!("cannot encode the report as JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::trace::tests::line;
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ShapesArgs,
    }

    fn args(flags: &[&str]) -> ShapesArgs {
        let mut argv = vec!["shapes", "t.jsonl"];
        argv.extend_from_slice(flags);
        Cli::parse_from(argv).args
    }

    /// Early requests decode at batch 2, later ones at batch 4; the engine captured only 1.
    fn trace() -> trace::Trace {
        let lines: Vec<String> = (0..10)
            .map(|i| {
                let b = if i < 5 { 2 } else { 4 };
                line(i, 1, &[b; 4], &[1])
            })
            .collect();
        let mut t = trace::Trace::default();
        t.read_from(lines.join("\n").as_bytes()).unwrap();
        t.finish()
    }

    #[test]
    fn a_proposal_is_checked_on_the_window_it_did_not_see() {
        let r = propose_report(&args(&["--propose", "--holdout"]), &trace()).unwrap();
        assert_eq!(r.train_until, 0.5);
        assert_eq!(r.proposed.sizes, vec![2]);
        assert_eq!(r.flag, "--cuda-graph-sizes 2");
        assert!(r.reached);
        assert_eq!(r.proposed.train.coverage, 1.0);
        assert_eq!(r.proposed.train.requests, 5);
        let holdout = r.proposed.holdout.clone().unwrap();
        assert_eq!(holdout.coverage, 0.0, "the later traffic outgrew it");
        assert_eq!(holdout.decode_steps, 5.0);
        assert_eq!(r.current.sizes, vec![1]);
        assert_eq!(r.current.train.coverage, 0.0);
        assert!(r.proposed.cost.bytes > 0 && r.proposed.cost.seconds > 0.0);
        assert_eq!(r.preset.model, "llama-3-8b");
        let whole = propose_report(&args(&["--propose"]), &trace()).unwrap();
        assert_eq!(whole.proposed.sizes, vec![2, 4]);
        assert!(whole.proposed.holdout.is_none());
        let json: serde_json::Value = serde_json::from_str(&to_json(&r).unwrap()).unwrap();
        assert_eq!(json["proposed"]["holdout"]["coverage"], 0.0);
        assert_eq!(json["proposed"]["cost"]["per_size"][0]["size"], 2);
    }

    #[test]
    fn the_text_reports_name_their_figures() {
        let t = trace();
        let text = render::distribution(&distribution(&t));
        assert!(text.starts_with("shapes: 10 requests"), "{text}");
        assert!(text.contains("capture sizes: 1\n"), "{text}");
        assert!(text.contains("prefill/mixed"), "{text}");
        assert!(
            text.contains("cache: 500 of 1,000 prompt tokens cached (50.0%)"),
            "{text}"
        );
        let r = propose_report(&args(&["--propose", "--holdout"]), &t).unwrap();
        let text = render::proposal(&r);
        assert!(text.contains("proposed sizes     2\n"), "{text}");
        assert!(text.contains("held-out window"), "{text}");
        assert!(
            text.ends_with("apply: infergate engine --cuda-graph-sizes 2\n"),
            "{text}"
        );
    }

    #[test]
    fn bad_flags_are_refused() {
        let t = trace();
        let err = |flags: &[&str]| propose_report(&args(flags), &t).unwrap_err();
        assert!(err(&["--target-share", "0"]).contains("--target-share"));
        assert!(err(&["--max-sizes", "0"]).contains("--max-sizes"));
        assert!(err(&["--holdout", "--train-until", "1"]).contains("held-out"));
        assert!(err(&["--train-until", "1.5"]).contains("--train-until"));
        assert!(err(&["--gpu", "tpu"]).contains("h100"));
        assert!(err(&["--model", "gpt-9"]).contains("llama-3-8b"));
    }
}
