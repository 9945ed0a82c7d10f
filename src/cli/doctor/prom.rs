//! `infergate doctor --prometheus URL`: the same window read through PromQL instead of two
//! scrapes, from a Prometheus that scrapes the gateway's admin `/metrics`. Each counter becomes
//! `sum(increase(...[W]))`, each gauge `avg_over_time(...[W])` per series, each histogram its
//! buckets' `sum by (le) (increase(...[W]))`; the rules then see the same [`WindowData`].

use std::time::Duration;

use serde_json::Value;

use super::window::{COUNTERS, GAUGES, HISTOGRAMS, Hist, Increase, WindowData};

/// The label selector of `name`: `{pool="…"}` for per-pool series when a pool is asked for
/// (the tenants' counters are gateway-wide and never filtered).
fn selector(name: &str, pool: Option<&str>) -> String {
    match pool {
        Some(p) if !name.starts_with("infergate_tenant_") => {
            let escaped = p.replace('\\', "\\\\").replace('"', "\\\"");
            format!("{name}{{pool=\"{escaped}\"}}")
        }
        _ => name.to_string(),
    }
}

/// A PromQL range of `window`, in whole seconds (at least 1).
fn range(window: Duration) -> String {
    format!("[{}s]", window.as_secs().max(1))
}

/// Every query of one window, with what its answer fills.
#[derive(Debug, Clone, PartialEq)]
pub enum Query {
    /// Increase of a counter (`sum`), and its series (`count`).
    Counter(&'static str, String, String),
    /// Per-series average of a gauge.
    Gauge(&'static str, String),
    /// A histogram's bucket increases by `le`, its `_sum` and its `_count` increases.
    Histogram(&'static str, String, String, String),
}

/// The queries of one window.
pub fn queries(window: Duration, pool: Option<&str>) -> Vec<Query> {
    let r = range(window);
    let mut out = Vec::new();
    for name in COUNTERS {
        let sel = selector(name, pool);
        out.push(Query::Counter(
            name,
            format!("sum(increase({sel}{r}))"),
            format!("count(count_over_time({sel}{r}))"),
        ));
    }
    for name in GAUGES {
        out.push(Query::Gauge(
            name,
            format!("avg_over_time({}{r})", selector(name, pool)),
        ));
    }
    for name in HISTOGRAMS {
        let part = |suffix: &str| selector(&format!("{name}{suffix}"), pool);
        out.push(Query::Histogram(
            name,
            format!("sum by (le) (increase({}{r}))", part("_bucket")),
            format!("sum(increase({}{r}))", part("_sum")),
            format!("sum(increase({}{r}))", part("_count")),
        ));
    }
    out
}

/// Percent-encodes a query parameter (RFC 3986 unreserved characters pass).
pub fn encode(q: &str) -> String {
    let mut out = String::with_capacity(q.len() * 3);
    for b in q.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One series of an instant-query answer: its labels and value.
pub type Series = (serde_json::Map<String, Value>, f64);

/// The samples of an instant-query answer: each series' labels and value. An error when
/// Prometheus said so or the answer is not one.
pub fn parse_answer(body: &str) -> Result<Vec<Series>, String> {
    let v: Value =
        serde_json::from_str(body).map_err(|e| format!("not a Prometheus answer: {e}"))?;
    if v["status"] != "success" {
        return Err(format!(
            "Prometheus answered {}: {}",
            v["status"],
            v["error"].as_str().unwrap_or("")
        ));
    }
    let result = v["data"]["result"]
        .as_array()
        .ok_or("a Prometheus answer without data.result")?;
    Ok(result
        .iter()
        .filter_map(|r| {
            let value = r["value"][1].as_str()?.parse::<f64>().ok()?;
            let labels = r["metric"].as_object().cloned().unwrap_or_default();
            value.is_finite().then_some((labels, value))
        })
        .collect())
}

/// Fills a window from the answers of [`queries`]; `ask` runs one query.
pub async fn window<F, Fut>(
    window: Duration,
    pool: Option<&str>,
    ask: F,
) -> Result<WindowData, String>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let one = |samples: Vec<Series>| samples.first().map(|s| s.1);
    let mut data = WindowData {
        window_s: window.as_secs().max(1) as f64,
        ..Default::default()
    };
    for q in queries(window, pool) {
        match q {
            Query::Counter(name, inc, count) => {
                let total = one(parse_answer(&ask(inc).await?)?);
                let series = one(parse_answer(&ask(count).await?)?);
                if let (Some(total), Some(series)) = (total, series) {
                    data.counters.insert(
                        name,
                        Increase {
                            total,
                            series: series as usize,
                        },
                    );
                }
            }
            Query::Gauge(name, q) => {
                let values: Vec<f64> = parse_answer(&ask(q).await?)?
                    .into_iter()
                    .map(|s| s.1)
                    .collect();
                if !values.is_empty() {
                    data.gauges.insert(name, values);
                }
            }
            Query::Histogram(name, buckets, sum, count) => {
                let Some(count) = one(parse_answer(&ask(count).await?)?) else {
                    continue;
                };
                let sum = one(parse_answer(&ask(sum).await?)?).unwrap_or(0.0);
                let b: Vec<(f64, f64)> = parse_answer(&ask(buckets).await?)?
                    .into_iter()
                    .filter_map(|(labels, v)| {
                        let le = labels.get("le")?.as_str()?.parse::<f64>().ok()?;
                        Some((le, v))
                    })
                    .collect();
                data.hists.insert(
                    name,
                    Hist {
                        buckets: Hist::cumulative(b),
                        sum,
                        count,
                    },
                );
            }
        }
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_filter_per_pool_series_only() {
        let qs = queries(Duration::from_secs(30), Some("chat"));
        assert!(
            qs.contains(&Query::Counter(
                "infergate_worker_busy_seconds_total",
                "sum(increase(infergate_worker_busy_seconds_total{pool=\"chat\"}[30s]))".into(),
                "count(count_over_time(infergate_worker_busy_seconds_total{pool=\"chat\"}[30s]))"
                    .into(),
            ))
        );
        assert!(qs.contains(&Query::Counter(
            "infergate_tenant_cost_nanousd_total",
            "sum(increase(infergate_tenant_cost_nanousd_total[30s]))".into(),
            "count(count_over_time(infergate_tenant_cost_nanousd_total[30s]))".into(),
        )));
        assert!(qs.contains(&Query::Histogram(
            "infergate_worker_batch_size",
            "sum by (le) (increase(infergate_worker_batch_size_bucket{pool=\"chat\"}[30s]))".into(),
            "sum(increase(infergate_worker_batch_size_sum{pool=\"chat\"}[30s]))".into(),
            "sum(increase(infergate_worker_batch_size_count{pool=\"chat\"}[30s]))".into(),
        )));
    }

    #[test]
    fn encodes_a_query() {
        assert_eq!(
            encode("sum(x{a=\"b\"}[30s])"),
            "sum%28x%7Ba%3D%22b%22%7D%5B30s%5D%29"
        );
    }

    #[test]
    fn parses_answers_and_errors() {
        let ok = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"le":"2"},"value":[1.0,"4"]},{"metric":{},"value":[1.0,"NaN"]}]}}"#;
        let s = parse_answer(ok).unwrap();
        assert_eq!(s.len(), 1, "NaN is dropped");
        assert_eq!(s[0].1, 4.0);
        let err = r#"{"status":"error","error":"parse error"}"#;
        assert!(parse_answer(err).unwrap_err().contains("parse error"));
        assert!(parse_answer("<html>").is_err());
    }

    #[tokio::test]
    async fn a_window_from_answers() {
        let answer = |q: String| async move {
            let v = if q.contains("busy_seconds") && q.starts_with("sum(") {
                r#"[{"metric":{},"value":[0,"15"]}]"#
            } else if q.contains("busy_seconds") {
                r#"[{"metric":{},"value":[0,"2"]}]"#
            } else if q.starts_with("avg_over_time(infergate_worker_running") {
                r#"[{"metric":{"worker":"a"},"value":[0,"3"]},{"metric":{"worker":"b"},"value":[0,"5"]}]"#
            } else if q.contains("batch_size_bucket") {
                r#"[{"metric":{"le":"+Inf"},"value":[0,"10"]},{"metric":{"le":"2"},"value":[0,"10"]}]"#
            } else if q.contains("batch_size_sum") {
                r#"[{"metric":{},"value":[0,"20"]}]"#
            } else if q.contains("batch_size_count") {
                r#"[{"metric":{},"value":[0,"10"]}]"#
            } else {
                "[]"
            };
            Ok(format!(r#"{{"status":"success","data":{{"result":{v}}}}}"#))
        };
        let w = window(Duration::from_secs(30), None, answer).await.unwrap();
        assert_eq!(w.rate("infergate_worker_busy_seconds_total"), Some(0.5));
        assert_eq!(w.counters["infergate_worker_busy_seconds_total"].series, 2);
        assert_eq!(w.gauges["infergate_worker_running"], vec![3.0, 5.0]);
        let h = w.hist("infergate_worker_batch_size").unwrap();
        assert_eq!(h.buckets, vec![(2.0, 10.0), (f64::INFINITY, 10.0)]);
        assert_eq!(h.mean(), Some(2.0));
        assert!(
            !w.counters
                .contains_key("infergate_worker_host_seconds_total")
        );
    }
}
