//! What a CUDA-graph capture size costs before the first request: the device memory its graph
//! keeps and the start-up time capturing it takes, for a model preset on a GPU preset. Pure
//! arithmetic over documented assumptions, so `infergate shapes --propose` can price a set of
//! sizes and the sim backend can charge the same figures.
//!
//! The model, per captured batch size `b` (tokens = sequences on a decode step):
//! - memory = [`GRAPH_SEGMENT_BYTES`] + `b` x (MLP gate-up activation of one token, per GPU):
//!   a graph's private memory pool holds its intermediate tensors, and the widest is the MLP's
//!   gate-up output, `2 x intermediate_size` BF16 values a token, split over tensor parallelism;
//! - time = layers x ([`CAPTURE_S_PER_LAYER`] + `b` x [`CAPTURE_S_PER_LAYER_TOKEN`]): capture
//!   records each kernel launch of a warm-up pass, so it grows with the kernels (layers) and
//!   only slightly with the batch. It is host-bound, so the GPU preset does not change it.
//!
//! Calibration (facts, not code): vLLM's per-size capture log for Llama-3.1-8B-Instruct (32
//! layers, intermediate_size 14336), vllm-project/vllm PR #22897 (2025-08): "Graph capturing
//! for 464 input tokens finished in 0.057 secs, took 26.00 MiB", for 80 to 112 tokens 0.048
//! to 0.063 secs and 6 to 8 MiB. The model gives 25.4 + 2 MiB and 0.059 s at 464, 6.4 MiB and
//! 0.050 s at 80. Totals sum the sizes as that log measures them; vLLM's default set (67 sizes,
//! "can take more than 10s" by the lazy-capture RFC, vllm-project/vllm issue #20098) prices at
//! about 3.6 s and 1 GiB on that model, the same order.

use crate::presets::{GpuPreset, ModelPreset};

/// Fixed memory of one graph: the per-size figures in vLLM's log are whole multiples of 2 MiB,
/// the segment PyTorch's caching allocator carves small blocks from.
pub const GRAPH_SEGMENT_BYTES: u64 = 2 << 20;
/// Capture time per decoder layer of one size: 0.048 s for the 32 layers of Llama-3.1-8B at
/// 80 tokens (PR #22897's log), about 1.5 ms a layer.
pub const CAPTURE_S_PER_LAYER: f64 = 1.5e-3;
/// Added capture time per layer and token: 0.057 s at 464 tokens against 0.048 s at 80 in the
/// same log, 9 ms over 384 tokens and 32 layers.
pub const CAPTURE_S_PER_LAYER_TOKEN: f64 = 0.75e-6;
/// Bytes of a BF16 value.
const BF16_BYTES: u64 = 2;

/// The cost of one capture size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SizeCost {
    /// The batch size captured.
    pub size: usize,
    /// Device memory its graph keeps, per GPU.
    pub bytes: u64,
    /// Seconds capturing it adds to start-up.
    pub seconds: f64,
}

/// The cost of a set of capture sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct CaptureCost {
    /// Each size's cost, ascending by size.
    pub sizes: Vec<SizeCost>,
    /// Memory of them all, per GPU.
    pub bytes: u64,
    /// Start-up seconds of them all.
    pub seconds: f64,
    /// `bytes` as a share of one GPU's memory.
    pub gpu_memory_share: f64,
    /// KV-cache tokens that memory would otherwise hold (per GPU).
    pub kv_tokens: u64,
}

impl CaptureCost {
    /// Two graphs of every size (vLLM V1's full decode graph and piecewise graph).
    pub fn twice(mut self) -> Self {
        for c in &mut self.sizes {
            c.bytes = c.bytes.saturating_mul(2);
            c.seconds *= 2.0;
        }
        self.bytes = self.bytes.saturating_mul(2);
        self.seconds *= 2.0;
        self.gpu_memory_share *= 2.0;
        self.kv_tokens = self.kv_tokens.saturating_mul(2);
        self
    }
}

/// The capture-cost model of one model preset on one GPU preset.
#[derive(Debug, Clone, PartialEq)]
pub struct CaptureCostModel {
    /// Activation bytes one token holds in a graph, per GPU.
    bytes_per_token: u64,
    /// Decoder layers.
    layers: f64,
    /// One GPU's memory.
    gpu_bytes: u64,
    /// KV bytes one token occupies on one GPU.
    kv_bytes_per_token: u64,
}

impl CaptureCostModel {
    /// The model of `model` sharded over `tensor_parallel_size` GPUs of `gpu`.
    pub fn new(gpu: &GpuPreset, model: &ModelPreset, tensor_parallel_size: usize) -> Self {
        let tp = tensor_parallel_size.max(1) as u64;
        let kv_heads = (model.num_kv_heads as u64 / tp).max(1);
        Self {
            bytes_per_token: (2 * model.intermediate_size as u64 * BF16_BYTES).div_ceil(tp),
            layers: model.num_layers as f64,
            gpu_bytes: gpu.memory_bytes,
            kv_bytes_per_token: 2
                * model.num_layers as u64
                * kv_heads
                * model.head_dim as u64
                * BF16_BYTES,
        }
    }

    /// The cost of capturing batch size `size`.
    pub fn size(&self, size: usize) -> SizeCost {
        SizeCost {
            size,
            bytes: GRAPH_SEGMENT_BYTES
                .saturating_add(self.bytes_per_token.saturating_mul(size as u64)),
            seconds: self.layers * (CAPTURE_S_PER_LAYER + size as f64 * CAPTURE_S_PER_LAYER_TOKEN),
        }
    }

    /// The cost of capturing every size of `sizes` (duplicates counted once).
    pub fn of(&self, sizes: &[usize]) -> CaptureCost {
        let mut distinct = sizes.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let sizes: Vec<SizeCost> = distinct.into_iter().map(|s| self.size(s)).collect();
        let bytes = sizes.iter().fold(0u64, |a, c| a.saturating_add(c.bytes));
        CaptureCost {
            bytes,
            seconds: sizes.iter().map(|c| c.seconds).sum(),
            gpu_memory_share: if self.gpu_bytes == 0 {
                0.0
            } else {
                bytes as f64 / self.gpu_bytes as f64
            },
            kv_tokens: bytes / self.kv_bytes_per_token.max(1),
            sizes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec_path::CaptureSizes;
    use crate::presets;

    const MIB: f64 = (1u64 << 20) as f64;

    fn llama_8b_h100() -> CaptureCostModel {
        let gpu = presets::gpu("h100").unwrap();
        let model = presets::model("llama-3-8b").unwrap();
        CaptureCostModel::new(gpu, model, 1)
    }

    #[test]
    fn one_size_matches_vllms_logged_capture() {
        let m = llama_8b_h100();
        let big = m.size(464);
        // vLLM: 26 MiB and 0.057 s at 464 tokens.
        assert!((big.bytes as f64 / MIB - 27.4).abs() < 0.2, "{big:?}");
        assert!((big.seconds - 0.059).abs() < 0.002, "{big:?}");
        // vLLM: 6 MiB and 0.048 s at 80 tokens.
        let small = m.size(80);
        assert!((small.bytes as f64 / MIB - 6.4).abs() < 0.2, "{small:?}");
        assert!((small.seconds - 0.050).abs() < 0.002, "{small:?}");
    }

    #[test]
    fn vllms_default_sizes_cost_seconds_and_about_a_gibibyte() {
        let m = llama_8b_h100();
        let sizes = CaptureSizes::vllm_default(512);
        assert_eq!(sizes.as_slice().len(), 67);
        let c = m.of(sizes.as_slice());
        assert_eq!(c.sizes.len(), 67);
        assert!(c.seconds > 3.0 && c.seconds < 4.0, "{}", c.seconds);
        let gib = c.bytes as f64 / (1u64 << 30) as f64;
        assert!(gib > 0.9 && gib < 1.1, "{gib}");
        assert!(c.gpu_memory_share > 0.01 && c.gpu_memory_share < 0.02);
        // Llama-3-8B holds 128 KiB of KV a token.
        assert_eq!(c.kv_tokens, c.bytes / (128 * 1024));
    }

    #[test]
    fn fewer_and_smaller_sizes_cost_less_and_tp_splits_memory() {
        let m = llama_8b_h100();
        let few = m.of(&[4, 1, 2, 4]);
        assert_eq!(
            few.sizes.iter().map(|c| c.size).collect::<Vec<_>>(),
            [1, 2, 4]
        );
        assert!(few.seconds < m.of(&[1, 2, 4, 8]).seconds);
        assert!(few.bytes < m.of(&[1, 2, 4, 8]).bytes);
        assert_eq!(m.of(&[]).bytes, 0);
        let gpu = presets::gpu("h100").unwrap();
        let model = presets::model("llama-3-70b").unwrap();
        let tp1 = CaptureCostModel::new(gpu, model, 1).size(256);
        let tp4 = CaptureCostModel::new(gpu, model, 4).size(256);
        assert!(tp4.bytes < tp1.bytes);
        assert_eq!(tp4.seconds, tp1.seconds, "capture is host-bound");
        assert!(tp1.seconds > m.size(256).seconds, "80 layers against 32");
    }
}
