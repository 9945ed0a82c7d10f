//! Which execution path a step takes: replay of a CUDA graph captured for its batch size, or
//! kernel-by-kernel eager launch. One rule for the `sim` backend (which costs the path) and the
//! `cuda` backend (which runs it), so `x-infergate-exec-path` and
//! `infergate_engine_steps_total{path}` mean the same on both.
//!
//! As in vLLM, a decode-only batch of `b` sequences replays the graph of the smallest capture
//! size `>= b`, padded with empty slots; a step with more sequences than the largest capture
//! size runs eagerly. A step with prefill tokens runs eagerly too (`--cudagraph-mode
//! full-decode-only`, the default), or, with `full-and-piecewise` (vLLM V1's default), replays
//! piecewise graphs padded to the smallest capture size `>=` its tokens while those fit the
//! largest: everything but attention captured, attention launched between the pieces.

use crate::roofline::BatchShape;

/// Largest CUDA-graph capture size, as in vLLM.
pub const MAX_CAPTURE_SIZE: usize = 512;

/// How a step was executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecPath {
    /// Replay of a captured CUDA graph (decode-only batch within the capture sizes).
    Graph,
    /// Eager kernel-by-kernel launch (prefill, mixed, or too-large batches).
    Eager,
}

impl ExecPath {
    /// Lowercase label for metrics and logs: "graph" or "eager".
    pub fn as_str(self) -> &'static str {
        match self {
            ExecPath::Graph => "graph",
            ExecPath::Eager => "eager",
        }
    }
}

/// The batch sizes that have a captured graph, ascending and distinct; empty means every step
/// runs eagerly (`--enforce-eager`). `piecewise`: steps with prefill within the largest size
/// replay piecewise graphs (`--cudagraph-mode full-and-piecewise`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureSizes {
    sizes: Vec<usize>,
    piecewise: bool,
}

/// `--cudagraph-mode`: which steps replay graphs (vLLM's `cudagraph_mode` names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CudagraphMode {
    /// Full graphs for decode-only batches; every step with prefill runs eagerly (vLLM V0).
    #[default]
    FullDecodeOnly,
    /// Also piecewise graphs for steps with prefill within the largest size (vLLM V1).
    FullAndPiecewise,
}

impl CaptureSizes {
    /// vLLM's default: 1, 2, 4, then multiples of 8 up to `max_num_seqs` rounded up to 8
    /// (at most [`MAX_CAPTURE_SIZE`]).
    pub fn vllm_default(max_num_seqs: usize) -> Self {
        let limit = max_num_seqs
            .max(1)
            .div_ceil(8)
            .saturating_mul(8)
            .min(MAX_CAPTURE_SIZE);
        let mut sizes = vec![1, 2, 4];
        sizes.extend((8..=limit).step_by(8));
        Self {
            sizes,
            piecewise: false,
        }
    }

    /// No graphs: every step eager.
    pub fn none() -> Self {
        Self {
            sizes: Vec::new(),
            piecewise: false,
        }
    }

    /// The sizes of `--cuda-graph-sizes` (empty: [`vllm_default`](Self::vllm_default)), or none
    /// with `--enforce-eager`. Sizes are sorted and deduplicated; sizes above the larger of
    /// `max_num_seqs` and 1 could never be used and are dropped. Zero or above
    /// [`MAX_CAPTURE_SIZE`] is an error.
    pub fn from_flags(
        sizes: &[usize],
        enforce_eager: bool,
        max_num_seqs: usize,
    ) -> Result<Self, String> {
        if enforce_eager {
            return Ok(Self::none());
        }
        if sizes.is_empty() {
            return Ok(Self::vllm_default(max_num_seqs));
        }
        if let Some(bad) = sizes.iter().find(|&&s| s == 0 || s > MAX_CAPTURE_SIZE) {
            return Err(format!(
                "--cuda-graph-sizes: {bad} is not a batch size between 1 and {MAX_CAPTURE_SIZE}"
            ));
        }
        let mut v: Vec<usize> = sizes
            .iter()
            .copied()
            .filter(|&s| s <= max_num_seqs.max(1))
            .collect();
        v.sort_unstable();
        v.dedup();
        if v.is_empty() {
            return Err(format!(
                "--cuda-graph-sizes: every size is above --max-num-seqs {max_num_seqs}; give one at most that, or --enforce-eager"
            ));
        }
        Ok(Self {
            sizes: v,
            piecewise: false,
        })
    }

    /// These sizes under `mode`: piecewise graphs for prefill steps too, or not.
    pub fn with_mode(mut self, mode: CudagraphMode) -> Self {
        self.piecewise = mode == CudagraphMode::FullAndPiecewise;
        self
    }

    /// Whether steps with prefill replay piecewise graphs within the largest size.
    pub fn is_piecewise(&self) -> bool {
        self.piecewise && !self.sizes.is_empty()
    }

    /// The sizes, ascending.
    pub fn as_slice(&self) -> &[usize] {
        &self.sizes
    }

    /// The largest size, 0 when there are none.
    pub fn largest(&self) -> usize {
        self.sizes.last().copied().unwrap_or(0)
    }

    /// The path of a step of `shape` and the batch size its linear layers run at: the capture
    /// size it is padded to on the graph path (in sequences for a decode-only step, in tokens
    /// for a piecewise one), else its own sequence count.
    pub fn pick(&self, shape: &BatchShape) -> (ExecPath, usize) {
        let fitting = |n: usize| {
            let i = self.sizes.partition_point(|&s| s < n);
            self.sizes.get(i).copied()
        };
        let graph_size = if shape.is_decode_only() {
            fitting(shape.num_seqs)
        } else if self.piecewise && shape.num_seqs > 0 {
            fitting(shape.new_tokens.max(shape.num_seqs))
        } else {
            None
        };
        match graph_size {
            Some(size) => (ExecPath::Graph, size),
            None => (ExecPath::Eager, shape.num_seqs),
        }
    }
}

/// A request's path class, from its steps (summed over its sequences): `eager` when none
/// replayed a graph; otherwise `mixed` when some step took it off the fast path, else `graph`.
///
/// Off the fast path means an eager step past the captured budget (`off_path`: more sequences
/// or tokens than the largest capture size, by its own prefill chunk or the others'). Eager
/// steps within the budget are the fast path's own: every step with prefill tokens runs
/// eagerly, so a request decoding beside short prefills stays `graph`. Without the count (an
/// older record, a header), at most one eager step (its prefill) is allowed.
pub fn request_path(graph: u64, eager: u64, off_path: Option<u64>) -> &'static str {
    if graph == 0 {
        "eager"
    } else if off_path.map_or(eager <= 1, |n| n == 0) {
        "graph"
    } else {
        "mixed"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(n: usize) -> BatchShape {
        BatchShape {
            num_seqs: n,
            num_decode_seqs: n,
            new_tokens: n,
            kv_tokens_read: 100 * n,
            attn_token_pairs: 100 * n as u64,
        }
    }

    #[test]
    fn the_default_follows_vllm() {
        let s = CaptureSizes::vllm_default(256);
        assert_eq!(&s.as_slice()[..5], &[1, 2, 4, 8, 16]);
        assert_eq!(s.largest(), 256);
        assert_eq!(CaptureSizes::vllm_default(5).as_slice(), &[1, 2, 4, 8]);
        assert_eq!(CaptureSizes::vllm_default(4096).largest(), MAX_CAPTURE_SIZE);
    }

    #[test]
    fn a_decode_batch_pads_to_the_next_capture_size() {
        let s = CaptureSizes::from_flags(&[8, 1, 4, 2, 4], false, 256).unwrap();
        assert_eq!(s.as_slice(), &[1, 2, 4, 8]);
        assert_eq!(s.pick(&decode(1)), (ExecPath::Graph, 1));
        assert_eq!(s.pick(&decode(3)), (ExecPath::Graph, 4));
        assert_eq!(s.pick(&decode(8)), (ExecPath::Graph, 8));
        // A rare shape: more sequences than the largest capture size.
        assert_eq!(s.pick(&decode(9)), (ExecPath::Eager, 9));
    }

    #[test]
    fn a_request_is_mixed_only_when_a_step_left_the_captured_budget() {
        // Decoding beside ten short prefills (eager, within the budget) is the fast path.
        assert_eq!(request_path(100, 11, Some(0)), "graph");
        assert_eq!(request_path(100, 11, Some(1)), "mixed");
        assert_eq!(request_path(0, 11, Some(11)), "eager");
        // Without the count: the prefill step alone.
        assert_eq!(request_path(100, 1, None), "graph");
        assert_eq!(request_path(100, 2, None), "mixed");
        assert_eq!(request_path(0, 1, None), "eager");
    }

    #[test]
    fn prefill_and_mixed_steps_run_eagerly() {
        let s = CaptureSizes::vllm_default(256);
        let prefill = BatchShape {
            num_seqs: 1,
            num_decode_seqs: 0,
            new_tokens: 300,
            kv_tokens_read: 300,
            attn_token_pairs: 45_000,
        };
        assert_eq!(s.pick(&prefill), (ExecPath::Eager, 1));
        let mixed = BatchShape {
            num_seqs: 3,
            num_decode_seqs: 2,
            new_tokens: 50,
            ..prefill
        };
        assert_eq!(s.pick(&mixed), (ExecPath::Eager, 3));
        assert_eq!(s.pick(&BatchShape::default()), (ExecPath::Eager, 0));
    }

    #[test]
    fn piecewise_graphs_take_prefill_steps_within_the_largest_size_by_tokens() {
        let s = CaptureSizes::from_flags(&[8, 16, 64], false, 64)
            .unwrap()
            .with_mode(CudagraphMode::FullAndPiecewise);
        assert!(s.is_piecewise());
        let mixed = BatchShape {
            num_seqs: 5,
            num_decode_seqs: 4,
            new_tokens: 40,
            kv_tokens_read: 400,
            attn_token_pairs: 4_000,
        };
        // Padded to the size that holds its 40 tokens, not its 5 sequences.
        assert_eq!(s.pick(&mixed), (ExecPath::Graph, 64));
        let big = BatchShape {
            new_tokens: 65,
            ..mixed
        };
        assert_eq!(s.pick(&big), (ExecPath::Eager, 5), "past the largest size");
        // Decode-only steps are padded by sequences, as without the mode.
        assert_eq!(s.pick(&decode(9)), (ExecPath::Graph, 16));
        assert_eq!(s.pick(&decode(65)), (ExecPath::Eager, 65));
        // The default mode keeps every prefill step eager; no sizes, no graphs at all.
        let plain = CaptureSizes::from_flags(&[8, 16, 64], false, 64).unwrap();
        assert_eq!(plain.pick(&mixed), (ExecPath::Eager, 5));
        let none = CaptureSizes::none().with_mode(CudagraphMode::FullAndPiecewise);
        assert!(!none.is_piecewise());
        assert_eq!(none.pick(&mixed), (ExecPath::Eager, 5));
    }

    #[test]
    fn enforce_eager_captures_nothing() {
        let s = CaptureSizes::from_flags(&[1, 2], true, 256).unwrap();
        assert_eq!(s, CaptureSizes::none());
        assert_eq!(s.largest(), 0);
        assert_eq!(s.pick(&decode(1)), (ExecPath::Eager, 1));
    }

    #[test]
    fn bad_sizes_are_refused_and_unusable_ones_dropped() {
        assert!(
            CaptureSizes::from_flags(&[0, 4], false, 256)
                .unwrap_err()
                .contains("0 is not a batch size")
        );
        assert!(CaptureSizes::from_flags(&[1024], false, 2048).is_err());
        assert_eq!(
            CaptureSizes::from_flags(&[1, 64, 128], false, 64)
                .unwrap()
                .as_slice(),
            &[1, 64]
        );
        assert!(
            CaptureSizes::from_flags(&[128], false, 64)
                .unwrap_err()
                .contains("--max-num-seqs 64")
        );
        assert_eq!(
            CaptureSizes::from_flags(&[], false, 16).unwrap(),
            CaptureSizes::vllm_default(16)
        );
    }
}
