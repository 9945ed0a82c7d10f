//! Flags of `infergate bench` and `infergate bench diff`, and the parsers of their values.

use std::path::PathBuf;
use std::time::Duration;

/// `infergate bench [--url …] | diff A B`: a run, or the comparison of two reports.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchCli {
    /// `diff A.json B.json`; absent for a run.
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    /// Flags of a run.
    #[command(flatten)]
    pub args: BenchArgs,
}

/// Subcommands of `infergate bench`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchCommand {
    /// Compare two JSON reports side by side, with the ratio B/A of every headline number.
    Diff {
        /// The baseline report.
        a: PathBuf,
        /// The report compared with it.
        b: PathBuf,
    },
}

/// Flags of a bench run: replay a workload against a gateway or an engine and report latency.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Base URL of the gateway or engine, e.g. http://127.0.0.1:8080 (plain HTTP); required
    /// for a run.
    #[arg(long)]
    pub url: Option<String>,
    /// Workload name (`config/workloads/NAME.yaml` or shipped) or path to a YAML file.
    #[arg(long, default_value = "chat")]
    pub workload: String,
    /// Replay the gateway's trace file (its `trace:` output) instead of a workload: arrivals,
    /// prompt and answer lengths, tenants, sessions and prefix groups as recorded.
    #[arg(long, value_name = "TRACE", conflicts_with = "workload")]
    pub replay: Option<std::path::PathBuf>,
    /// With --replay: time scale of the recorded arrivals (2 = twice as fast).
    #[arg(long, default_value_t = 1.0, requires = "replay")]
    pub speed: f64,
    /// Run length instead of the workload's, e.g. 30s, 500ms, 2m.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Mean arrival rate instead of the workload's, requests/s (open-loop workloads).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Seed instead of the workload's.
    #[arg(long)]
    pub seed: Option<u64>,
    /// API key sent as `Authorization: Bearer` (default: env INFERGATE_API_KEY).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Key per workload tenant, `TENANT=KEY` (repeatable); other tenants use --api-key.
    #[arg(long = "tenant-key", value_name = "TENANT=KEY")]
    pub tenant_keys: Vec<String>,
    /// Model name sent in every request.
    #[arg(long, default_value = "llama-3-8b")]
    pub model: String,
    /// API to call: `chat` (/v1/chat/completions) or `completions` (/v1/completions).
    #[arg(long, value_enum, default_value_t = Endpoint::Chat)]
    pub endpoint: Endpoint,
    /// JSON report path (default bench-<workload>.json).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write every request's record to this JSONL file.
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// Most requests in flight (= HTTP/1.1 connections) at once; each takes one file descriptor.
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
    /// Longest wait for a response head or between two body frames before a request counts as
    /// a transport error, e.g. 120s.
    #[arg(long, value_parser = parse_duration, default_value = "120s")]
    pub idle_timeout: Duration,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// After the run, fail (exit non-zero) naming each class some of whose successful requests
    /// did not take PATH (`graph`, `eager` or `mixed`, as `by_path` names them); repeatable.
    #[arg(long = "expect-path", value_name = "CLASS=PATH[,CLASS=PATH...]")]
    pub expect_path: Vec<String>,
}

/// The OpenAI API a bench run calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Endpoint {
    /// `/v1/chat/completions` with one user message.
    Chat,
    /// `/v1/completions` with a text prompt.
    Completions,
}

impl Endpoint {
    /// The request path under the base URL.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }

    /// The name shown in the report title.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat",
            Endpoint::Completions => "completions",
        }
    }
}

/// A command-line duration: a bare number is seconds, anything else as in
/// [`infergate::duration::parse`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(seconds) => Duration::try_from_secs_f64(seconds).map_err(|e| format!("`{text}`: {e}")),
        Err(_) => infergate::duration::parse(text),
    }
}

/// Splits `TENANT=KEY` flags into pairs; every malformed one is reported.
pub fn parse_tenant_keys(flags: &[String]) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut bad = Vec::new();
    for (i, flag) in flags.iter().enumerate() {
        match flag.split_once('=') {
            Some((t, k)) if !t.is_empty() && !k.is_empty() => pairs.push((t.into(), k.into())),
            // The value may be a bare key: never echo it.
            _ => bad.push(format!("--tenant-key #{} is not TENANT=KEY", i + 1)),
        }
    }
    if bad.is_empty() {
        Ok(pairs)
    } else {
        Err(bad.join("\n"))
    }
}
