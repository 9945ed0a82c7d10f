//! Validation of the optional sections of the config file (listeners, TLS, log, health, forward,
//! drain, limits). Each takes the raw section, reports bad values, and fills in the defaults.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde_saphyr::Spanned;

use super::raw::{
    RawAdmin, RawDrain, RawForward, RawHealth, RawLimits, RawLog, RawOutlier, RawTls,
    RawUsageCheck, Text,
};
use super::snapshot::{
    AdminConfig, ConnectionLimits, ForwardConfig, HealthConfig, LogConfig, LogFormat, TlsConfig,
};
use super::values::{parse_duration, parse_socket_addr};
use crate::diagnostics::Sink;
use crate::workers::state::OutlierSettings;

/// `health:` with defaults 250ms / 1s / 3 / 2, scrapes up to 4 MiB, KV event lines up to 4 MiB,
/// KV event reconnects backing off up to 30 s.
pub(super) fn health(sink: &mut Sink<'_>, raw: Option<&RawHealth>) -> HealthConfig {
    let min_bytes = |sink: &mut Sink<'_>, field: Option<&Spanned<usize>>, name: &str| match field {
        None => 4 << 20,
        Some(n) if n.value < 1024 => {
            sink.at(&n.referenced, format!("{name} must be at least 1024 bytes"));
            4 << 20
        }
        Some(n) => n.value,
    };
    HealthConfig {
        max_scrape_bytes: min_bytes(
            sink,
            raw.and_then(|h| h.max_scrape_bytes.as_ref()),
            "health.max_scrape_bytes",
        ),
        max_kv_event_line_bytes: min_bytes(
            sink,
            raw.and_then(|h| h.max_kv_event_line_bytes.as_ref()),
            "health.max_kv_event_line_bytes",
        ),
        kv_events_max_backoff: duration(
            sink,
            raw.and_then(|h| h.kv_events_max_backoff.as_ref()),
            "health.kv_events_max_backoff",
            Duration::from_secs(30),
        ),
        poll_interval: duration(
            sink,
            raw.and_then(|h| h.poll_interval.as_ref()),
            "health.poll_interval",
            Duration::from_millis(250),
        ),
        timeout: duration(
            sink,
            raw.and_then(|h| h.timeout.as_ref()),
            "health.timeout",
            Duration::from_secs(1),
        ),
        eject_after: at_least_one(
            sink,
            raw.and_then(|h| h.eject_after.as_ref()),
            "health.eject_after",
            3,
        ),
        readmit_after: at_least_one(
            sink,
            raw.and_then(|h| h.readmit_after.as_ref()),
            "health.readmit_after",
            2,
        ),
    }
}

/// `forward:` with defaults 2s / 60s / 30s / 10m and 2 retries.
pub(super) fn forward(sink: &mut Sink<'_>, raw: Option<&RawForward>) -> ForwardConfig {
    let mut field = |get: fn(&RawForward) -> Option<&Text>, name: &str, default_secs: u64| {
        duration(
            sink,
            raw.and_then(get),
            name,
            Duration::from_secs(default_secs),
        )
    };
    ForwardConfig {
        connect_timeout: field(|f| f.connect_timeout.as_ref(), "forward.connect_timeout", 2),
        first_byte_timeout: field(
            |f| f.first_byte_timeout.as_ref(),
            "forward.first_byte_timeout",
            60,
        ),
        idle_timeout: field(|f| f.idle_timeout.as_ref(), "forward.idle_timeout", 30),
        total_timeout: field(|f| f.total_timeout.as_ref(), "forward.total_timeout", 600),
        retries: raw.and_then(|f| f.retries).unwrap_or(2),
    }
}

/// `usage_check:` with defaults ratio 2, prompt slack 256, 8,192 tokens a media part,
/// completion slack 16; the ratio must be a number of at least 1.
pub(super) fn usage_check(
    sink: &mut Sink<'_>,
    raw: Option<&RawUsageCheck>,
) -> crate::usage_check::UsageCheckConfig {
    let default = crate::usage_check::UsageCheckConfig::default();
    let Some(raw) = raw else {
        return default;
    };
    let prompt_ratio = match &raw.prompt_ratio {
        None => default.prompt_ratio,
        Some(r) if !r.value.is_finite() || r.value < 1.0 => {
            sink.at(
                &r.referenced,
                format!(
                    "usage_check.prompt_ratio must be a number ≥ 1, got {}",
                    r.value
                ),
            );
            default.prompt_ratio
        }
        Some(r) => r.value,
    };
    crate::usage_check::UsageCheckConfig {
        prompt_ratio,
        prompt_slack: raw.prompt_slack.unwrap_or(default.prompt_slack),
        media_part_tokens: raw.media_part_tokens.unwrap_or(default.media_part_tokens),
        completion_slack: raw.completion_slack.unwrap_or(default.completion_slack),
    }
}

/// `outlier:` (passive health) with defaults 5 / 10s / 5m; the cap may not be below the base.
pub(super) fn outlier(sink: &mut Sink<'_>, raw: Option<&RawOutlier>) -> OutlierSettings {
    let d = OutlierSettings::default();
    let base_ejection = duration(
        sink,
        raw.and_then(|o| o.base_ejection_time.as_ref()),
        "outlier.base_ejection_time",
        d.base_ejection,
    );
    let max_field = raw.and_then(|o| o.max_ejection_time.as_ref());
    let mut max_ejection = duration(sink, max_field, "outlier.max_ejection_time", d.max_ejection);
    if max_ejection < base_ejection {
        if let Some(text) = max_field {
            sink.at(
                &text.referenced,
                "outlier.max_ejection_time must be at least outlier.base_ejection_time",
            );
        }
        max_ejection = base_ejection;
    }
    OutlierSettings {
        eject_after: at_least_one(
            sink,
            raw.and_then(|o| o.eject_after.as_ref()),
            "outlier.eject_after",
            d.eject_after,
        ),
        base_ejection,
        max_ejection,
    }
}

/// `drain.grace`, default 30 s; zero is allowed (no grace).
pub(super) fn drain_grace(sink: &mut Sink<'_>, raw: Option<&RawDrain>) -> Duration {
    let default = Duration::from_secs(30);
    let Some(text) = raw.and_then(|d| d.grace.as_ref()) else {
        return default;
    };
    parse_duration(&text.value).unwrap_or_else(|msg| {
        sink.at(&text.referenced, format!("drain.grace: {msg}"));
        default
    })
}

/// `limits.max_body_bytes`, default 8 MiB; must be at least 1.
pub(super) fn max_body_bytes(sink: &mut Sink<'_>, raw: Option<&RawLimits>) -> usize {
    let default = 8 * 1024 * 1024;
    match raw.and_then(|l| l.max_body_bytes.as_ref()) {
        None => default,
        Some(n) if n.value == 0 => {
            sink.at(&n.referenced, "limits.max_body_bytes must be ≥ 1");
            default
        }
        Some(n) => n.value,
    }
}

/// `limits.max_buffered_body_bytes`: memory of request bodies held gateway-wide at once (their
/// buffers' capacity), default 256 MiB; it must hold at least one body of `max_body_bytes`.
pub(super) fn max_buffered_body_bytes(
    sink: &mut Sink<'_>,
    raw: Option<&RawLimits>,
    max_body_bytes: usize,
) -> usize {
    let default = (256 * 1024 * 1024).max(max_body_bytes);
    match raw.and_then(|l| l.max_buffered_body_bytes.as_ref()) {
        None => default,
        Some(n) if n.value < max_body_bytes => {
            sink.at(
                &n.referenced,
                format!(
                    "limits.max_buffered_body_bytes must be at least limits.max_body_bytes ({max_body_bytes})"
                ),
            );
            default
        }
        Some(n) => n.value,
    }
}

/// `limits:` for client connections: header read timeout 10 s, 16,384 connections in all and
/// 4,096 per client IP, body read timeout 30 s, no cap on requests in flight.
pub(super) fn connections(sink: &mut Sink<'_>, raw: Option<&RawLimits>) -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: duration(
            sink,
            raw.and_then(|l| l.header_read_timeout.as_ref()),
            "limits.header_read_timeout",
            Duration::from_secs(10),
        ),
        body_read_timeout: duration(
            sink,
            raw.and_then(|l| l.body_read_timeout.as_ref()),
            "limits.body_read_timeout",
            Duration::from_secs(30),
        ),
        max_connections: at_least_one(
            sink,
            raw.and_then(|l| l.max_connections.as_ref()),
            "limits.max_connections",
            16_384,
        ),
        max_connections_per_ip: at_least_one(
            sink,
            raw.and_then(|l| l.max_connections_per_ip.as_ref()),
            "limits.max_connections_per_ip",
            4_096,
        ),
        max_requests_in_flight: raw
            .and_then(|l| l.max_requests_in_flight.as_ref())
            .map(|n| at_least_one(sink, Some(n), "limits.max_requests_in_flight", 1)),
    }
}

/// A duration field, or `default` when absent; a bad or zero value is reported.
fn duration(sink: &mut Sink<'_>, field: Option<&Text>, name: &str, default: Duration) -> Duration {
    let Some(text) = field else { return default };
    match parse_duration(&text.value) {
        Ok(d) if d.is_zero() => sink.at(
            &text.referenced,
            format!("{name} must be greater than zero"),
        ),
        Ok(d) => return d,
        Err(msg) => sink.at(&text.referenced, format!("{name}: {msg}")),
    }
    default
}

/// A count that must be at least 1, or `default` when absent.
fn at_least_one(
    sink: &mut Sink<'_>,
    field: Option<&Spanned<u32>>,
    name: &str,
    default: u32,
) -> u32 {
    match field {
        None => default,
        Some(n) if n.value == 0 => {
            sink.at(&n.referenced, format!("{name} must be ≥ 1"));
            default
        }
        Some(n) => n.value,
    }
}

/// A socket address field, or `default` when absent.
pub(super) fn address(
    sink: &mut Sink<'_>,
    field: Option<&Text>,
    name: &str,
    default: SocketAddr,
) -> SocketAddr {
    let Some(text) = field else { return default };
    parse_socket_addr(&text.value).unwrap_or_else(|msg| {
        sink.at(&text.referenced, format!("{name}: {msg}"));
        default
    })
}

/// The admin listener; a non-loopback address needs a key, and a named key variable must be set.
pub(super) fn admin(sink: &mut Sink<'_>, raw: Option<&RawAdmin>) -> AdminConfig {
    let listen_field = raw.and_then(|a| a.listen.as_ref());
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 8081));
    let listen = address(sink, listen_field, "admin.listen", loopback);
    let key_env = raw.and_then(|a| a.api_key_env.as_ref());
    let api_key = key_env.and_then(|env| match std::env::var(&env.value) {
        Ok(key) if !key.is_empty() => Some(key),
        Ok(_) => {
            let msg = format!(
                "admin.api_key_env: environment variable `{}` is empty",
                env.value
            );
            sink.at(&env.referenced, msg);
            None
        }
        Err(_) => {
            let msg = format!(
                "admin.api_key_env: environment variable `{}` is not set",
                env.value
            );
            sink.at(&env.referenced, msg);
            None
        }
    });
    if let Some(field) = listen_field.filter(|_| !listen.ip().is_loopback() && key_env.is_none()) {
        let msg = format!(
            "admin.listen {listen} is not a loopback address: set admin.api_key_env to the \
             environment variable holding the admin key"
        );
        sink.at(&field.referenced, msg);
    }
    AdminConfig { listen, api_key }
}

/// TLS files resolved against the config file's directory; each must exist.
pub(super) fn tls(sink: &mut Sink<'_>, raw: &RawTls, base: &Path) -> Option<TlsConfig> {
    let mut resolve = |field: &Text, name: &str| {
        let joined = base.join(&field.value);
        let path = std::path::absolute(&joined).unwrap_or(joined);
        if path.is_file() {
            return Some(path);
        }
        sink.at(
            &field.referenced,
            format!("{name}: file {} does not exist", path.display()),
        );
        None
    };
    let cert = resolve(&raw.cert, "tls.cert");
    let key = resolve(&raw.key, "tls.key");
    Some(TlsConfig {
        cert: cert?,
        key: key?,
    })
}

/// Log format and level; the level must not be empty.
pub(super) fn log(sink: &mut Sink<'_>, raw: Option<&RawLog>) -> LogConfig {
    let format = raw.and_then(|l| l.format).unwrap_or(LogFormat::Text);
    let level = match raw.and_then(|l| l.level.as_ref()) {
        Some(text) if text.value.trim().is_empty() => {
            sink.at(
                &text.referenced,
                "log.level is empty: write e.g. info or info,infergate=debug",
            );
            String::new()
        }
        Some(text) => text.value.trim().to_string(),
        None => "info".to_string(),
    };
    LogConfig { format, level }
}

/// `trace:`: the flight-record trace file (`path`, relative to the config file), the share of
/// requests written (`sample`, default 1), the size it rotates at (`max_bytes`, default
/// 100 MiB, at least 4 KiB) and the rotated files kept (`keep`, default 5); and the OTLP export
/// (`otlp`, see [`super::otlp_section`]). `path` may be left out when `otlp` is given.
pub(super) fn trace(
    sink: &mut Sink<'_>,
    raw: Option<&super::raw::RawTrace>,
    base: &Path,
) -> (
    Option<crate::trace::TraceConfig>,
    Option<crate::trace::otlp::OtlpConfig>,
) {
    use crate::trace::{DEFAULT_KEEP, DEFAULT_MAX_BYTES, TraceConfig};
    let Some(raw) = raw else {
        return (None, None);
    };
    let sample = match &raw.sample {
        None => 1.0,
        Some(s) if !(0.0..=1.0).contains(&s.value) => {
            sink.at(&s.referenced, "trace.sample must be between 0 and 1");
            1.0
        }
        Some(s) => s.value,
    };
    let otlp = raw
        .otlp
        .as_ref()
        .and_then(|o| super::otlp_section::otlp(sink, o, sample));
    let path = match &raw.path {
        None if raw.otlp.is_some() => {
            let file_only = [
                raw.max_bytes.as_ref().map(|m| (&m.referenced, "max_bytes")),
                raw.keep.as_ref().map(|k| (&k.referenced, "keep")),
            ];
            for (at, key) in file_only.into_iter().flatten() {
                sink.at(
                    at,
                    format!("trace.{key} is a setting of the trace file: give `path` too"),
                );
            }
            return (None, otlp);
        }
        None => {
            sink.whole("trace: give `path` (a JSON-lines file, created on first start) or `otlp`");
            return (None, None);
        }
        Some(path) if path.value.trim().is_empty() => {
            sink.at(&path.referenced, "trace.path is empty");
            return (None, otlp);
        }
        Some(path) => path,
    };
    let joined = base.join(&path.value);
    let max_bytes = match &raw.max_bytes {
        None => DEFAULT_MAX_BYTES,
        Some(m) if m.value < 4096 => {
            sink.at(&m.referenced, "trace.max_bytes must be ≥ 4096");
            DEFAULT_MAX_BYTES
        }
        Some(m) => m.value,
    };
    let keep = match &raw.keep {
        None => DEFAULT_KEEP,
        Some(k) if k.value > 1000 => {
            sink.at(&k.referenced, "trace.keep must be ≤ 1000");
            DEFAULT_KEEP
        }
        Some(k) => k.value,
    };
    let file = TraceConfig {
        path: std::path::absolute(&joined).unwrap_or(joined),
        sample,
        max_bytes,
        keep,
    };
    (Some(file), otlp)
}

/// `ledger:`: a SQLite file (`path`, relative to the config file) or a PostgreSQL database
/// (`postgres: {url}`), retention in days (default 90; 0 keeps every row), the writer's queue
/// size (default 65,536 rows).
pub(super) fn ledger(
    sink: &mut Sink<'_>,
    raw: Option<&super::raw::RawLedger>,
    base: &Path,
) -> crate::ledger::LedgerConfig {
    use crate::ledger::{
        DEFAULT_QUEUE_ROWS, DEFAULT_RETENTION_DAYS, LedgerBackend, LedgerConfig, LedgerSettings,
    };
    let Some(raw) = raw else {
        return LedgerConfig::Unset;
    };
    if raw.enabled == Some(false) {
        return LedgerConfig::Off;
    }
    let backend = match (&raw.path, &raw.postgres) {
        (Some(path), None) => {
            if path.value.trim().is_empty() {
                sink.at(&path.referenced, "ledger.path is empty");
            }
            let joined = base.join(&path.value);
            LedgerBackend::Sqlite(std::path::absolute(&joined).unwrap_or(joined))
        }
        (None, Some(pg)) => {
            let Some((url, at)) = url_or_env(
                sink,
                pg.url.as_ref(),
                pg.url_env.as_ref(),
                "ledger.postgres",
                None,
            ) else {
                return LedgerConfig::Off;
            };
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                // Never repeat the URL: it may hold a password.
                sink.at(&at, "ledger.postgres.url must start with postgres://");
            }
            LedgerBackend::Postgres(url)
        }
        (Some(path), Some(_)) => {
            sink.at(
                &path.referenced,
                "ledger: give `path` (SQLite) or `postgres` (PostgreSQL), not both",
            );
            return LedgerConfig::Off;
        }
        (None, None) => {
            sink.whole(
                "ledger: give `path` (a SQLite file, created on first start), `postgres: {url}` or `enabled: false`",
            );
            return LedgerConfig::Off;
        }
    };
    let retention_days = match &raw.retention_days {
        None => Some(DEFAULT_RETENTION_DAYS),
        Some(d) if d.value == 0 => None,
        Some(d) => Some(d.value),
    };
    let queue_rows = match &raw.queue_rows {
        None => DEFAULT_QUEUE_ROWS,
        Some(q) if q.value < 1_000 => {
            sink.at(&q.referenced, "ledger.queue_rows must be ≥ 1000");
            DEFAULT_QUEUE_ROWS
        }
        Some(q) => q.value,
    };
    LedgerConfig::On(LedgerSettings {
        backend,
        retention_days,
        queue_rows,
    })
}

/// `state.redis`: a `redis://` URL, a key prefix (default `infergate`), the timeout of one call
/// (default 50ms) past which the replica uses its local share, `replicas` (≥ 1; the divisor of
/// that share before any heartbeat was counted), `fail_closed` (default false).
pub(super) fn redis(
    sink: &mut Sink<'_>,
    raw: &super::raw::RawRedis,
) -> Option<crate::limits::RedisSettings> {
    let (url, at) = url_or_env(
        sink,
        raw.url.as_ref(),
        raw.url_env.as_ref(),
        "state.redis",
        None,
    )?;
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        sink.at(&at, "state.redis.url must start with redis://");
        return None;
    }
    let timeout = match &raw.timeout {
        None => Duration::from_millis(50),
        Some(t) => match parse_duration(&t.value) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => {
                sink.at(&t.referenced, "state.redis.timeout must be above 0");
                return None;
            }
            Err(msg) => {
                sink.at(&t.referenced, format!("state.redis.timeout: {msg}"));
                return None;
            }
        },
    };
    let key_prefix = raw
        .key_prefix
        .as_ref()
        .map_or_else(|| "infergate".to_string(), |k| k.value.clone());
    if let Some(k) = raw
        .key_prefix
        .as_ref()
        .filter(|k| k.value.trim().is_empty())
    {
        sink.at(&k.referenced, "state.redis.key_prefix is empty");
    }
    if let Some(r) = raw.replicas.as_ref().filter(|r| r.value == 0) {
        sink.at(&r.referenced, "state.redis.replicas must be ≥ 1");
    }
    Some(crate::limits::RedisSettings {
        url,
        key_prefix,
        timeout,
        replicas: raw.replicas.as_ref().map(|r| r.value.max(1)),
        fail_closed: raw.fail_closed.unwrap_or(false),
        lease: raw.lease.as_ref().map(|l| lease(sink, l)),
        prefix_homes: raw.prefix_homes.unwrap_or(false),
    })
}

/// `state.redis.lease`: block sizes in requests (default 10), tokens (default 4000) and
/// concurrency slots (default 2), each ≥ 1, and how long an unused lease is kept (default 10s,
/// above 0).
fn lease(sink: &mut Sink<'_>, raw: &super::raw::RawLease) -> crate::limits::LeaseSettings {
    let mut block = |v: &Option<Spanned<u64>>, what: &str, default: u64| match v {
        None => default,
        Some(n) if n.value == 0 => {
            sink.at(
                &n.referenced,
                format!("state.redis.lease.{what} must be ≥ 1"),
            );
            1
        }
        Some(n) => n.value,
    };
    let requests = block(&raw.requests, "requests", 10);
    let tokens = block(&raw.tokens, "tokens", 4_000);
    let slots = match &raw.slots {
        None => 2,
        Some(n) if n.value == 0 => {
            sink.at(&n.referenced, "state.redis.lease.slots must be ≥ 1");
            1
        }
        Some(n) => n.value,
    };
    let hold = match &raw.hold {
        None => Duration::from_secs(10),
        Some(t) => match parse_duration(&t.value) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => {
                sink.at(&t.referenced, "state.redis.lease.hold must be above 0");
                Duration::from_secs(10)
            }
            Err(msg) => {
                sink.at(&t.referenced, format!("state.redis.lease.hold: {msg}"));
                Duration::from_secs(10)
            }
        },
    };
    crate::limits::LeaseSettings {
        requests,
        tokens,
        slots,
        hold,
    }
}

/// A URL given inline (`url`) or, when it holds a password, in an environment variable
/// (`url_env`, e.g. from a Kubernetes Secret); exactly one of the two. `what` names the section.
fn url_or_env(
    sink: &mut Sink<'_>,
    url: Option<&Text>,
    env: Option<&Text>,
    what: &str,
    at: Option<&serde_saphyr::Location>,
) -> Option<(String, serde_saphyr::Location)> {
    match (url, env) {
        (Some(u), None) => Some((u.value.trim().to_string(), u.referenced)),
        (None, Some(e)) => match std::env::var(&e.value) {
            Ok(v) if !v.trim().is_empty() => Some((v.trim().to_string(), e.referenced)),
            _ => {
                let msg = format!(
                    "{what}.url_env: environment variable `{}` is not set or empty",
                    e.value
                );
                sink.at(&e.referenced, msg);
                None
            }
        },
        (Some(u), Some(_)) => {
            sink.at(
                &u.referenced,
                format!("{what}: give `url` or `url_env`, not both"),
            );
            None
        }
        (None, None) => {
            let msg =
                format!("{what}: give `url` or `url_env` (an environment variable holding it)");
            match at {
                Some(l) => sink.at(l, msg),
                None => sink.whole(msg),
            }
            None
        }
    }
}
