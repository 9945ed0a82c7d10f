//! infergate engine worker: an OpenAI-compatible server over a continuous-batching scheduler,
//! a paged, prefix-cached KV block manager and a pluggable backend.
//!
//! The layers, from the socket in:
//! - **Serving**: [`server`] (the worker's HTTP server, built by [`launch`] from [`args`]),
//!   [`edge`] (the tower layers every request crosses: body limits, timeouts, the drain; shared
//!   with the gateway), [`openai`] (wire types, parsing, validation, chat templates),
//!   [`embeddings`], [`metrics`] (vLLM's metric names), [`misbehave`] (quality faults for
//!   tests), [`kv_events`] (which prefix keys this worker holds, for a router) and [`flight`]
//!   (each request's flight record, carried back with its answer).
//! - **The step loop**: [`core`] (admit → schedule → execute → sample → stream out → free) over
//!   [`scheduler`] (iteration-level batching, chunked prefill, preemption), [`block_manager`]
//!   (paged KV with prefix caching), [`sequence`] and [`request`] (one request's state and what
//!   it asks for), [`generation`], [`output_text`] and [`logprobs`] (what goes back to the
//!   client), [`exec_path`] (graph replay or eager, per step) and [`host_time`] (host versus
//!   accelerator time), on a [`clock`] that is real when serving and virtual in the simulator.
//! - **Backends** ([`backend`]): `sim` (the [`roofline`] time model of a GPU and model from
//!   [`presets`]), `cpu` (a real Llama-family forward pass: [`model`], [`gguf`], [`tokenizer`])
//!   and `cuda` (the same models on a GPU; the `cuda` feature, which builds without CUDA).
//!
//! Who uses it: the gateway library uses only the protocol pieces ([`edge`], [`openai`],
//! [`flight`], [`kv_events`]) and the tokenizer its prompt counts share; the `infergate` binary
//! (`src/cli`) runs the worker (`infergate engine`) and its simulator drives [`core`] and
//! [`scheduler`] on the virtual clock. A separate protocol crate would remove no arrow (the
//! command-line crate needs the step loop either way), so these stay one crate.
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
pub mod misbehave;
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
pub mod vllm_kv_events;
pub mod warmup;
