//! A trace line as OpenTelemetry spans, in OTLP's JSON encoding (the protobuf messages'
//! proto3 JSON, with trace and span ids as hex strings and times as Unix-nanosecond strings, as
//! OTLP/HTTP specifies): one SERVER span for the request, named `{gen_ai.operation.name}
//! {gen_ai.request.model}`, and one CLIENT span per attempt on a worker, its child. Attributes
//! use the GenAI and HTTP semantic-convention names where they exist, `infergate.*` for the rest
//! (tenant, pool, version, execution paths, batch sizes, engine times, preemptions). A request
//! whose client sent a W3C `traceparent` joins that trace under the client's span.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use serde_json::{Value, json};

use crate::trace::{AttemptLine, TraceLine};

/// `service.name` of the resource.
pub const SERVICE_NAME: &str = "infergate";
/// SpanKind values of the OTLP schema.
const KIND_SERVER: u8 = 2;
const KIND_CLIENT: u8 = 3;
/// Status code ERROR of the OTLP schema.
const STATUS_ERROR: u8 = 2;

/// Trace and span ids: random 64-bit words (a per-process random SipHash key over a counter),
/// never zero.
pub struct Ids {
    seed: RandomState,
    n: u64,
}

impl Default for Ids {
    fn default() -> Self {
        Self {
            seed: RandomState::new(),
            n: 0,
        }
    }
}

impl Ids {
    fn word(&mut self) -> u64 {
        loop {
            self.n = self.n.wrapping_add(1);
            let mut h = self.seed.build_hasher();
            h.write_u64(self.n);
            let w = h.finish();
            if w != 0 {
                return w;
            }
        }
    }

    /// A new span id: 16 hex digits.
    pub fn span_id(&mut self) -> String {
        format!("{:016x}", self.word())
    }

    /// A new trace id: 32 hex digits.
    pub fn trace_id(&mut self) -> String {
        format!("{:016x}{:016x}", self.word(), self.word())
    }
}

/// The body of one export: every line's spans under one resource and scope.
pub fn export_request(lines: &[TraceLine], ids: &mut Ids) -> Value {
    let spans: Vec<Value> = lines.iter().flat_map(|l| spans(l, ids)).collect();
    let version = env!("CARGO_PKG_VERSION");
    let mut resource = Attrs::default();
    resource.str("service.name", SERVICE_NAME);
    resource.str("service.version", version);
    json!({"resourceSpans": [{
        "resource": {"attributes": resource.0},
        "scopeSpans": [{
            "scope": {"name": SERVICE_NAME, "version": version},
            "spans": spans,
        }],
    }]})
}

/// Spans one line becomes: 1 + its attempts.
pub fn span_count(line: &TraceLine) -> u64 {
    1 + line.attempts.len() as u64
}

/// The GenAI operation of an endpoint (`gen_ai.operation.name`).
pub fn operation(endpoint: &str) -> &'static str {
    match endpoint {
        "/v1/completions" => "text_completion",
        "/v1/embeddings" => "embeddings",
        _ => "chat",
    }
}

/// The request's SERVER span, then a CLIENT span per attempt.
pub fn spans(line: &TraceLine, ids: &mut Ids) -> Vec<Value> {
    let (trace_id, parent) = match line.traceparent.as_deref().and_then(parent_of) {
        Some((trace, span)) => (trace.to_owned(), span.to_owned()),
        None => (ids.trace_id(), String::new()),
    };
    let op = operation(line.endpoint);
    let name = format!("{op} {}", line.model);
    let start = nanos(line.start_ms as f64);
    let span_id = ids.span_id();
    let mut out = Vec::with_capacity(1 + line.attempts.len());
    let mut server = json!({
        "traceId": trace_id,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": KIND_SERVER,
        "startTimeUnixNano": start.to_string(),
        "endTimeUnixNano": (start + nanos(line.total_ms)).to_string(),
        "attributes": server_attrs(line, op).0,
    });
    if line.status >= 500 {
        server["status"] =
            json!({"code": STATUS_ERROR, "message": format!("HTTP {}", line.status)});
    }
    out.push(server);
    for (i, a) in line.attempts.iter().enumerate() {
        let begin = start + nanos(a.start_ms);
        let mut client = json!({
            "traceId": trace_id,
            "spanId": ids.span_id(),
            "parentSpanId": span_id,
            "name": name,
            "kind": KIND_CLIENT,
            "startTimeUnixNano": begin.to_string(),
            "endTimeUnixNano": (begin + nanos(a.ms)).to_string(),
            "attributes": attempt_attrs(line, a, (op, i)).0,
        });
        if let Some(why) = attempt_error(a) {
            client["status"] = json!({"code": STATUS_ERROR, "message": why});
        }
        out.push(client);
    }
    out
}

/// The trace id and parent span id of a well-formed `traceparent`.
fn parent_of(tp: &str) -> Option<(&str, &str)> {
    if !infergate_engine::edge::trace_context::valid_traceparent(tp.as_bytes()) {
        return None;
    }
    Some((tp.get(3..35)?, tp.get(36..52)?))
}

/// `ms` milliseconds in whole nanoseconds (0 for a negative or non-finite value).
fn nanos(ms: f64) -> u64 {
    if ms.is_finite() && ms > 0.0 {
        (ms * 1e6).round() as u64
    } else {
        0
    }
}

/// Why an attempt failed (`error.type`): its failure, or its 4xx/5xx status.
fn attempt_error(a: &AttemptLine) -> Option<String> {
    match (a.error, a.status) {
        (Some(e), _) => Some(e.to_owned()),
        (None, Some(s)) if s >= 400 => Some(s.to_string()),
        _ => None,
    }
}

fn server_attrs(line: &TraceLine, op: &str) -> Attrs {
    let mut a = Attrs::default();
    a.str("gen_ai.operation.name", op);
    a.str("gen_ai.request.model", &line.model);
    let served = if line.served_model.is_empty() {
        &line.model
    } else {
        &line.served_model
    };
    a.str("gen_ai.response.model", served);
    if let Some(m) = line.max_tokens {
        a.int("gen_ai.request.max_tokens", m);
    }
    let flight = line.flight.as_ref();
    let input = line.prompt_tokens.or(flight.map(|f| f.tokens.prompt));
    let output = line.completion_tokens.or(flight.map(|f| f.tokens.decode));
    if let Some(t) = input {
        a.int("gen_ai.usage.input_tokens", t);
    }
    if let Some(t) = output {
        a.int("gen_ai.usage.output_tokens", t);
    }
    a.str("http.request.method", "POST");
    if !line.endpoint.is_empty() {
        a.str("http.route", line.endpoint);
    }
    a.int("http.response.status_code", line.status.into());
    if line.status >= 500 {
        a.str("error.type", &line.status.to_string());
    }
    a.str("infergate.request_id", &line.request_id);
    a.str("infergate.tenant", &line.tenant);
    a.str("infergate.pool", &line.pool);
    if let Some(class) = &line.class {
        a.str("infergate.class", class);
    }
    if !line.version.is_empty() {
        a.str("infergate.version", &line.version);
    }
    a.str("infergate.worker", &line.worker);
    a.bool("infergate.stream", line.stream);
    if let Some(q) = line.queue_ms {
        a.int("infergate.gateway.queue_ms", q);
    }
    if let Some(t) = line.ttft_ms {
        a.f64("infergate.ttft_ms", t);
    }
    a.f64("infergate.total_ms", line.total_ms);
    a.str("infergate.flight", line.flight_status);
    if let Some(f) = flight {
        a.str("infergate.engine.version", &f.engine);
        a.str("infergate.engine.backend", &f.backend);
        a.ints("infergate.engine.capture_sizes", &f.capture);
        a.str("infergate.exec.path", f.path());
        a.int("infergate.exec.graph_steps", f.steps.graph.into());
        a.int("infergate.exec.eager_steps", f.steps.eager.into());
        a.int("infergate.exec.off_path_steps", f.off_path.into());
        a.int("infergate.batch.min", f.batch.min.into());
        a.int("infergate.batch.max", f.batch.max.into());
        a.f64("infergate.batch.mean", f.batch.mean);
        a.int("infergate.tokens.cached", f.tokens.cached);
        a.f64("infergate.engine.queue_ms", f.queue_ms);
        a.f64("infergate.engine.prefill_ms", f.prefill_ms);
        a.f64("infergate.engine.decode_ms", f.decode_ms);
        a.int("infergate.preemptions", f.preemptions.into());
        let x = &f.features;
        a.int("infergate.features.prompts", x.prompts.into());
        a.int("infergate.features.n", x.n.into());
        a.int("infergate.features.best_of", x.best_of.into());
        a.bool("infergate.features.logprobs", x.logprobs);
        a.bool("infergate.features.echo", x.echo);
        a.bool("infergate.features.tools", x.tools);
        a.bool("infergate.features.response_format", x.response_format);
        a.int("infergate.features.images", x.images.into());
    }
    a
}

fn attempt_attrs(line: &TraceLine, at: &AttemptLine, (op, index): (&str, usize)) -> Attrs {
    let mut a = Attrs::default();
    a.str("gen_ai.operation.name", op);
    let model = if line.served_model.is_empty() {
        &line.model
    } else {
        &line.served_model
    };
    a.str("gen_ai.request.model", model);
    if let Ok(uri) = at.worker.parse::<hyper::Uri>()
        && let Some(host) = uri.host()
    {
        a.str(
            "server.address",
            host.trim_start_matches('[').trim_end_matches(']'),
        );
        let default = if uri.scheme_str() == Some("https") {
            443
        } else {
            80
        };
        a.int("server.port", uri.port_u16().unwrap_or(default).into());
    }
    a.str("http.request.method", "POST");
    if !line.endpoint.is_empty() {
        a.str("url.full", &format!("{}{}", at.worker, line.endpoint));
    }
    if let Some(s) = at.status {
        a.int("http.response.status_code", s.into());
    }
    if let Some(e) = attempt_error(at) {
        a.str("error.type", &e);
    }
    a.str("infergate.worker", &at.worker);
    a.int("infergate.attempt", index as u64);
    a.bool("infergate.retried", at.retried);
    a
}

/// OTLP `KeyValue`s.
#[derive(Default)]
struct Attrs(Vec<Value>);

impl Attrs {
    fn put(&mut self, key: &str, value: Value) {
        self.0.push(json!({"key": key, "value": value}));
    }
    fn str(&mut self, key: &str, v: &str) {
        self.put(key, json!({"stringValue": v}));
    }
    /// int64 travels as a JSON string (proto3 JSON).
    fn int(&mut self, key: &str, v: u64) {
        self.put(key, json!({"intValue": v.min(i64::MAX as u64).to_string()}));
    }
    /// JSON has no NaN or infinity: such a value is left out.
    fn f64(&mut self, key: &str, v: f64) {
        if v.is_finite() {
            self.put(key, json!({"doubleValue": v}));
        }
    }
    fn bool(&mut self, key: &str, v: bool) {
        self.put(key, json!({"boolValue": v}));
    }
    fn ints(&mut self, key: &str, v: &[u32]) {
        let values: Vec<Value> = v
            .iter()
            .map(|x| json!({"intValue": x.to_string()}))
            .collect();
        self.put(key, json!({"arrayValue": {"values": values}}));
    }
}

#[cfg(test)]
#[path = "span_tests.rs"]
mod tests;
