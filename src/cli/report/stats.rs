//! From records to numbers: nearest-rank percentiles, goodput against the SLO, throughput and the
//! per-tenant, per-worker and per-path breakdowns.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Breakdown, CachedSummary, Percentiles, Report, RequestRecord};

impl Percentiles {
    /// Nearest-rank percentiles of `values` (the p-th is the ⌈p·n/100⌉-th smallest); NaNs are
    /// ignored, an empty sample gives all zeros.
    pub fn of(values: &[f64]) -> Percentiles {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
        if sorted.is_empty() {
            return Percentiles::default();
        }
        sorted.sort_by(f64::total_cmp);
        let sum: f64 = sorted.iter().sum();
        Percentiles {
            p50: rank(&sorted, 50.0),
            p90: rank(&sorted, 90.0),
            p95: rank(&sorted, 95.0),
            p99: rank(&sorted, 99.0),
            max: sorted[sorted.len() - 1],
            mean: sum / sorted.len() as f64,
        }
    }
}

/// The nearest-rank `p`-th percentile of a sorted, non-empty slice.
fn rank(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    let r = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[r.clamp(1, n) - 1]
}

/// `part / whole`, or 0 when `whole` is 0 (reports never carry NaN).
pub(super) fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { part / whole } else { 0.0 }
}

/// The latency samples of a set of records: TTFTs, every gap and e2e of the successful ones.
pub(super) struct Samples {
    ttft: Vec<f64>,
    pub(super) itl: Vec<f64>,
    e2e: Vec<f64>,
}

impl Samples {
    pub(super) fn of<'a>(records: impl Iterator<Item = &'a RequestRecord>) -> Samples {
        let mut s = Samples {
            ttft: Vec::new(),
            itl: Vec::new(),
            e2e: Vec::new(),
        };
        for r in records.filter(|r| r.ok()) {
            s.ttft.extend(r.ttft);
            s.itl.extend_from_slice(&r.itl);
            s.e2e.push(r.e2e);
        }
        s
    }
}

/// Time per output token after the first, `(e2e − ttft) / (tokens − 1)`, for requests with ≥ 2.
fn tpot(r: &RequestRecord) -> Option<f64> {
    let ttft = r.ttft?;
    (r.ok() && r.output_tokens >= 2).then(|| (r.e2e - ttft) / (r.output_tokens - 1) as f64)
}

/// Summarizes a run of `duration_s` seconds against the SLO.
pub fn summarize(
    title: &str,
    records: &[RequestRecord],
    duration_s: f64,
    slo_ttft: Duration,
    slo_itl: Duration,
) -> Report {
    let (slo_ttft_s, slo_itl_s) = (slo_ttft.as_secs_f64(), slo_itl.as_secs_f64());
    let samples = Samples::of(records.iter());
    let count = |f: &dyn Fn(u16) -> bool| records.iter().filter(|r| f(r.status)).count() as u64;
    let tpots: Vec<f64> = records.iter().filter_map(tpot).collect();
    let ok_records = || records.iter().filter(|r| r.ok());
    let tokens_in: u64 = ok_records().map(|r| r.prompt_tokens).sum();
    let tokens_out: u64 = ok_records().map(|r| r.output_tokens).sum();
    let good = records
        .iter()
        .filter(|r| r.good(slo_ttft_s, slo_itl_s))
        .count();
    let slice =
        |key: fn(&RequestRecord) -> Option<&str>| breakdowns(records, key, slo_ttft_s, slo_itl_s);
    let mut report = Report {
        title: title.to_owned(),
        duration_s,
        requests: records.len() as u64,
        ok: count(&|s| (200..300).contains(&s)),
        rate_limited: count(&|s| s == 429),
        client_errors: count(&|s| (400..500).contains(&s) && s != 429),
        server_errors: count(&|s| !(100..500).contains(&s)),
        ttft: Percentiles::of(&samples.ttft),
        itl: Percentiles::of(&samples.itl),
        tpot_mean: Percentiles::of(&tpots).mean,
        tpot: Percentiles::of(&tpots),
        e2e: Percentiles::of(&samples.e2e),
        tokens_in_per_s: share(tokens_in as f64, duration_s),
        tokens_out_per_s: share(tokens_out as f64, duration_s),
        goodput: share(good as f64, records.len() as f64),
        slo_ttft_s,
        slo_itl_s,
        jain_index: 1.0,
        by_tenant: slice(|r| r.tenant.as_deref()),
        by_worker: slice(|r| r.worker.as_deref()),
        by_path: slice(|r| r.path.as_deref()),
        by_class: super::victims::by_class(records, slo_ttft_s, slo_itl_s),
        victims: super::victims::victims(records, slo_ttft_s, slo_itl_s),
        by_engine: BTreeMap::new(),
        extra: BTreeMap::new(),
        cached_tokens: cached_summary(records),
    };
    report.jain_index = jain_index(&report.by_tenant);
    report
}

/// The explained hit rate over the successful answers that carried it; `None` when none did.
fn cached_summary(records: &[RequestRecord]) -> Option<CachedSummary> {
    let mut s = CachedSummary::default();
    for r in records.iter().filter(|r| r.ok()) {
        if let Some(c) = r.cached {
            s.answers += 1;
            s.prompt_tokens += r.prompt_tokens;
            s.predicted += c.predicted;
            s.delivered += c.delivered;
            s.available += c.available;
        }
    }
    (s.answers > 0).then_some(s)
}

/// Jain's index of each tenant's served tokens over its max-min fair share of all that was
/// served: capacity water-filled over the demands, smallest first.
fn jain_index(by_tenant: &BTreeMap<String, Breakdown>) -> f64 {
    if by_tenant.len() < 2 {
        return 1.0;
    }
    let mut demands: Vec<(f64, f64)> = by_tenant
        .values()
        .map(|b| {
            (
                b.asked_tokens.max(b.served_tokens) as f64,
                b.served_tokens as f64,
            )
        })
        .collect();
    demands.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut left: f64 = demands.iter().map(|d| d.1).sum();
    let n = demands.len();
    let ratios: Vec<f64> = demands
        .iter()
        .enumerate()
        .filter_map(|(i, &(demand, served))| {
            let fair = demand.min(left / (n - i) as f64);
            left -= fair;
            (fair > 0.0).then(|| served / fair)
        })
        .collect();
    let (sum, squares): (f64, f64) = (ratios.iter().sum(), ratios.iter().map(|x| x * x).sum());
    if squares > 0.0 {
        sum * sum / (ratios.len() as f64 * squares)
    } else {
        1.0
    }
}

/// One [`Breakdown`] per distinct key; records without a key are left out.
fn breakdowns(
    records: &[RequestRecord],
    key: fn(&RequestRecord) -> Option<&str>,
    slo_ttft_s: f64,
    slo_itl_s: f64,
) -> BTreeMap<String, Breakdown> {
    let mut groups: BTreeMap<&str, Vec<&RequestRecord>> = BTreeMap::new();
    for r in records {
        if let Some(k) = key(r) {
            groups.entry(k).or_default().push(r);
        }
    }
    groups
        .into_iter()
        .map(|(k, rs)| (k.to_owned(), breakdown(&rs, slo_ttft_s, slo_itl_s)))
        .collect()
}

/// The headline numbers of one slice of the records.
pub(super) fn breakdown(rs: &[&RequestRecord], slo_ttft_s: f64, slo_itl_s: f64) -> Breakdown {
    let s = Samples::of(rs.iter().copied());
    let good = rs.iter().filter(|r| r.good(slo_ttft_s, slo_itl_s)).count();
    let itl = Percentiles::of(&s.itl);
    let worst: Vec<f64> = rs
        .iter()
        .filter(|r| r.ok())
        .filter_map(|r| r.itl.iter().copied().reduce(f64::max))
        .collect();
    Breakdown {
        worst_gap_p99: Percentiles::of(&worst).p99,
        requests: rs.len() as u64,
        ok: rs.iter().filter(|r| r.ok()).count() as u64,
        ttft_p50: Percentiles::of(&s.ttft).p50,
        ttft_p99: Percentiles::of(&s.ttft).p99,
        itl_p99: itl.p99,
        itl_max: itl.max,
        e2e_p99: Percentiles::of(&s.e2e).p99,
        goodput: share(good as f64, rs.len() as f64),
        served_tokens: rs
            .iter()
            .filter(|r| r.ok())
            .map(|r| r.prompt_tokens + r.output_tokens)
            .sum(),
        asked_tokens: rs
            .iter()
            .map(|r| r.prompt_tokens + r.asked_output_tokens)
            .sum(),
    }
}
