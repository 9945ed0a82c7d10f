//! Trust no worker: each case puts a worker that misbehaves on purpose (`common::rogue`) beside a
//! healthy engine in one pool and checks the gateway's bound, and that the healthy worker kept
//! serving.

mod polls;
mod streams;
mod usage;
