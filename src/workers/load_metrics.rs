//! Reads an engine's queue and KV load from its Prometheus `/metrics` text, in the dialect of
//! each engine: vLLM (and ours, which speaks vLLM's), SGLang and TGI.

use serde::Deserialize;

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

/// `num_gpu_blocks × block_size` of a cache info line.
fn capacity_from_info(line: &str) -> Option<u64> {
    let blocks: u64 = label(line, "num_gpu_blocks")?.parse().ok()?;
    let size: u64 = label(line, "block_size")?.parse().ok()?;
    blocks.checked_mul(size).filter(|&c| c > 0)
}

/// Protected tokens from our engine's `kv_protected_blocks` label of the cache-config info.
fn protected_from_info(line: &str) -> Option<u64> {
    let blocks: u64 = label(line, "kv_protected_blocks")?.parse().ok()?;
    let size: u64 = label(line, "block_size")?.parse().ok()?;
    blocks.checked_mul(size).filter(|&c| c > 0)
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

/// Parses a scrape. Values of the same metric under several label sets (several models or
/// engine cores) are summed; KV usage is averaged over them. Errors when none of the dialect's
/// queue metrics is present, which usually means the wrong dialect is configured.
pub fn parse_load(text: &str, dialect: Dialect) -> Result<EngineLoad, String> {
    let names = dialect.names();
    let (mut waiting, mut running, mut kv, mut kv_n) = (None::<f64>, None::<f64>, 0.0, 0u32);
    let mut kv_name: Option<&str> = None;
    let (mut kv_capacity, mut kv_protected, mut started_at) = (None::<u64>, None::<u64>, None);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        if names.cache_info == Some(name) {
            // An info metric: what matters is in its labels.
            if let Some(c) = capacity_from_info(line) {
                *kv_capacity.get_or_insert(0) += c;
            }
            if let Some(c) = protected_from_info(line) {
                *kv_protected.get_or_insert(0) += c;
            }
            continue;
        }
        // The value follows the labels; an optional timestamp may follow it.
        let rest = match line[name_end..].rfind('}') {
            Some(i) => &line[name_end + i + 1..],
            None => &line[name_end..],
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        if !value.is_finite() {
            continue;
        }
        if names.waiting.contains(&name) {
            *waiting.get_or_insert(0.0) += value;
        } else if names.running.contains(&name) {
            *running.get_or_insert(0.0) += value;
        } else if names.capacity_tokens == Some(name) && value >= 1.0 {
            *kv_capacity.get_or_insert(0) += value as u64;
        } else if name == "process_start_time_seconds" {
            started_at = Some(value);
        } else if names.kv.contains(&name) && kv_name.is_none_or(|n| n == name) {
            kv_name = Some(names.kv.iter().copied().find(|n| *n == name).unwrap_or(""));
            kv += value;
            kv_n += 1;
        }
    }
    if waiting.is_none() && running.is_none() {
        return Err(format!(
            "no {} queue metrics ({} / {}) in the scrape",
            dialect_name(dialect),
            names.waiting.join(","),
            names.running.join(",")
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
        assert!(err.contains("vllm:num_requests_waiting"), "{err}");
    }

    #[test]
    fn ignores_junk_lines_and_non_finite_values() {
        let text = "garbage\nvllm:num_requests_running NaN\nvllm:num_requests_running 2\n";
        assert_eq!(parse_load(text, Dialect::Vllm).unwrap().running, 2.0);
    }
}
