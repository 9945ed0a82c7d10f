//! Workloads: seeded, reproducible descriptions of traffic (arrivals, prompt and output lengths
//! and their correlation, shared prefixes, sessions, tenants, or a recorded trace), loaded from
//! `config/workloads/NAME.yaml` and turned into a plan of requests for `bench` and `sim`.

mod arrivals;
mod body;
mod build;
mod build_mix;
mod dist;
mod load;
mod model;
mod plan;
mod replay;
mod rng;
mod shape;
mod spec;
mod trace;

#[cfg(test)]
mod dist_tests;
#[cfg(test)]
mod load_tests;
#[cfg(test)]
mod shape_tests;
#[cfg(test)]
mod tests;

pub use body::{feature_bytes, request_body};
pub use load::{WORKLOAD_DIR, load, load_file, parse, shipped};
pub use model::{
    Arrival, LengthDist, Mix, Overrides, PlannedRequest, PrefixGroups, RequestClass, Sessions, Slo,
    Tenant, Trace, TraceEntry, TracePrompt, Workload,
};
pub use plan::{Requests, prompt_text};
pub use replay::{load_or_replay, replay};
pub use rng::{Rng, Zipf};
