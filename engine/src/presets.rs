//! GPU and model presets for the sim backend: datasheet numbers for accelerators and
//! `config.json` shapes for models, looked up by name or alias.

/// One accelerator's datasheet figures, as used by the roofline step-time model.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuPreset {
    /// Canonical preset name (lowercase).
    pub name: &'static str,
    /// Peak HBM (device memory) bandwidth in bytes per second.
    pub hbm_bytes_per_s: f64,
    /// Peak dense BF16 tensor throughput in FLOP/s (no structured sparsity).
    pub bf16_flops_per_s: f64,
    /// Device memory in bytes (vendors' "80GB" is 80 GiB of HBM; see `GIB`).
    pub memory_bytes: u64,
    /// GPU-to-GPU bandwidth per direction in bytes per second, used for tensor-parallel all-reduce.
    pub interconnect_bytes_per_s: f64,
}

/// One model's shape, from its Hugging Face `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPreset {
    /// Canonical preset name (lowercase).
    pub name: &'static str,
    /// Decoder layers (`num_hidden_layers`).
    pub num_layers: usize,
    /// Residual stream width (`hidden_size`).
    pub hidden_size: usize,
    /// Query heads (`num_attention_heads`).
    pub num_heads: usize,
    /// Key/value heads (`num_key_value_heads`; fewer than `num_heads` under GQA).
    pub num_kv_heads: usize,
    /// Per-head width (`hidden_size / num_attention_heads` for these models).
    pub head_dim: usize,
    /// MLP inner width (`intermediate_size`).
    pub intermediate_size: usize,
    /// Vocabulary size (`vocab_size`).
    pub vocab_size: usize,
    /// Total parameters including the embedding table (and the LM head when untied).
    pub num_params: u64,
    /// Longest supported context (`max_position_embeddings`).
    pub max_model_len: usize,
    /// Whether the LM head shares the embedding matrix (`tie_word_embeddings`).
    pub tie_word_embeddings: bool,
}

/// Bytes per element of BF16 weights, activations and KV cache.
const BF16_BYTES: u64 = 2;

/// One gibibyte; vendors' "GB" of HBM capacity are binary (nvidia-smi shows 81920 MiB on A100 80GB).
const GIB: u64 = 1 << 30;

impl ModelPreset {
    /// KV-cache bytes per token across all layers: 2 (K and V) x layers x kv_heads x head_dim x 2 (bf16).
    pub fn kv_bytes_per_token(&self) -> u64 {
        2 * self.num_layers as u64 * self.num_kv_heads as u64 * self.head_dim as u64 * BF16_BYTES
    }

    /// Bytes of all weights in BF16.
    pub fn weight_bytes(&self) -> u64 {
        self.num_params * BF16_BYTES
    }

    /// Parameters of one `vocab_size x hidden_size` matrix (the embedding table or the LM head).
    pub fn vocab_matrix_params(&self) -> u64 {
        self.vocab_size as u64 * self.hidden_size as u64
    }
}

/// The GPU presets; the first name of each entry is canonical, the rest are aliases.
static GPUS: &[(&[&str], GpuPreset)] = &[
    (
        &["h100", "h100-sxm"],
        // NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: 3.35 TB/s HBM3, BF16 1,979 TFLOPS
        // "with sparsity" (989.4 dense), 80GB, NVLink 900 GB/s (bidirectional, so 450 GB/s a direction).
        GpuPreset {
            name: "h100",
            hbm_bytes_per_s: 3.35e12,
            bf16_flops_per_s: 989.4e12,
            memory_bytes: 80 * GIB,
            interconnect_bytes_per_s: 450e9,
        },
    ),
    (
        &["h200"],
        // NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: 4.8 TB/s HBM3e, BF16 1,979 TFLOPS
        // with sparsity (989.4 dense), 141GB, NVLink 900 GB/s (450 GB/s a direction).
        GpuPreset {
            name: "h200",
            hbm_bytes_per_s: 4.8e12,
            bf16_flops_per_s: 989.4e12,
            memory_bytes: 141 * GIB,
            interconnect_bytes_per_s: 450e9,
        },
    ),
    (
        &["a100", "a100-80gb"],
        // NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column: 2,039 GB/s HBM2e, BF16 312 TFLOPS
        // dense (624 with sparsity), 80GB, NVLink 600 GB/s (300 GB/s a direction).
        GpuPreset {
            name: "a100",
            hbm_bytes_per_s: 2.039e12,
            bf16_flops_per_s: 312e12,
            memory_bytes: 80 * GIB,
            interconnect_bytes_per_s: 300e9,
        },
    ),
    (
        &["l4"],
        // NVIDIA L4 Tensor Core GPU datasheet: 300 GB/s GDDR6, BF16 242 TFLOPS with sparsity
        // (121 dense), 24GB, no NVLink: PCIe Gen4 x16 64 GB/s (32 GB/s a direction).
        GpuPreset {
            name: "l4",
            hbm_bytes_per_s: 300e9,
            bf16_flops_per_s: 121e12,
            memory_bytes: 24 * GIB,
            interconnect_bytes_per_s: 32e9,
        },
    ),
    (
        &["mi300x"],
        // AMD Instinct MI300X accelerator datasheet: 5.3 TB/s HBM3, BF16 1,307.4 TFLOPS dense
        // (2,614.9 with sparsity), 192GB, 7 Infinity Fabric links of 128 GB/s (64 GB/s a direction
        // each, 448 GB/s a direction in all to the 7 peers of an 8-GPU platform).
        GpuPreset {
            name: "mi300x",
            hbm_bytes_per_s: 5.3e12,
            bf16_flops_per_s: 1307.4e12,
            memory_bytes: 192 * GIB,
            interconnect_bytes_per_s: 448e9,
        },
    ),
];

/// The model presets; the first name of each entry is canonical, the rest are aliases.
/// Aliases are matched case-insensitively, so HF ids are listed in lowercase.
static MODELS: &[(&[&str], ModelPreset)] = &[
    (
        &[
            "llama-3-8b",
            "meta-llama/meta-llama-3-8b",
            "meta-llama/meta-llama-3-8b-instruct",
            "meta-llama-3-8b",
            "meta-llama-3-8b-instruct",
        ],
        // huggingface.co/meta-llama/Meta-Llama-3-8B-Instruct config.json: 32 layers, hidden 4096,
        // 32 heads, 8 KV heads, intermediate 14336, vocab 128256, max_position_embeddings 8192,
        // tie_word_embeddings false. 8,030,261,248 parameters (model card "8B"; safetensors total).
        ModelPreset {
            name: "llama-3-8b",
            num_layers: 32,
            hidden_size: 4096,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            intermediate_size: 14336,
            vocab_size: 128_256,
            num_params: 8_030_261_248,
            max_model_len: 8192,
            tie_word_embeddings: false,
        },
    ),
    (
        &[
            "llama-3-70b",
            "meta-llama/meta-llama-3-70b",
            "meta-llama/meta-llama-3-70b-instruct",
            "meta-llama-3-70b",
            "meta-llama-3-70b-instruct",
        ],
        // huggingface.co/meta-llama/Meta-Llama-3-70B-Instruct config.json: 80 layers, hidden 8192,
        // 64 heads, 8 KV heads, intermediate 28672, vocab 128256, max_position_embeddings 8192,
        // tie_word_embeddings false. 70,553,706,496 parameters (safetensors total).
        ModelPreset {
            name: "llama-3-70b",
            num_layers: 80,
            hidden_size: 8192,
            num_heads: 64,
            num_kv_heads: 8,
            head_dim: 128,
            intermediate_size: 28672,
            vocab_size: 128_256,
            num_params: 70_553_706_496,
            max_model_len: 8192,
            tie_word_embeddings: false,
        },
    ),
    (
        &[
            "mistral-7b",
            "mistralai/mistral-7b-instruct-v0.3",
            "mistralai/mistral-7b-v0.3",
            "mistral-7b-instruct-v0.3",
        ],
        // huggingface.co/mistralai/Mistral-7B-Instruct-v0.3 config.json: 32 layers, hidden 4096,
        // 32 heads, 8 KV heads, intermediate 14336, vocab 32768, max_position_embeddings 32768,
        // tie_word_embeddings false. 7,248,023,552 parameters (safetensors total).
        ModelPreset {
            name: "mistral-7b",
            num_layers: 32,
            hidden_size: 4096,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            intermediate_size: 14336,
            vocab_size: 32_768,
            num_params: 7_248_023_552,
            max_model_len: 32_768,
            tie_word_embeddings: false,
        },
    ),
    (
        &[
            "qwen2.5-0.5b",
            "qwen/qwen2.5-0.5b-instruct",
            "qwen/qwen2.5-0.5b",
            "qwen2.5-0.5b-instruct",
        ],
        // huggingface.co/Qwen/Qwen2.5-0.5B-Instruct config.json: 24 layers, hidden 896, 14 heads,
        // 2 KV heads, intermediate 4864, vocab 151936, max_position_embeddings 32768,
        // tie_word_embeddings true. 494,032,768 parameters (safetensors total, QKV biases included).
        ModelPreset {
            name: "qwen2.5-0.5b",
            num_layers: 24,
            hidden_size: 896,
            num_heads: 14,
            num_kv_heads: 2,
            head_dim: 64,
            intermediate_size: 4864,
            vocab_size: 151_936,
            num_params: 494_032_768,
            max_model_len: 32_768,
            tie_word_embeddings: true,
        },
    ),
];

/// Finds the entry whose name or alias equals `name`, ignoring ASCII case and surrounding spaces.
fn find<T>(table: &'static [(&'static [&'static str], T)], name: &str) -> Option<&'static T> {
    let name = name.trim();
    table
        .iter()
        .find(|(aliases, _)| aliases.iter().any(|a| a.eq_ignore_ascii_case(name)))
        .map(|(_, preset)| preset)
}

/// Looks up a GPU preset by name or alias, case-insensitively.
pub fn gpu(name: &str) -> Option<&'static GpuPreset> {
    find(GPUS, name)
}

/// Looks up a model preset by name, alias or Hugging Face id, case-insensitively.
pub fn model(name: &str) -> Option<&'static ModelPreset> {
    find(MODELS, name)
}

/// Canonical GPU preset names, in table order.
pub fn gpu_names() -> Vec<&'static str> {
    GPUS.iter().map(|(_, g)| g.name).collect()
}

/// Canonical model preset names, in table order.
pub fn model_names() -> Vec<&'static str> {
    MODELS.iter().map(|(_, m)| m.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str) -> &'static ModelPreset {
        model(name).unwrap()
    }

    #[test]
    fn kv_bytes_per_token_matches_hand_computation() {
        assert_eq!(m("llama-3-8b").kv_bytes_per_token(), 131_072);
        assert_eq!(m("llama-3-70b").kv_bytes_per_token(), 327_680);
        assert_eq!(m("mistral-7b").kv_bytes_per_token(), 131_072);
        assert_eq!(m("qwen2.5-0.5b").kv_bytes_per_token(), 12_288);
    }

    #[test]
    fn weight_bytes_are_bf16() {
        assert_eq!(m("llama-3-8b").weight_bytes(), 16_060_522_496);
        assert_eq!(m("llama-3-70b").weight_bytes(), 141_107_412_992);
    }

    /// Recomputes each parameter count from the shapes (Llama/Mistral: no biases; Qwen2: QKV biases).
    #[test]
    fn num_params_agree_with_shapes() {
        for name in model_names() {
            let p = m(name);
            let (h, kv) = (p.hidden_size as u64, (p.num_kv_heads * p.head_dim) as u64);
            let q = (p.num_heads * p.head_dim) as u64;
            let mut attn = h * q + 2 * h * kv + q * h;
            if name.starts_with("qwen") {
                attn += q + 2 * kv;
            }
            let mlp = 3 * h * p.intermediate_size as u64;
            let layer = attn + mlp + 2 * h;
            let heads = if p.tie_word_embeddings { 1 } else { 2 };
            let total = p.num_layers as u64 * layer + h + heads * p.vocab_matrix_params();
            assert_eq!(total, p.num_params, "{name}");
            assert_eq!(p.num_heads * p.head_dim, p.hidden_size, "{name}");
        }
    }

    #[test]
    fn lookups_accept_aliases_and_any_case() {
        assert_eq!(gpu("H100").unwrap().name, "h100");
        assert_eq!(gpu("h100-SXM").unwrap().name, "h100");
        assert_eq!(gpu("A100-80GB").unwrap().name, "a100");
        assert_eq!(gpu(" mi300x ").unwrap().name, "mi300x");
        assert!(gpu("h800").is_none());
        assert_eq!(m("meta-llama/Meta-Llama-3-8B-Instruct").name, "llama-3-8b");
        assert_eq!(
            m("meta-llama/Meta-Llama-3-70B-Instruct").name,
            "llama-3-70b"
        );
        assert_eq!(m("Qwen/Qwen2.5-0.5B-Instruct").name, "qwen2.5-0.5b");
        assert_eq!(m("mistralai/Mistral-7B-Instruct-v0.3").name, "mistral-7b");
        assert_eq!(m("LLAMA-3-8B").name, "llama-3-8b");
        assert!(model("llama-2-7b").is_none());
    }

    #[test]
    fn names_list_every_preset_once() {
        assert_eq!(gpu_names(), ["h100", "h200", "a100", "l4", "mi300x"]);
        assert_eq!(
            model_names(),
            ["llama-3-8b", "llama-3-70b", "mistral-7b", "qwen2.5-0.5b"]
        );
        for n in gpu_names() {
            assert_eq!(gpu(n).unwrap().name, n);
        }
    }
}
