//! The relay under the forward phase: send to a worker, retry another before the first byte,
//! stream or hold the answer back, and read its usage. Retries route again through the pool
//! (`PoolRuntime`), never back through the pipeline.

pub mod attempts;
pub mod body;
pub mod hold;
pub mod json_members;
pub mod passive_health;
pub mod send;
pub mod stream_end;
pub mod usage;
