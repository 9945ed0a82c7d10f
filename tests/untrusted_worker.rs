//! Trust no worker: each case puts a worker that misbehaves on purpose ([`common::rogue`]) beside
//! a healthy engine in one pool and checks the gateway's bound, and that the healthy worker kept
//! serving. One module per area; one test binary for all of them.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests stop at the first thing that is not as it should be"
)]

#[path = "e2e/common/mod.rs"]
mod common;
#[path = "e2e/tenant_support/mod.rs"]
mod tenant_support;

#[path = "untrusted_worker/usage.rs"]
mod usage;

#[path = "untrusted_worker/polls.rs"]
mod polls;

#[path = "untrusted_worker/streams.rs"]
mod streams;
