//! Upstream workers: their live state, pools, load polling and discovery.

pub mod conns;
pub mod engine_triage;
pub mod h1;
pub mod kv_events;
pub mod load_metrics;
pub mod poller;
pub mod pool;
pub mod prefix_homes;
pub mod state;
pub mod triage_export;
pub mod vllm_events;
