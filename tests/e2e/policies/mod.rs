//! Traffic policies: the canary split and its analysis, degradation, shadow traffic, quality
//! signals and drift.

mod canary;
mod degradation;
mod quality;
mod shadow;
