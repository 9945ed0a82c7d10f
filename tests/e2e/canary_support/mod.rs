//! Harness of the canary tests: a gateway whose model [`MODEL`] is split between a `stable`
//! version (pool `stable`) and a `canary` version (model `llama-3-8b-canary`, pool `canary`),
//! each pool one sim engine of its own (so a fault knob hits one version only); steady
//! background traffic with a fresh session id per request so both versions get samples; the
//! canary admin API and metrics; an observer that records every canary weight the admin API
//! shows.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::common::Engine;
use crate::common::gateway::{FAST_HEALTH, Gateway, MODEL, TempDir, chat, eventually, send};

/// The canary version's model in the main config.
pub const CANARY_MODEL: &str = "llama-3-8b-canary";
/// How long any decision the tests wait for may take (several windows, with slack for a busy
/// machine). A whole ramp (two promotions and the end) once took more than 15 s with the nine
/// tests of `tests/e2e/policies/canary.rs` sharing two cores (those tests alone usually take about 9 s).
pub const SETTLE: Duration = Duration::from_secs(30);
/// Completion tokens of one traffic request: a few engine steps, so a request reports both a
/// time to first token and inter-token gaps.
pub const TOKENS: u64 = 4;

/// The canary settings of one test: the sticky key and the `analysis:` section.
pub struct Analysis {
    /// `session`, `user` or `tenant`.
    pub sticky: &'static str,
    /// Window, e.g. `1s`.
    pub window: &'static str,
    /// Fewest requests per version before a decision.
    pub min_samples: u64,
    /// Largest TTFT and inter-token p99 ratio canary/stable.
    pub max_p99_ratio: f64,
    /// Canary weights in percent.
    pub schedule: &'static [u32],
}

/// One split: two engines, the config directory and the gateway (all stopped on drop).
pub struct Split {
    /// The gateway.
    pub gw: Gateway,
    _stable: Engine,
    _canary: Engine,
    _dir: TempDir,
}

impl Split {
    /// Starts a plain stable engine, a canary engine with `canary_args` (fault knobs), and a
    /// gateway polling every 100 ms whose canary starts at `canary_weight` percent.
    pub async fn start(canary_args: &[&str], canary_weight: u32, analysis: &Analysis) -> Split {
        let mut args = vec!["--gpu", "h100"];
        args.extend_from_slice(canary_args);
        let (stable, canary) =
            tokio::join!(Engine::start(&["--gpu", "h100"]), Engine::start(&args));
        let dir = TempDir::new("canary");
        dir.write_config(&config_yaml(&stable.url, &canary.url));
        dir.write_routing(&routing_yaml(canary_weight, analysis));
        let gw = Gateway::start(&dir.config(), &[]).await;
        Split {
            gw,
            _stable: stable,
            _canary: canary,
            _dir: dir,
        }
    }

    /// [`MODEL`]'s entry of `GET /admin/canary`.
    pub async fn state(&self) -> Value {
        canary_state(&self.gw.admin_at("/admin/canary")).await
    }

    /// `POST /admin/canary/{op}` with `extra` merged into `{"model": MODEL}`: status and the
    /// answer (the model's state on success, the error document otherwise).
    pub async fn admin(&self, op: &str, extra: Value) -> (StatusCode, Value) {
        let mut body = json!({ "model": MODEL });
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let url = self.gw.admin_at(&format!("/admin/canary/{op}"));
        let (status, _, text) = send(Method::POST, &url, &[], Some(body.to_string()))
            .await
            .unwrap_or_else(|e| panic!("POST {url}: {e}"));
        let json: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("POST {url}: answer not JSON ({e}): {text}"));
        let out = match json["models"].get(MODEL) {
            Some(state) if status == StatusCode::OK => state.clone(),
            _ => json,
        };
        (status, out)
    }

    /// `infergate_canary_decisions_total{model,decision}`.
    pub async fn decisions(&self, decision: &str) -> u64 {
        let selector = format!(
            "infergate_canary_decisions_total{{model=\"{MODEL}\",decision=\"{decision}\"}}"
        );
        self.gw.metric(&selector).await as u64
    }

    /// `infergate_canary_weight{model,version}`, `None` while the series does not exist.
    pub async fn weight_gauge(&self, version: &str) -> Option<u32> {
        let selector =
            format!("infergate_canary_weight{{model=\"{MODEL}\",version=\"{version}\"}}");
        crate::common::find_metric(&self.gw.metrics().await, &selector).map(|v| v as u32)
    }

    /// `infergate_version_requests_total{model,version,outcome}`.
    pub async fn version_requests(&self, version: &str, outcome: &str) -> u64 {
        let selector = format!(
            "infergate_version_requests_total{{model=\"{MODEL}\",version=\"{version}\",outcome=\"{outcome}\"}}"
        );
        self.gw.metric(&selector).await as u64
    }

    /// Waits until the hold counter has grown by `windows` from `from`: that many windows were
    /// judged (holding) since.
    pub async fn wait_holds(&self, from: u64, windows: u64) {
        eventually(
            &format!("{windows} more hold decisions"),
            SETTLE,
            || async { (self.decisions("hold").await >= from + windows).then_some(()) },
        )
        .await;
    }

    /// Waits until the admin API shows the canary at `weight` percent; returns that state.
    pub async fn wait_weight(&self, weight: u32) -> Value {
        eventually(&format!("canary weight {weight}"), SETTLE, || async {
            let state = self.state().await;
            (canary_weight(&state) == weight).then_some(state)
        })
        .await
    }

    /// One streamed chat request with `x-session-id: session`.
    pub async fn ask(&self, session: &str) -> Reply {
        ask(&self.gw.at("/v1/chat/completions"), Some(session), None).await
    }
}

/// The model's entry of `GET /admin/canary` at `url`.
async fn canary_state(url: &str) -> Value {
    let (status, _, text) = send(Method::GET, url, &[], None)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(status, StatusCode::OK, "GET {url}: {text}");
    let json: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {url}: not JSON ({e}): {text}"));
    json["models"]
        .get(MODEL)
        .cloned()
        .unwrap_or_else(|| panic!("no canary for {MODEL} in {json}"))
}

/// The main config: [`MODEL`] on pool `stable`, [`CANARY_MODEL`] (served upstream as
/// [`MODEL`]) on pool `canary`, health polled every 100 ms (the canary tick).
fn config_yaml(stable: &str, canary: &str) -> String {
    format!(
        "listen: \"127.0.0.1:0\"\n\
         admin:\n  listen: \"127.0.0.1:0\"\n\
         debug_headers: true\n\
         policies: policies\n\
         {FAST_HEALTH}\
         models:\n  \
           - {{name: {MODEL}, pool: stable}}\n  \
           - {{name: {CANARY_MODEL}, pool: canary, upstream_model: {MODEL}}}\n\
         pools:\n  \
           - name: stable\n    workers:\n      - url: {stable}\n  \
           - name: canary\n    workers:\n      - url: {canary}\n"
    )
}

/// `policies/routing.yaml`: [`MODEL`] split `stable`/`canary` at `canary_weight`, with `a`'s
/// sticky key and analysis and an error-rate margin of 2 points.
fn routing_yaml(canary_weight: u32, a: &Analysis) -> String {
    let schedule: Vec<String> = a.schedule.iter().map(u32::to_string).collect();
    format!(
        "models:\n  {MODEL}:\n    versions:\n      \
           - {{name: stable, model: {MODEL}, weight: {stable}}}\n      \
           - {{name: canary, model: {CANARY_MODEL}, weight: {canary_weight}}}\n    \
         stable: stable\n    sticky: {sticky}\n    analysis:\n      \
           window: {window}\n      min_samples: {min}\n      max_error_rate_delta: 0.02\n      \
           max_ttft_p99_ratio: {ratio}\n      max_itl_p99_ratio: {ratio}\n      \
           schedule: [{schedule}]\n",
        stable = 100 - canary_weight,
        sticky = a.sticky,
        window = a.window,
        min = a.min_samples,
        ratio = a.max_p99_ratio,
        schedule = schedule.join(", "),
    )
}

/// The canary's weight in a model's admin state.
pub fn canary_weight(state: &Value) -> u32 {
    version_weight(state, "canary")
}

/// The weight of `version` in a model's admin state (`weights: [[name, percent], ...]`).
pub fn version_weight(state: &Value, version: &str) -> u32 {
    state["weights"]
        .as_array()
        .and_then(|ws| ws.iter().find(|w| w[0] == version))
        .and_then(|w| w[1].as_u64())
        .and_then(|w| u32::try_from(w).ok())
        .unwrap_or_else(|| panic!("no weight of {version} in {state}"))
}

/// The `decision` and `reason` of a model state's `last_decision` (empty strings when none).
pub fn last_decision(state: &Value) -> (String, String) {
    let d = &state["last_decision"];
    let text = |k: &str| d[k].as_str().unwrap_or_default().to_owned();
    (text("decision"), text("reason"))
}

/// What one request got back.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status (0 when the exchange itself failed).
    pub status: u16,
    /// `x-infergate-version`, if present.
    pub version: Option<String>,
    /// `x-infergate-pool`, if present.
    pub pool: Option<String>,
}

/// A non-streamed chat request naming `model` directly: status and body.
pub async fn ask_model(url: &str, model: &str) -> (StatusCode, String) {
    let mut body = chat("You are terse.", "Say hello.", TOKENS, false);
    body["model"] = json!(model);
    match send(Method::POST, url, &[], Some(body.to_string())).await {
        Ok((status, _, text)) => (status, text),
        Err(e) => panic!("request for {model}: {e}"),
    }
}

/// A streamed chat request for [`MODEL`] to `url`, keyed by the `x-session-id` header and/or
/// the body's `user`.
pub async fn ask(url: &str, session: Option<&str>, user: Option<&str>) -> Reply {
    let mut body = chat("You are terse.", "Say hello.", TOKENS, true);
    if let Some(u) = user {
        body["user"] = json!(u);
    }
    let headers: Vec<(&str, &str)> = session.map(|s| ("x-session-id", s)).into_iter().collect();
    match send(Method::POST, url, &headers, Some(body.to_string())).await {
        Ok((status, headers, _)) => {
            let header = |name: &str| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            Reply {
                status: status.as_u16(),
                version: header("x-infergate-version"),
                pool: header("x-infergate-pool"),
            }
        }
        Err(_) => Reply {
            status: 0,
            version: None,
            pool: None,
        },
    }
}

/// Closed-loop background traffic: `clients` tasks, each sending one request after another,
/// every request with a fresh session id (so the split's share holds over any stretch).
/// Stopped on drop.
pub struct Traffic {
    tasks: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    replies: Arc<Mutex<Vec<Reply>>>,
}

impl Traffic {
    /// Starts `clients` clients against `split`'s gateway.
    pub fn start(split: &Split, clients: usize) -> Traffic {
        let url = split.gw.at("/v1/chat/completions");
        let replies = Arc::new(Mutex::new(Vec::new()));
        let next = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..clients)
            .map(|_| {
                let (url, replies) = (url.clone(), replies.clone());
                let (next, stop) = (next.clone(), stop.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let reply = ask(&url, Some(&format!("bg-{n}")), None).await;
                        replies.lock().unwrap().push(reply);
                    }
                })
            })
            .collect();
        Traffic {
            tasks,
            stop,
            replies,
        }
    }

    /// Stops sending and waits for the requests in flight to finish, so that none is cut off
    /// (a client that leaves mid-answer is a sample of its own).
    pub async fn stop(mut self) -> Vec<Reply> {
        self.stop.store(true, Ordering::Relaxed);
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
        self.replies()
    }

    /// Replies received so far.
    pub fn replies(&self) -> Vec<Reply> {
        self.replies.lock().unwrap().clone()
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Polls `GET /admin/canary` every 20 ms and records each canary weight that differs from the
/// previous one, so a test can assert the exact path the weights took. Stopped on drop.
pub struct Observer {
    task: JoinHandle<()>,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<u32>>>,
}

impl Observer {
    /// Starts observing `split`'s canary.
    pub fn start(split: &Split) -> Observer {
        let url = split.gw.admin_at("/admin/canary");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (seen, stop) = (seen.clone(), stop.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let w = canary_weight(&canary_state(&url).await);
                    {
                        let mut s = seen.lock().unwrap();
                        if s.last() != Some(&w) {
                            s.push(w);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        });
        Observer { task, stop, seen }
    }

    /// The distinct successive canary weights seen so far.
    pub fn seen(&self) -> Vec<u32> {
        self.seen.lock().unwrap().clone()
    }

    /// The weights seen once the observer itself has seen `weight` last (the admin API may
    /// have shown it to the test a poll earlier).
    pub async fn seen_until(&self, weight: u32) -> Vec<u32> {
        eventually(
            &format!("observer sees weight {weight}"),
            SETTLE,
            || async {
                let seen = self.seen();
                (seen.last() == Some(&weight)).then_some(seen)
            },
        )
        .await
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.abort();
    }
}
