//! Validation of `trace.otlp:`, the OTLP/HTTP export of the flight records: a plain-HTTP
//! collector URL, extra headers that are valid HTTP and none the exporter sets itself, a sample
//! share, an export timeout, and the queue and batch sizes, each error at its line.

use std::time::Duration;

use super::raw::RawOtlp;
use super::values::parse_duration;
use crate::diagnostics::Sink;
use crate::trace::otlp::{
    DEFAULT_BATCH, DEFAULT_BATCH_DELAY, DEFAULT_MAX_QUEUE, DEFAULT_TIMEOUT, OtlpConfig,
};

/// Most records the export queue may hold (each is a request's line, ~2 KiB).
const MAX_QUEUE: usize = 1 << 20;

/// Checks `trace.otlp`; `file_sample` (the trace file's `sample`) is the default share.
pub(super) fn otlp(sink: &mut Sink<'_>, raw: &RawOtlp, file_sample: f64) -> Option<OtlpConfig> {
    let endpoint = match &raw.endpoint {
        None => {
            sink.whole("trace.otlp: give `endpoint`, e.g. http://127.0.0.1:4318/v1/traces");
            None
        }
        Some(e) => match endpoint(&e.value) {
            Ok(url) => Some(url),
            Err(msg) => {
                sink.at(&e.referenced, format!("trace.otlp.endpoint: {msg}"));
                None
            }
        },
    };
    let mut headers = Vec::new();
    for (name, value) in raw.headers.iter().flatten() {
        let lower = name.value.trim().to_ascii_lowercase();
        if hyper::header::HeaderName::from_bytes(lower.as_bytes()).is_err() {
            let msg = format!("trace.otlp.headers: `{}` is not a header name", name.value);
            sink.at(&name.referenced, msg);
        } else if matches!(
            lower.as_str(),
            "content-type" | "content-length" | "host" | "transfer-encoding" | "connection"
        ) {
            let msg = format!("trace.otlp.headers: `{lower}` is set by the exporter itself");
            sink.at(&name.referenced, msg);
        } else if hyper::header::HeaderValue::from_str(&value.value).is_err() {
            // The value may be a secret: never repeated.
            let msg = format!("trace.otlp.headers.{lower}: the value is not a valid header value");
            sink.at(&value.referenced, msg);
        } else {
            headers.push((lower, value.value.clone()));
        }
    }
    headers.sort();
    let sample = match &raw.sample {
        None => file_sample,
        Some(s) if !(0.0..=1.0).contains(&s.value) => {
            sink.at(&s.referenced, "trace.otlp.sample must be between 0 and 1");
            file_sample
        }
        Some(s) => s.value,
    };
    let mut duration = |field: &Option<super::raw::Text>, name: &str, default: Duration| {
        let Some(t) = field else {
            return default;
        };
        match parse_duration(&t.value) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => {
                sink.at(&t.referenced, format!("trace.otlp.{name} must be above 0"));
                default
            }
            Err(msg) => {
                sink.at(&t.referenced, format!("trace.otlp.{name}: {msg}"));
                default
            }
        }
    };
    let timeout = duration(&raw.timeout, "timeout", DEFAULT_TIMEOUT);
    let batch_delay = duration(&raw.batch_delay, "batch_delay", DEFAULT_BATCH_DELAY);
    let max_queue = match &raw.max_queue {
        None => DEFAULT_MAX_QUEUE,
        Some(q) if q.value == 0 || q.value > MAX_QUEUE => {
            let msg = format!("trace.otlp.max_queue must be between 1 and {MAX_QUEUE}");
            sink.at(&q.referenced, msg);
            DEFAULT_MAX_QUEUE
        }
        Some(q) => q.value,
    };
    let batch = match &raw.batch {
        None => DEFAULT_BATCH.min(max_queue),
        Some(b) if b.value == 0 || b.value > max_queue => {
            let msg = format!("trace.otlp.batch must be between 1 and max_queue ({max_queue})");
            sink.at(&b.referenced, msg);
            DEFAULT_BATCH.min(max_queue)
        }
        Some(b) => b.value,
    };
    Some(OtlpConfig {
        endpoint: endpoint?,
        headers,
        sample,
        timeout,
        max_queue,
        batch,
        batch_delay,
    })
}

/// A plain-HTTP URL with a host and a path (OTLP/HTTP posts traces to `/v1/traces`).
fn endpoint(text: &str) -> Result<String, String> {
    let text = text.trim();
    let uri: hyper::Uri = text.parse().map_err(|e| {
        format!("`{text}` is not a URL ({e}): write e.g. http://127.0.0.1:4318/v1/traces")
    })?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "`{text}`: https is not supported; export to a local OpenTelemetry Collector over http (it forwards over TLS)"
            ));
        }
        _ => {
            return Err(format!(
                "`{text}`: write an http:// URL, e.g. http://127.0.0.1:4318/v1/traces"
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{text}` has no host"));
    }
    if uri.path() == "/" {
        return Err(format!(
            "`{text}` has no path: OTLP/HTTP takes traces at /v1/traces, write e.g. {}/v1/traces",
            text.trim_end_matches('/')
        ));
    }
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_plain_http_urls_with_a_path() {
        assert_eq!(
            endpoint(" http://otel:4318/v1/traces "),
            Ok("http://otel:4318/v1/traces".into())
        );
        for (bad, says) in [
            ("https://otel:4318/v1/traces", "https is not supported"),
            (
                "otel:4318/v1/traces",
                "e.g. http://127.0.0.1:4318/v1/traces",
            ),
            ("ftp://otel/v1/traces", "http:// URL"),
            ("http://otel:4318", "no path"),
            ("http://otel:4318/", "no path"),
            ("not a url", "not a URL"),
        ] {
            let e = endpoint(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
