//! The replay task of `quality.regression`: every `interval` it sends each prompt of the fixed set
//! to each version of each listed model, one at a time, scores the answers with
//! [`crate::quality::signals`] and counts them as `infergate_quality_regression_total` and
//! `infergate_quality_regression_runs_total` (never the text, in a metric or a log line).
//!
//! **Why in-process forwarding, not a loopback request.** A prompt goes through the pipeline's
//! own pieces from validation on: [`validate`] with the body a client would send (the model's
//! upstream name, the routing features), the split's rewrite to the version's model and pool,
//! the pool's routing policy ([`route::pick`]) and the relay ([`forward`]: passive health,
//! retries before the first byte, timeouts, the worker's in-flight count, routing feedback).
//! It never enters the public listener, so there is nothing for a client to forge: no marker
//! header or internal key that could make a request unbilled, and no gateway-only exception in
//! the edge, authentication or metering. It has no caller, so it reaches none of the phases that
//! bill or judge a tenant's traffic: no rate limit or budget, no usage-ledger row, no tenant
//! counter, no sample for the canary's analysis or the sampled quality signals. By design, too,
//! it skips admission's queue and degradation: the point is how the version itself answers, and
//! a round is one request in flight per gateway replica (each replica replays the set, so size
//! `interval` for the fleet). The pool's own series (TTFT, worker load) do see it: the worker did
//! that work.

use std::sync::Arc;
use std::time::Instant;

use http_body_util::BodyExt;
use hyper::HeaderMap;
use hyper::body::Bytes;

use crate::canary::CanarySpec;
use crate::config::TierSpec;
use crate::gateway::{Gateway, Live};
use crate::pipeline::forward::relay::attempts::Attempts;
use crate::pipeline::forward::relay::body::OnEnd;
use crate::pipeline::forward::relay::send::{Outbound, forward};
use crate::pipeline::forward::settings;
use crate::pipeline::route;
use crate::pipeline::validate::request::{Endpoint, validate};
use crate::quality::capture::{Capture, asked_of};
use crate::quality::regression::{DEFAULT_VERSION, PromptKind, RegressionPrompt, Schedule, Step};
use crate::quality::signals::{self, Signals};
use std::collections::BTreeMap;

impl Gateway {
    /// Replays the regression prompts on the schedule of the snapshot in force (none while
    /// `quality.regression` is absent), until the gateway drains.
    pub async fn replay_loop(self: Arc<Self>) {
        let mut schedule = Schedule::default();
        while !self.is_draining() {
            let live = self.live();
            let interval = live
                .snapshot
                .quality
                .regression
                .as_ref()
                .map(|r| r.interval);
            match schedule.step(interval, Instant::now()) {
                Step::Wait(d) => {
                    // An old snapshot is not kept alive by the wait.
                    drop(live);
                    tokio::time::sleep(d).await;
                }
                // Not ready (workers not yet polled, or none healthy at all): the round would
                // measure the gateway's start, not a version; the next is an interval later.
                Step::Run if !self.is_ready() => {
                    tracing::debug!("regression round skipped: the gateway is not ready");
                }
                // A round finishes on the snapshot it started with, as a request does.
                Step::Run => self.replay_round(&live).await,
            }
        }
    }

    /// One round: every prompt against every version, in order.
    async fn replay_round(&self, live: &Live) {
        let Some(config) = &live.snapshot.quality.regression else {
            return;
        };
        let tier = internal_tier();
        let (mut ok, mut failed) = (0u64, 0u64);
        for target in targets(&config.models, &live.snapshot.canaries) {
            let labels = [target.model.as_str(), &target.version];
            for prompt in config.prompts.iter() {
                if self.is_draining() {
                    return;
                }
                let result = match self.replay(live, &tier, &target, prompt).await {
                    Ok(raised) => {
                        ok += 1;
                        for signal in raised.names() {
                            self.metrics
                                .quality_regression
                                .with_label_values(&[labels[0], labels[1], signal])
                                .inc();
                        }
                        "ok"
                    }
                    Err(error) => {
                        failed += 1;
                        // The prompt's id, never its text.
                        tracing::debug!(prompt = %prompt.id, model = labels[0], version = labels[1], %error, "regression prompt failed");
                        "error"
                    }
                };
                self.metrics
                    .quality_regression_runs
                    .with_label_values(&[labels[0], labels[1], result])
                    .inc();
            }
        }
        tracing::debug!(ok, failed, "regression round done");
    }

    /// Sends `prompt` to `target`'s version and scores the answer; why not, as a message.
    async fn replay(
        &self,
        live: &Live,
        tier: &TierSpec,
        target: &Target,
        prompt: &RegressionPrompt,
    ) -> Result<Signals, String> {
        let snapshot = &live.snapshot;
        let endpoint = match prompt.kind {
            PromptKind::Chat => Endpoint::ChatCompletions,
            PromptKind::Completion => Endpoint::Completions,
        };
        let body = Bytes::from(prompt.body(&target.model));
        let mut valid = validate(endpoint, &HeaderMap::new(), body, snapshot, tier)
            .map_err(|e| e.to_string())?;
        // The split's rewrite, to the version instead of a sticky key's pick.
        let version = snapshot
            .model(&target.served)
            .ok_or_else(|| format!("version model `{}` missing", target.served))?;
        if version.upstream_name() != valid.model || version.pool != valid.pool {
            valid.body.set_string("model", version.upstream_name());
            valid.pool = version.pool;
        }
        let pool = live
            .pools
            .get(valid.pool)
            .ok_or("the version routes to a missing pool")?;
        let first = route::pick(pool, &valid.features, false, &self.metrics)
            .ok_or_else(|| format!("no healthy worker in pool `{}`", pool.name))?;
        let request_id = infergate_engine::edge::request_id::fresh();
        let request_id = request_id.to_str().unwrap_or("regression");
        let sent = valid.body.bytes();
        // No caller to account: the answer's end only teaches routing.
        let mut on_end = |_: Attempts| -> Option<OnEnd> { None };
        let out = Outbound {
            path: endpoint.path(),
            body: sent.clone(),
            stream: false,
            expects_done: true,
            by_load: false,
            features: &valid.features,
            request_id,
            traceparent: None,
            started: Instant::now(),
            hide_usage_chunk: false,
            on_end: &mut on_end,
            grace_over: self.grace_over(),
            capture: false,
        };
        let res = forward(pool, first, out, settings(snapshot), &self.metrics)
            .await
            .map_err(|e| e.to_string())?;
        let status = res.status();
        // A whole answer, already held (and bounded) by the relay.
        let answer = res
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("the answer broke off: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("the worker answered {status}"));
        }
        let mut capture = Capture::default();
        capture.json_body(&answer);
        let asked = capture.checkable(asked_of(&sent));
        let refusals = &snapshot.quality.refusal_phrases;
        Ok(signals::score(&capture.answer(), asked, refusals))
    }
}

/// The limits a replayed prompt is validated under: any model, any `max_tokens` (the prompts
/// file is the operator's own, and each prompt names its `max_tokens`).
fn internal_tier() -> TierSpec {
    TierSpec {
        name: "regression".into(),
        priority: 0,
        requests_per_minute: None,
        tokens_per_minute: None,
        max_concurrent: None,
        max_tokens: u32::MAX,
        default_max_tokens: 256,
        models: vec!["*".into()],
        budgets: Vec::new(),
        min_deadline: None,
    }
}

/// One (model, version) a round replays the prompts against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The model as clients name it (the body's `model`).
    pub model: String,
    /// The version's name ([`DEFAULT_VERSION`] without a canary split).
    pub version: String,
    /// The config model that serves the version (its pool and upstream name).
    pub served: String,
}

/// Every version of each of `models`: both of a canary split's, in its file order; the model
/// itself as [`DEFAULT_VERSION`] without one.
pub fn targets(models: &[String], canaries: &BTreeMap<String, CanarySpec>) -> Vec<Target> {
    let mut out = Vec::new();
    for model in models {
        match canaries.get(model) {
            Some(spec) => out.extend(spec.versions.iter().map(|v| Target {
                model: model.clone(),
                version: v.name.clone(),
                served: v.model.clone(),
            })),
            None => out.push(Target {
                model: model.clone(),
                version: DEFAULT_VERSION.into(),
                served: model.clone(),
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_canary_model_is_replayed_on_both_versions_and_a_plain_one_as_default() {
        let spec = crate::canary::spec::parse_models(
            "models:\n  chat:\n    versions:\n      - {name: v1, model: chat-a, weight: 90}\n      - {name: v2, model: chat-b, weight: 10}\n",
        )
        .unwrap();
        let models = ["chat".to_string(), "embed".to_string()];
        let got: Vec<(String, String, String)> = targets(&models, &spec)
            .into_iter()
            .map(|t| (t.model, t.version, t.served))
            .collect();
        let want = [
            ("chat", "v1", "chat-a"),
            ("chat", "v2", "chat-b"),
            ("embed", "default", "embed"),
        ]
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
        assert_eq!(got, want);
        assert!(targets(&[], &spec).is_empty());
    }
}
