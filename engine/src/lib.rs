//! infergate engine worker: an OpenAI-compatible server over a continuous-batching scheduler,
//! a paged, prefix-cached KV block manager and a pluggable backend: `sim` (a roofline time model
//! of a named GPU, with host time), `cpu` (a real Llama-family forward pass) and `cuda` (behind the
//! `cuda` feature).
#![deny(unsafe_code)]

pub mod args;
pub mod backend;
pub mod batch_hist;
pub mod block_manager;
pub mod capture_cost;
pub mod clock;
pub mod core;
pub mod edge;
pub mod embeddings;
pub mod exec_path;
pub mod flight;
pub mod generation;
pub mod gguf;
pub mod host_time;
pub mod kv_events;
pub mod launch;
pub mod logprobs;
pub mod metrics;
pub mod model;
pub mod openai;
pub mod output_text;
pub mod presets;
pub mod request;
pub mod roofline;
pub mod scheduler;
pub mod sequence;
pub mod server;
pub mod tokenizer;
