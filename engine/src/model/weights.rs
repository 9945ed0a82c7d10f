//! Model weights in memory (f32, PyTorch layouts) and their assembly from named tensors, shared by
//! the Hugging Face and GGUF loaders so both get the same shape checks.

use super::config::ModelConfig;

/// A dense linear layer: `weight` is `[out_features, in_features]`, row-major (PyTorch's layout).
#[derive(Debug, Clone, PartialEq)]
pub struct Linear {
    /// Row-major `[out_features, in_features]`.
    pub weight: Vec<f32>,
    /// Added to the output, if present (`[out_features]`).
    pub bias: Option<Vec<f32>>,
    /// Output width.
    pub out_features: usize,
    /// Input width.
    pub in_features: usize,
}

/// One transformer block.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    /// RMSNorm before attention.
    pub input_norm: Vec<f32>,
    /// Query projection.
    pub q_proj: Linear,
    /// Key projection.
    pub k_proj: Linear,
    /// Value projection.
    pub v_proj: Linear,
    /// Attention output projection.
    pub o_proj: Linear,
    /// RMSNorm before the MLP.
    pub post_attention_norm: Vec<f32>,
    /// SwiGLU gate.
    pub gate_proj: Linear,
    /// SwiGLU up projection.
    pub up_proj: Linear,
    /// SwiGLU down projection.
    pub down_proj: Linear,
}

/// All weights of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelWeights {
    /// `[vocab_size, hidden_size]`.
    pub embed_tokens: Vec<f32>,
    /// The blocks, first to last.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm.
    pub norm: Vec<f32>,
    /// Untied LM head; `None` means the embedding table is reused.
    pub lm_head: Option<Linear>,
}

/// A named tensor, converted to f32, with its PyTorch shape (outermost dimension first).
pub type Tensor = (Vec<usize>, Vec<f32>);

/// Where a loader finds tensors by their Hugging Face names
/// (`model.layers.0.self_attn.q_proj.weight`, ...).
pub trait TensorSource {
    /// The tensor called `name`, or `None` when the checkpoint has no such tensor.
    fn tensor(&mut self, name: &str) -> Result<Option<Tensor>, String>;
}

fn required(src: &mut dyn TensorSource, name: &str, shape: &[usize]) -> Result<Vec<f32>, String> {
    match src.tensor(name)? {
        Some(t) => check(name, t, shape),
        None => Err(format!("the checkpoint has no tensor {name}")),
    }
}

fn check(name: &str, (got, data): Tensor, shape: &[usize]) -> Result<Vec<f32>, String> {
    if got != shape {
        return Err(format!(
            "tensor {name} has shape {got:?}, the config needs {shape:?}"
        ));
    }
    let n: usize = shape.iter().product();
    if data.len() != n {
        return Err(format!(
            "tensor {name} holds {} values, not {n}",
            data.len()
        ));
    }
    Ok(data)
}

fn linear(
    src: &mut dyn TensorSource,
    prefix: &str,
    out_features: usize,
    in_features: usize,
    bias: bool,
) -> Result<Linear, String> {
    let weight = required(
        src,
        &format!("{prefix}.weight"),
        &[out_features, in_features],
    )?;
    let bias = if bias {
        Some(required(src, &format!("{prefix}.bias"), &[out_features])?)
    } else {
        None
    };
    Ok(Linear {
        weight,
        bias,
        out_features,
        in_features,
    })
}

impl ModelWeights {
    /// Assembles the weights `config` calls for from `src`, checking every shape.
    pub fn from_source(config: &ModelConfig, src: &mut dyn TensorSource) -> Result<Self, String> {
        config.validate()?;
        let h = config.hidden_size;
        let embed_tokens = required(src, "model.embed_tokens.weight", &[config.vocab_size, h])?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("model.layers.{i}");
            let bias = config.attention_bias;
            layers.push(LayerWeights {
                input_norm: required(src, &format!("{p}.input_layernorm.weight"), &[h])?,
                q_proj: linear(
                    src,
                    &format!("{p}.self_attn.q_proj"),
                    config.q_dim(),
                    h,
                    bias,
                )?,
                k_proj: linear(
                    src,
                    &format!("{p}.self_attn.k_proj"),
                    config.kv_dim(),
                    h,
                    bias,
                )?,
                v_proj: linear(
                    src,
                    &format!("{p}.self_attn.v_proj"),
                    config.kv_dim(),
                    h,
                    bias,
                )?,
                o_proj: linear(
                    src,
                    &format!("{p}.self_attn.o_proj"),
                    h,
                    config.q_dim(),
                    false,
                )?,
                post_attention_norm: required(
                    src,
                    &format!("{p}.post_attention_layernorm.weight"),
                    &[h],
                )?,
                gate_proj: linear(
                    src,
                    &format!("{p}.mlp.gate_proj"),
                    config.intermediate_size,
                    h,
                    false,
                )?,
                up_proj: linear(
                    src,
                    &format!("{p}.mlp.up_proj"),
                    config.intermediate_size,
                    h,
                    false,
                )?,
                down_proj: linear(
                    src,
                    &format!("{p}.mlp.down_proj"),
                    h,
                    config.intermediate_size,
                    false,
                )?,
            });
        }
        let norm = required(src, "model.norm.weight", &[h])?;
        // Some tied checkpoints still carry a copy of the head; an untied one must have it.
        let lm_head =
            match src.tensor("lm_head.weight")? {
                Some(t) if !config.tie_word_embeddings => Some(Linear {
                    weight: check("lm_head.weight", t, &[config.vocab_size, h])?,
                    bias: None,
                    out_features: config.vocab_size,
                    in_features: h,
                }),
                Some(_) => None,
                None if config.tie_word_embeddings => None,
                None => return Err(
                    "the checkpoint has no tensor lm_head.weight and tie_word_embeddings is false"
                        .into(),
                ),
            };
        Ok(Self {
            embed_tokens,
            layers,
            norm,
            lm_head,
        })
    }
}
