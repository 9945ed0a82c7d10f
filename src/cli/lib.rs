//! The tools beside the gateway, over its library (`infergate`): [`bench`] (load against a live
//! URL), [`sim`] (the same routing, admission and degradation code against simulated engines),
//! [`plan`] (KV, speculative decoding and capacity sizing), [`report`] (what bench and sim print),
//! [`workload`] (the request mixes both replay), [`shapes`] (a trace's shapes and the capture
//! sizes they call for), [`usage_cli`] (the ledger from the command line)
//! and [`doctor`] (names an on-call symptom from live metrics). The `infergate` binary
//! (`main.rs`) dispatches to them and to the gateway's and engine's roles.
#![forbid(unsafe_code)]

pub mod bench;
pub mod doctor;
pub mod plan;
pub mod report;
pub mod shapes;
pub mod sim;
pub mod usage_cli;
pub mod workload;
