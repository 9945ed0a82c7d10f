//! infergate: an inference gateway and smart load balancer for LLM serving.
//!
//! The layers, from the socket in:
//! - **Serving**: [`server`] (listeners, TLS, connection caps, the drain, signals), [`admin`]
//!   (the admin listener and its API), [`gateway`] (the live state: the snapshot swapped on
//!   reload, background polls and ticks), [`up`] and [`supervisor`] (the embedded default with
//!   its spawned engines).
//! - **The request path**: [`pipeline`] calls the phases in order (accept → authenticate →
//!   validate → meter → degrade → split → admit → route → forward → account), one module each,
//!   with one exit that accounts every request once. The validate phase holds the request's
//!   parsing (`pipeline::validate::request`); the forward phase holds the body sent upstream with
//!   its spliced edits (`pipeline::forward::upstream_body`) and the relay
//!   (`pipeline::forward::relay`: send, retry before the first byte through the pool, stream or
//!   hold the answer, read its usage). Shared with the serving layer and the simulator, so beside
//!   the pipeline rather than in it: [`request_body`] (bounded body reads under the process-wide
//!   body budget the gateway owns) and [`tokens`] (prompt counts, also configured by
//!   [`config`]). [`error`] is the one table from error to HTTP status and SSE event.
//! - **Decisions**, pure and shared with the simulator: [`routing`], [`admission`], [`limits`],
//!   [`budgets`], [`pricing`], [`degrade`], [`canary`], [`shadow`], [`tenants`], [`quality`]
//!   (signals of an answer and drift scores), [`usage_check`]
//!   (whether a worker's reported usage is plausible).
//! - **Workers**: [`workers`] (live state, pools, polls, KV events, discovery, passive health)
//!   over [`upstream`] (the pooled client).
//! - **Configuration**: [`config`] compiles the YAML files into one snapshot; [`diagnostics`]
//!   locates their errors (a leaf every domain's checks report through).
//! - **Accounting and observability**: [`ledger`], [`usage_api`], [`dashboard`], [`metrics`],
//!   [`trace`] (the flight record of each request, as JSON lines); small shared pieces:
//!   [`duration`], [`utc`].
//!
//! The tools (bench, sim, plan, report, workload, usage, doctor) and the `infergate` binary are
//! their own crate over this one (`src/cli`, `infergate-cli`); the engine is another
//! (`engine`, `infergate-engine`), which this crate uses for the shared edge layers, the OpenAI
//! wire types, SSE and the KV-event format. Dependencies point one way: cli → gateway → engine.
#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod budgets;
pub mod canary;
pub mod config;
pub mod dashboard;
pub mod degrade;
pub mod diagnostics;
pub mod duration;
pub mod error;
pub mod fast_maps;
pub mod gateway;
pub mod ledger;
pub mod limits;
pub mod metrics;
pub mod pipeline;
pub mod pricing;
pub mod quality;
pub mod request_body;
pub mod routing;
pub mod server;
pub mod shadow;
pub mod supervisor;
pub mod tenants;
pub mod tokens;
pub mod trace;
pub mod up;
pub mod upstream;
pub mod usage_api;
pub mod usage_check;
pub mod utc;
pub mod workers;
