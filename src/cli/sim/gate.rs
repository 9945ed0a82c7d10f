//! What a request meets before an engine's queue, run with the live code wherever it is a pure
//! function: the gateway's accept, validate and meter checks (body size 413, `request::validate`
//! with the tier's `max_tokens` ceiling and models 400/403/404, the model's `max_context` 400)
//! on the very body `infergate bench` sends, against a gateway config (by default the embedded
//! one `infergate up` serves); then the engine's own context check (400). Rate limits, budgets
//! and tenant concurrency caps depend on wall-clock state and are not modelled.
//!
//! Decoding, serializing and BPE-counting a prompt costs far more than simulating it (about a
//! millisecond for 2,000 tokens), so [`Gate::check`] runs the whole live path only for requests
//! a cheap bound cannot clear: `validate`'s verdict depends on the tier and `max_tokens`, not on
//! the prompt's words, and is kept per (tier, max_tokens); the body and the prompt estimate are
//! bounded by the prompt's token count. Tests hold the shortcut to the whole path.

use std::collections::HashMap;
use std::sync::OnceLock;

use hyper::HeaderMap;
use hyper::body::Bytes;

use crate::workload::{PlannedRequest, feature_bytes, request_body};
use infergate::config::{ModelRoute, Snapshot};
use infergate::error::GatewayError;
use infergate::pipeline::validate::request::{
    Endpoint, PromptSize, ValidRequest, check_context, validate,
};
use infergate::request_body::body_limits;
use infergate::routing::shape_class::{Shape, classify};
use infergate::tokens::Estimator;
use infergate_engine::tokenizer::SimTokenizer;

/// Body bytes besides the prompt text: the JSON keys and values `bench` sends, model name apart,
/// with room to spare.
const BODY_OVERHEAD: usize = 1024;

/// What `validate` said for a (tier, max_tokens, prompt empty) triple: the model's context and
/// tokenizer, or the refusal.
type Verdict = Result<(Option<usize>, Estimator), Refused>;

/// Which check refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The body is over `limits.max_body_bytes` (413).
    Body,
    /// `validate` refused it: a `max_tokens` over the tier's ceiling, a model the tier may not
    /// use, a malformed field (400/403/404).
    Invalid,
    /// The prompt is longer than the model's `max_context` (400).
    Context,
    /// The engine's check: prompt plus `max_tokens` over its context length (400).
    EngineContext,
    /// The engine's parser refused a replayed request's features (image parts: 400).
    EngineInvalid,
}

/// A refusal and the status the client gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Refused {
    /// The check that refused.
    pub why: Refusal,
    /// HTTP status.
    pub status: u16,
}

/// `e` as the refusal `why`.
fn refused(why: Refusal, e: &GatewayError) -> Refused {
    Refused {
        why,
        status: e.status().as_u16(),
    }
}

/// Bytes of the longest decoding of one token of the plan's tokenizer (computed once).
fn max_token_bytes() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        // Without the tokenizer no plan exists either; the bound then never clears a body.
        SimTokenizer::shared().map_or(usize::MAX, |t| {
            (0..=t.eos())
                .map(|id| t.decode(&[id]).len())
                .max()
                .unwrap_or(0)
                .max(1)
        })
    })
}

/// The gateway's checks for one simulated fleet, and how many requests each refused.
#[derive(Debug)]
pub(super) struct Gate {
    snapshot: Snapshot,
    /// The model name clients send (the preset's canonical name, as `bench --model` defaults).
    model: String,
    endpoint: Endpoint,
    /// The engines' context length (the model preset's `max_model_len`).
    engine_context: usize,
    /// Refusals per [`Refusal`], in declaration order.
    counts: [u64; 5],
    /// `validate`'s verdicts so far, by (tier index, max_tokens, prompt empty).
    verdicts: HashMap<(usize, u32, bool), Verdict>,
    /// Index of the pool simulated, when the config's shape classes may send requests to
    /// another (`None`: every request is this pool's).
    pool: Option<usize>,
    /// Requests a shape class sent to another pool.
    elsewhere: u64,
}

impl Gate {
    /// Checks against `snapshot` for clients of `model` on the chat endpoint when `chat`, in
    /// front of engines with a context of `engine_context` tokens. A model the config does not
    /// route is checked as if routed without `max_context`, so only the engines bound it.
    pub(super) fn new(
        mut snapshot: Snapshot,
        model: &str,
        chat: bool,
        engine_context: usize,
    ) -> Result<Self, String> {
        if snapshot.tiers.is_empty() || snapshot.pools.is_empty() {
            return Err("the gateway config has no tier or no pool".into());
        }
        if snapshot.model(model).is_none() {
            snapshot.models.push(ModelRoute {
                name: model.to_owned(),
                pool: 0,
                upstream_model: None,
                max_context: None,
                tokenizer: Estimator::default(),
                direct: true,
            });
        }
        Ok(Self {
            snapshot,
            model: model.to_owned(),
            endpoint: if chat {
                Endpoint::ChatCompletions
            } else {
                Endpoint::Completions
            },
            engine_context,
            counts: [0; 5],
            verdicts: HashMap::new(),
            pool: None,
            elsewhere: 0,
        })
    }

    /// Simulates the pool named `pool` (or, without a name, the pool of the clients' model):
    /// requests the config's shape classes send to another pool are not this fleet's.
    pub(super) fn for_pool(mut self, pool: Option<&str>) -> Self {
        let s = &self.snapshot;
        self.pool = match pool {
            Some(name) => s.pools.iter().position(|p| p.name == name),
            None => s.model(&self.model).map(|m| m.pool),
        };
        self
    }

    /// Whether the gateway sends `req` (of `prompt_tokens`, chat wrap included) to a pool
    /// other than the simulated one, once the config has shape classes: its class's pool, else
    /// its model's. Counted when it does. The live `classify` phase with the same rules: n = 1
    /// and no images, as `bench` sends.
    pub(super) fn elsewhere(&mut self, req: &PlannedRequest, prompt_tokens: u64) -> bool {
        let classes = &self.snapshot.shape_classes;
        let Some(pool) = self.pool.filter(|_| !classes.is_empty()) else {
            return false;
        };
        let tier = self.tier(req.tenant.as_deref());
        let shape = Shape {
            prompt_tokens,
            max_tokens: u64::from(req.output_tokens),
            n: 1,
            media_parts: 0,
            tier: self
                .snapshot
                .tiers
                .get(tier)
                .map_or("", |t| t.name.as_str()),
            model: &self.model,
        };
        let target = classify(classes, &shape)
            .map(|c| c.pool)
            .or_else(|| self.snapshot.model(&self.model).map(|m| m.pool));
        let away = target.is_some_and(|t| t != pool);
        if away {
            self.elsewhere += 1;
        }
        away
    }

    /// The tier a simulated tenant is checked under: a configured tenant's tier, else the tier
    /// named like the tenant (the simulator's convention, as for `--tier` and degradation), else
    /// the demo tenant's `default_tier`, else the first tier.
    fn tier(&self, tenant: Option<&str>) -> usize {
        let s = &self.snapshot;
        let index = |name: &str| s.tiers.iter().position(|t| t.name == name);
        tenant
            .and_then(|t| match s.tenants.iter().find(|spec| spec.name == t) {
                Some(spec) => index(&spec.tier),
                None => index(t),
            })
            .or_else(|| s.default_tier.as_deref().and_then(index))
            .unwrap_or(0)
    }

    /// The per-tenant limits of `tenant`'s tier (see [`Gate::tier`]).
    pub(super) fn limits_of(&self, tenant: Option<&str>) -> infergate::limits::TierLimits {
        self.snapshot
            .tiers
            .get(self.tier(tenant))
            .map(|t| t.limits())
            .unwrap_or_default()
    }

    /// The gateway's answer to `req` before any upstream work: `None` when it forwards it.
    /// Runs [`Gate::check_whole`] unless cheap bounds show its answer (see the module notes).
    pub(super) fn check(&mut self, req: &PlannedRequest) -> Option<Refused> {
        let tokens = req.prompt.len();
        let max_token_bytes = max_token_bytes();
        // No token has more raw bytes than its own decoding, and a raw byte becomes at most 6
        // body bytes (`\u00XX` in JSON; 3 when lossy UTF-8 replaces it).
        let body_bound = tokens
            .saturating_mul(max_token_bytes)
            .saturating_mul(6)
            .saturating_add(BODY_OVERHEAD + self.model.len())
            .saturating_add(req.features.as_ref().map_or(0, |f| {
                feature_bytes(f, self.endpoint == Endpoint::ChatCompletions)
            }));
        if body_limits(&self.snapshot).too_large(body_bound) {
            return self.check_whole(req);
        }
        let key = (
            self.tier(req.tenant.as_deref()),
            req.output_tokens,
            tokens == 0,
        );
        let verdict = match self.verdicts.get(&key) {
            Some(v) => *v,
            None => {
                let v = self.verdict(req, key.0);
                self.verdicts.insert(key, v);
                v
            }
        };
        let (max_context, estimator) = match verdict {
            Ok(v) => v,
            Err(refused) => return Some(refused),
        };
        // Without a context the gateway's count decides nothing: forwarded.
        let context = max_context?;
        // Room for the chat wrap (`user\n` … `\n`).
        let wrap = 16;
        let bound = match estimator {
            // A quarter of the text's bytes, at most 3 per raw byte (lossy UTF-8).
            Estimator::Bytes => tokens
                .saturating_mul(max_token_bytes)
                .saturating_mul(3)
                .saturating_add(wrap)
                .div_ceil(4),
            // A BPE re-reads a planned prompt's text as about its planned tokens (the plan is
            // made of cl100k tokens; `prompt_text`); twice as many is far beyond any drift.
            Estimator::Cl100k | Estimator::O200k => tokens.saturating_add(wrap).saturating_mul(2),
        };
        if bound > context {
            return self.check_whole(req);
        }
        None
    }

    /// `validate`'s verdict on `req`'s body under tier `tier`, with the prompt cut to its first
    /// token (validate only needs a prompt to be there, so the verdict holds for the whole one).
    fn verdict(&self, req: &PlannedRequest, tier: usize) -> Verdict {
        let stand_in = PlannedRequest {
            id: req.id,
            at: req.at,
            tenant: req.tenant.clone(),
            class: req.class.clone(),
            session: None,
            group: None,
            prompt: req.prompt.iter().take(1).copied().collect(),
            output_tokens: req.output_tokens,
            features: req.features,
        };
        self.validate(&stand_in, tier)
            .map(|v| (v.max_context, v.estimator))
    }

    /// The body `bench` sends for `req`, through `validate` under tier `tier`.
    fn validate(&self, req: &PlannedRequest, tier: usize) -> Result<ValidRequest, Refused> {
        let chat = self.endpoint == Endpoint::ChatCompletions;
        let body = Bytes::from(request_body(req, &self.model, chat).to_string());
        let tier = &self.snapshot.tiers[tier];
        validate(self.endpoint, &HeaderMap::new(), body, &self.snapshot, tier)
            .map_err(|e| refused(Refusal::Invalid, &e))
    }

    /// The whole live path on `req`'s real body: size, `validate`, the estimate and the
    /// context check.
    pub(super) fn check_whole(&self, req: &PlannedRequest) -> Option<Refused> {
        let chat = self.endpoint == Endpoint::ChatCompletions;
        let body = request_body(req, &self.model, chat).to_string();
        let limits = body_limits(&self.snapshot);
        if limits.too_large(body.len()) {
            let e = GatewayError::PayloadTooLarge(limits.max_bytes);
            return Some(refused(Refusal::Body, &e));
        }
        let tier = &self.snapshot.tiers[self.tier(req.tenant.as_deref())];
        let body = Bytes::from(body);
        let valid = match validate(self.endpoint, &HeaderMap::new(), body, &self.snapshot, tier) {
            Ok(v) => v,
            Err(e) => return Some(refused(Refusal::Invalid, &e)),
        };
        // The gateway counts tokens exactly whenever a context is configured; without one the
        // request is forwarded.
        valid.max_context?;
        let prompt_tokens = match &valid.prompt {
            PromptSize::Tokens(n) => *n,
            PromptSize::Text(text) => valid.estimator.count(text),
        };
        check_context(&valid, prompt_tokens)
            .err()
            .map(|e| refused(Refusal::Context, &e))
    }

    /// The engine's answer to a request of `prompt_tokens` (as it tokenizes them, template
    /// included) asking for `max_tokens`: `None` when it queues it.
    ///
    /// The engine's server applies this rule before its queue (the "maximum context length"
    /// 400), outside the engine core the simulator runs: the same function here.
    pub(super) fn check_engine(&self, prompt_tokens: u64, max_tokens: u32) -> Option<Refused> {
        let prompt = usize::try_from(prompt_tokens).unwrap_or(usize::MAX);
        let asked = usize::try_from(max_tokens).unwrap_or(usize::MAX);
        let over = !infergate_engine::request::fits_context(prompt, asked, self.engine_context);
        over.then_some(Refused {
            why: Refusal::EngineContext,
            status: 400,
        })
    }

    /// Counts a refusal.
    pub(super) fn count(&mut self, why: Refusal) {
        self.counts[why as usize] += 1;
    }

    /// Refusals per check, and the requests classes sent elsewhere, for the report's `extra`.
    pub(super) fn extra(&self) -> Vec<(&'static str, f64)> {
        let [body, invalid, context, engine, engine_invalid] = self.counts.map(|n| n as f64);
        let mut extra = vec![
            ("gateway_refused_body_size", body),
            ("gateway_refused_invalid", invalid),
            ("gateway_refused_context", context),
            ("engine_refused_context", engine),
            ("engine_refused_invalid", engine_invalid),
        ];
        if self.pool.is_some() && !self.snapshot.shape_classes.is_empty() {
            extra.push(("shape_class_elsewhere", self.elsewhere as f64));
        }
        extra
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::workload::{self, Overrides};

    fn request(prompt: usize, output: u32, tenant: Option<&str>) -> PlannedRequest {
        let words = SimTokenizer::shared().expect("tokenizer").word_tokens();
        PlannedRequest {
            id: 0,
            at: Duration::ZERO,
            tenant: tenant.map(str::to_owned),
            class: None,
            session: None,
            group: None,
            prompt: (0..prompt).map(|i| words[i * 7919 % words.len()]).collect(),
            output_tokens: output,
            features: None,
        }
    }

    fn gate_on(snapshot: Snapshot, model: &str, chat: bool) -> Gate {
        Gate::new(snapshot, model, chat, 8192).expect("gate")
    }

    fn gate(model: &str) -> Gate {
        gate_on(
            infergate::config::load_default().expect("embedded config"),
            model,
            true,
        )
    }

    /// Checks `req` both ways: the shortcut must give the whole path's answer.
    fn both(g: &mut Gate, req: &PlannedRequest) -> Option<(Refusal, u16)> {
        let whole = g.check_whole(req);
        assert_eq!(g.check(req), whole, "{} tokens", req.prompt.len());
        whole.map(|r| (r.why, r.status))
    }

    #[test]
    fn the_embedded_config_refuses_as_the_gateway_does() {
        let mut g = gate("llama-3-8b");
        assert_eq!(both(&mut g, &request(100, 16, None)), None);
        // llama-3-8b's max_context is 8,192: the chat wrap adds 3 tokens to the estimate.
        assert_eq!(both(&mut g, &request(8189, 16, None)), None);
        let over = Some((Refusal::Context, 400));
        assert_eq!(both(&mut g, &request(8190, 16, None)), over);
        assert_eq!(both(&mut g, &request(9000, 16, None)), over);
        // The demo tenant's tier (paid) allows max_tokens up to 4,096, free up to 1,024.
        assert_eq!(both(&mut g, &request(100, 4096, None)), None);
        let invalid = Some((Refusal::Invalid, 400));
        assert_eq!(both(&mut g, &request(100, 4097, None)), invalid);
        assert_eq!(both(&mut g, &request(100, 2000, Some("free"))), invalid);
        assert_eq!(both(&mut g, &request(100, 2000, Some("someone"))), None);
    }

    #[test]
    fn a_model_the_config_does_not_route_is_bounded_by_the_engines_only() {
        let mut g = gate("mistral-7b");
        assert_eq!(both(&mut g, &request(9000, 16, None)), None);
        assert_eq!(g.check_engine(8000, 192), None);
        assert_eq!(g.check_engine(8000, 193).map(|r| r.status), Some(400));
        assert!(g.check_engine(8192, 1).is_some(), "no room for one token");
    }

    #[test]
    fn a_body_over_the_size_limit_gets_413() {
        let mut snapshot = infergate::config::load_default().expect("embedded config");
        snapshot.max_body_bytes = 4096;
        let mut g = gate_on(snapshot, "llama-3-8b", false);
        assert_eq!(both(&mut g, &request(100, 16, None)), None);
        let big = both(&mut g, &request(2000, 16, None));
        assert_eq!(big, Some((Refusal::Body, 413)));
    }

    #[test]
    fn the_shortcut_agrees_with_the_whole_path_on_the_shipped_workloads() {
        let o = Overrides {
            duration: Some(Duration::from_secs(20)),
            ..Overrides::default()
        };
        let mut g = gate("llama-3-8b");
        let mut refused = 0;
        for name in workload::shipped() {
            let w = workload::load(name).expect("shipped");
            for req in w.requests(&o).expect("plan") {
                refused += usize::from(both(&mut g, &req).is_some());
            }
        }
        assert!(
            refused > 0,
            "mixed-long's summaries are over llama-3-8b's context"
        );
    }
}
