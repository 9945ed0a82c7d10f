//! The engine worker on its own: API, backends (sim, cpu, cuda), KV, metrics, sampling, faults, edge.

mod engine_api;
mod engine_cpu;
mod engine_cuda;
mod engine_edge;
mod engine_endpoints;
mod engine_faults;
mod engine_kv;
mod engine_metrics;
mod engine_misbehave;
mod engine_sampling;
mod engine_warmup;
