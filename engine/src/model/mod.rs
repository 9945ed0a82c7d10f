//! Real Llama-family models for the `cpu` backend: shapes, weights, the loaders (Hugging Face
//! model directories and GGUF files, both producing the same in-memory model), the forward pass
//! over the engine's paged KV cache, and sampling on real logits.

pub mod config;
pub mod default_model;
pub mod embed;
pub mod forward;
pub mod gguf_model;
pub mod hf;
pub mod kv_cache;
pub mod matmul;
pub mod ops;
pub mod sampler;
pub mod weights;

use std::path::Path;

use config::ModelConfig;
use weights::ModelWeights;

/// A model ready to serve: its shape, weights, tokenizer and chat template.
pub struct LoadedModel {
    /// Name to serve it under by default (directory or file stem, or GGUF `general.name`).
    pub name: String,
    /// Shape.
    pub config: ModelConfig,
    /// Weights, f32.
    pub weights: ModelWeights,
    /// The model's own tokenizer.
    pub tokenizer: tokenizers::Tokenizer,
    /// Jinja chat template source, if the model ships one.
    pub chat_template: Option<String>,
    /// BOS token text, for templates that print it.
    pub bos_token: String,
    /// EOS token text, for templates that print it.
    pub eos_token: String,
}

/// Loads a Hugging Face model directory or a `.gguf` file.
pub fn load(path: &Path) -> Result<LoadedModel, String> {
    if path.is_dir() {
        hf::load_dir(path)
    } else if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        gguf_model::load_file(path)
    } else if path.exists() {
        Err(format!(
            "{} is neither a model directory nor a .gguf file",
            path.display()
        ))
    } else {
        Err(format!("{} does not exist", path.display()))
    }
}
