//! The file schemas as plain serde structs, exactly as written in YAML. Values that need a semantic
//! check keep their place in the file (`Spanned`) so validation can report the line.

use std::collections::HashMap;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::snapshot::{Dialect, LogFormat};

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
    pub usage_check: Option<RawUsageCheck>,
    pub outlier: Option<RawOutlier>,
    pub drain: Option<RawDrain>,
    pub limits: Option<RawLimits>,
    pub metrics: Option<RawMetrics>,
    pub debug_headers: Option<bool>,
    pub ledger: Option<RawLedger>,
    pub trace: Option<RawTrace>,
    pub state: Option<RawState>,
    pub quality: Option<RawQuality>,
    pub models: Vec<RawModel>,
    pub pools: Vec<RawPool>,
    pub tenants: Option<Vec<RawTenant>>,
}

/// `state:` (fleet mode).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawState {
    pub redis: Option<RawRedis>,
}

/// `state.redis:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRedis {
    pub url: Option<Text>,
    pub url_env: Option<Text>,
    pub key_prefix: Option<Text>,
    pub timeout: Option<Text>,
    pub replicas: Option<Spanned<u32>>,
    pub fail_closed: Option<bool>,
    pub lease: Option<RawLease>,
    pub prefix_homes: Option<bool>,
}

/// `state.redis.lease:` (quota leasing).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLease {
    pub requests: Option<Spanned<u64>>,
    pub tokens: Option<Spanned<u64>>,
    pub slots: Option<Spanned<u32>>,
    pub hold: Option<Text>,
}

/// `trace:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTrace {
    pub path: Option<Text>,
    pub sample: Option<Spanned<f64>>,
    pub max_bytes: Option<Spanned<u64>>,
    pub keep: Option<Spanned<u32>>,
    pub otlp: Option<RawOtlp>,
}

/// `trace.otlp:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOtlp {
    pub endpoint: Option<Text>,
    pub headers: Option<HashMap<Text, Text>>,
    pub sample: Option<Spanned<f64>>,
    pub timeout: Option<Text>,
    pub max_queue: Option<Spanned<usize>>,
    pub batch: Option<Spanned<usize>>,
    pub batch_delay: Option<Text>,
}

/// `quality:` (quality signals of sampled answers, drift windows).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQuality {
    pub sample_share: Option<Spanned<f64>>,
    pub pool_share: Option<HashMap<Text, Spanned<f64>>>,
    pub refusal_phrases: Option<Vec<Text>>,
    pub queue: Option<Spanned<usize>>,
    pub drift: Option<RawDrift>,
    pub regression: Option<RawRegression>,
}

/// `quality.regression:` (replayed regression prompts).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegression {
    pub prompts: Text,
    pub interval: Option<Text>,
    pub models: Option<Vec<Text>>,
}

/// `quality.drift:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDrift {
    pub enabled: Option<bool>,
    pub window: Option<Spanned<u64>>,
    pub min_count: Option<Spanned<u64>>,
    pub reference: Option<Text>,
    pub psi_threshold: Option<Spanned<f64>>,
}

/// `ledger:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLedger {
    pub enabled: Option<bool>,
    pub path: Option<Text>,
    pub postgres: Option<RawPostgres>,
    pub retention_days: Option<Spanned<u32>>,
    pub queue_rows: Option<Spanned<usize>>,
}

/// `ledger.postgres:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPostgres {
    pub url: Option<Text>,
    pub url_env: Option<Text>,
}

/// `policies/prices.yaml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPricesFile {
    pub version: Option<Spanned<u32>>,
    pub currency: Option<Text>,
    pub models: Option<HashMap<Text, RawPrice>>,
    pub tiers: Option<HashMap<Text, Spanned<f64>>>,
}

/// One model's prices, USD per 1M tokens.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPrice {
    pub input: Spanned<f64>,
    pub cached_input: Option<Spanned<f64>>,
    pub output: Spanned<f64>,
}

/// One budget of a tier or tenant (tenants.yaml).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBudget {
    pub period: Text,
    pub usd: Spanned<f64>,
    pub kind: Option<Text>,
}

/// `metrics:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    pub public: Option<bool>,
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
    pub max_scrape_bytes: Option<Spanned<usize>>,
    pub max_kv_event_line_bytes: Option<Spanned<usize>>,
    pub kv_events_max_backoff: Option<Text>,
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

/// `usage_check:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUsageCheck {
    pub prompt_ratio: Option<Spanned<f64>>,
    pub prompt_slack: Option<u64>,
    pub media_part_tokens: Option<u64>,
    pub completion_slack: Option<u64>,
}

/// `outlier:` (passive health).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOutlier {
    pub eject_after: Option<Spanned<u32>>,
    pub base_ejection_time: Option<Text>,
    pub max_ejection_time: Option<Text>,
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
    pub max_buffered_body_bytes: Option<Spanned<usize>>,
    pub header_read_timeout: Option<Text>,
    pub body_read_timeout: Option<Text>,
    pub max_connections: Option<Spanned<u32>>,
    pub max_connections_per_ip: Option<Spanned<u32>>,
    pub max_requests_in_flight: Option<Spanned<u32>>,
}

/// One entry of `models:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    pub name: Text,
    pub pool: Text,
    pub upstream_model: Option<String>,
    pub max_context: Option<usize>,
    pub tokenizer: Option<crate::tokens::Estimator>,
    pub direct: Option<bool>,
}

/// One entry of `pools:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPool {
    pub name: Text,
    pub dialect: Option<Dialect>,
    pub workers: Option<Vec<RawWorker>>,
    pub admission: Option<RawAdmission>,
    pub kv_events: Option<RawKvEvents>,
}

/// A pool's `kv_events: {zmq, endpoints, topic, tokenizer}`: its vLLM workers' KV-event
/// publishers (`endpoints`: worker URL → endpoint, overriding the `zmq` template).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKvEvents {
    pub zmq: Option<Text>,
    pub endpoints: Option<HashMap<Text, Text>>,
    pub topic: Option<Text>,
    pub tokenizer: Text,
    pub chat_template: Option<Text>,
}

/// A pool's `admission:` section.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmission {
    pub max_in_flight_per_worker: Option<Spanned<usize>>,
    pub max_queue: Option<usize>,
    pub max_wait: Option<Text>,
    pub fair_share: Option<Spanned<RawFairShare>>,
}

/// `admission.fair_share:` `{input_weight, output_weight, locality_window, borrow_slots}`
/// (`{}`: defaults).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFairShare {
    pub input_weight: Option<f64>,
    pub output_weight: Option<f64>,
    pub locality_window: Option<f64>,
    pub borrow_slots: Option<Spanned<u64>>,
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

/// One entry of `tenants:`; its keys come from any mix of the three sources.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTenant {
    pub name: Text,
    pub tier: Text,
    pub keys: Option<Vec<Text>>,
    pub key_env: Option<Text>,
    pub key_file: Option<Text>,
}

/// `policies/tenants.yaml`: tier name → tier, and the tier of a generated demo tenant.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTiersFile {
    pub tiers: Option<HashMap<Text, RawTier>>,
    pub default_tier: Option<Text>,
    pub budgets: Option<HashMap<Text, Vec<RawBudget>>>,
}

/// One tier of tenants.yaml; every field is optional (defaults in `TierSpec`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTier {
    pub priority: Option<u32>,
    pub requests_per_minute: Option<Spanned<u64>>,
    pub tokens_per_minute: Option<Spanned<u64>>,
    pub max_concurrent: Option<Spanned<u32>>,
    pub max_tokens: Option<Spanned<u32>>,
    pub default_max_tokens: Option<Spanned<u32>>,
    pub models: Option<Vec<Text>>,
    pub budgets: Option<Vec<RawBudget>>,
    pub min_deadline: Option<Text>,
}
