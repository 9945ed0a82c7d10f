//! The checked workload model: what a YAML file or a trace becomes after validation. Every value
//! here is in range; the planner consumes it without further checks.

use std::path::PathBuf;
use std::time::Duration;

use infergate::trace::TraceFeatures;

/// A named, seeded description of traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// The workload's name (from the file; defaults to the file stem).
    pub name: String,
    /// Seed for every random draw of the plan.
    pub seed: u64,
    /// Default run length (overridable); requests are planned in [0, duration).
    pub duration: Duration,
    /// When requests arrive.
    pub arrival: Arrival,
    /// Goodput thresholds.
    pub slo: Slo,
    /// The shape of generated requests; `None` exactly when `arrival` is a trace.
    pub mix: Option<Mix>,
    /// Cap on the number of planned requests (closed loops default to concurrency × seconds).
    pub requests: Option<u64>,
}

/// How requests arrive.
#[derive(Debug, Clone, PartialEq)]
pub enum Arrival {
    /// A Poisson process at `rate` requests/s.
    Poisson {
        /// Requests per second.
        rate: f64,
    },
    /// Poisson at `rate`, and at `rate × factor` during [start, start + length).
    Burst {
        /// Requests per second outside the window.
        rate: f64,
        /// Multiplier inside the window.
        factor: f64,
        /// Window start, from the beginning of the run.
        start: Duration,
        /// Window length.
        length: Duration,
    },
    /// Poisson stages of (rate, duration) back to back; the last rate holds after they end.
    Stages(Vec<(f64, Duration)>),
    /// A closed loop: `concurrency` clients each send the next request when the previous ends.
    Closed {
        /// Number of clients.
        concurrency: usize,
    },
    /// Replay of a JSONL trace, timestamps and lengths as recorded.
    Trace(Trace),
}

/// Goodput thresholds: a request is good when its TTFT and every inter-token gap are within them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slo {
    /// Time to first token (default 1s).
    pub ttft: Duration,
    /// Inter-token latency (default 100ms).
    pub itl: Duration,
}

impl Default for Slo {
    fn default() -> Self {
        Self {
            ttft: Duration::from_secs(1),
            itl: Duration::from_millis(100),
        }
    }
}

/// The joint shape of generated requests.
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    /// Kinds of request and their shares (one, named `default`, unless the file lists `classes`).
    pub classes: Vec<RequestClass>,
    /// Shared system prompts, if any.
    pub prefix_groups: Option<PrefixGroups>,
    /// Multi-turn sessions, if any.
    pub sessions: Option<Sessions>,
    /// Tenant mix; empty means requests carry no tenant.
    pub tenants: Vec<Tenant>,
}

/// One kind of request: its share and its joint prompt/output lengths.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestClass {
    /// Class name (`default` for the top-level lengths).
    pub name: String,
    /// Relative weight (> 0).
    pub weight: f64,
    /// Length of each new user turn, in tokens (excluding group prefix and session history).
    pub prompt_tokens: LengthDist,
    /// Answer length in tokens.
    pub output_tokens: LengthDist,
    /// Spearman rank correlation of the two lengths, in [-1, 1] (Gaussian copula; default 0).
    pub correlation: f64,
}

/// A distribution of token counts; samples are rounded and clamped to [min, max].
#[derive(Debug, Clone, PartialEq)]
pub enum LengthDist {
    /// Always `value`.
    Fixed(u32),
    /// Uniform over [min, max].
    Uniform {
        /// Smallest value.
        min: u32,
        /// Largest value.
        max: u32,
    },
    /// Lognormal with arithmetic mean `mean` and log-space standard deviation `sigma`.
    Lognormal {
        /// Mean before clamping, tokens.
        mean: f64,
        /// Standard deviation of the logarithm.
        sigma: f64,
        /// Clamp floor.
        min: u32,
        /// Clamp ceiling.
        max: u32,
    },
    /// A weighted mixture; weights are normalized to sum to 1.
    Mixture(Vec<(f64, LengthDist)>),
}

/// Shared system prompts: each request (or session) picks one with Zipf popularity.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixGroups {
    /// Number of groups.
    pub count: usize,
    /// Prefix length in tokens.
    pub tokens: u32,
    /// Zipf exponent of group popularity (0 = uniform).
    pub zipf: f64,
    /// Share of requests (or sessions) that use a group, in [0, 1].
    pub share: f64,
}

/// Multi-turn sessions: `count` sessions run side by side; a finished one is replaced by a new one.
#[derive(Debug, Clone, PartialEq)]
pub struct Sessions {
    /// Sessions in progress at any time.
    pub count: usize,
    /// Turns per session.
    pub turns: LengthDist,
    /// New-turn length of a session's first turn (e.g. a long document), instead of the class's.
    pub first_turn: Option<LengthDist>,
}

/// One tenant of the mix.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// Tenant name, sent as the request's tenant.
    pub name: String,
    /// Relative weight (> 0).
    pub weight: f64,
}

/// A loaded JSONL trace, sorted by timestamp.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its entries.
    pub entries: Vec<TraceEntry>,
}

/// One trace line.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEntry {
    /// Offset from the start of the trace.
    pub at: Duration,
    /// Tenant, if recorded.
    pub tenant: Option<String>,
    /// Session, if recorded.
    pub session: Option<String>,
    /// The prompt: a length to synthesize, or the recorded text.
    pub prompt: TracePrompt,
    /// Answer length in tokens.
    pub output_tokens: u32,
    /// The prefix group it shares its first tokens with (a gateway trace's marks).
    pub group: Option<TraceGroup>,
    /// The features it asked for that change the engine's path (a gateway trace's); `None`
    /// for a plain request.
    pub features: Option<TraceFeatures>,
    /// The class it is reported and checked under (`bench --expect-path`): a gateway trace
    /// line's shape class, else [`REPLAY_CLASS`]; `None` for a workload trace's entries.
    pub class: Option<String>,
}

/// The class of a replayed request whose trace line names none (`--expect-path replay=graph`).
pub const REPLAY_CLASS: &str = "replay";

/// A trace entry's shared prefix: the group, and how many of its first tokens the group shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceGroup {
    /// Group id, from 0.
    pub id: usize,
    /// Shared prefix tokens.
    pub tokens: u32,
}

/// A trace entry's prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum TracePrompt {
    /// Total prompt length in tokens; sessions reuse their history and fill the rest.
    Tokens(u32),
    /// The prompt text, tokenized with cl100k.
    Text(String),
}

/// Per-run changes to a workload.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Overrides {
    /// Run length instead of the workload's.
    pub duration: Option<Duration>,
    /// New mean arrival rate (requests/s): Poisson's rate, burst's base rate, stages scaled to
    /// this time-weighted mean, or a trace sped up to it. Not valid for closed loops.
    pub rate: Option<f64>,
    /// Seed instead of the workload's.
    pub seed: Option<u64>,
}

/// One request of the plan. Timestamps are offsets from the start; for closed loops `at` is zero
/// and requests are consumed in order by `concurrency` clients.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedRequest {
    /// Position in the plan, from 0.
    pub id: u64,
    /// Send time, from the start of the run.
    pub at: Duration,
    /// Tenant, when the workload has a tenant mix.
    pub tenant: Option<String>,
    /// The workload class it was drawn from (`default` for a workload without `classes`);
    /// `None` for a trace's requests.
    pub class: Option<String>,
    /// Session id, when the request is a turn of a session.
    pub session: Option<String>,
    /// Prefix group, when the request uses a shared system prompt.
    pub group: Option<usize>,
    /// Token ids: group prefix (identical for the whole group), then history, then the new turn.
    pub prompt: Vec<u32>,
    /// Tokens to generate (each choice's).
    pub output_tokens: u32,
    /// Features a replayed request asks for again (`n`, logprobs, tools, `response_format`,
    /// images); `None` for a plain request and for every request of a generated workload.
    pub features: Option<TraceFeatures>,
}
