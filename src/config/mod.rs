//! Gateway configuration: `config/infergate.yaml`, `policies/routing.yaml` and
//! `policies/tenants.yaml` parsed as plain serde structs, validated in one pass that reports every error with its file and line, and compiled
//! into one immutable [`Snapshot`] for the gateway to swap in atomically.

mod compile;
mod degradation_file;
mod otlp_section;
mod pool_policy;
mod pools;
mod prices_file;
mod quality_section;
mod raw;
mod regression_section;
mod routing_doc;
mod routing_file;
mod sections;
mod shape_classes;
mod snapshot;
mod tenant_section;
mod tiers_file;
mod values;

#[cfg(test)]
mod error_tests;
#[cfg(test)]
mod tenant_tests;
#[cfg(test)]
mod tests;

use std::path::Path;

pub use crate::diagnostics::{ConfigError, ConfigErrors, Problem, Seg, YamlPath, into_messages};
pub use snapshot::{
    AdminConfig, AdmissionSpec, ConnectionLimits, Dialect, ForwardConfig, HealthConfig, LogConfig,
    LogFormat, ModelRoute, PoolSpec, Snapshot, TenantSpec, TierSpec, TlsConfig, VllmKvEventsSpec,
    WorkerSource,
};

use compile::{PolicySource, PolicySources};

/// The shipped gateway config, the embedded default of `infergate up`.
pub const DEFAULT_CONFIG: &str = include_str!("../../config/infergate.yaml");

/// The shipped routing policies that go with [`DEFAULT_CONFIG`].
pub const DEFAULT_ROUTING: &str = include_str!("../../policies/routing.yaml");

/// The shipped tiers that go with [`DEFAULT_CONFIG`].
pub const DEFAULT_TENANTS: &str = include_str!("../../policies/tenants.yaml");

/// The shipped prices that go with [`DEFAULT_CONFIG`].
pub const DEFAULT_PRICES: &str = include_str!("../../policies/prices.yaml");

/// Reads the config file at `config_path` and `<policies>/routing.yaml` and
/// `<policies>/tenants.yaml` next to it (`policies` defaults to `../policies`, relative to the
/// config file; a missing routing.yaml there means default policies, a missing tenants.yaml the
/// one built-in tier `default`), and compiles them. Every error found is returned.
pub fn load(config_path: &Path) -> Result<Snapshot, ConfigErrors> {
    let text = std::fs::read_to_string(config_path)
        .map_err(|err| compile::unreadable(config_path, &err))?;
    compile::compile(&text, config_path, PolicySources::FROM_DISK)
}

/// Compiles config text (and routing text, when given) without reading them from disk; tiers are
/// the built-in `default` tier. Same as [`load_str_with`] without tenants text.
pub fn load_str(
    config_text: &str,
    config_path: &Path,
    routing: Option<(&str, &Path)>,
) -> Result<Snapshot, ConfigErrors> {
    load_str_with(config_text, config_path, routing, None)
}

/// Compiles config text, and routing and tenants text when given, without reading them from disk
/// (a tenant's `key_file` is still read). The paths name the files in messages and anchor relative
/// paths (TLS and key files); they are also what `Snapshot::files` lists. Without routing text
/// every pool gets the default `prefix` policy; without tenants text the only tier is the
/// built-in `default` (unlimited) and it is the default tier.
pub fn load_str_with(
    config_text: &str,
    config_path: &Path,
    routing: Option<(&str, &Path)>,
    tenants: Option<(&str, &Path)>,
) -> Result<Snapshot, ConfigErrors> {
    load_str_full(config_text, config_path, routing, tenants, None)
}

/// Like [`load_str_with`], plus degradation policy text (`policies/degradation.yaml`).
pub fn load_str_full(
    config_text: &str,
    config_path: &Path,
    routing: Option<(&str, &Path)>,
    tenants: Option<(&str, &Path)>,
    degradation: Option<(&str, &Path)>,
) -> Result<Snapshot, ConfigErrors> {
    load_str_all(
        config_text,
        config_path,
        routing,
        tenants,
        degradation,
        None,
    )
}

/// Like [`load_str_full`], plus prices text (`policies/prices.yaml`).
pub fn load_str_all(
    config_text: &str,
    config_path: &Path,
    routing: Option<(&str, &Path)>,
    tenants: Option<(&str, &Path)>,
    degradation: Option<(&str, &Path)>,
    prices: Option<(&str, &Path)>,
) -> Result<Snapshot, ConfigErrors> {
    let sources = PolicySources {
        routing: given(routing),
        tenants: given(tenants),
        degradation: given(degradation),
        prices: given(prices),
    };
    compile::compile(config_text, config_path, sources)
}

/// A policy file given as text, or absent.
fn given<'a>(file: Option<(&'a str, &'a Path)>) -> PolicySource<'a> {
    match file {
        Some((text, path)) => PolicySource::Text(text, path),
        None => PolicySource::Absent,
    }
}

/// Compiles the embedded defaults ([`DEFAULT_CONFIG`], [`DEFAULT_ROUTING`],
/// [`DEFAULT_TENANTS`]), named as the shipped files under `config/` and `policies/`.
pub fn load_default() -> Result<Snapshot, ConfigErrors> {
    load_embedded("")
}

/// Compiles the embedded defaults, named as the shipped files under `<prefix>config/` and
/// `<prefix>policies/` (`infergate up` names them `<embedded>/...`).
pub fn load_embedded(prefix: &str) -> Result<Snapshot, ConfigErrors> {
    let name = |file: &str| std::path::PathBuf::from(format!("{prefix}{file}"));
    let (config, routing, tenants) = (
        name("config/infergate.yaml"),
        name("policies/routing.yaml"),
        name("policies/tenants.yaml"),
    );
    let (degradation, prices) = (
        name("policies/degradation.yaml"),
        name("policies/prices.yaml"),
    );
    load_str_all(
        DEFAULT_CONFIG,
        &config,
        Some((DEFAULT_ROUTING, &routing)),
        Some((DEFAULT_TENANTS, &tenants)),
        Some((DEFAULT_DEGRADATION, &degradation)),
        Some((DEFAULT_PRICES, &prices)),
    )
}

/// The shipped `policies/degradation.yaml`, embedded for `infergate up`.
pub const DEFAULT_DEGRADATION: &str = include_str!("../../policies/degradation.yaml");
