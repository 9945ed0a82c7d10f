//! Traffic policies: the canary split and its analysis, degradation, shadow traffic, quality
//! signals and drift (with the shipped quality-canary and prompt-drift scenarios on real sim
//! engines), replayed regression prompts.

mod canary;
mod degradation;
mod prompt_drift;
mod quality;
mod quality_canary;
mod regression;
mod shadow;
