//! What doctor measures over its window, whatever the source: counter increases, gauge values
//! and histogram bucket increases of the gateway's metrics, optionally of one pool. Built from
//! two scrapes of the gateway's `/metrics` a window apart ([`WindowData::from_scrapes`]) or
//! from Prometheus ([`super::prom`]). Also the histogram arithmetic doctor needs (quantiles
//! interpolated within buckets as PromQL's `histogram_quantile` does).

use std::collections::HashMap;

use super::expo::Sample;

/// Counters doctor reads (window increase, summed over series).
pub const COUNTERS: [&str; 12] = [
    "infergate_worker_busy_seconds_total",
    "infergate_worker_host_seconds_total",
    "infergate_worker_recomputed_tokens_total",
    "infergate_worker_preemptions_total",
    "infergate_worker_prompt_tokens_total",
    "infergate_worker_generation_tokens_total",
    "infergate_worker_prefix_cache_hits_total",
    "infergate_worker_prefix_cache_queries_total",
    "infergate_tenant_cost_nanousd_total",
    "infergate_tenant_prompt_tokens_total",
    "infergate_tenant_cached_tokens_total",
    "infergate_tenant_completion_tokens_total",
];

/// Gauges doctor reads (per series).
pub const GAUGES: [&str; 6] = [
    "infergate_worker_max_num_seqs",
    "infergate_worker_max_num_batched_tokens",
    "infergate_worker_kv_usage",
    "infergate_worker_running",
    "infergate_worker_waiting",
    "infergate_queue_depth",
];

/// Histograms doctor reads (bucket increases, summed over series by bound).
pub const HISTOGRAMS: [&str; 8] = [
    "infergate_worker_step_gap_seconds",
    "infergate_worker_batch_size",
    "infergate_worker_iteration_tokens",
    "infergate_worker_request_prompt_tokens",
    "infergate_worker_inter_token_latency_seconds",
    "infergate_worker_time_per_output_token_seconds",
    "infergate_ttft_seconds",
    "infergate_inter_chunk_seconds",
];

/// A histogram's increase over the window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hist {
    /// `(le, cumulative count)`, ascending, `+Inf` last.
    pub buckets: Vec<(f64, f64)>,
    /// Increase of `_sum`.
    pub sum: f64,
    /// Increase of `_count`.
    pub count: f64,
}

impl Hist {
    /// Buckets summed over series, sorted by bound; series with different bounds sum to counts
    /// that dip at a bound only some have, and a cumulative count never falls, so each is
    /// read as the running maximum.
    pub fn cumulative(mut buckets: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut seen = 0.0_f64;
        for (_, c) in &mut buckets {
            seen = seen.max(*c);
            *c = seen;
        }
        buckets
    }

    /// Mean observation, `None` without observations.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }

    fn total(&self) -> f64 {
        self.buckets
            .last()
            .map_or(self.count, |b| b.1.max(self.count))
    }

    /// The `q` quantile, linear within its bucket (the `+Inf` bucket answers its lower bound,
    /// as PromQL does); `None` without observations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.total();
        if total <= 0.0 || self.buckets.is_empty() {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total;
        let (mut prev_le, mut prev_cum) = (0.0_f64, 0.0_f64);
        for &(le, cum) in &self.buckets {
            if cum >= rank && cum > prev_cum {
                if !le.is_finite() {
                    return Some(prev_le);
                }
                let within = (rank - prev_cum) / (cum - prev_cum);
                return Some(prev_le + (le - prev_le) * within.clamp(0.0, 1.0));
            }
            prev_le = if le.is_finite() { le } else { prev_le };
            prev_cum = cum;
        }
        Some(prev_le)
    }

    /// The share of observations above `x` (linear within `x`'s bucket; the `+Inf` bucket
    /// counts wholly above); `None` without observations.
    pub fn share_above(&self, x: f64) -> Option<f64> {
        let total = self.total();
        if total <= 0.0 {
            return None;
        }
        let (mut prev_le, mut prev_cum) = (0.0_f64, 0.0_f64);
        for &(le, cum) in &self.buckets {
            if le >= x {
                let at_x = if le.is_finite() && le > prev_le {
                    prev_cum + (cum - prev_cum) * ((x - prev_le) / (le - prev_le)).clamp(0.0, 1.0)
                } else {
                    prev_cum
                };
                return Some(((total - at_x) / total).clamp(0.0, 1.0));
            }
            prev_le = le;
            prev_cum = cum;
        }
        Some(((total - prev_cum) / total).clamp(0.0, 1.0))
    }

    /// The upper bound of the highest bucket holding an observation (a bound on the maximum;
    /// the largest finite bound when that bucket is `+Inf`).
    pub fn max_bound(&self) -> Option<f64> {
        let total = self.total();
        if total <= 0.0 {
            return None;
        }
        let mut last_finite = None;
        for &(le, cum) in &self.buckets {
            if le.is_finite() {
                if cum >= total {
                    return Some(le);
                }
                last_finite = Some(le);
            }
        }
        last_finite
    }
}

/// A counter's increase over the window, summed over its series.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Increase {
    /// Summed increase.
    pub total: f64,
    /// Series that had a value at both ends of the window.
    pub series: usize,
}

/// Everything doctor reads, for one window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowData {
    /// Seconds the window lasted.
    pub window_s: f64,
    /// By name of [`COUNTERS`]; absent when no series had two ends.
    pub counters: HashMap<&'static str, Increase>,
    /// By name of [`GAUGES`]: one value per series.
    pub gauges: HashMap<&'static str, Vec<f64>>,
    /// By name of [`HISTOGRAMS`]; absent when no series had two ends.
    pub hists: HashMap<&'static str, Hist>,
}

/// Keeps `s` when it belongs to `pool` (samples without a pool label are gateway-wide and kept).
fn in_pool(s: &Sample, pool: Option<&str>) -> bool {
    match (pool, s.label("pool")) {
        (Some(want), Some(have)) => want == have,
        _ => true,
    }
}

/// A counter's increase between two values, a drop read as a reset (as PromQL's `increase`).
fn increase(before: f64, after: f64) -> f64 {
    if after >= before {
        after - before
    } else {
        after
    }
}

/// Increases per series of `name` (keyed by all labels, `le` included) between the scrapes.
fn series_increases<'a>(
    before: &'a [Sample],
    after: &'a [Sample],
    name: &str,
    pool: Option<&str>,
) -> Vec<(&'a Sample, f64)> {
    let earlier: HashMap<(String, Option<&str>), f64> = before
        .iter()
        .filter(|s| s.name == name && in_pool(s, pool))
        .map(|s| ((s.series_key(), s.label("le")), s.value))
        .collect();
    after
        .iter()
        .filter(|s| s.name == name && in_pool(s, pool))
        .filter_map(|s| {
            let was = earlier.get(&(s.series_key(), s.label("le")))?;
            Some((s, increase(*was, s.value)))
        })
        .collect()
}

impl WindowData {
    /// The window between two scrapes `window_s` apart, of one pool's series when `pool` is
    /// given (gateway-wide series, such as the tenants' cost, are always read).
    pub fn from_scrapes(
        before: &[Sample],
        after: &[Sample],
        window_s: f64,
        pool: Option<&str>,
    ) -> Self {
        let mut data = WindowData {
            window_s,
            ..Default::default()
        };
        for name in COUNTERS {
            let incs = series_increases(before, after, name, pool);
            if !incs.is_empty() {
                let total = incs.iter().map(|(_, v)| v).sum();
                data.counters.insert(
                    name,
                    Increase {
                        total,
                        series: incs.len(),
                    },
                );
            }
        }
        for name in GAUGES {
            // The mean of the window's two ends, per series (the later end alone if new).
            let values: Vec<f64> = after
                .iter()
                .filter(|s| s.name == name && in_pool(s, pool))
                .map(|s| {
                    before
                        .iter()
                        .find(|b| b.name == s.name && b.labels == s.labels)
                        .map_or(s.value, |b| (b.value + s.value) / 2.0)
                })
                .collect();
            if !values.is_empty() {
                data.gauges.insert(name, values);
            }
        }
        for name in HISTOGRAMS {
            let count = series_increases(before, after, &format!("{name}_count"), pool);
            if count.is_empty() {
                continue;
            }
            let sum = series_increases(before, after, &format!("{name}_sum"), pool);
            let mut buckets: Vec<(f64, f64)> = Vec::new();
            for (s, inc) in series_increases(before, after, &format!("{name}_bucket"), pool) {
                let Some(le) = s.label("le").and_then(|v| v.parse::<f64>().ok()) else {
                    continue;
                };
                match buckets.iter_mut().find(|(b, _)| *b == le) {
                    Some((_, c)) => *c += inc,
                    None => buckets.push((le, inc)),
                }
            }
            data.hists.insert(
                name,
                Hist {
                    buckets: Hist::cumulative(buckets),
                    sum: sum.iter().map(|(_, v)| v).sum(),
                    count: count.iter().map(|(_, v)| v).sum(),
                },
            );
        }
        data
    }

    /// A counter's increase per second of window.
    pub fn rate(&self, name: &str) -> Option<f64> {
        let inc = self.counters.get(name)?;
        (self.window_s > 0.0).then(|| inc.total / self.window_s)
    }

    /// A counter's increase over the window.
    pub fn increase(&self, name: &str) -> Option<f64> {
        self.counters.get(name).map(|i| i.total)
    }

    /// A histogram's increase over the window, when it had observations.
    pub fn hist(&self, name: &str) -> Option<&Hist> {
        self.hists.get(name).filter(|h| h.count > 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::expo::parse_exposition;

    fn hist(buckets: &[(f64, f64)]) -> Hist {
        Hist {
            buckets: buckets.to_vec(),
            sum: 0.0,
            count: buckets.last().map_or(0.0, |b| b.1),
        }
    }

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let h = hist(&[(1.0, 50.0), (2.0, 100.0), (f64::INFINITY, 100.0)]);
        assert_eq!(h.quantile(0.5), Some(1.0));
        assert_eq!(h.quantile(0.75), Some(1.5));
        let tail = hist(&[(1.0, 90.0), (f64::INFINITY, 100.0)]);
        assert_eq!(
            tail.quantile(0.99),
            Some(1.0),
            "+Inf answers its lower bound"
        );
        assert_eq!(hist(&[]).quantile(0.5), None);
        assert_eq!(h.max_bound(), Some(2.0));
        assert_eq!(tail.max_bound(), Some(1.0));
    }

    #[test]
    fn sums_over_different_bounds_never_fall() {
        let b = Hist::cumulative(vec![(f64::INFINITY, 7.0), (1.5, 1.0), (1.0, 5.0)]);
        assert_eq!(b, vec![(1.0, 5.0), (1.5, 5.0), (f64::INFINITY, 7.0)]);
    }

    #[test]
    fn share_above_interpolates_and_counts_inf_wholly() {
        let h = hist(&[(10_000.0, 90.0), (50_000.0, 98.0), (f64::INFINITY, 100.0)]);
        // 30k is half-way through the 10k..50k bucket: 4 of its 8, plus 2 past 50k.
        assert!((h.share_above(30_000.0).unwrap() - 0.06).abs() < 1e-12);
        assert_eq!(h.share_above(60_000.0), Some(0.02));
        assert_eq!(hist(&[]).share_above(1.0), None);
    }

    #[test]
    fn a_window_takes_increases_resets_and_pools() {
        let before = parse_exposition(
            "infergate_worker_busy_seconds_total{pool=\"p\",worker=\"a\"} 10\n\
infergate_worker_busy_seconds_total{pool=\"p\",worker=\"b\"} 50\n\
infergate_worker_busy_seconds_total{pool=\"q\",worker=\"c\"} 0\n\
infergate_worker_running{pool=\"p\",worker=\"a\"} 2\n\
infergate_worker_batch_size_bucket{pool=\"p\",worker=\"a\",le=\"2\"} 1\n\
infergate_worker_batch_size_bucket{pool=\"p\",worker=\"a\",le=\"+Inf\"} 1\n\
infergate_worker_batch_size_sum{pool=\"p\",worker=\"a\"} 2\n\
infergate_worker_batch_size_count{pool=\"p\",worker=\"a\"} 1\n",
        );
        let after = parse_exposition(
            "infergate_worker_busy_seconds_total{pool=\"p\",worker=\"a\"} 13\n\
infergate_worker_busy_seconds_total{pool=\"p\",worker=\"b\"} 1\n\
infergate_worker_busy_seconds_total{pool=\"q\",worker=\"c\"} 9\n\
infergate_worker_busy_seconds_total{pool=\"p\",worker=\"new\"} 100\n\
infergate_worker_running{pool=\"p\",worker=\"a\"} 4\n\
infergate_worker_batch_size_bucket{pool=\"p\",worker=\"a\",le=\"2\"} 5\n\
infergate_worker_batch_size_bucket{pool=\"p\",worker=\"a\",le=\"+Inf\"} 7\n\
infergate_worker_batch_size_sum{pool=\"p\",worker=\"a\"} 20\n\
infergate_worker_batch_size_count{pool=\"p\",worker=\"a\"} 7\n",
        );
        let w = WindowData::from_scrapes(&before, &after, 10.0, Some("p"));
        // a: +3, b: reset to 1, new: no earlier value; c: another pool.
        assert_eq!(
            w.counters["infergate_worker_busy_seconds_total"],
            Increase {
                total: 4.0,
                series: 2
            }
        );
        assert_eq!(w.rate("infergate_worker_busy_seconds_total"), Some(0.4));
        assert_eq!(w.gauges["infergate_worker_running"], vec![3.0]);
        let h = w.hist("infergate_worker_batch_size").unwrap();
        assert_eq!(h.buckets, vec![(2.0, 4.0), (f64::INFINITY, 6.0)]);
        assert_eq!((h.sum, h.count), (18.0, 6.0));
        let all = WindowData::from_scrapes(&before, &after, 10.0, None);
        assert_eq!(
            all.counters["infergate_worker_busy_seconds_total"].series,
            3
        );
    }
}
