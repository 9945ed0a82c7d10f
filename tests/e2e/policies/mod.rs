//! Traffic policies: the canary split and its analysis, degradation, shadow traffic, quality
//! signals and drift, replayed regression prompts.

mod canary;
mod degradation;
mod quality;
mod regression;
mod shadow;
