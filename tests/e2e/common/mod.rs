//! The one harness of the end-to-end tests (and, through `benches/common`, the benchmarks): real
//! child processes on ephemeral loopback ports ([`process`], [`engine`], [`gateway`]), real
//! HTTP/1.1 ([`http`]), SSE read as it arrives ([`sse`]), Prometheus text ([`metrics`]), scratch
//! directories ([`tempdir`]), seeded content ([`text`]) and a stand-in worker for answers no engine
//! gives on demand ([`worker`]). Everything waits by polling against a
//! deadline ([`poll`]), never by sleeping blindly; every child is killed when its handle drops.
#![allow(dead_code, unused_imports)]

/// The repository root (these tests and benchmarks belong to `src/cli`, two levels down).
pub const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

pub mod engine;
pub mod gateway;
pub mod http;
pub mod machine;
pub mod metrics;
pub mod poll;
pub mod process;
pub mod rogue;
pub mod skip;
pub mod sse;
pub mod tempdir;
pub mod text;
pub mod worker;

// The flat names the tests import (`common::Engine`, `common::get`, ...).
pub use engine::*;
pub use http::*;
pub use metrics::*;
pub use poll::*;
pub use sse::*;
pub use tempdir::*;
pub use text::*;
pub use worker::*;
