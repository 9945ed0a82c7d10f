//! The engines' side of a simulated run: per worker and over the fleet, the numbers that tell
//! the five on-call symptoms apart (issue 44): busy and host shares of the run, batch sizes,
//! queue, preemptions and recomputed tokens; and what the ledger would bill (cost per 1k tokens
//! and the cached share of prompt tokens) under the gateway config's prices.

use std::collections::BTreeMap;

use super::worker::{WorkerStats, count_percentile};
use crate::report::{EngineBreakdown, RequestRecord};
use infergate::pricing::{Prices, TokenCounts};

/// `a / b`, or 0 when `b` is 0.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// One row per worker over a run of `end` seconds.
pub(super) fn by_engine(stats: &[WorkerStats], end: f64) -> BTreeMap<String, EngineBreakdown> {
    stats
        .iter()
        .map(|s| {
            let row = EngineBreakdown {
                busy_fraction: ratio(s.busy_seconds, end),
                host_fraction: ratio(s.host_seconds, end),
                batch_mean: s.batch_mean(),
                batch_p95: count_percentile(&s.batch_counts, 95.0),
                queue_mean: ratio(s.queue_area, end),
                preemptions: s.preemptions,
                recomputed_tokens: s.recomputed_tokens,
            };
            (s.name.clone(), row)
        })
        .collect()
}

/// Fleet numbers for the report's `extra`: busy and host shares averaged over the workers, batch
/// sizes over every step of every worker, the engine queues' total and the recomputed tokens.
pub(super) fn fleet_extra(stats: &[WorkerStats], end: f64) -> Vec<(&'static str, f64)> {
    let sum = |f: fn(&WorkerStats) -> f64| stats.iter().map(f).sum::<f64>();
    let worker_seconds = end * stats.len() as f64;
    let mut counts: Vec<u64> = Vec::new();
    for s in stats {
        if counts.len() < s.batch_counts.len() {
            counts.resize(s.batch_counts.len(), 0);
        }
        for (n, c) in s.batch_counts.iter().enumerate() {
            counts[n] += c;
        }
    }
    let all = WorkerStats {
        batch_counts: counts,
        ..WorkerStats::default()
    };
    vec![
        (
            "busy_fraction",
            ratio(sum(|s| s.busy_seconds), worker_seconds),
        ),
        (
            "host_fraction",
            ratio(sum(|s| s.host_seconds), worker_seconds),
        ),
        ("batch_mean", all.batch_mean()),
        ("batch_p95", count_percentile(&all.batch_counts, 95.0)),
        ("engine_queue_mean", ratio(sum(|s| s.queue_area), end)),
        ("recomputed_tokens", sum(|s| s.recomputed_tokens)),
    ]
}

/// What the ledger would bill for the successful requests under `prices` (tier multipliers left
/// out): cost per 1,000 tokens (prompt and completion) in USD, and the cached share of prompt
/// tokens. The cost is left out when the model has no price.
pub(super) fn cost_extra(
    prices: &Prices,
    model: &str,
    records: &[RequestRecord],
    cached: u64,
) -> Vec<(&'static str, f64)> {
    let ok = || records.iter().filter(|r| r.ok());
    let prompt: u64 = ok().map(|r| r.prompt_tokens).sum();
    let completion: u64 = ok().map(|r| r.output_tokens).sum();
    let mut out = vec![("cached_share", ratio(cached as f64, prompt as f64))];
    if let Some(price) = prices.price_of(model, model) {
        let tokens = TokenCounts {
            prompt,
            cached,
            completion,
        };
        let nano = price.cost(tokens, 1_000_000) as f64;
        let per_1k = ratio(nano / 1e9, (prompt + completion) as f64 / 1000.0);
        out.push(("cost_per_1k_tokens_usd", per_1k));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(name: &str, busy: f64, host: f64, batches: &[(usize, u64)]) -> WorkerStats {
        let mut counts = vec![0; 1 + batches.iter().map(|b| b.0).max().unwrap_or(0)];
        for &(n, c) in batches {
            counts[n] = c;
        }
        WorkerStats {
            name: name.into(),
            busy_seconds: busy,
            host_seconds: host,
            batch_counts: counts,
            queue_area: 50.0,
            ..WorkerStats::default()
        }
    }

    #[test]
    fn rows_and_fleet_numbers_divide_by_the_run() {
        let w = [
            stats("w00", 3.0, 6.0, &[(8, 95), (2, 5)]),
            stats("w01", 5.0, 1.0, &[(1, 100)]),
        ];
        let rows = by_engine(&w, 10.0);
        assert_eq!(rows["w00"].busy_fraction, 0.3);
        assert_eq!(rows["w00"].host_fraction, 0.6);
        assert!((rows["w00"].batch_mean - 7.7).abs() < 1e-9);
        assert_eq!(rows["w00"].batch_p95, 8.0);
        assert_eq!(rows["w00"].queue_mean, 5.0);
        let fleet: BTreeMap<_, _> = fleet_extra(&w, 10.0).into_iter().collect();
        assert_eq!(fleet["busy_fraction"], 0.4);
        assert_eq!(fleet["host_fraction"], 0.35);
        // 200 steps: 100 of 1, 5 of 2, 95 of 8 → p95 is the 190th smallest, an 8.
        assert_eq!(fleet["batch_p95"], 8.0);
        assert_eq!(fleet["engine_queue_mean"], 10.0);
    }

    #[test]
    fn cached_tokens_lower_the_cost_per_token() {
        let usd = |p: f64| infergate::pricing::usd_per_million(p).unwrap_or_default();
        let price = infergate::pricing::ModelPrice {
            input: usd(0.20),
            cached_input: usd(0.05),
            output: usd(0.60),
        };
        let prices = Prices {
            version: 1,
            models: [("m".to_string(), price)].into_iter().collect(),
            tier_multipliers: BTreeMap::new(),
        };
        let record = RequestRecord {
            id: 0,
            tenant: None,
            class: None,
            worker: None,
            path: None,
            shared: None,
            status: 200,
            start: 0.0,
            ttft: Some(0.1),
            itl: vec![],
            e2e: 1.0,
            prompt_tokens: 1900,
            output_tokens: 100,
            asked_output_tokens: 100,
            cached: None,
        };
        let cost = |cached| -> BTreeMap<_, _> {
            cost_extra(&prices, "m", std::slice::from_ref(&record), cached)
                .into_iter()
                .collect()
        };
        // 1,900 × 0.20 + 100 × 0.60 = 440 µUSD per 2,000 tokens: 0.22 mUSD per 1k.
        assert!((cost(0)["cost_per_1k_tokens_usd"] - 0.00022).abs() < 1e-12);
        // 1,800 cached: 100 × 0.20 + 1,800 × 0.05 + 100 × 0.60 = 170 µUSD → 0.085 mUSD per 1k.
        let cached = cost(1800);
        assert!((cached["cost_per_1k_tokens_usd"] - 0.000085).abs() < 1e-12);
        assert!((cached["cached_share"] - 1800.0 / 1900.0).abs() < 1e-12);
        assert!(
            !cost_extra(&prices, "other", &[record], 0)
                .iter()
                .any(|(k, _)| *k == "cost_per_1k_tokens_usd")
        );
    }
}
