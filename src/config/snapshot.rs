//! The compiled configuration: one immutable, validated `Snapshot` that the gateway swaps in whole.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::routing::PolicyConfig;

/// Everything the gateway needs from `config/infergate.yaml`, `policies/routing.yaml` and
/// `policies/tenants.yaml`, validated and resolved (addresses parsed, durations parsed, paths absolute, references
/// turned into indices).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Address of the client-facing listener. Default `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// The admin listener and its key.
    pub admin: AdminConfig,
    /// TLS termination on the client listener; `None` serves plain HTTP. Default `None`.
    pub tls: Option<TlsConfig>,
    /// Log format and filter.
    pub log: LogConfig,
    /// Worker health and load polling.
    pub health: HealthConfig,
    /// Upstream timeouts and retries.
    pub forward: ForwardConfig,
    /// How far a worker's reported usage may stray from what the request made possible.
    pub usage_check: crate::usage_check::UsageCheckConfig,
    /// Passive health: failed requests in a row that eject a worker, and ejection times.
    pub outlier: crate::workers::state::OutlierSettings,
    /// How long streams in flight may run after SIGTERM. Default 30 s.
    pub drain_grace: Duration,
    /// Largest request body accepted, in bytes. Default 8 MiB (8,388,608).
    pub max_body_bytes: usize,
    /// Memory of the request bodies the gateway holds at once, over all requests (read or
    /// waiting to be forwarded), counted by allocated capacity; past it new bodies get 503 with
    /// Retry-After. Default 256 MiB (32 bodies of the default `max_body_bytes`).
    pub max_buffered_body_bytes: usize,
    /// Client connection timeouts and caps (`limits:`).
    pub connections: ConnectionLimits,
    /// Whether `/metrics` is also served on the client listener (`metrics.public`). Default
    /// `false`: it shows tenant names and worker addresses, so only the admin listener has it.
    pub metrics_public: bool,
    /// Whether answers carry `x-infergate-pool` and `x-infergate-worker` (`debug_headers`).
    /// Default `false`: they reveal internal addresses.
    pub debug_headers: bool,
    /// Models clients may ask for, in file order.
    pub models: Vec<ModelRoute>,
    /// Worker pools, in file order; `ModelRoute::pool` indexes this.
    pub pools: Vec<PoolSpec>,
    /// Tenants from the config's `tenants:`, in file order. Default none (`infergate up` then
    /// makes a demo tenant of `default_tier` with a fresh key).
    pub tenants: Vec<TenantSpec>,
    /// Tiers from tenants.yaml, in file order; without that file, one built-in tier `default`
    /// (priority 0, no limits, `max_tokens` 4096, `default_max_tokens` 256, all models).
    pub tiers: Vec<TierSpec>,
    /// Tier of a generated demo tenant: tenants.yaml's `default_tier`, `default` without that
    /// file, `None` when the file names none.
    pub default_tier: Option<String>,
    /// Canary split per model name (clients' model), from `policies/routing.yaml` `models:`.
    pub canaries: std::collections::BTreeMap<String, crate::canary::CanarySpec>,
    /// Shadow traffic per model name, from `policies/routing.yaml` `shadows:`.
    pub shadows: std::collections::BTreeMap<String, crate::shadow::ShadowSpec>,
    /// Shape classes, from `policies/routing.yaml` `shape_classes:` (first match wins).
    pub shape_classes: Vec<crate::routing::shape_class::ShapeClass>,
    /// Degradation policy per pool name, from `policies/degradation.yaml` (absent: none).
    pub degradation: std::collections::BTreeMap<String, crate::degrade::DegradationPolicy>,
    /// Budgets per tenant name (tenants.yaml `budgets:`), replacing their tier's.
    pub tenant_budgets: std::collections::BTreeMap<String, Vec<crate::budgets::BudgetSpec>>,
    /// Prices from `policies/prices.yaml` (version 0 and no models without that file).
    pub prices: std::sync::Arc<crate::pricing::Prices>,
    /// Fleet mode: tenant limits shared through Redis (`state.redis`); `None` keeps them local.
    pub redis: Option<crate::limits::RedisSettings>,
    /// The usage ledger (`ledger:`).
    pub ledger: crate::ledger::LedgerConfig,
    /// The flight-record trace file (`trace:`); `None` writes none. Read at start only.
    pub trace: Option<crate::trace::TraceConfig>,
    /// The flight records' OTLP/HTTP export (`trace.otlp`); `None` exports none. Read at start
    /// only.
    pub otlp: Option<crate::trace::otlp::OtlpConfig>,
    /// Quality signals of sampled answers and drift windows (`quality:`).
    pub quality: std::sync::Arc<crate::quality::QualityConfig>,
    /// Every file the snapshot was compiled from (config, routing.yaml and tenants.yaml when
    /// read, tenants' `key_file`s), absolute, for the file watcher.
    pub files: Vec<PathBuf>,
}

impl Snapshot {
    /// The budgets of `tenant` of tier `tier`: its own, else its tier's.
    pub fn budgets_of<'a>(
        &'a self,
        tenant: &str,
        tier: &'a TierSpec,
    ) -> &'a [crate::budgets::BudgetSpec] {
        self.tenant_budgets
            .get(tenant)
            .map_or(tier.budgets.as_slice(), Vec::as_slice)
    }

    /// The route of the model clients call `name`.
    pub fn model(&self, name: &str) -> Option<&ModelRoute> {
        self.models.iter().find(|m| m.name == name)
    }

    /// Whether `name` is only a non-stable version of another model (a canary arm), so clients
    /// reach it through the split and never by name.
    pub fn is_version_only(&self, name: &str) -> bool {
        !self.canaries.contains_key(name)
            && self.canaries.values().any(|spec| {
                spec.versions
                    .iter()
                    .enumerate()
                    .any(|(i, v)| i != spec.stable && v.model == name)
            })
    }

    /// The pool called `name`, with its index in `pools`.
    pub fn pool(&self, name: &str) -> Option<(usize, &PoolSpec)> {
        self.pools.iter().enumerate().find(|(_, p)| p.name == name)
    }

    /// The tier called `name`.
    pub fn tier(&self, name: &str) -> Option<&TierSpec> {
        self.tiers.iter().find(|t| t.name == name)
    }
}

pub use crate::tenants::TenantSpec;

/// What a tier allows: priority in admission queues, rate limits, token ceilings, models.
#[derive(Debug, Clone, PartialEq)]
pub struct TierSpec {
    /// Unique tier name.
    pub name: String,
    /// Admission priority; higher is served first. Default 0.
    pub priority: u32,
    /// Requests per minute per tenant, ≥ 1; `None` is unlimited. Default `None`.
    pub requests_per_minute: Option<u64>,
    /// Tokens (prompt + reserved completion) per minute per tenant, ≥ 1; `None` is unlimited.
    /// Default `None`.
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight per tenant, ≥ 1; `None` is unlimited. Default `None`.
    pub max_concurrent: Option<u32>,
    /// Largest `max_tokens` a request may ask for, ≥ 1. Default 4096.
    pub max_tokens: u32,
    /// Completion tokens reserved when a request gives no `max_tokens`, ≤ `max_tokens`.
    /// Default 256 (or `max_tokens` when smaller).
    pub default_max_tokens: u32,
    /// Model names the tier may call; `"*"` allows every model. Default `["*"]`.
    pub models: Vec<String>,
    /// Spending budgets of each tenant of the tier (unless the tenant has its own). Default none.
    pub budgets: Vec<crate::budgets::BudgetSpec>,
    /// The shortest TTFT deadline a request of the tier may ask for (`x-infergate-deadline-ms`;
    /// shorter ones are raised to it); `None`: the tier's requests take no deadline (400).
    pub min_deadline: Option<std::time::Duration>,
}

impl TierSpec {
    /// The per-tenant limits the tier sets (the limiter's input; the simulator's too).
    pub fn limits(&self) -> crate::limits::TierLimits {
        crate::limits::TierLimits {
            requests_per_minute: self.requests_per_minute,
            tokens_per_minute: self.tokens_per_minute,
            max_concurrent: self.max_concurrent,
        }
    }

    /// True when the tier may call the model clients call `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.models.iter().any(|m| m == "*" || m == model)
    }
}

/// The admin listener (reload, status, drain endpoints).
#[derive(Debug, Clone, PartialEq)]
pub struct AdminConfig {
    /// Address of the admin listener. Default `127.0.0.1:8081` (loopback only).
    pub listen: SocketAddr,
    /// Admin key read at load time from the variable named by `admin.api_key_env`.
    /// Required when `listen` is not a loopback address. Default `None`.
    pub api_key: Option<String>,
}

/// A certificate chain and private key for rustls.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsConfig {
    /// PEM certificate chain, absolute (the file gives it relative to itself).
    pub cert: PathBuf,
    /// PEM private key, absolute.
    pub key: PathBuf,
}

/// How logs are written.
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// Line format. Default `text`.
    pub format: LogFormat,
    /// `tracing` filter directive, e.g. `info` or `info,infergate=debug`. Default `info`.
    pub level: String,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Health checking and load polling of workers.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthConfig {
    /// Interval between `/metrics` polls of each worker. Default 250 ms.
    pub poll_interval: Duration,
    /// Time allowed for one poll. Default 1 s.
    pub timeout: Duration,
    /// Consecutive failed polls that eject a worker (failed requests count apart, see
    /// `Snapshot::outlier`). Default 3.
    pub eject_after: u32,
    /// Consecutive successful polls that end a poll ejection (the worker then serves one probe
    /// request before its full share). Default 2.
    pub readmit_after: u32,
    /// Largest `/metrics` scrape read, bytes; a larger one is a failed poll (`too_large`) and
    /// is not read past this. Default 4 MiB (a busy vLLM exports ~100 KiB).
    pub max_scrape_bytes: usize,
    /// Longest line of a worker's `/kv/events` stream, bytes; a longer one drops the stream.
    /// Default 4 MiB (a snapshot of ~220k keys, a cache of ~14M tokens).
    pub max_kv_event_line_bytes: usize,
    /// Ceiling of the wait before a failing KV event stream is reopened; the wait starts at
    /// `poll_interval` and doubles per failure in a row. Default 30 s.
    pub kv_events_max_backoff: Duration,
}

/// Client connection limits of the public listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Time a client has to send a request's whole header block, from the moment the gateway
    /// waits for one: a slow header gets 408 and the connection closes, and an idle keep-alive
    /// connection closes after the same time. Default 10 s.
    pub header_read_timeout: Duration,
    /// Time a client has to send a request's whole body once its headers are in; past it the
    /// request gets 408 and the connection closes. Default 30 s.
    pub body_read_timeout: Duration,
    /// Open client connections in all; past it new ones are closed at once. Default 16,384.
    pub max_connections: u32,
    /// Open connections from one client IP. Default 4,096 (behind a proxy or NAT every client
    /// shares its address: raise it there).
    pub max_connections_per_ip: u32,
    /// Requests in flight on the public listener (from arrival until the answer's last byte)
    /// past which a new one gets 503 at once, before any work; reads (GET: models, health,
    /// metrics) are never capped. None by default. A reload applies it to requests that arrive
    /// after it.
    pub max_requests_in_flight: Option<u32>,
}

/// Timeouts and retries of forwarded requests.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardConfig {
    /// Time to open a connection to a worker. Default 2 s.
    pub connect_timeout: Duration,
    /// Time from sending the request to the first response byte. Default 60 s.
    pub first_byte_timeout: Duration,
    /// Longest gap between two body chunks. Default 30 s.
    pub idle_timeout: Duration,
    /// Whole-request limit, streaming included. Default 10 min.
    pub total_timeout: Duration,
    /// Extra attempts on another worker before the first byte (connect failure or 503). Default 2.
    pub retries: u32,
}

/// A model name clients may use, and the pool that serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRoute {
    /// Name clients put in the `model` field.
    pub name: String,
    /// Index into `Snapshot::pools`.
    pub pool: usize,
    /// Name sent to the workers when it differs from `name`. Default `None`.
    pub upstream_model: Option<String>,
    /// Context length in tokens; longer prompts are refused before any upstream work.
    /// Default `None` (the worker decides).
    pub max_context: Option<usize>,
    /// Tokenizer estimating prompt tokens for metering (`cl100k`, `o200k`, `bytes`). Default `cl100k`.
    pub tokenizer: crate::tokens::Estimator,
    /// Whether clients may name this model even when it is only another model's canary version.
    /// Default `false`: a canary arm is reached through the split alone, so the kill switch holds.
    pub direct: bool,
}

impl ModelRoute {
    /// The model name to send upstream.
    pub fn upstream_name(&self) -> &str {
        self.upstream_model.as_deref().unwrap_or(&self.name)
    }
}

/// A pool of interchangeable workers with one routing policy.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSpec {
    /// Unique pool name (metric label, `x-infergate-pool` header).
    pub name: String,
    /// Metrics dialect of the workers. Default `infergate`.
    pub dialect: Dialect,
    /// Where the workers come from; never empty.
    pub workers: Vec<WorkerSource>,
    /// Routing policy from `policies/routing.yaml`. Default `prefix` with default settings.
    pub policy: PolicyConfig,
    /// Bounded priority queue in front of the workers.
    pub admission: AdmissionSpec,
    /// vLLM KV events over ZMQ for precise prefix routing (`kv_events:`). Default `None`: the
    /// workers' own `GET /kv/events`, if any.
    pub kv_events: Option<VllmKvEventsSpec>,
}

/// Where a pool's vLLM workers publish their KV events, and how to read their token ids.
#[derive(Debug, Clone, PartialEq)]
pub struct VllmKvEventsSpec {
    /// ZMQ endpoint, `tcp://HOST:PORT`; `{host}` stands for each worker URL's host. Default
    /// `None`: only the workers of `endpoints`.
    pub endpoint: Option<String>,
    /// Endpoints of single workers, by worker URL (first match wins over `endpoint`).
    pub endpoints: Vec<(String, String)>,
    /// Topic the publisher sends on (vLLM's `KVEventsConfig.topic`). Default empty.
    pub topic: String,
    /// The model's `tokenizer.json`, resolved against the config file's directory.
    pub tokenizer: std::path::PathBuf,
    /// Its vocabulary, loaded at compile time.
    pub vocab: std::sync::Arc<crate::workers::vllm_events::vocab::Vocab>,
    /// The workers' chat template (`chat_template: chatml`), so chat prompts are hashed as the
    /// workers cache them. Default `None`: chat prompts keep the canonical form, whose keys
    /// the events rarely match.
    pub chat: Option<crate::routing::chat_keys::ChatMarkup>,
}

impl VllmKvEventsSpec {
    /// The endpoint of the worker at `worker_url`; `None` when none is configured for it.
    pub fn endpoint_for(&self, worker_url: &str) -> Option<String> {
        if let Some((_, e)) = self.endpoints.iter().find(|(u, _)| u == worker_url) {
            return Some(e.clone());
        }
        let template = self.endpoint.as_ref()?;
        if !template.contains("{host}") {
            return Some(template.clone());
        }
        let uri: hyper::Uri = worker_url.parse().ok()?;
        let host = uri.host()?;
        Some(template.replace("{host}", host))
    }
}

pub use crate::admission::AdmissionSpec;

/// Which metric names a worker's `/metrics` uses (defined with the parser that reads them).
pub use crate::workers::load_metrics::Dialect;

/// One source of workers in a pool.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerSource {
    /// A fixed worker: an `http` or `https` base URL without trailing slash.
    Url(String),
    /// Engine workers the gateway starts itself (child processes of the same binary).
    Spawn {
        /// Number of processes, at least 1. Default 1.
        count: usize,
        /// Arguments after `infergate engine`. Default none.
        args: Vec<String>,
    },
    /// Workers found by resolving a DNS name (e.g. a Kubernetes headless Service).
    Dns {
        /// Name to resolve; each address is one worker.
        name: String,
        /// Port of every worker.
        port: u16,
        /// `http` or `https`. Default `http`.
        scheme: String,
        /// Re-resolution interval. Default 5 s.
        interval: Duration,
    },
}
