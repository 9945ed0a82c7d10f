//! The end-to-end tests, one binary: real processes on loopback, real HTTP and SSE, the real
//! config files, and real servers (Redis, PostgreSQL, Chromium, promtool) started by the tests.
//! One folder per area; `common` is the harness every area shares, the `*_support` modules the
//! harnesses of one area. `cargo test --test e2e AREA::` runs one area, `cargo test --test e2e
//! NAME` one file or test.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests stop at the first thing that is not as it should be"
)]

mod canary_support;
mod common;
mod degradation_support;
mod tenant_support;
mod tools_support;

mod deploy;
mod edge;
mod engine;
mod fleet;
mod gateway;
mod openai;
mod policies;
mod tenants;
mod tools;
mod trust;
