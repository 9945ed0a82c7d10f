//! One pooled HTTP client and the exchange of a single planned request: build the streaming
//! body, send it, read the answer frame by frame and turn what was seen into a [`RequestRecord`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::args::Endpoint;
use super::sse::{SseReader, flight_facts, parse_exec_path, path_class};
use crate::report::{CachedTokens, RequestRecord};
use crate::workload::{PlannedRequest, request_body};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use infergate::routing::ROUTE_CACHED_HEADER;

/// What a [`Target`] is built from.
#[derive(Debug, Clone)]
pub struct TargetSpec {
    /// Base URL (`http://host:port`, optionally ending in `/v1`).
    pub url: String,
    /// API to call.
    pub endpoint: Endpoint,
    /// Model name sent in every request.
    pub model: String,
    /// Default API key.
    pub api_key: Option<String>,
    /// Keys of named tenants.
    pub tenant_keys: Vec<(String, String)>,
    /// Idle connections kept per host (the most requests in flight).
    pub max_connections: usize,
    /// Longest wait for the response head or the next body frame.
    pub idle_timeout: Duration,
}

/// Where and how requests are sent; shared by every request task.
pub struct Target {
    client: Client<HttpConnector, Full<Bytes>>,
    uri: Uri,
    endpoint: Endpoint,
    model: String,
    api_key: Option<HeaderValue>,
    tenant_keys: HashMap<String, HeaderValue>,
    idle_timeout: Duration,
}

/// `Bearer KEY` as a sensitive header value; the error never repeats the key.
fn bearer(key: &str, whose: &str) -> Result<HeaderValue, String> {
    let mut v = HeaderValue::from_str(&format!("Bearer {key}"))
        .map_err(|_| format!("the API key of {whose} is not a valid header value"))?;
    v.set_sensitive(true);
    Ok(v)
}

impl Target {
    /// Checks the URL and keys and builds the client.
    pub fn new(spec: &TargetSpec) -> Result<Target, String> {
        let base = spec.url.trim_end_matches('/');
        if base.starts_with("https://") {
            return Err("bench speaks plain HTTP only; put it beside the gateway".into());
        }
        let path = match base.strip_suffix("/v1") {
            Some(_) => spec.endpoint.path().trim_start_matches("/v1"),
            None => spec.endpoint.path(),
        };
        let uri: Uri = format!("{base}{path}")
            .parse()
            .map_err(|e| format!("--url `{}`: {e}", spec.url))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(format!(
                "--url `{}` must look like http://host:port",
                spec.url
            ));
        }
        let api_key = match &spec.api_key {
            Some(k) => Some(bearer(k, "--api-key")?),
            None => None,
        };
        let mut tenant_keys = HashMap::new();
        for (tenant, key) in &spec.tenant_keys {
            tenant_keys.insert(tenant.clone(), bearer(key, &format!("tenant `{tenant}`"))?);
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(spec.idle_timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(spec.max_connections)
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Ok(Target {
            client,
            uri,
            endpoint: spec.endpoint,
            model: spec.model.clone(),
            api_key,
            tenant_keys,
            idle_timeout: spec.idle_timeout,
        })
    }

    /// The URL requests go to.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The streaming request for `req`.
    fn request(&self, req: &PlannedRequest) -> Result<Request<Full<Bytes>>, String> {
        // The same bytes the simulator's gateway stage validates.
        let body = request_body(req, &self.model, self.endpoint == Endpoint::Chat);
        let mut b = Request::post(self.uri.clone()).header(CONTENT_TYPE, "application/json");
        let key = req.tenant.as_ref().and_then(|t| self.tenant_keys.get(t));
        if let Some(key) = key.or(self.api_key.as_ref()) {
            b = b.header(AUTHORIZATION, key.clone());
        }
        if let Some(session) = &req.session {
            b = b.header("x-session-id", session.as_str());
        }
        b.body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| e.to_string())
    }

    /// Sends `req` and reads its answer to the end. Latencies count from `t0` (the planned send
    /// time, so a late client start is not hidden); `start` is `t0` from the start of the run.
    pub async fn exchange(&self, req: &PlannedRequest, t0: Instant, start: f64) -> RequestRecord {
        let mut record = RequestRecord {
            id: req.id,
            tenant: req.tenant.clone(),
            class: req.class.clone(),
            worker: None,
            path: None,
            shared: None,
            status: 0,
            start,
            ttft: None,
            itl: Vec::new(),
            e2e: 0.0,
            prompt_tokens: req.prompt.len() as u64,
            output_tokens: 0,
            asked_output_tokens: u64::from(req.output_tokens),
            cached: None,
        };
        let sent = match self.request(req) {
            Ok(r) => tokio::time::timeout(self.idle_timeout, self.client.request(r)).await,
            Err(_) => return record,
        };
        if let Ok(Ok(res)) = sent {
            self.read(res, t0, &mut record).await;
        }
        record.e2e = t0.elapsed().as_secs_f64();
        record
    }

    /// Reads a response into `record`; a stream cut short or silent too long is a transport
    /// error (status 0).
    async fn read(&self, res: Response<Incoming>, t0: Instant, record: &mut RequestRecord) {
        let (parts, mut body) = res.into_parts();
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
        record.worker = header("x-infergate-worker").map(str::to_owned);
        let routed = header(ROUTE_CACHED_HEADER).and_then(parse_route_cached);
        let mut reader = SseReader::default();
        reader.stats.paths = header("x-infergate-exec-path").and_then(parse_exec_path);
        if let Some((shared, path)) = parts
            .headers
            .get(infergate_engine::flight::FLIGHT_HEADER)
            .and_then(|v| flight_facts(v.as_bytes()))
        {
            reader.stats.shared = shared;
            reader.stats.flight_path = Some(path);
        }
        let mut complete = false;
        loop {
            match tokio::time::timeout(self.idle_timeout, body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        reader.feed(data, Instant::now());
                    }
                }
                Ok(None) => {
                    complete = true;
                    break;
                }
                Ok(Some(Err(_))) | Err(_) => break,
            }
        }
        let s = reader.stats;
        let streamed_ok = parts.status.is_success() && complete && s.done;
        record.status = match (s.error, parts.status.is_success()) {
            (Some(code), _) => code,
            (None, true) if !streamed_ok => 0,
            _ => parts.status.as_u16(),
        };
        // The flight record's class counts the steps past the captured budget; the exec-path
        // counts alone cannot tell an eager step beside a short prefill from one past it.
        record.path = s
            .flight_path
            .or_else(|| s.paths.map(|(g, e)| path_class(g, e)))
            .map(str::to_owned);
        record.shared = s.shared;
        record.ttft = s.first.map(|f| f.duration_since(t0).as_secs_f64());
        record.itl = s.gaps;
        record.cached = routed
            .zip(s.cached)
            .map(|((predicted, available), delivered)| CachedTokens {
                predicted,
                delivered,
                available,
            });
        if let Some((prompt, output)) = s.usage {
            record.prompt_tokens = prompt;
            record.output_tokens = output;
        } else {
            record.output_tokens = s.chunks;
        }
    }
}

/// `(predicted, available)` from an `x-infergate-route-cached` value; `None` unless both parse.
pub fn parse_route_cached(value: &str) -> Option<(u64, u64)> {
    let (mut predicted, mut available) = (None, None);
    for part in value.split(',') {
        let (key, n) = part.trim().split_once('=')?;
        let n = n.trim().parse::<u64>().ok()?;
        match key.trim() {
            "predicted" => predicted = Some(n),
            "available" => available = Some(n),
            _ => {}
        }
    }
    predicted.zip(available)
}
