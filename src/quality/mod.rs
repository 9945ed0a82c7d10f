//! Quality and drift (issue 48), the pure parts: [`signals`] scores one relayed answer (empty,
//! repetition loop, length limit, refusal, invalid JSON, malformed tool arguments) and [`drift`]
//! compares a distribution between a reference window and the current one (PSI, KS). The
//! sampling of answers, the counters per tenant, model and version, and the canary's use of them
//! build on these.

pub mod drift;
pub mod signals;
