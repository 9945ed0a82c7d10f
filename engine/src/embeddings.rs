//! `POST /v1/embeddings` behind the HTTP layer: tokenize and check each input, then embed it.
//!
//! - `cpu`: a real embedding from the served model ([`Model::embed`]: final hidden states
//!   mean-pooled, L2-normalised). It runs on a blocking worker thread over a private scratch KV
//!   cache, outside the generation scheduler, so it never touches the serving cache or stalls
//!   the core thread; one pass runs at a time (each already spreads its matrix products over the
//!   cores).
//! - `sim`: **synthetic**: a deterministic unit vector of the preset's hidden size, seeded by a
//!   hash of the token ids. Same input, same vector; it carries no meaning.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::launch::Engine;
use crate::model::forward::Model;
use crate::openai::{self, ApiError, Prompt};

/// How this engine turns token ids into a vector.
pub enum Embedder {
    /// Synthetic vectors of `dim` values.
    Sim {
        /// The preset's hidden size.
        dim: usize,
    },
    /// The real model; `permits` bounds concurrent passes.
    Cpu {
        /// The served model (shared with the backend, read only).
        model: Arc<Model>,
        /// One pass at a time.
        permits: Arc<Semaphore>,
    },
    /// A backend that serves no embeddings (yet): requests get a 400 naming it.
    Unavailable {
        /// The model's hidden size.
        dim: usize,
        /// The backend's name.
        backend: &'static str,
    },
}

impl Embedder {
    /// The real embedder of `model`.
    pub fn cpu(model: Arc<Model>) -> Self {
        Self::Cpu {
            model,
            permits: Arc::new(Semaphore::new(1)),
        }
    }

    /// Length of every vector.
    pub fn dimensions(&self) -> usize {
        match self {
            Self::Sim { dim } => *dim,
            Self::Cpu { model, .. } => model.config.hidden_size,
            Self::Unavailable { dim, .. } => *dim,
        }
    }

    /// The embedding of `tokens`.
    async fn embed(&self, tokens: Vec<u32>) -> Result<Vec<f32>, ApiError> {
        match self {
            Self::Sim { dim } => Ok(sim_vector(&tokens, *dim)),
            Self::Unavailable { backend, .. } => Err(ApiError::bad_request(
                format!(
                    "the {backend} backend does not serve embeddings; run this model on the cpu backend for /v1/embeddings"
                ),
                None,
            )),
            Self::Cpu { model, permits } => {
                let _permit = permits
                    .acquire()
                    .await
                    .map_err(|_| ApiError::internal("the embeddings queue is closed"))?;
                let model = model.clone();
                // A forward pass takes up to seconds: keep it off the reactor.
                tokio::task::spawn_blocking(move || model.embed(&tokens))
                    .await
                    .map_err(|e| ApiError::internal(format!("embedding task failed: {e}")))?
                    .map_err(ApiError::internal)
            }
        }
    }
}

/// A synthetic unit vector of `dim` values, a pure function of `tokens` (splitmix64 seeded by
/// an xxh3 hash of the ids).
pub fn sim_vector(tokens: &[u32], dim: usize) -> Vec<f32> {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let mut state = xxhash_rust::xxh3::xxh3_64(&bytes);
    let mut v: Vec<f32> = (0..dim)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            // Uniform in [-1, 1).
            ((z >> 11) as f64 / (1u64 << 52) as f64 - 1.0) as f32
        })
        .collect();
    openai::l2_normalize(&mut v);
    v
}

/// Answers a `/v1/embeddings` body: validate, tokenize, check each input against the context
/// length and vocabulary, embed, and write the list.
pub async fn answer(engine: &Engine, body: &[u8]) -> Result<String, ApiError> {
    let req = openai::parse_embeddings(body)?;
    if !engine.served_names.iter().any(|n| n == &req.model) {
        return Err(ApiError::not_found(format!(
            "The model `{}` does not exist.",
            req.model
        )));
    }
    let dim = engine.embedder.dimensions();
    if let Some(d) = req.dimensions.filter(|&d| d != dim) {
        return Err(ApiError::bad_request(
            format!(
                "this model's embeddings have {dim} dimensions; `dimensions` {d} is not supported"
            ),
            Some("dimensions"),
        ));
    }
    let tokenizer = engine.tokenizer.clone();
    let inputs = req.inputs;
    // Tokenizing long inputs takes milliseconds: keep it off the reactor. Text gets BOS as a
    // completions prompt does.
    let tokenized = tokio::task::spawn_blocking(move || {
        inputs
            .into_iter()
            .map(|p| match p {
                Prompt::Tokens(t) => Ok(t),
                Prompt::Text(text) => tokenizer.encode(&text, true),
            })
            .collect::<Result<Vec<_>, String>>()
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))?
    .map_err(|e| ApiError::bad_request(e, Some("input")))?;
    for tokens in &tokenized {
        check_input(engine, tokens)?;
    }
    let prompt_tokens = tokenized.iter().map(Vec::len).sum();
    let mut vectors = Vec::with_capacity(tokenized.len());
    for tokens in tokenized {
        vectors.push(engine.embedder.embed(tokens).await?);
    }
    Ok(openai::embeddings_response(
        &req.model,
        &vectors,
        req.format,
        prompt_tokens,
    ))
}

/// Refuses an input that is empty, names unknown tokens, or exceeds the context length.
fn check_input(engine: &Engine, tokens: &[u32]) -> Result<(), ApiError> {
    if tokens.is_empty() {
        return Err(ApiError::bad_request("the input is empty", Some("input")));
    }
    if let Some(bad) = tokens.iter().find(|&&t| t as usize >= engine.vocab_size) {
        return Err(ApiError::bad_request(
            format!("token id {bad} is out of vocabulary"),
            Some("input"),
        ));
    }
    let limit = engine.max_model_len;
    if tokens.len() > limit {
        return Err(ApiError::bad_request(
            format!(
                "This model's maximum context length is {limit} tokens, however you requested {} tokens in the input. Please reduce the length of the input.",
                tokens.len()
            ),
            Some("input"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_vectors_are_unit_deterministic_and_distinct() {
        let a = sim_vector(&[1, 2, 3], 64);
        assert_eq!(a.len(), 64);
        let norm: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        assert_eq!(a, sim_vector(&[1, 2, 3], 64));
        assert_ne!(a, sim_vector(&[1, 2, 4], 64));
        assert_ne!(a, sim_vector(&[3, 2, 1], 64));
        assert_eq!(Embedder::Sim { dim: 7 }.dimensions(), 7);
    }
}
