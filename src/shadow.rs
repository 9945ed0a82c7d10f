//! Shadow traffic: a sampled share of a model's requests is mirrored to another model's pool
//! with bounded concurrency. The shadow answer is read, compared with the client's (status,
//! latency, output length) into metrics, and thrown away. The client's request never waits for,
//! and is never changed or failed by, its shadow.

use crate::diagnostics::{Problem, YamlPath};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde::Deserialize;
use tokio::sync::{Semaphore, oneshot};

use crate::metrics::GatewayMetrics;
use crate::upstream::UpstreamClient;
use crate::workers::pool::PoolRuntime;

/// One model's shadow, from `policies/routing.yaml` `shadows:` (as written: defaults filled in,
/// checked by [`check_shadows`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowSpec {
    /// Config model (and so pool) that serves the shadow copies.
    pub model: String,
    /// Share of requests mirrored, 0..=1. Default 0.1.
    #[serde(default = "default_share")]
    pub share: f64,
    /// Most shadow requests in flight; beyond it copies are dropped, never queued. Default 8.
    #[serde(default = "default_concurrency")]
    pub max_concurrency: usize,
}

fn default_share() -> f64 {
    0.1
}

fn default_concurrency() -> usize {
    8
}

/// Reads only the `shadows:` key of routing.yaml text; errors are messages (model names
/// unchecked). For unit tests; the config hands over the parsed section.
#[cfg(test)]
pub fn parse_shadows(text: &str) -> Result<BTreeMap<String, ShadowSpec>, Vec<String>> {
    #[derive(Deserialize)]
    struct ShadowsOnly {
        #[serde(default)]
        shadows: BTreeMap<String, ShadowSpec>,
    }
    let shadows = match serde_saphyr::from_str::<ShadowsOnly>(text) {
        Ok(file) => file.shadows,
        Err(e) => return Err(vec![format!("shadows: {e}")]),
    };
    let (specs, problems) = check_shadows(shadows, &|_| true);
    crate::diagnostics::into_messages(specs, problems)
}

/// Checks routing.yaml's parsed `shadows:` section, model names against `known` (the config's
/// models): the shadows and every problem, each with its place in the file.
pub fn check_shadows(
    shadows: BTreeMap<String, ShadowSpec>,
    known: &dyn Fn(&str) -> bool,
) -> (BTreeMap<String, ShadowSpec>, Vec<Problem>) {
    let mut problems = Vec::new();
    let root = YamlPath::root().key("shadows");
    for (model, s) in &shadows {
        let at = root.key(model);
        let mut push = |key: Option<&str>, message: String| {
            let path = key.map_or_else(|| at.clone(), |k| at.key(k));
            problems.push(Problem::at(&path, message));
        };
        if !known(model) {
            push(
                None,
                format!("shadows: model `{model}` is not a model of the config"),
            );
        }
        if !known(&s.model) {
            push(
                Some("model"),
                format!(
                    "shadows: shadow model `{}` is not a model of the config",
                    s.model
                ),
            );
        }
        if !(0.0..=1.0).contains(&s.share) {
            push(
                Some("share"),
                format!(
                    "shadows: `{model}`: share must be in 0..=1, got {}",
                    s.share
                ),
            );
        }
        if s.max_concurrency == 0 {
            push(
                Some("max_concurrency"),
                format!("shadows: `{model}`: max_concurrency must be at least 1"),
            );
        }
    }
    (shadows, problems)
}

/// A shadow at run time: its spec and the permits that bound its concurrency.
#[derive(Debug, Clone)]
pub struct Shadow {
    /// The configured shadow.
    pub spec: ShadowSpec,
    permits: Arc<Semaphore>,
}

/// What the client's own response turned out to be, for the comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrimaryOutcome {
    /// HTTP status.
    pub status: u16,
    /// Completion tokens reported (or counted).
    pub output_tokens: u64,
    /// End-to-end latency.
    pub latency: Duration,
}

impl Shadow {
    /// A shadow with `spec.max_concurrency` permits.
    pub fn new(spec: ShadowSpec) -> Self {
        let permits = Arc::new(Semaphore::new(spec.max_concurrency));
        Self { spec, permits }
    }

    /// Whether request `id` is in the sampled share (deterministic in the id).
    pub fn sampled(&self, id: &str) -> bool {
        let h = xxhash_rust::xxh3::xxh3_64(id.as_bytes());
        ((h >> 11) as f64 / (1u64 << 53) as f64) < self.spec.share
    }

    /// Starts the shadow copy of `body` (already pointed at the shadow model) on `pool`, unless
    /// the concurrency bound is reached. Returns the sender the client's response reports to.
    pub fn mirror(
        &self,
        client: UpstreamClient,
        pool: Arc<PoolRuntime>,
        body: Bytes,
        path: &'static str,
        metrics: Arc<GatewayMetrics>,
        model: String,
    ) -> Option<oneshot::Sender<PrimaryOutcome>> {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            metrics
                .shadow_requests
                .with_label_values(&[&model, "dropped"])
                .inc();
            return None;
        };
        let (tx, rx) = oneshot::channel::<PrimaryOutcome>();
        tokio::spawn(async move {
            let _permit = permit;
            let started = Instant::now();
            let outcome =
                tokio::time::timeout(Duration::from_secs(120), call(&client, &pool, body, path))
                    .await;
            let latency = started.elapsed();
            let (status, tokens) = match outcome {
                Ok(Ok(r)) => r,
                _ => {
                    metrics
                        .shadow_requests
                        .with_label_values(&[&model, "error"])
                        .inc();
                    return;
                }
            };
            metrics
                .shadow_requests
                .with_label_values(&[&model, "ok"])
                .inc();
            // The client's answer may still be streaming: wait for it, not forever.
            let Ok(Ok(primary)) = tokio::time::timeout(Duration::from_secs(600), rx).await else {
                return;
            };
            let same = if primary.status == status {
                "true"
            } else {
                "false"
            };
            metrics
                .shadow_status_match
                .with_label_values(&[&model, same])
                .inc();
            if primary.latency > Duration::ZERO {
                metrics
                    .shadow_latency_ratio
                    .with_label_values(&[&model])
                    .observe(latency.as_secs_f64() / primary.latency.as_secs_f64());
            }
            if primary.output_tokens > 0 {
                metrics
                    .shadow_output_ratio
                    .with_label_values(&[&model])
                    .observe(tokens as f64 / primary.output_tokens as f64);
            }
        });
        Some(tx)
    }
}

/// Sends the copy to a worker of `pool` and reads the whole answer: (status, completion tokens).
async fn call(
    client: &UpstreamClient,
    pool: &PoolRuntime,
    body: Bytes,
    path: &str,
) -> Result<(u16, u64), String> {
    let features = crate::routing::RequestFeatures::default();
    let (worker, _) = pool
        .route(&features, &[], false)
        .ok_or("no healthy shadow worker")?;
    let _guard = worker.start_request();
    let req = hyper::Request::post(format!("{}{path}", worker.url))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let res = client.request(req).await.map_err(|e| e.to_string())?;
    let status = res.status().as_u16();
    let bytes = res
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let tokens = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["usage"]["completion_tokens"].as_u64())
        .unwrap_or(0);
    Ok((status, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_shadows_and_checks_ranges() {
        let ok = parse_shadows(
            "pools: {p: {policy: prefix}}\nshadows:\n  m: {model: m2, share: 0.25}\n",
        )
        .unwrap();
        assert_eq!(ok["m"].model, "m2");
        assert_eq!(ok["m"].max_concurrency, 8);
        assert!(parse_shadows("pools: {}\n").unwrap().is_empty());
        let err = parse_shadows("shadows:\n  m: {model: m2, share: 2, max_concurrency: 0}\n")
            .unwrap_err();
        assert_eq!(err.len(), 2, "{err:?}");
    }

    #[test]
    fn sampling_takes_about_the_share() {
        let s = Shadow::new(ShadowSpec {
            model: "x".into(),
            share: 0.2,
            max_concurrency: 1,
        });
        let n = (0..10_000)
            .filter(|i| s.sampled(&format!("req-{i}")))
            .count();
        assert!((1_800..=2_200).contains(&n), "{n}");
    }
}
