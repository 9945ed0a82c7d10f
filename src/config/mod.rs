//! Gateway configuration: `config/infergate.yaml` and `policies/routing.yaml` parsed as plain serde
//! structs, validated in one pass that reports every error with its file and line, and compiled
//! into one immutable [`Snapshot`] for the gateway to swap in atomically.

mod compile;
mod error;
mod pools;
mod raw;
mod routing_file;
mod sections;
mod snapshot;
mod values;

#[cfg(test)]
mod error_tests;
#[cfg(test)]
mod tests;

use std::path::Path;

pub use error::{ConfigError, ConfigErrors};
pub use snapshot::{
    AdminConfig, Dialect, ForwardConfig, HealthConfig, LogConfig, LogFormat, ModelRoute, PoolSpec,
    Snapshot, TlsConfig, WorkerSource,
};

use compile::RoutingSource;

/// The shipped gateway config, the embedded default of `infergate up`.
pub const DEFAULT_CONFIG: &str = include_str!("../../config/infergate.yaml");

/// The shipped routing policies that go with [`DEFAULT_CONFIG`].
pub const DEFAULT_ROUTING: &str = include_str!("../../policies/routing.yaml");

/// Reads the config file at `config_path` and `<policies>/routing.yaml` next to it (`policies`
/// defaults to `../policies`, relative to the config file; a missing routing.yaml there means
/// default policies), and compiles them. Every error found is returned, not just the first.
pub fn load(config_path: &Path) -> Result<Snapshot, ConfigErrors> {
    let text = std::fs::read_to_string(config_path)
        .map_err(|err| compile::unreadable(config_path, &err))?;
    compile::compile(&text, config_path, RoutingSource::Policies)
}

/// Compiles config text (and routing text, when given) without reading them from disk. The paths
/// name the files in messages and anchor relative paths (TLS files); they are also what
/// `Snapshot::files` lists. Without routing text every pool gets the default `prefix` policy.
pub fn load_str(
    config_text: &str,
    config_path: &Path,
    routing: Option<(&str, &Path)>,
) -> Result<Snapshot, ConfigErrors> {
    let routing = match routing {
        Some((text, path)) => RoutingSource::Text(text, path),
        None => RoutingSource::Absent,
    };
    compile::compile(config_text, config_path, routing)
}

/// Compiles the embedded defaults ([`DEFAULT_CONFIG`], [`DEFAULT_ROUTING`]), named as the shipped
/// files `config/infergate.yaml` and `policies/routing.yaml`.
pub fn load_default() -> Result<Snapshot, ConfigErrors> {
    load_str(
        DEFAULT_CONFIG,
        Path::new("config/infergate.yaml"),
        Some((DEFAULT_ROUTING, Path::new("policies/routing.yaml"))),
    )
}
