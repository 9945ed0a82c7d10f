//! Victims and culprits (issue 43): the figures per workload class and path, and the common
//! class split by whether its requests shared a step with an off-path step. A rare request that
//! leaves the fast path (a long prompt's prefill chunks, a burst past the largest capture size)
//! is slow itself; the split says whether it also slows the common requests that decode beside
//! it, and how much of the common class's tail is theirs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::stats::{Samples, breakdown, share};
use super::{Breakdown, Percentiles, RequestRecord};

/// One class's figures, and the same per execution path of its requests.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClassBreakdown {
    /// Every request of the class.
    #[serde(flatten)]
    pub all: Breakdown,
    /// Its requests by execution path (`graph`, `eager`, `mixed`); those without one left out.
    #[serde(default)]
    pub by_path: BTreeMap<String, Breakdown>,
}

/// The common class (the one with the most requests) split by whether its requests shared a
/// step with an off-path step.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Victims {
    /// The common class; empty when no request names its class.
    pub class: String,
    /// Its requests.
    pub requests: u64,
    /// Of which nobody said whether they shared a step (refused or failed before an answer, or
    /// no flight record reached the client: a gateway relays it only with `debug_headers`).
    pub unknown: u64,
    /// Those that decoded in at least one step that ran eagerly for others.
    pub shared: Breakdown,
    /// Those that never did.
    pub not_shared: Breakdown,
    /// Share of its known requests that shared a step (the base rate of the two shares below).
    pub shared_share: f64,
    /// Of its known requests' inter-token gaps longer than their ITL p99, the share that
    /// belongs to requests that shared a step: "who holds the tail".
    pub tail_share: f64,
    /// Of those gaps longer than the SLO's ITL, the share that belongs to requests that shared
    /// a step.
    pub miss_share: f64,
}

/// One [`ClassBreakdown`] per class named by the records.
pub(super) fn by_class(
    records: &[RequestRecord],
    slo_ttft_s: f64,
    slo_itl_s: f64,
) -> BTreeMap<String, ClassBreakdown> {
    let mut groups: BTreeMap<&str, Vec<&RequestRecord>> = BTreeMap::new();
    for r in records {
        if let Some(c) = r.class.as_deref() {
            groups.entry(c).or_default().push(r);
        }
    }
    groups
        .into_iter()
        .map(|(class, rs)| {
            let mut paths: BTreeMap<&str, Vec<&RequestRecord>> = BTreeMap::new();
            for r in &rs {
                if let Some(p) = r.path.as_deref() {
                    paths.entry(p).or_default().push(r);
                }
            }
            let by_path = paths
                .into_iter()
                .map(|(p, prs)| (p.to_owned(), breakdown(&prs, slo_ttft_s, slo_itl_s)))
                .collect();
            let all = breakdown(&rs, slo_ttft_s, slo_itl_s);
            (class.to_owned(), ClassBreakdown { all, by_path })
        })
        .collect()
}

/// The class with the most requests (the first by name on a tie), if any request names one.
pub fn common_class(records: &[RequestRecord]) -> Option<&str> {
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for c in records.iter().filter_map(|r| r.class.as_deref()) {
        *counts.entry(c).or_default() += 1;
    }
    // `max_by_key` keeps the last of equals: walk the names backwards so the first one wins.
    counts
        .into_iter()
        .rev()
        .max_by_key(|&(_, n)| n)
        .map(|(c, _)| c)
}

/// The common class split by [`RequestRecord::shared`].
pub(super) fn victims(records: &[RequestRecord], slo_ttft_s: f64, slo_itl_s: f64) -> Victims {
    let Some(class) = common_class(records) else {
        return Victims::default();
    };
    let mine: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| r.class.as_deref() == Some(class))
        .collect();
    let pick = |want: bool| -> Vec<&RequestRecord> {
        mine.iter()
            .copied()
            .filter(|r| r.shared == Some(want))
            .collect()
    };
    let (shared, not_shared) = (pick(true), pick(false));
    let known = shared.len() + not_shared.len();
    let gaps = |rs: &[&RequestRecord]| Samples::of(rs.iter().copied()).itl;
    let (shared_gaps, other_gaps) = (gaps(&shared), gaps(&not_shared));
    let all_gaps: Vec<f64> = shared_gaps.iter().chain(&other_gaps).copied().collect();
    let tail_over = |limit: f64| {
        let over = |g: &[f64]| g.iter().filter(|&&x| x > limit).count() as f64;
        share(over(&shared_gaps), over(&shared_gaps) + over(&other_gaps))
    };
    Victims {
        class: class.to_owned(),
        requests: mine.len() as u64,
        unknown: (mine.len() - known) as u64,
        shared: breakdown(&shared, slo_ttft_s, slo_itl_s),
        not_shared: breakdown(&not_shared, slo_ttft_s, slo_itl_s),
        shared_share: share(shared.len() as f64, known as f64),
        tail_share: tail_over(Percentiles::of(&all_gaps).p99),
        miss_share: tail_over(slo_itl_s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u64, class: &str, path: &str, shared: Option<bool>, itl: &[f64]) -> RequestRecord {
        RequestRecord {
            id,
            tenant: None,
            class: Some(class.into()),
            worker: None,
            path: Some(path.into()),
            shared,
            status: 200,
            start: 0.0,
            ttft: Some(0.05),
            itl: itl.to_vec(),
            e2e: 0.05 + itl.iter().sum::<f64>(),
            prompt_tokens: 10,
            output_tokens: itl.len() as u64 + 1,
            asked_output_tokens: itl.len() as u64 + 1,
            cached: None,
        }
    }

    /// 100 short requests with 10 gaps each: 90 never shared a step (10 ms gaps), 8 did
    /// (one 80 ms gap each, the rest 10 ms), 2 unknown; and 2 long ones on the mixed path.
    fn sample() -> Vec<RequestRecord> {
        let mut out = Vec::new();
        for i in 0..90 {
            out.push(rec(i, "short", "graph", Some(false), &[0.01; 10]));
        }
        let mut hit = [0.01; 10];
        hit[3] = 0.08;
        for i in 90..98 {
            out.push(rec(i, "short", "mixed", Some(true), &hit));
        }
        for i in 98..100 {
            out.push(rec(i, "short", "graph", None, &[0.01; 10]));
        }
        for i in 100..102 {
            out.push(rec(i, "long", "mixed", Some(false), &[0.02; 4]));
        }
        out
    }

    #[test]
    fn the_common_class_splits_into_those_that_shared_a_step_and_the_rest() {
        let v = victims(&sample(), 1.0, 0.05);
        assert_eq!(v.class, "short");
        assert_eq!((v.requests, v.unknown), (100, 2));
        assert_eq!((v.shared.requests, v.not_shared.requests), (8, 90));
        assert!((v.shared_share - 8.0 / 98.0).abs() < 1e-12);
        // 980 gaps: 8 of 80 ms, the rest 10 ms; p99 is the 971st smallest, 10 ms, so the eight
        // long gaps are the whole tail, and every SLO miss.
        assert_eq!(v.shared.itl_p99, 0.08);
        assert_eq!(v.shared.itl_max, 0.08);
        assert_eq!(v.not_shared.itl_p99, 0.01);
        assert_eq!(v.tail_share, 1.0);
        assert_eq!(v.miss_share, 1.0);
        assert_eq!(v.not_shared.goodput, 1.0);
        assert_eq!(v.shared.goodput, 0.0);
    }

    #[test]
    fn classes_break_down_by_path() {
        let c = by_class(&sample(), 1.0, 0.05);
        assert_eq!(c.keys().collect::<Vec<_>>(), ["long", "short"]);
        let short = &c["short"];
        assert_eq!(short.all.requests, 100);
        assert_eq!(short.by_path["graph"].requests, 92);
        assert_eq!(short.by_path["mixed"].requests, 8);
        assert_eq!(short.by_path["mixed"].itl_max, 0.08);
        assert_eq!(c["long"].by_path.len(), 1);
        assert_eq!(c["long"].all.itl_p99, 0.02);
        // Flattened: a class's own figures sit beside its `by_path`.
        let json = serde_json::to_value(short).unwrap();
        assert_eq!(json["requests"], 100);
        assert_eq!(json["by_path"]["mixed"]["requests"], 8);
        let back: ClassBreakdown = serde_json::from_value(json).unwrap();
        assert_eq!(&back, short);
    }

    #[test]
    fn no_class_no_split_and_ties_go_to_the_first_name() {
        let mut plain = sample();
        plain.iter_mut().for_each(|r| r.class = None);
        assert_eq!(victims(&plain, 1.0, 0.05), Victims::default());
        assert!(by_class(&plain, 1.0, 0.05).is_empty());
        let tie = vec![
            rec(0, "b", "graph", None, &[]),
            rec(1, "a", "graph", None, &[]),
        ];
        assert_eq!(common_class(&tie), Some("a"));
        let v = victims(&tie, 1.0, 0.05);
        assert_eq!((v.requests, v.unknown, v.tail_share), (1, 1, 0.0));
    }
}
