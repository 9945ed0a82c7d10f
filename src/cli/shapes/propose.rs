//! Capture sizes chosen from traffic: the fewest-padding set of at most `max_sizes` sizes whose
//! largest covers a target share of a training window's decode-only steps, and its coverage on
//! any window. Pure over decode steps by batch size (`dist::decode_steps`).
//!
//! A decode-only batch of `b` replays the graph of the smallest capture size `>= b`, so which
//! steps a set covers depends only on its largest size; the other sizes decide the padding
//! (`size - b` empty slots a step computes). The largest is the smallest batch size seen at
//! which the cumulative share of steps reaches the target; the rest split the sizes below it
//! into groups, each padded to its top, chosen by dynamic programming to pad the fewest slots.

use std::collections::BTreeMap;

use infergate_engine::exec_path::MAX_CAPTURE_SIZE;
use serde::Serialize;

use super::dist::{round3, share};
use super::trace::Request;

/// A proposal's capture sizes and whether they reach the target.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    /// Capture sizes, ascending (empty: the window had no decode-only step).
    pub sizes: Vec<u32>,
    /// Whether they cover the target share of the window's decode-only steps (not when that
    /// needs a size above the engine's largest, 512).
    pub reached: bool,
}

/// How a set of capture sizes does on one window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Coverage {
    /// Requests in the window.
    pub requests: u64,
    /// Decode-only engine steps in the window.
    pub decode_steps: f64,
    /// Of which a capture size holds (graph path).
    pub covered_steps: f64,
    /// `covered_steps / decode_steps` (1 without decode steps: nothing to miss).
    pub coverage: f64,
    /// Share of the covered steps' batch slots that are padding.
    pub padding_share: f64,
}

/// Splits requests (ordered by arrival) into the first `train_until` of them and the rest; the
/// training window keeps at least one request when there is one.
pub fn split(requests: &[Request], train_until: f64) -> (&[Request], &[Request]) {
    let n = requests.len();
    let k = ((n as f64 * train_until.clamp(0.0, 1.0)).round() as usize).clamp(n.min(1), n);
    requests.split_at(k)
}

/// Proposes at most `max_sizes` capture sizes covering `target` of `steps` (decode-only steps
/// by batch size).
pub fn propose(steps: &BTreeMap<u32, f64>, target: f64, max_sizes: usize) -> Proposal {
    let total: f64 = steps.values().sum();
    let limit = u32::try_from(MAX_CAPTURE_SIZE).unwrap_or(u32::MAX);
    let usable: Vec<(u32, f64)> = steps
        .iter()
        .filter(|&(&b, &s)| b <= limit && s > 0.0)
        .map(|(&b, &s)| (b, s))
        .collect();
    if total <= 0.0 || usable.is_empty() || max_sizes == 0 {
        return Proposal {
            sizes: Vec::new(),
            reached: total <= 0.0,
        };
    }
    // The smallest largest size reaching the target.
    let mut cum = 0.0;
    let mut top = usable.len() - 1;
    let mut reached = false;
    for (i, &(_, s)) in usable.iter().enumerate() {
        cum += s;
        if cum / total >= target - 1e-9 {
            top = i;
            reached = true;
            break;
        }
    }
    let xs = &usable[..=top];
    Proposal {
        sizes: least_padding(xs, max_sizes.min(xs.len())),
        reached,
    }
}

/// Splits `xs` (ascending sizes with their steps) into `k` contiguous groups padded to their
/// tops, with the fewest padded slots; returns the tops (the last is always `xs`'s last).
fn least_padding(xs: &[(u32, f64)], k: usize) -> Vec<u32> {
    let m = xs.len();
    if m == 0 || k == 0 {
        return Vec::new();
    }
    // Padding of the group xs[i..=j] padded to xs[j]: prefix sums of steps and of steps x size.
    let mut steps = vec![0.0; m + 1];
    let mut slots = vec![0.0; m + 1];
    for (i, &(b, s)) in xs.iter().enumerate() {
        steps[i + 1] = steps[i] + s;
        slots[i + 1] = slots[i] + s * f64::from(b);
    }
    let pad = |i: usize, j: usize| {
        f64::from(xs[j].0) * (steps[j + 1] - steps[i]) - (slots[j + 1] - slots[i])
    };
    // best[g][j]: least padding of xs[..=j] in g + 1 groups; from[g][j]: where its last starts.
    let mut best = vec![vec![f64::INFINITY; m]; k];
    let mut from = vec![vec![0usize; m]; k];
    for (j, b) in best[0].iter_mut().enumerate() {
        *b = pad(0, j);
    }
    for g in 1..k {
        for j in g..m {
            for i in g..=j {
                let c = best[g - 1][i - 1] + pad(i, j);
                if c < best[g][j] - 1e-12 {
                    best[g][j] = c;
                    from[g][j] = i;
                }
            }
        }
    }
    let mut tops = Vec::with_capacity(k);
    let (mut g, mut j) = (k - 1, m - 1);
    loop {
        tops.push(xs[j].0);
        if g == 0 {
            break;
        }
        j = from[g][j] - 1;
        g -= 1;
    }
    tops.reverse();
    tops
}

/// How `sizes` do on `steps`, a window of `requests` requests.
pub fn coverage(steps: &BTreeMap<u32, f64>, sizes: &[u32], requests: usize) -> Coverage {
    let mut sorted = sizes.to_vec();
    sorted.sort_unstable();
    let (mut total, mut covered, mut real, mut padded) = (0.0, 0.0, 0.0, 0.0);
    for (&b, &s) in steps {
        total += s;
        let i = sorted.partition_point(|&c| c < b);
        if let Some(&size) = sorted.get(i) {
            covered += s;
            real += s * f64::from(b);
            padded += s * f64::from(size - b);
        }
    }
    Coverage {
        requests: requests as u64,
        decode_steps: round3(total),
        covered_steps: round3(covered),
        coverage: if total > 0.0 {
            share(covered, total)
        } else {
            1.0
        },
        padding_share: share(padded, real + padded),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(pairs: &[(u32, f64)]) -> BTreeMap<u32, f64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn the_largest_size_is_the_smallest_reaching_the_target() {
        // 90% of steps at batch <= 4, 5% at 12, 5% at 40.
        let s = steps(&[(1, 30.0), (3, 30.0), (4, 30.0), (12, 5.0), (40, 5.0)]);
        let p = propose(&s, 0.95, 8);
        assert_eq!(p.sizes, vec![1, 3, 4, 12]);
        assert!(p.reached);
        assert_eq!(coverage(&s, &p.sizes, 10).coverage, 0.95);
        assert_eq!(propose(&s, 0.9, 8).sizes, vec![1, 3, 4]);
        assert_eq!(propose(&s, 1.0, 8).sizes.last(), Some(&40));
        assert!(propose(&s, 1.0, 8).reached);
    }

    #[test]
    fn fewer_sizes_pad_the_least() {
        let s = steps(&[(1, 100.0), (2, 1.0), (7, 1.0), (8, 100.0)]);
        // Two sizes: 1 and 8 (padding 1x6 + 1x1 slots), not 2 and 8 (100 slots).
        assert_eq!(propose(&s, 1.0, 2).sizes, vec![1, 8]);
        assert_eq!(propose(&s, 1.0, 1).sizes, vec![8]);
        let c = coverage(&s, &[1, 8], 4);
        assert_eq!(c.coverage, 1.0);
        // 7 padded slots beside 909 real ones.
        assert_eq!(c.padding_share, share(7.0, 916.0));
        assert_eq!(coverage(&s, &[1, 2], 4).coverage, share(101.0, 202.0));
        assert_eq!(propose(&s, 1.0, 10).sizes, vec![1, 2, 7, 8]);
    }

    #[test]
    fn sizes_past_the_engines_largest_cannot_be_proposed() {
        let s = steps(&[(8, 10.0), (600, 90.0)]);
        let p = propose(&s, 0.95, 4);
        assert_eq!(p.sizes, vec![8]);
        assert!(!p.reached);
        let none = propose(&BTreeMap::new(), 0.95, 4);
        assert!(none.sizes.is_empty() && none.reached);
        let c = coverage(&BTreeMap::new(), &[], 0);
        assert_eq!((c.coverage, c.decode_steps), (1.0, 0.0));
    }

    #[test]
    fn the_training_window_is_the_first_share_by_arrival() {
        let rs: Vec<Request> = (0..10)
            .map(|i| Request {
                start_ms: i,
                ..Request::default()
            })
            .collect();
        let (a, b) = split(&rs, 0.7);
        assert_eq!((a.len(), b.len()), (7, 3));
        assert_eq!(b[0].start_ms, 7);
        assert_eq!(split(&rs, 0.0).0.len(), 1);
        assert_eq!(split(&rs, 1.0).1.len(), 0);
        assert_eq!(split(&[], 0.5).0.len(), 0);
    }
}
