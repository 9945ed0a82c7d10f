//! Reads an engine's queue and KV load from its Prometheus `/metrics` text, in the dialect of
//! each engine: vLLM (and ours, which speaks vLLM's), SGLang and TGI.
//!
//! A worker's numbers are not believed blindly: a value the gateway reads that is NaN, infinite,
//! negative or past a sane ceiling makes the whole scrape invalid ([`PollFailure::InvalidValue`]),
//! and the poller counts it as a failed poll, so a worker that keeps lying is ejected.

use serde::Deserialize;

/// Most requests a worker may report waiting or running (each gauge, summed over label sets).
/// No engine queues a million requests; a larger number is a broken exporter.
pub const MAX_QUEUE: f64 = 1e6;
/// Most KV capacity a worker may claim, in tokens (10 billion: some thousand times the largest
/// single-engine caches of 2026).
pub const MAX_KV_CAPACITY_TOKENS: u64 = 10_000_000_000;
/// Slack allowed around KV usage's `0..=1` for rounding in exporters; within it the value is
/// clamped, past it the scrape is invalid.
pub const KV_USAGE_SLACK: f64 = 0.01;

/// Why a poll of a worker's `/metrics` failed: the fixed `reason` label of
/// `infergate_worker_poll_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollFailure {
    /// No full answer within `health.timeout`.
    Timeout,
    /// The request could not be sent or its head not read (refused, reset, bad URL).
    Connect,
    /// The answer's status was not 2xx.
    Status,
    /// The body broke off while being read.
    Read,
    /// The body was larger than `health.max_scrape_bytes` (reading stopped there).
    TooLarge,
    /// A value the gateway reads was NaN, infinite, negative or past its ceiling.
    InvalidValue,
    /// None of the dialect's queue metrics was in the scrape (often the wrong dialect).
    NoMetrics,
}

impl PollFailure {
    /// Every reason, for pre-registering the metric's label values.
    pub const ALL: [PollFailure; 7] = [
        PollFailure::Timeout,
        PollFailure::Connect,
        PollFailure::Status,
        PollFailure::Read,
        PollFailure::TooLarge,
        PollFailure::InvalidValue,
        PollFailure::NoMetrics,
    ];

    /// Metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            PollFailure::Timeout => "timeout",
            PollFailure::Connect => "connect",
            PollFailure::Status => "status",
            PollFailure::Read => "read",
            PollFailure::TooLarge => "too_large",
            PollFailure::InvalidValue => "invalid_value",
            PollFailure::NoMetrics => "no_metrics",
        }
    }
}

/// A failed poll: its reason and a line for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollError {
    /// The counted reason.
    pub reason: PollFailure,
    /// What exactly was wrong.
    pub detail: String,
}

impl PollError {
    /// An error of `reason` described by `detail`.
    pub fn new(reason: PollFailure, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for PollError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason.as_str(), self.detail)
    }
}

fn invalid(name: &str, value: impl std::fmt::Display) -> PollError {
    PollError::new(
        PollFailure::InvalidValue,
        format!("{name} = {value} is out of range"),
    )
}

/// A queue gauge as read: finite, not negative, at most [`MAX_QUEUE`].
fn queue_value(name: &str, value: f64) -> Result<f64, PollError> {
    if value.is_finite() && (0.0..=MAX_QUEUE).contains(&value) {
        Ok(value)
    } else {
        Err(invalid(name, value))
    }
}

/// The metric names an engine family exposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    /// vLLM's `vllm:` metrics.
    Vllm,
    /// SGLang's `sglang:` metrics.
    Sglang,
    /// Hugging Face TGI's `tgi_` metrics.
    Tgi,
    /// infergate's own engine: vLLM names.
    Infergate,
}

impl Dialect {
    /// Whether its workers answer `GET /ready` (503 while warming up): only ours; vLLM binds
    /// after warm-up, and the others keep their health path (the metrics poll).
    pub fn has_ready(self) -> bool {
        matches!(self, Dialect::Infergate)
    }
}

/// Load of one engine as last polled.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    /// Requests queued inside the engine.
    pub waiting: f64,
    /// Requests in the running batch.
    pub running: f64,
    /// KV-cache usage, 0..=1 (0 when the engine does not report it).
    pub kv_usage: f64,
    /// KV capacity in tokens: vLLM's `vllm:cache_config_info` labels `num_gpu_blocks ×
    /// block_size`, SGLang's `sglang:max_total_num_tokens`; `None` when not exported.
    pub kv_capacity: Option<u64>,
    /// Tokens of that capacity whose reused blocks outlive blocks used once (our engine's
    /// segmented LRU: `kv_protected_blocks × block_size` in `vllm:cache_config_info`); `None`
    /// for plain LRU engines.
    pub kv_protected: Option<u64>,
    /// `process_start_time_seconds`, when exported: a change means the engine restarted.
    pub started_at: Option<f64>,
}

struct Names {
    waiting: &'static [&'static str],
    running: &'static [&'static str],
    kv: &'static [&'static str],
    /// A gauge whose value is the KV capacity in tokens.
    capacity_tokens: Option<&'static str>,
    /// An info metric whose `num_gpu_blocks` and `block_size` labels give the capacity.
    cache_info: Option<&'static str>,
}

/// The value of label `name` in a sample line's `{...}`, unquoted.
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let open = line.find('{')?;
    let close = line.rfind('}')?;
    let labels = line.get(open + 1..close)?;
    labels.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == name).then(|| v.trim().trim_matches('"'))
    })
}

/// `blocks_label × block_size` of a cache info line, in tokens: `Ok(None)` when either label is
/// missing or not a number (older exporters), an error when the product overflows or passes
/// [`MAX_KV_CAPACITY_TOKENS`].
fn tokens_from_info(line: &str, blocks_label: &str) -> Result<Option<u64>, PollError> {
    let parsed = |name: &str| label(line, name).and_then(|v| v.parse::<u64>().ok());
    let (Some(blocks), Some(size)) = (parsed(blocks_label), parsed("block_size")) else {
        return Ok(None);
    };
    match blocks.checked_mul(size) {
        Some(0) => Ok(None),
        Some(c) if c <= MAX_KV_CAPACITY_TOKENS => Ok(Some(c)),
        _ => Err(invalid(
            &format!("{blocks_label} × block_size"),
            format!("{blocks} × {size}"),
        )),
    }
}

/// Adds `more` tokens of capacity, invalid past [`MAX_KV_CAPACITY_TOKENS`] in all.
fn add_capacity(total: &mut Option<u64>, more: u64) -> Result<(), PollError> {
    let sum = total.unwrap_or(0).saturating_add(more);
    if sum > MAX_KV_CAPACITY_TOKENS {
        return Err(invalid("KV capacity (tokens)", sum));
    }
    *total = Some(sum);
    Ok(())
}

impl Dialect {
    fn names(self) -> Names {
        match self {
            Dialect::Vllm | Dialect::Infergate => Names {
                waiting: &["vllm:num_requests_waiting"],
                running: &["vllm:num_requests_running"],
                // The older name was replaced by kv_cache_usage_perc in vLLM 0.10.
                kv: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
                capacity_tokens: None,
                cache_info: Some("vllm:cache_config_info"),
            },
            Dialect::Sglang => Names {
                waiting: &["sglang:num_queue_reqs"],
                running: &["sglang:num_running_reqs"],
                kv: &["sglang:token_usage"],
                capacity_tokens: Some("sglang:max_total_num_tokens"),
                cache_info: None,
            },
            Dialect::Tgi => Names {
                waiting: &["tgi_queue_size"],
                running: &["tgi_batch_current_size"],
                kv: &[],
                capacity_tokens: None,
                cache_info: None,
            },
        }
    }
}

/// The sample lines of a Prometheus text scrape, each with its metric name and where the name
/// ends (comments and blank lines skipped).
pub(super) fn samples(text: &str) -> impl Iterator<Item = (&str, &str, usize)> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        Some((line, &line[..name_end], name_end))
    })
}

/// Parses a scrape. Values of the same metric under several label sets (several models or
/// engine cores) are summed; KV usage is averaged over them. Errors with
/// [`PollFailure::NoMetrics`] when none of the dialect's queue metrics is present (usually the
/// wrong dialect), and with [`PollFailure::InvalidValue`] when a value the gateway reads is NaN,
/// infinite, negative or past its ceiling ([`MAX_QUEUE`], [`MAX_KV_CAPACITY_TOKENS`], KV usage
/// outside `0..=1` by more than [`KV_USAGE_SLACK`]). Lines the gateway does not read are ignored.
pub fn parse_load(text: &str, dialect: Dialect) -> Result<EngineLoad, PollError> {
    let names = dialect.names();
    let (mut waiting, mut running, mut kv, mut kv_n) = (None::<f64>, None::<f64>, 0.0, 0u32);
    let mut kv_name: Option<&str> = None;
    let (mut kv_capacity, mut kv_protected, mut started_at) = (None::<u64>, None::<u64>, None);
    for (line, name, name_end) in samples(text) {
        if names.cache_info == Some(name) {
            // An info metric: what matters is in its labels.
            if let Some(c) = tokens_from_info(line, "num_gpu_blocks")? {
                add_capacity(&mut kv_capacity, c)?;
            }
            if let Some(c) = tokens_from_info(line, "kv_protected_blocks")? {
                add_capacity(&mut kv_protected, c)?;
            }
            continue;
        }
        let read = names.waiting.contains(&name)
            || names.running.contains(&name)
            || names.capacity_tokens == Some(name)
            || name == "process_start_time_seconds"
            || names.kv.contains(&name);
        if !read {
            continue;
        }
        // The value follows the labels; an optional timestamp may follow it.
        let rest = match line[name_end..].rfind('}') {
            Some(i) => &line[name_end + i + 1..],
            None => &line[name_end..],
        };
        let raw = rest.split_whitespace().next().unwrap_or("");
        let value = raw
            .parse::<f64>()
            .map_err(|_| invalid(name, format!("{raw:?}")))?;
        if names.waiting.contains(&name) {
            let sum = waiting.unwrap_or(0.0) + queue_value(name, value)?;
            waiting = Some(queue_value(name, sum)?);
        } else if names.running.contains(&name) {
            let sum = running.unwrap_or(0.0) + queue_value(name, value)?;
            running = Some(queue_value(name, sum)?);
        } else if names.capacity_tokens == Some(name) {
            if !value.is_finite() || value < 0.0 || value > MAX_KV_CAPACITY_TOKENS as f64 {
                return Err(invalid(name, value));
            }
            if value >= 1.0 {
                add_capacity(&mut kv_capacity, value as u64)?;
            }
        } else if name == "process_start_time_seconds" {
            if !value.is_finite() || value < 0.0 {
                return Err(invalid(name, value));
            }
            started_at = Some(value);
        } else if kv_name.is_none_or(|n| n == name) {
            if !value.is_finite() || !(-KV_USAGE_SLACK..=1.0 + KV_USAGE_SLACK).contains(&value) {
                return Err(invalid(name, value));
            }
            kv_name = Some(names.kv.iter().copied().find(|n| *n == name).unwrap_or(""));
            kv += value.clamp(0.0, 1.0);
            kv_n += 1;
        }
    }
    if waiting.is_none() && running.is_none() {
        return Err(PollError::new(
            PollFailure::NoMetrics,
            format!(
                "no {} queue metrics ({} / {}) in the scrape",
                dialect_name(dialect),
                names.waiting.join(","),
                names.running.join(",")
            ),
        ));
    }
    Ok(EngineLoad {
        waiting: waiting.unwrap_or(0.0),
        running: running.unwrap_or(0.0),
        kv_usage: if kv_n == 0 {
            0.0
        } else {
            (kv / f64::from(kv_n)).clamp(0.0, 1.0)
        },
        kv_capacity,
        kv_protected,
        started_at,
    })
}

fn dialect_name(d: Dialect) -> &'static str {
    match d {
        Dialect::Vllm => "vllm",
        Dialect::Sglang => "sglang",
        Dialect::Tgi => "tgi",
        Dialect::Infergate => "infergate",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_names_with_labels_and_sums_label_sets() {
        let text = "# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n\
vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 2.0\n\
vllm:num_requests_running{model_name=\"m\"} 7\n\
vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5 1700000000000\n\
vllm:num_requests_waiting_by_reason{reason=\"x\"} 99\n";
        let l = parse_load(text, Dialect::Vllm).unwrap();
        assert_eq!(
            l,
            EngineLoad {
                waiting: 5.0,
                running: 7.0,
                kv_usage: 0.5,
                ..EngineLoad::default()
            }
        );
    }

    #[test]
    fn reads_kv_capacity_and_start_time() {
        let text = "vllm:num_requests_running{model_name=\"m\"} 1\n\
vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",num_gpu_blocks=\"8816\",enable_prefix_caching=\"True\"} 1.0\n\
process_start_time_seconds 1.7e9\n";
        let l = parse_load(text, Dialect::Vllm).unwrap();
        assert_eq!(l.kv_capacity, Some(8816 * 16));
        assert_eq!(l.kv_protected, None, "vLLM evicts plain LRU");
        assert_eq!(l.started_at, Some(1.7e9));
        let ours = "vllm:num_requests_running 1\n\
vllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"True\",kv_protected_blocks=\"4408\",num_gpu_blocks=\"8816\"} 1\n";
        let l = parse_load(ours, Dialect::Infergate).unwrap();
        assert_eq!(l.kv_protected, Some(4408 * 16));
        let s =
            "sglang:num_running_reqs 1\nsglang:max_total_num_tokens{model_name=\"m\"} 161721.0\n";
        assert_eq!(
            parse_load(s, Dialect::Sglang).unwrap().kv_capacity,
            Some(161_721)
        );
        let bare = "vllm:num_requests_running 1\nvllm:cache_config_info{block_size=\"x\"} 1\n";
        assert_eq!(parse_load(bare, Dialect::Vllm).unwrap().kv_capacity, None);
    }

    #[test]
    fn reads_older_vllm_gpu_cache_usage() {
        let text = "vllm:num_requests_running{model_name=\"m\"} 1\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.25\n";
        let l = parse_load(text, Dialect::Infergate).unwrap();
        assert_eq!(l.kv_usage, 0.25);
        assert_eq!(l.waiting, 0.0);
    }

    #[test]
    fn reads_sglang_and_tgi() {
        let s = "sglang:num_queue_reqs{model_name=\"m\"} 4\nsglang:num_running_reqs{model_name=\"m\"} 9\nsglang:token_usage{model_name=\"m\"} 0.75\n";
        assert_eq!(
            parse_load(s, Dialect::Sglang).unwrap(),
            EngineLoad {
                waiting: 4.0,
                running: 9.0,
                kv_usage: 0.75,
                ..EngineLoad::default()
            }
        );
        let t = "tgi_queue_size 2\ntgi_batch_current_size 6\n";
        assert_eq!(
            parse_load(t, Dialect::Tgi).unwrap(),
            EngineLoad {
                waiting: 2.0,
                running: 6.0,
                kv_usage: 0.0,
                ..EngineLoad::default()
            }
        );
    }

    #[test]
    fn wrong_dialect_is_an_error_naming_the_metrics() {
        let err = parse_load("tgi_queue_size 2\n", Dialect::Vllm).unwrap_err();
        assert_eq!(err.reason, PollFailure::NoMetrics);
        assert!(err.detail.contains("vllm:num_requests_waiting"), "{err}");
    }

    #[test]
    fn ignores_junk_lines_and_values_it_does_not_read() {
        let text = "garbage\nvllm:num_requests_running 2\nvllm:other_gauge NaN\nvllm:x -Inf\n";
        assert_eq!(parse_load(text, Dialect::Vllm).unwrap().running, 2.0);
        // A value it does read must be a number.
        let text = "vllm:num_requests_running 2\nvllm:num_requests_waiting lots\n";
        assert_eq!(reason(text, Dialect::Vllm), Some(PollFailure::InvalidValue));
    }

    fn reason(text: &str, dialect: Dialect) -> Option<PollFailure> {
        parse_load(text, dialect).err().map(|e| e.reason)
    }

    #[test]
    fn a_queue_value_out_of_range_makes_the_scrape_invalid() {
        let invalid = Some(PollFailure::InvalidValue);
        for bad in ["NaN", "+Inf", "-Inf", "1e308", "-1", "1000001"] {
            let text = format!("vllm:num_requests_running 1\nvllm:num_requests_waiting {bad}\n");
            assert_eq!(reason(&text, Dialect::Vllm), invalid, "waiting {bad}");
            let text = format!("vllm:num_requests_running {bad}\n");
            assert_eq!(reason(&text, Dialect::Vllm), invalid, "running {bad}");
            let text = format!("sglang:num_queue_reqs {bad}\n");
            assert_eq!(reason(&text, Dialect::Sglang), invalid, "sglang {bad}");
        }
        // Each label set within the ceiling, but their sum past it.
        let text = "tgi_queue_size{a=\"1\"} 600000\ntgi_queue_size{a=\"2\"} 600000\n";
        assert_eq!(reason(text, Dialect::Tgi), invalid);
        // The ceiling itself is still believed.
        let text = "vllm:num_requests_waiting 1000000\n";
        assert_eq!(parse_load(text, Dialect::Vllm).unwrap().waiting, MAX_QUEUE);
    }

    #[test]
    fn kv_usage_is_clamped_within_its_slack_and_invalid_past_it() {
        let run = "vllm:num_requests_running 0\n";
        let ok = format!("{run}vllm:kv_cache_usage_perc 1.005\n");
        assert_eq!(parse_load(&ok, Dialect::Vllm).unwrap().kv_usage, 1.0);
        let ok = format!("{run}vllm:kv_cache_usage_perc -0.001\n");
        assert_eq!(parse_load(&ok, Dialect::Vllm).unwrap().kv_usage, 0.0);
        for bad in ["1.5", "-0.5", "NaN", "Inf", "85"] {
            let text = format!("{run}vllm:kv_cache_usage_perc {bad}\n");
            assert_eq!(
                reason(&text, Dialect::Vllm),
                Some(PollFailure::InvalidValue),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_capacity_claim_past_the_ceiling_makes_the_scrape_invalid() {
        let invalid = Some(PollFailure::InvalidValue);
        let info = |blocks: &str| {
            format!(
                "vllm:num_requests_running 0\nvllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"{blocks}\"}} 1\n"
            )
        };
        assert_eq!(reason(&info("1000000000000"), Dialect::Vllm), invalid);
        assert_eq!(
            reason(&info("18446744073709551615"), Dialect::Vllm),
            invalid
        );
        // Large but believable: 62.5M blocks of 16 = 1e9 tokens.
        let l = parse_load(&info("62500000"), Dialect::Vllm).unwrap();
        assert_eq!(l.kv_capacity, Some(1_000_000_000));
        for bad in ["NaN", "-5", "1.6e13", "Inf"] {
            let text = format!("sglang:num_running_reqs 1\nsglang:max_total_num_tokens {bad}\n");
            assert_eq!(reason(&text, Dialect::Sglang), invalid, "{bad}");
        }
        let text = "vllm:num_requests_running 0\nprocess_start_time_seconds NaN\n";
        assert_eq!(reason(text, Dialect::Vllm), invalid);
    }

    #[test]
    fn every_reason_has_its_own_label() {
        let mut labels: Vec<&str> = PollFailure::ALL.iter().map(|r| r.as_str()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), PollFailure::ALL.len());
    }
}
