//! The shape of a Llama-family model, as its Hugging Face `config.json` (or GGUF metadata) gives it.

/// Architectures the cpu backend runs (all share the Llama block: RMSNorm, RoPE, GQA, SwiGLU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `LlamaForCausalLM`.
    Llama,
    /// `MistralForCausalLM` (the sliding window is not applied; see `max_position_embeddings`).
    Mistral,
    /// `Qwen2ForCausalLM`: Llama with biases on the q/k/v projections.
    Qwen2,
}

/// How rotary frequencies are stretched for long contexts (`rope_scaling` in `config.json`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by `factor`.
    Linear {
        /// Stretch factor.
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        /// Stretch factor for low frequencies.
        factor: f32,
        /// Wavelengths longer than `original / low_freq_factor` are fully scaled.
        low_freq_factor: f32,
        /// Wavelengths shorter than `original / high_freq_factor` are kept.
        high_freq_factor: f32,
        /// Context the model was pre-trained with.
        original_max_position_embeddings: usize,
    },
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Block flavour.
    pub arch: Arch,
    /// Rows of the embedding table.
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Transformer blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// RoPE stretching, if any.
    pub rope_scaling: Option<RopeScaling>,
    /// Longest context the model supports.
    pub max_position_embeddings: usize,
    /// The LM head reuses the embedding table.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases (Qwen2).
    pub attention_bias: bool,
    /// Beginning-of-sequence token, if the model has one.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation (config.json and generation_config.json together).
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Query width: `num_heads × head_dim`.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Key (and value) width: `num_kv_heads × head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Checks the numbers fit together; loaders call this before building weights.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        if !(self.rms_norm_eps > 0.0 && self.rope_theta > 0.0) {
            return Err("rms_norm_eps and rope_theta must be positive".into());
        }
        Ok(())
    }

    /// Parameters in the weights (embeddings counted once when tied).
    pub fn num_parameters(&self) -> usize {
        let h = self.hidden_size;
        let attn = h * self.q_dim() * 2 + h * self.kv_dim() * 2;
        let bias = if self.attention_bias {
            self.q_dim() + 2 * self.kv_dim()
        } else {
            0
        };
        let mlp = 3 * h * self.intermediate_size;
        let per_layer = attn + bias + mlp + 2 * h;
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        self.vocab_size * h + self.num_layers * per_layer + h + head
    }
}
