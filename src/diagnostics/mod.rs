//! Located diagnostics for the YAML files an operator edits: where a problem sits ([`YamlPath`],
//! serde-saphyr's spans) and the error that names its file, line and reason ([`ConfigError`]).
//! A leaf: it imports nothing else of the crate, so every domain that checks its own section
//! (canary, degradation, shadow, tenants) reports through it without importing the config.

mod error;
mod place;

pub use error::{ConfigError, ConfigErrors, Sink};
pub use place::{Problem, Seg, YamlPath, into_messages, placed};
