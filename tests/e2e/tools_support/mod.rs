//! Helpers of the measurement-tool tests (`plan`, `sim`, `bench`): run `infergate ARGS` as a real
//! child process to completion under a deadline, read its JSON output and reports, write short
//! workload files, and keep the timing-sensitive live comparison alone on the machine.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use infergate_cli::report::Report;
use serde_json::Value;

/// What a finished `infergate` run left behind.
#[derive(Debug)]
pub struct Run {
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
}

impl Run {
    /// Panics with the command's output unless it exited 0; returns stdout.
    pub fn ok(&self, what: &str) -> &str {
        assert_eq!(
            self.code,
            Some(0),
            "{what} failed\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        &self.stdout
    }
}

/// Runs `infergate ARGS` to completion; the child is killed if `within` passes first.
pub async fn infergate(args: &[&str], within: Duration) -> Run {
    let mut cmd = crate::common::process::infergate();
    cmd.args(args);
    let out = crate::common::process::run(cmd, within).await;
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `infergate ARGS`, expects exit 0 and parses stdout as JSON.
pub async fn infergate_json(args: &[&str]) -> Value {
    let run = infergate(args, Duration::from_secs(30)).await;
    let out = run.ok(&format!("infergate {args:?}"));
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}):\n{out}"))
}

/// Runs `infergate ARGS --out DIR/NAME.json`, expects exit 0 within `within`, and reads the
/// report it wrote.
pub async fn report_of(dir: &Path, name: &str, args: &[&str], within: Duration) -> Report {
    let out = dir.join(format!("{name}.json"));
    let out_s = out.to_string_lossy().into_owned();
    let mut args = args.to_vec();
    args.extend(["--out", &out_s]);
    infergate(&args, within).await.ok(args[0]);
    read_report(&out)
}

/// Reads a report written by `bench --out` or `sim --out`.
pub fn read_report(path: &Path) -> Report {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    Report::from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The `u64` at `key` of a JSON object.
pub fn uint(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no integer `{key}` in {v}"))
}

/// The `f64` at `key` of a JSON object.
pub fn float(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number `{key}` in {v}"))
}

/// Asserts `|a - b| <= tol`.
pub fn assert_close(what: &str, a: f64, b: f64, tol: f64) {
    assert!((a - b).abs() <= tol, "{what}: {a} vs {b} (tolerance {tol})");
}

/// A short open-loop workload: Poisson at `rate` for `duration`, uniform prompts, fixed answers,
/// no prefix groups, sessions or tenants.
#[derive(Debug, Clone, Copy)]
pub struct ShortWorkload {
    /// Requests per second.
    pub rate: f64,
    /// Run length, seconds.
    pub seconds: u32,
    /// Prompt tokens, uniform between these two.
    pub prompt: (u32, u32),
    /// Generated tokens of every request.
    pub output: u32,
    /// Seed of the plan.
    pub seed: u64,
}

impl ShortWorkload {
    /// The workload as YAML named `name`.
    pub fn yaml(&self, name: &str) -> String {
        format!(
            "name: {name}\nseed: {}\nduration: {}s\narrival:\n  poisson: {{rate: {}}}\n\
             prompt_tokens: {{dist: uniform, min: {}, max: {}}}\n\
             output_tokens: {{dist: fixed, value: {}}}\nslo: {{ttft: 2s, itl: 500ms}}\n",
            self.seed, self.seconds, self.rate, self.prompt.0, self.prompt.1, self.output
        )
    }

    /// Writes the workload to `DIR/NAME.yaml` and returns the path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, self.yaml(name)).expect("write workload file");
        path
    }
}

pub use crate::common::machine::{shared_machine, whole_machine};
