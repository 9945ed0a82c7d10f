//! Quality and drift (issue 48): [`signals`] scores one relayed answer (empty, repetition loop,
//! length limit, refusal, invalid JSON, malformed tool arguments) and [`drift`] compares a
//! distribution between a reference window and the current one (PSI, KS). The relay collects a
//! sampled answer's text ([`capture`]); at the answer's end the account phase hands it to the
//! [`sampler`]'s worker thread, which counts the signals per tenant, model and version, feeds
//! the canary's window and keeps the drift windows ([`windows`]). A fixed prompt set can be
//! replayed on a schedule against every version of a model ([`regression`]).

pub mod capture;
pub mod drift;
pub mod regression;
pub mod sampler;
pub mod signals;
pub mod windows;

pub use sampler::{DriftConfig, QualityConfig, QualityJob, QualitySampler};
