//! infergate: an inference gateway and smart load balancer for LLM serving.
#![forbid(unsafe_code)]
// A panic on a request path takes a connection down: shipped code returns errors instead
// (clippy.toml lets tests unwrap).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod account;
pub mod admin;
pub mod admission;
pub mod bench;
pub mod budgets;
pub mod canary;
pub mod config;
pub mod dashboard;
pub mod degrade;
pub mod duration;
pub mod error;
pub mod gateway;
pub mod ledger;
pub mod limits;
pub mod metrics;
pub mod pipeline;
pub mod plan;
pub mod pricing;
pub mod proxy;
pub mod report;
pub mod request;
pub mod request_body;
pub mod routing;
pub mod server;
pub mod shadow;
pub mod sim;
pub mod supervisor;
pub mod tenants;
pub mod tokens;
pub mod up;
pub mod upstream;
pub mod upstream_body;
pub mod usage_api;
pub mod usage_cli;
pub mod utc;
pub mod workers;
pub mod workload;
