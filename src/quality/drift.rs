//! Drift scores of a distribution between a reference window and the current one: the
//! Population Stability Index over fixed bins, `PSI = sum (a - e) ln(a / e)` with `e` the
//! reference share of a bin and `a` the current one (an empty bin counts as a small share, so
//! the score stays finite), and the two-sample Kolmogorov-Smirnov statistic over the same bins
//! (the largest gap between the cumulative shares). The usual reading of PSI: under 0.1 stable,
//! 0.1-0.2 a moderate shift, above 0.2 a significant one.

/// Share an empty bin counts as (on either side), so that `ln(a / e)` stays finite.
const EMPTY_SHARE: f64 = 1e-4;

/// Counts of values in fixed bins: `edges` ascending, bin `i` holds values in
/// `[edges[i-1], edges[i])`, bin 0 everything below `edges[0]`, the last everything from the
/// last edge up.
#[derive(Debug, Clone, PartialEq)]
pub struct Binned {
    edges: Vec<f64>,
    counts: Vec<u64>,
}

impl Binned {
    /// Empty bins at `edges` (sorted; non-finite edges dropped).
    pub fn new(edges: &[f64]) -> Self {
        let mut edges: Vec<f64> = edges.iter().copied().filter(|e| e.is_finite()).collect();
        edges.sort_by(f64::total_cmp);
        edges.dedup();
        let counts = vec![0; edges.len() + 1];
        Self { edges, counts }
    }

    /// Bins for token lengths: powers of two from 16 to 128 Ki.
    pub fn lengths() -> Self {
        let edges: Vec<f64> = (4..=17).map(|p| f64::from(1u32 << p)).collect();
        Self::new(&edges)
    }

    /// Bins for shares in [0, 1]: tenths.
    pub fn shares() -> Self {
        let edges: Vec<f64> = (1..10).map(|i| f64::from(i) / 10.0).collect();
        Self::new(&edges)
    }

    /// Counts `value` (NaN is ignored).
    pub fn add(&mut self, value: f64) {
        if value.is_nan() {
            return;
        }
        let bin = self.edges.partition_point(|e| *e <= value);
        self.counts[bin] += 1;
    }

    /// Counts one value of a categorical bin `index` (for finish reasons and the like).
    pub fn add_to_bin(&mut self, index: usize) {
        if let Some(c) = self.counts.get_mut(index) {
            *c += 1;
        }
    }

    /// Values counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The counts per bin.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Each bin's share of the total (all 0 when empty).
    fn shares_of(&self) -> Vec<f64> {
        let total = self.total() as f64;
        self.counts
            .iter()
            .map(|&c| if total > 0.0 { c as f64 / total } else { 0.0 })
            .collect()
    }
}

/// Why two windows cannot be compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotComparable {
    /// Different bins.
    Bins,
    /// A window holds fewer values than asked for.
    TooFew,
}

/// PSI of `current` against `reference`, each needing at least `min_count` values.
pub fn psi(reference: &Binned, current: &Binned, min_count: u64) -> Result<f64, NotComparable> {
    comparable(reference, current, min_count)?;
    let (e, a) = (reference.shares_of(), current.shares_of());
    Ok(e.iter()
        .zip(&a)
        .map(|(&e, &a)| {
            let (e, a) = (e.max(EMPTY_SHARE), a.max(EMPTY_SHARE));
            (a - e) * (a / e).ln()
        })
        .sum())
}

/// The Kolmogorov-Smirnov statistic of the binned windows: the largest gap between their
/// cumulative shares.
pub fn ks(reference: &Binned, current: &Binned, min_count: u64) -> Result<f64, NotComparable> {
    comparable(reference, current, min_count)?;
    let (e, a) = (reference.shares_of(), current.shares_of());
    let (mut ce, mut ca, mut gap) = (0.0f64, 0.0f64, 0.0f64);
    for (e, a) in e.iter().zip(&a) {
        ce += e;
        ca += a;
        gap = gap.max((ce - ca).abs());
    }
    Ok(gap)
}

fn comparable(reference: &Binned, current: &Binned, min_count: u64) -> Result<(), NotComparable> {
    if reference.edges != current.edges || reference.counts.len() != current.counts.len() {
        return Err(NotComparable::Bins);
    }
    if reference.total() < min_count.max(1) || current.total() < min_count.max(1) {
        return Err(NotComparable::TooFew);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_counts(edges: &[f64], counts: &[u64]) -> Binned {
        let mut b = Binned::new(edges);
        for (i, &c) in counts.iter().enumerate() {
            for _ in 0..c {
                b.add_to_bin(i);
            }
        }
        b
    }

    #[test]
    fn values_fall_in_half_open_bins() {
        let mut b = Binned::new(&[10.0, 20.0]);
        for v in [5.0, 10.0, 19.9, 20.0, 1e9, f64::NAN] {
            b.add(v);
        }
        assert_eq!(b.counts(), &[1, 2, 2]);
        assert_eq!(b.total(), 5);
        assert_eq!(Binned::lengths().counts().len(), 15);
    }

    #[test]
    fn psi_matches_a_hand_calculation() {
        // Reference shares 0.5, 0.3, 0.2; current 0.3, 0.3, 0.4:
        // (0.3-0.5) ln(0.3/0.5) + 0 + (0.4-0.2) ln(0.4/0.2) = 0.10217 + 0.13863 = 0.24079.
        let edges = [1.0, 2.0];
        let reference = with_counts(&edges, &[50, 30, 20]);
        let current = with_counts(&edges, &[30, 30, 40]);
        let got = psi(&reference, &current, 10).unwrap();
        let want = -0.2 * (0.6f64).ln() + 0.2 * (2.0f64).ln();
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        assert!(got > 0.2, "a significant shift");
        // The same distribution: 0.
        assert!(psi(&reference, &reference, 10).unwrap().abs() < 1e-12);
        // KS: cumulative 0.5/0.8/1.0 against 0.3/0.6/1.0: gap 0.2.
        assert!((ks(&reference, &current, 10).unwrap() - 0.2).abs() < 1e-12);
    }

    #[test]
    fn an_empty_bin_keeps_psi_finite() {
        let edges = [1.0];
        let reference = with_counts(&edges, &[100, 0]);
        let current = with_counts(&edges, &[50, 50]);
        let got = psi(&reference, &current, 10).unwrap();
        assert!(got.is_finite() && got > 1.0, "{got}");
    }

    #[test]
    fn windows_must_share_bins_and_hold_enough_values() {
        let a = with_counts(&[1.0], &[5, 5]);
        let b = with_counts(&[2.0], &[5, 5]);
        assert_eq!(psi(&a, &b, 1), Err(NotComparable::Bins));
        assert_eq!(psi(&a, &a, 11), Err(NotComparable::TooFew));
        assert_eq!(ks(&a, &a, 10), Ok(0.0));
    }
}
