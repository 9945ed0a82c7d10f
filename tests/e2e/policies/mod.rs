//! Traffic policies: the canary split and its analysis, degradation, shadow traffic.

mod canary;
mod degradation;
mod shadow;
