//! What a validated generation request asks the engine for.

/// Sampling and stopping parameters of one sequence, already validated and defaulted.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Most completion tokens to generate (always ≥ 1 once resolved against the context).
    pub max_tokens: usize,
    /// Fewest completion tokens before EOS or a stop string may end the sequence.
    pub min_tokens: usize,
    /// Softmax temperature, 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1].
    pub top_p: f32,
    /// Keep only the k most likely tokens; -1 or 0 disables.
    pub top_k: i32,
    /// Seed for reproducible sampling; `None` draws one.
    pub seed: Option<u64>,
    /// Keep generating past EOS until `max_tokens`.
    pub ignore_eos: bool,
    /// Stop strings; the output is cut before the first match.
    pub stop: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            max_tokens: 16,
            min_tokens: 0,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            seed: None,
            ignore_eos: false,
            stop: Vec::new(),
        }
    }
}
