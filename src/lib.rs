//! infergate: an inference gateway and smart load balancer for LLM serving.
//!
//! The layers, from the socket in:
//! - **Serving**: [`server`] (listeners, TLS, connection caps, the drain, signals), [`admin`]
//!   (the admin listener and its API), [`gateway`] (the live state: the snapshot swapped on
//!   reload, background polls and ticks), [`up`] and [`supervisor`] (the embedded default with
//!   its spawned engines).
//! - **The request path**: [`pipeline`] calls the phases in order (accept → authenticate →
//!   validate → meter → degrade → split → admit → route → forward → account), one file each,
//!   with one exit that accounts every request once; [`request`], [`request_body`],
//!   [`upstream_body`] and [`tokens`] are the validate phase's parsing, bounded bodies, spliced
//!   edits and prompt counts; [`proxy`] is the relay under the forward phase (send, retry before
//!   the first byte, stream or hold the answer, read and check its usage); [`error`] is the one
//!   table from error to HTTP status and SSE event.
//! - **Decisions**, pure and shared with the simulator: [`routing`], [`admission`], [`limits`],
//!   [`budgets`], [`pricing`], [`degrade`], [`canary`], [`shadow`], [`tenants`].
//! - **Workers**: [`workers`] (live state, pools, polls, KV events, discovery, passive health)
//!   over [`upstream`] (the pooled client).
//! - **Configuration**: [`config`] compiles the YAML files into one snapshot; [`diagnostics`]
//!   locates their errors (a leaf every domain's checks report through).
//! - **Accounting and observability**: [`ledger`], [`usage_api`], [`dashboard`], [`metrics`],
//!   [`trace`] (the flight record of each request, as JSON lines).
//! - **Tools** beside the gateway: [`bench`], [`sim`], [`plan`], [`report`], [`workload`],
//!   [`usage_cli`], [`doctor`] (names a symptom from live metrics); small shared pieces:
//!   [`duration`], [`utc`].
#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod bench;
pub mod budgets;
pub mod canary;
pub mod config;
pub mod dashboard;
pub mod degrade;
pub mod diagnostics;
pub mod doctor;
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
pub mod trace;
pub mod up;
pub mod upstream;
pub mod upstream_body;
pub mod usage_api;
pub mod usage_cli;
pub mod utc;
pub mod workers;
pub mod workload;
