//! The batch sizes of the steps a request was in, as a small bounded histogram that travels in
//! its flight record (`batch_hist`). Decode-only steps (the ones a CUDA graph can serve) and
//! steps with prefill tokens (always eager) are counted apart, since only the first say which
//! capture sizes would have helped.
//!
//! Exact while a request saw at most [`MAX_BINS`] distinct sizes; past that the histogram
//! coarsens: its bucket `width` doubles (1, 2, 4, ...) until the sizes fit, and each bin's
//! `size` is the top of its bucket, so a bin `[s, k]` of width `w` counts `k` steps of a batch
//! in `(s - w, s]`. Coarsening depends only on the sizes seen, not their order, and histograms
//! of different widths merge on the coarser grid (the widths are powers of two).
//!
//! Steps per batch size from a trace: a step of batch `b` is in `b` sequences, each of which
//! counts it once, so over the requests of a window `steps(b) = sum of hist[b] / b`. Exact when
//! every request is traced and every histogram has width 1.

use serde::{Deserialize, Serialize};

/// Most bins of one histogram (each costs at most 22 bytes of JSON).
pub const MAX_BINS: usize = 16;
/// Largest batch size a histogram keeps apart; larger ones count as this.
pub const MAX_SIZE: u32 = 1 << 24;

/// Counts of steps by batch size, at most [`MAX_BINS`] bins; `Copy`, so a sequence's finish
/// accounting stays a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "HistWire", into = "HistWire")]
pub struct Hist {
    /// Bucket width, a power of two.
    width: u32,
    /// Bins in use.
    len: u8,
    /// `(size, steps)`, the first `len` ascending, the rest zero.
    bins: [(u32, u32); MAX_BINS],
}

impl Default for Hist {
    fn default() -> Self {
        Self {
            width: 1,
            len: 0,
            bins: [(0, 0); MAX_BINS],
        }
    }
}

/// The wire form: `{"width": 1, "bins": [[size, steps], ...]}`, sizes ascending.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
struct HistWire {
    width: u32,
    bins: Vec<(u32, u32)>,
}

impl From<Hist> for HistWire {
    fn from(h: Hist) -> Self {
        Self {
            width: h.width,
            bins: h.bins().to_vec(),
        }
    }
}

impl TryFrom<HistWire> for Hist {
    type Error = &'static str;

    /// A histogram as the engine makes them: at most [`MAX_BINS`] bins, a power-of-two width,
    /// sizes positive, multiples of the width, strictly ascending, every count positive.
    fn try_from(w: HistWire) -> Result<Self, Self::Error> {
        let width = if w.width == 0 && w.bins.is_empty() {
            1
        } else {
            w.width
        };
        if !width.is_power_of_two() || width > MAX_SIZE {
            return Err("batch_hist width");
        }
        if w.bins.len() > MAX_BINS {
            return Err("batch_hist bins");
        }
        let mut h = Self {
            width,
            ..Self::default()
        };
        let mut last = 0u32;
        for (i, &(size, steps)) in w.bins.iter().enumerate() {
            if size <= last || size % width != 0 || size > MAX_SIZE || steps == 0 {
                return Err("batch_hist bin");
            }
            h.bins[i] = (size, steps);
            last = size;
        }
        h.len = w.bins.len() as u8;
        Ok(h)
    }
}

/// `size` rounded up to a multiple of `width`.
fn bucket(size: u32, width: u32) -> u32 {
    size.clamp(1, MAX_SIZE).div_ceil(width) * width
}

impl Hist {
    /// Bucket width: 1 while exact.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// `(size, steps)` bins, sizes ascending (each the top of its bucket).
    pub fn bins(&self) -> &[(u32, u32)] {
        &self.bins[..usize::from(self.len)]
    }

    /// Steps counted.
    pub fn steps(&self) -> u64 {
        self.bins().iter().map(|&(_, k)| u64::from(k)).sum()
    }

    /// Counts one step of `size` sequences.
    pub fn add(&mut self, size: u32) {
        self.add_n(size, 1);
    }

    /// Counts `steps` steps of `size` sequences, coarsening when there is no room.
    fn add_n(&mut self, size: u32, steps: u32) {
        if steps == 0 {
            return;
        }
        loop {
            let b = bucket(size, self.width);
            let bins = &mut self.bins[..usize::from(self.len)];
            match bins.binary_search_by_key(&b, |&(s, _)| s) {
                Ok(i) => {
                    bins[i].1 = bins[i].1.saturating_add(steps);
                    return;
                }
                Err(i) if usize::from(self.len) < MAX_BINS => {
                    let len = usize::from(self.len);
                    self.bins.copy_within(i..len, i + 1);
                    self.bins[i] = (b, steps);
                    self.len += 1;
                    return;
                }
                Err(_) => self.coarsen(self.width * 2),
            }
        }
    }

    /// Re-buckets every bin on the grid of `width` (a power of two at least the current one).
    fn coarsen(&mut self, width: u32) {
        if width <= self.width {
            return;
        }
        let old = *self;
        // The unused tail stays zero, so equal histograms compare equal.
        *self = Self {
            width,
            ..Self::default()
        };
        for &(size, steps) in old.bins() {
            // Ascending sizes stay ascending on a coarser grid: merge into the last bin or append.
            let b = bucket(size, width);
            match usize::from(self.len).checked_sub(1) {
                Some(last) if self.bins[last].0 == b => {
                    self.bins[last].1 = self.bins[last].1.saturating_add(steps);
                }
                _ => {
                    self.bins[usize::from(self.len)] = (b, steps);
                    self.len += 1;
                }
            }
        }
    }

    /// Adds `other`'s counts (both on the coarser of the two grids).
    pub fn merge(&mut self, other: &Hist) {
        self.coarsen(other.width);
        for &(size, steps) in other.bins() {
            self.add_n(size, steps);
        }
    }
}

/// A request's (or one sequence's) steps by batch size: decode-only steps apart from steps
/// with prefill tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BatchHist {
    /// Decode-only steps: graph when a capture size holds the batch, else eager.
    pub decode: Hist,
    /// Steps with prefill tokens (prefill or mixed): always eager.
    pub mixed: Hist,
}

impl BatchHist {
    /// Counts a step of `size` sequences, decode-only or not.
    pub fn add(&mut self, size: u32, decode_only: bool) {
        if decode_only {
            self.decode.add(size);
        } else {
            self.mixed.add(size);
        }
    }

    /// Adds `other`'s counts.
    pub fn merge(&mut self, other: &BatchHist) {
        self.decode.merge(&other.decode);
        self.mixed.merge(&other.mixed);
    }

    /// Steps counted, both kinds.
    pub fn steps(&self) -> u64 {
        self.decode.steps() + self.mixed.steps()
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.steps() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(sizes: impl IntoIterator<Item = u32>) -> Hist {
        let mut h = Hist::default();
        for s in sizes {
            h.add(s);
        }
        h
    }

    #[test]
    fn few_sizes_are_counted_exactly() {
        let h = of([3, 1, 3, 2, 3]);
        assert_eq!(h.width(), 1);
        assert_eq!(h.bins(), &[(1, 1), (2, 1), (3, 3)]);
        assert_eq!(h.steps(), 5);
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(json, r#"{"width":1,"bins":[[1,1],[2,1],[3,3]]}"#);
        assert_eq!(serde_json::from_str::<Hist>(&json).unwrap(), h);
    }

    #[test]
    fn many_sizes_coarsen_the_same_whatever_their_order() {
        let up = of(1..=40);
        let down = of((1..=40).rev());
        assert_eq!(up, down);
        assert_eq!(up.width(), 4, "{up:?}");
        assert_eq!(up.bins().len(), 10);
        assert_eq!(up.bins()[0], (4, 4));
        assert_eq!(up.bins()[9], (40, 4));
        assert_eq!(up.steps(), 40);
    }

    #[test]
    fn histograms_merge_on_the_coarser_grid() {
        let mut fine = of([1, 2, 3]);
        let coarse = of(1..=40);
        fine.merge(&coarse);
        assert_eq!(fine.width(), 4);
        assert_eq!(fine.bins()[0], (4, 7));
        assert_eq!(fine.steps(), 43);
        let mut a = BatchHist::default();
        a.add(2, true);
        a.add(5, false);
        let mut b = BatchHist::default();
        b.add(2, true);
        b.merge(&a);
        assert_eq!(b.decode.bins(), &[(2, 2)]);
        assert_eq!(b.mixed.bins(), &[(5, 1)]);
        assert_eq!(b.steps(), 3);
    }

    #[test]
    fn out_of_range_sizes_are_clamped() {
        let h = of([0, u32::MAX]);
        assert_eq!(h.bins(), &[(1, 1), (MAX_SIZE, 1)]);
        let full = of((0..40).map(|i| MAX_SIZE - i * 1000));
        assert!(full.bins().len() <= MAX_BINS);
        assert_eq!(full.steps(), 40);
    }

    #[test]
    fn only_well_formed_histograms_parse() {
        let parse = |s: &str| serde_json::from_str::<Hist>(s);
        assert!(parse(r#"{"width":2,"bins":[[2,1],[8,3]]}"#).is_ok());
        assert_eq!(parse("{}").unwrap(), Hist::default());
        for bad in [
            r#"{"width":3,"bins":[]}"#,
            r#"{"width":1,"bins":[[2,1],[2,1]]}"#,
            r#"{"width":1,"bins":[[3,1],[2,1]]}"#,
            r#"{"width":2,"bins":[[3,1]]}"#,
            r#"{"width":1,"bins":[[0,1]]}"#,
            r#"{"width":1,"bins":[[1,0]]}"#,
            r#"{"width":1,"bins":[[1,-1]]}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let many: Vec<String> = (1..=17).map(|i| format!("[{i},1]")).collect();
        let json = format!(r#"{{"width":1,"bins":[{}]}}"#, many.join(","));
        assert!(parse(&json).is_err());
    }
}
