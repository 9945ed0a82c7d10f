//! The file schemas as plain serde structs, exactly as written in YAML. Values that need a semantic
//! check keep their place in the file (`Spanned`) so validation can report the line.

use std::collections::HashMap;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::Spanned;

use super::snapshot::{Dialect, LogFormat};
use crate::routing::PolicyConfig;

/// A string with its place in the file.
pub(super) type Text = Spanned<String>;

/// `config/infergate.yaml`. Only `models` and `pools` are required.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub listen: Option<Text>,
    pub admin: Option<RawAdmin>,
    pub tls: Option<RawTls>,
    pub log: Option<RawLog>,
    pub policies: Option<Text>,
    pub health: Option<RawHealth>,
    pub forward: Option<RawForward>,
    pub drain: Option<RawDrain>,
    pub limits: Option<RawLimits>,
    pub models: Vec<RawModel>,
    pub pools: Vec<RawPool>,
}

/// `admin:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    pub listen: Option<Text>,
    pub api_key_env: Option<Text>,
}

/// `tls:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub cert: Text,
    pub key: Text,
}

/// `log:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    pub format: Option<LogFormat>,
    pub level: Option<Text>,
}

/// `health:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    pub poll_interval: Option<Text>,
    pub timeout: Option<Text>,
    pub eject_after: Option<Spanned<u32>>,
    pub readmit_after: Option<Spanned<u32>>,
}

/// `forward:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawForward {
    pub connect_timeout: Option<Text>,
    pub first_byte_timeout: Option<Text>,
    pub idle_timeout: Option<Text>,
    pub total_timeout: Option<Text>,
    pub retries: Option<u32>,
}

/// `drain:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDrain {
    pub grace: Option<Text>,
}

/// `limits:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub max_body_bytes: Option<Spanned<usize>>,
}

/// One entry of `models:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    pub name: Text,
    pub pool: Text,
    pub upstream_model: Option<String>,
}

/// One entry of `pools:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPool {
    pub name: Text,
    pub dialect: Option<Dialect>,
    pub workers: Option<Vec<RawWorker>>,
}

/// One entry of a pool's `workers:`, a single-key map naming its kind.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum RawWorker {
    Url(Text),
    Spawn(RawSpawn),
    Dns(Box<RawDns>),
}

/// `spawn: {count, args}`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSpawn {
    pub count: Option<Spanned<usize>>,
    pub args: Option<Vec<String>>,
}

/// `dns: {name, port, scheme, interval}`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDns {
    pub name: Text,
    pub port: Spanned<u16>,
    pub scheme: Option<Text>,
    pub interval: Option<Text>,
}

/// `policies/routing.yaml`: pool name → policy.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRouting {
    pub pools: Option<HashMap<Text, PolicyConfig>>,
}

/// `policies/routing.yaml` read a second time for the place of every key under each pool, so a
/// parameter out of range is reported on its own line (`PolicyConfig` itself carries no places).
#[derive(Debug, Deserialize)]
pub(super) struct RoutingKeys {
    pub pools: Option<HashMap<Text, Option<HashMap<Text, IgnoredAny>>>>,
}
