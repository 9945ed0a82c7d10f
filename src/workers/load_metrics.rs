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
}

struct Names {
    waiting: &'static [&'static str],
    running: &'static [&'static str],
    kv: &'static [&'static str],
}

impl Dialect {
    fn names(self) -> Names {
        match self {
            Dialect::Vllm | Dialect::Infergate => Names {
                waiting: &["vllm:num_requests_waiting"],
                running: &["vllm:num_requests_running"],
                // The older name was replaced by kv_cache_usage_perc in vLLM 0.10.
                kv: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            },
            Dialect::Sglang => Names {
                waiting: &["sglang:num_queue_reqs"],
                running: &["sglang:num_running_reqs"],
                kv: &["sglang:token_usage"],
            },
            Dialect::Tgi => Names {
                waiting: &["tgi_queue_size"],
                running: &["tgi_batch_current_size"],
                kv: &[],
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
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
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
                kv_usage: 0.5
            }
        );
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
                kv_usage: 0.75
            }
        );
        let t = "tgi_queue_size 2\ntgi_batch_current_size 6\n";
        assert_eq!(
            parse_load(t, Dialect::Tgi).unwrap(),
            EngineLoad {
                waiting: 2.0,
                running: 6.0,
                kv_usage: 0.0
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
