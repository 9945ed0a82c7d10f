//! The forward phase: send to a worker, stream back, retry before the first byte.

pub mod body;
pub mod forward;
pub mod hold;
pub mod json_members;
pub mod stream_end;
pub mod usage;
pub mod usage_check;
