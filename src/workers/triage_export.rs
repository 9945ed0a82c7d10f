//! The triage metrics polled from each worker, exported again in the gateway's `/metrics` under
//! `infergate_worker_*{pool,worker}` (names in [`super::engine_triage`]): counters as counters,
//! caps as gauges, histograms as histograms with the worker's own bucket bounds. Labels stay
//! bounded: pool names from config, worker URLs as discovered, at most
//! [`super::engine_triage::MAX_BUCKETS`] bounds a histogram.
//!
//! A worker's series keep their last polled values until the worker is polled again, or
//! dropped when a reload removes it ([`TriageExport::retain`]).

use std::collections::BTreeMap;
use std::sync::Mutex;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};

use super::engine_triage::{COUNTERS, EngineTriage, GAUGES, HISTOGRAMS, Mirror};

/// The collector: the last triage scrape of each `(pool, worker)`.
pub struct TriageExport {
    descs: Vec<Desc>,
    last: Mutex<BTreeMap<(String, String), EngineTriage>>,
}

fn desc(m: &Mirror) -> Result<Desc, prometheus::Error> {
    Desc::new(
        m.export.to_string(),
        m.help.to_string(),
        vec!["pool".into(), "worker".into()],
        Default::default(),
    )
}

fn labels(pool: &str, worker: &str) -> Vec<LabelPair> {
    let pair = |name: &str, value: &str| {
        let mut l = LabelPair::default();
        l.set_name(name.to_string());
        l.set_value(value.to_string());
        l
    };
    vec![pair("pool", pool), pair("worker", worker)]
}

fn family(m: &Mirror, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(m.export.to_string());
    f.set_help(m.help.to_string());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

impl TriageExport {
    /// An empty collector with a descriptor for every mirrored family.
    pub fn new() -> Result<Self, prometheus::Error> {
        let descs = COUNTERS
            .iter()
            .chain(&GAUGES)
            .chain(&HISTOGRAMS)
            .map(desc)
            .collect::<Result<_, _>>()?;
        Ok(Self {
            descs,
            last: Mutex::default(),
        })
    }

    fn last(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), EngineTriage>> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the latest scrape of `worker` in `pool`.
    pub fn record(&self, pool: &str, worker: &str, triage: EngineTriage) {
        self.last()
            .insert((pool.to_string(), worker.to_string()), triage);
    }

    /// Drops the series of `worker` in `pool` (a worker no longer polled).
    pub fn forget(&self, pool: &str, worker: &str) {
        self.last().remove(&(pool.to_string(), worker.to_string()));
    }

    /// Keeps only the series of `(pool, worker URL)` pairs in `polled` (after a reload removed
    /// workers or pools).
    pub fn retain(&self, polled: &std::collections::HashSet<(String, String)>) {
        self.last().retain(|key, _| polled.contains(key));
    }
}

impl Collector for TriageExport {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let last = self.last();
        let mut out = Vec::new();
        for (i, mirror) in COUNTERS.iter().enumerate() {
            let metrics: Vec<Metric> = last
                .iter()
                .filter_map(|((pool, worker), t)| {
                    let v = t.counters[i]?;
                    let mut c = Counter::default();
                    c.set_value(v);
                    let mut metric = Metric::from_label(labels(pool, worker));
                    metric.set_counter(c);
                    Some(metric)
                })
                .collect();
            if !metrics.is_empty() {
                out.push(family(mirror, MetricType::COUNTER, metrics));
            }
        }
        for (i, mirror) in GAUGES.iter().enumerate() {
            let metrics: Vec<Metric> = last
                .iter()
                .filter_map(|((pool, worker), t)| {
                    let mut g = Gauge::default();
                    g.set_value(t.gauges[i]?);
                    let mut metric = Metric::from_label(labels(pool, worker));
                    metric.set_gauge(g);
                    Some(metric)
                })
                .collect();
            if !metrics.is_empty() {
                out.push(family(mirror, MetricType::GAUGE, metrics));
            }
        }
        for (i, mirror) in HISTOGRAMS.iter().enumerate() {
            let metrics: Vec<Metric> = last
                .iter()
                .filter_map(|((pool, worker), t)| {
                    let data = t.histograms[i].as_ref()?;
                    let mut h = Histogram::default();
                    // Counts were checked finite and within MAX_COUNTER at the poll.
                    h.set_sample_count(data.count.round() as u64);
                    h.set_sample_sum(data.sum);
                    h.set_bucket(
                        data.buckets
                            .iter()
                            // The encoder writes the +Inf bucket from the count itself.
                            .filter(|(le, _)| le.is_finite())
                            .map(|&(le, count)| {
                                let mut b = Bucket::default();
                                b.set_upper_bound(le);
                                b.set_cumulative_count(count.round() as u64);
                                b
                            })
                            .collect(),
                    );
                    let mut metric = Metric::from_label(labels(pool, worker));
                    metric.set_histogram(h);
                    Some(metric)
                })
                .collect();
            if !metrics.is_empty() {
                out.push(family(mirror, MetricType::HISTOGRAM, metrics));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::engine_triage::parse_triage;

    fn render(export: TriageExport) -> String {
        let registry = prometheus::Registry::new();
        registry.register(Box::new(export)).unwrap();
        let mut buf = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut buf,
        )
        .unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn exports_each_worker_under_its_pool_and_url() {
        let export = TriageExport::new().unwrap();
        let text = "infergate_engine_busy_seconds_total 12.5\n\
infergate_engine_max_num_seqs 2\n\
infergate_engine_batch_size_bucket{le=\"1\"} 1\n\
infergate_engine_batch_size_bucket{le=\"2\"} 4\n\
infergate_engine_batch_size_bucket{le=\"+Inf\"} 4\n\
infergate_engine_batch_size_sum 7\n\
infergate_engine_batch_size_count 4\n";
        export.record("chat", "http://a:1", parse_triage(text).unwrap());
        export.record(
            "chat",
            "http://b:2",
            parse_triage("vllm:num_preemptions_total 3\n").unwrap(),
        );
        export.record("gone", "http://c:3", parse_triage(text).unwrap());
        export.forget("gone", "http://c:3");
        export.record("removed", "http://d:4", parse_triage(text).unwrap());
        let polled: std::collections::HashSet<(String, String)> =
            [("chat", "http://a:1"), ("chat", "http://b:2")]
                .map(|(p, w)| (p.to_string(), w.to_string()))
                .into();
        export.retain(&polled);
        let out = render(export);
        assert!(
            out.contains("# TYPE infergate_worker_busy_seconds_total counter"),
            "{out}"
        );
        assert!(
            out.contains(
                "infergate_worker_busy_seconds_total{pool=\"chat\",worker=\"http://a:1\"} 12.5"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "infergate_worker_preemptions_total{pool=\"chat\",worker=\"http://b:2\"} 3"
            )
        );
        assert!(
            out.contains("infergate_worker_max_num_seqs{pool=\"chat\",worker=\"http://a:1\"} 2")
        );
        assert!(out.contains("# TYPE infergate_worker_batch_size histogram"));
        assert!(
            out.contains(
                "infergate_worker_batch_size_bucket{pool=\"chat\",worker=\"http://a:1\",le=\"2\"} 4"
            ),
            "{out}"
        );
        assert!(out.contains(
            "infergate_worker_batch_size_bucket{pool=\"chat\",worker=\"http://a:1\",le=\"+Inf\"} 4"
        ));
        assert!(
            out.contains(
                "infergate_worker_batch_size_count{pool=\"chat\",worker=\"http://a:1\"} 4"
            )
        );
        assert!(!out.contains("gone") && !out.contains("removed"), "{out}");
        // Families nobody exported are absent, not empty.
        assert!(!out.contains("infergate_worker_host_seconds_total"));
    }
}
