//! Harness of the degradation tests: a gateway with a free and a paid tenant in front of one
//! engine that serves one request at a time (so the admission queue is exactly the number of
//! waiting clients), a degradation policy with sub-second timings, a closed-loop flood whose
//! size sets the queue depth, and an observer that records every level the admin API shows.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::common::gateway::{Gateway, eventually};
use crate::tenant_support::{self, Conn, POOL, Reply, Setup, TempDir, key_of};

/// The tenant on the free tier.
pub const FREE: &str = "free-co";
/// The tenant on the paid tier.
pub const PAID: &str = "paid-co";
/// Completion tokens of one flood request (a few hundred ms on the sim engine).
pub const FLOOD_TOKENS: u64 = 32;
/// The cap level 1 puts on free requests.
pub const FREE_CAP: u64 = 8;
/// The longest free prompt level 2 accepts, in tokens.
pub const FREE_MAX_PROMPT: u64 = 50;
/// Minimum dwell of every level of [`policy`].
pub const DWELL: Duration = Duration::from_millis(300);
/// Signal window of [`policy`].
pub const WINDOW: Duration = Duration::from_secs(1);
/// How long any level change the tests wait for may take.
pub const SETTLE: Duration = Duration::from_secs(15);

/// Both tiers share a priority so that a free probe waits its turn behind the paid flood
/// (first come, first served) instead of starving; no rate limits get in the way.
const TIERS: &str = "tiers:\n  \
    free: {priority: 1, max_tokens: 1024, default_max_tokens: 64, models: [\"*\"]}\n  \
    paid: {priority: 1, max_tokens: 1024, default_max_tokens: 64, models: [\"*\"]}\n";

/// Queue-depth thresholds of one level: `(enter, exit)`.
pub type Band = (u64, u64);

/// The three-level policy of pool [`POOL`] on queue depth alone, with `bands[i]` for level i+1:
/// 1 caps free `max_tokens` at [`FREE_CAP`], 2 refuses free prompts above [`FREE_MAX_PROMPT`]
/// tokens, 3 sheds free. Window 1s, tick 100ms, dwell 300ms. Paid is never named.
pub fn policy(bands: [Band; 3]) -> String {
    let actions = [
        format!("cap_max_tokens: {{tiers: [free], max_tokens: {FREE_CAP}}}"),
        format!("refuse_long_prompts: {{tiers: [free], max_prompt_tokens: {FREE_MAX_PROMPT}}}"),
        "shed: {tiers: [free]}".to_string(),
    ];
    let names = ["cap_free", "refuse_long", "shed_free"];
    let mut s = format!("pools:\n  {POOL}:\n    window: 1s\n    tick: 100ms\n    levels:\n");
    for ((name, (enter, exit)), action) in names.iter().zip(bands).zip(actions) {
        s.push_str(&format!(
            "      - name: {name}\n        enter: {{queue_depth: {enter}}}\n        \
             exit: {{queue_depth: {exit}}}\n        min_dwell: 300ms\n        \
             actions:\n          - {action}\n"
        ));
    }
    s
}

/// The bands most tests use: enter 2/5/8, exit 1/3/5. A flood of N clients keeps N-1 waiting
/// (give or take one while a finished client sends its next request), so 3, 6 and 9 clients sit
/// squarely inside levels 1, 2 and 3 even with a probe waiting too.
pub const BANDS: [Band; 3] = [(2, 1), (5, 3), (8, 5)];

/// A gateway over one engine with admission `max_in_flight_per_worker: 1` and `degradation`.
pub struct Degraded {
    /// The gateway (killed on drop).
    pub gw: Gateway,
    dir: TempDir,
}

impl Degraded {
    /// Writes the config, tiers and `degradation` into a fresh directory and starts the gateway.
    pub async fn start(engine_url: &str, degradation: &str) -> Degraded {
        Self::start_with(engine_url, degradation, &[]).await
    }

    /// Like [`Degraded::start`], with more model names (`aliases`) served by the same pool.
    pub async fn start_with(engine_url: &str, degradation: &str, aliases: &[&str]) -> Degraded {
        let dir = TempDir::new("degrade");
        let workers = [engine_url];
        let setup = Setup {
            workers: &workers,
            admission: Some("{max_in_flight_per_worker: 1}"),
            aliases,
            tenants: &[(FREE, "free"), (PAID, "paid")],
            tiers: TIERS,
            ..Setup::default()
        };
        let config = setup.write(&dir);
        std::fs::write(degradation_path(&dir), degradation).expect("write degradation.yaml");
        // Warnings only: the level changes (logged as warnings) stay in the kept stderr.
        let gw = Gateway::start(&config, &[("RUST_LOG", "warn")]).await;
        Degraded { gw, dir }
    }

    /// `DIR/infergate.yaml`.
    pub fn config(&self) -> PathBuf {
        self.dir.path.join("infergate.yaml")
    }

    /// Replaces `policies/degradation.yaml` in one rename.
    pub fn write_policy(&self, text: &str) {
        crate::common::gateway::write_atomic(&degradation_path(&self.dir), text);
    }

    /// A `/v1/completions` request of `tenant` with `prompt`, asking `max_tokens`.
    pub async fn ask(&self, tenant: &str, prompt: &str, max_tokens: u64) -> Reply {
        let body = tenant_support::completion(prompt, max_tokens);
        tenant_support::post(&self.gw.at("/v1/completions"), Some(&key_of(tenant)), &body).await
    }

    /// Pool [`POOL`]'s entry of `GET /admin/degradation`.
    pub async fn state(&self) -> Value {
        admin_state(&self.gw.admin_at("/admin/degradation")).await
    }

    /// `POST /admin/degradation/{force,release}` with `body`: status and JSON answer.
    pub async fn admin_post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let mut conn = Conn::open(&self.gw.admin).await.expect("admin connection");
        let reply = conn
            .exchange(Method::POST, path, None, Bytes::from(body.to_string()))
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        (reply.status, reply.json())
    }

    /// `POST /admin/reload`: status and JSON answer.
    pub async fn reload(&self) -> (StatusCode, Value) {
        let mut conn = Conn::open(&self.gw.admin).await.expect("admin connection");
        let reply = conn
            .exchange(Method::POST, "/admin/reload", None, Bytes::new())
            .await
            .unwrap_or_else(|e| panic!("POST /admin/reload: {e}"));
        (reply.status, reply.json())
    }

    /// `infergate config check --config DIR/infergate.yaml`: exit code and stdout + stderr.
    pub async fn config_check(&self) -> (Option<i32>, String) {
        let mut cmd = crate::common::process::infergate();
        cmd.args(["config", "check", "--config"]).arg(self.config());
        let out = crate::common::process::run(cmd, Duration::from_secs(30)).await;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    }

    /// Forces pool [`POOL`] to `level`.
    pub async fn force(&self, level: u64) -> (StatusCode, Value) {
        let body = json!({"pool": POOL, "level": level});
        self.admin_post("/admin/degradation/force", &body).await
    }

    /// Releases the override of pool [`POOL`].
    pub async fn release(&self) -> (StatusCode, Value) {
        let body = json!({"pool": POOL});
        self.admin_post("/admin/degradation/release", &body).await
    }

    /// `infergate_degradation_transitions_total{pool,direction}`.
    pub async fn transitions(&self, direction: &str) -> f64 {
        let selector = format!(
            "infergate_degradation_transitions_total{{pool=\"{POOL}\",direction=\"{direction}\"}}"
        );
        self.gw.metric(&selector).await
    }

    /// `infergate_degradation_level{pool}`.
    pub async fn level_gauge(&self) -> f64 {
        let selector = format!("infergate_degradation_level{{pool=\"{POOL}\"}}");
        self.gw.metric(&selector).await
    }

    /// `infergate_degraded_requests_total{pool,action}`.
    pub async fn degraded(&self, action: &str) -> f64 {
        let selector =
            format!("infergate_degraded_requests_total{{pool=\"{POOL}\",action=\"{action}\"}}");
        self.gw.metric(&selector).await
    }

    /// Level changes the gateway logged so far.
    pub fn logged_changes(&self) -> usize {
        self.gw
            .stderr()
            .matches("degradation level changed")
            .count()
    }
}

fn degradation_path(dir: &TempDir) -> PathBuf {
    dir.path.join("policies").join("degradation.yaml")
}

/// Pool [`POOL`]'s entry of the admin degradation document at `url`.
async fn admin_state(url: &str) -> Value {
    let (status, text) = crate::common::get(url).await;
    assert_eq!(status, StatusCode::OK, "GET {url}: {text}");
    let doc: Value = serde_json::from_str(&text).expect("degradation status is JSON");
    doc["pools"]
        .as_array()
        .and_then(|pools| pools.iter().find(|p| p["pool"] == POOL))
        .cloned()
        .unwrap_or_else(|| panic!("no pool {POOL} in {doc}"))
}

/// What the flood's clients saw.
#[derive(Default)]
struct FloodLog {
    ok: AtomicU64,
    failures: Mutex<Vec<String>>,
}

/// Paid clients each sending one long completion after another on a keep-alive connection;
/// with one request served at a time, N clients keep about N-1 requests in the queue. A client
/// removed (or the whole flood dropped) closes its connection, which takes its request out of
/// the queue or off the worker at once.
pub struct Flood {
    url: String,
    clients: Vec<JoinHandle<()>>,
    log: Arc<FloodLog>,
}

impl Flood {
    /// No clients yet: see [`Flood::resize`].
    pub fn new(gw: &Gateway) -> Flood {
        Flood {
            url: gw.url.clone(),
            clients: Vec::new(),
            log: Arc::default(),
        }
    }

    /// Adds or removes clients until there are `n`.
    pub fn resize(&mut self, n: usize) {
        while self.clients.len() > n {
            if let Some(client) = self.clients.pop() {
                client.abort();
            }
        }
        while self.clients.len() < n {
            let (url, log) = (self.url.clone(), self.log.clone());
            self.clients.push(tokio::spawn(client(url, log)));
        }
    }

    /// Flood requests answered 200 so far.
    pub fn ok(&self) -> u64 {
        self.log.ok.load(Ordering::Relaxed)
    }

    /// Every flood answer that was not a 200, and every transport error.
    pub fn failures(&self) -> Vec<String> {
        self.log.failures.lock().unwrap().clone()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.resize(0);
    }
}

/// One flood client; stops at its first failure (recorded).
async fn client(url: String, log: Arc<FloodLog>) {
    let body =
        Bytes::from(tenant_support::completion("Tell me a long story.", FLOOD_TOKENS).to_string());
    let key = key_of(PAID);
    let mut conn = match Conn::open(&url).await {
        Ok(c) => c,
        Err(e) => {
            log.failures.lock().unwrap().push(format!("connect: {e}"));
            return;
        }
    };
    loop {
        let reply = conn
            .exchange(Method::POST, "/v1/completions", Some(&key), body.clone())
            .await;
        match reply {
            Ok(r) if r.status == StatusCode::OK => {
                log.ok.fetch_add(1, Ordering::Relaxed);
            }
            Ok(r) => {
                let seen = format!(
                    "{} {:?}: {}",
                    r.status,
                    r.header("x-infergate-degraded"),
                    r.text
                );
                log.failures.lock().unwrap().push(seen);
                return;
            }
            Err(e) => {
                log.failures.lock().unwrap().push(format!("send: {e}"));
                return;
            }
        }
    }
}

/// One reading of the admin degradation status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Current level.
    pub level: u64,
    /// Level changes since start.
    pub transitions: u64,
}

/// Polls `GET /admin/degradation` every 10 ms (far below the 300 ms dwell, so no level can
/// pass unseen) and keeps each reading that differs from the previous one.
pub struct Observer {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Observer {
    /// Starts polling the admin API of `gw`; returns once the first reading is in.
    pub async fn start(gw: &Gateway) -> Observer {
        let url = gw.admin_at("/admin/degradation");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let state = admin_state(&url).await;
                let reading = Seen {
                    level: state["level"].as_u64().expect("level"),
                    transitions: state["transitions"].as_u64().expect("transitions"),
                };
                {
                    let mut seen = sink.lock().unwrap();
                    if seen.last() != Some(&reading) {
                        seen.push(reading);
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let observer = Observer { seen, task };
        eventually("first degradation reading", SETTLE, || async {
            observer.last()
        })
        .await;
        observer
    }

    /// Every distinct reading so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The latest reading.
    pub fn last(&self) -> Option<Seen> {
        self.seen.lock().unwrap().last().copied()
    }

    /// The levels seen, in order.
    pub fn levels(&self) -> Vec<u64> {
        self.seen().iter().map(|s| s.level).collect()
    }

    /// Waits until the level is `level`, failing after [`SETTLE`]; returns the reading.
    pub async fn wait_level(&self, level: u64) -> Seen {
        let what = format!("degradation level {level} (seen {:?})", self.seen());
        eventually(&what, SETTLE, || async {
            self.last().filter(|s| s.level == level)
        })
        .await
    }

    /// Watches for `hold`, failing if the level or the transition count moves at all.
    pub async fn hold(&self, hold: Duration) -> Seen {
        let start = self.last().expect("a reading");
        let until = Instant::now() + hold;
        while Instant::now() < until {
            let now = self.last().expect("a reading");
            assert_eq!(
                now,
                start,
                "the level moved while the signal stayed in the band: {:?}",
                self.seen()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        start
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Asserts that consecutive readings move one level at a time, each move one transition.
pub fn assert_single_steps(seen: &[Seen]) {
    for pair in seen.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert_eq!(
            (a.level.abs_diff(b.level), b.transitions - a.transitions),
            (1, 1),
            "a move of more than one level between {a:?} and {b:?}; all readings: {seen:?}"
        );
    }
}

/// The `usage.completion_tokens` of a 200 answer.
pub fn completion_tokens(reply: &Reply) -> u64 {
    let json = reply.json();
    json["usage"]["completion_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no usage.completion_tokens in {json}"))
}

/// A prompt of well over [`FREE_MAX_PROMPT`] tokens.
pub fn long_prompt() -> String {
    let text = "the quick brown fox jumps over the lazy dog ".repeat(30);
    assert!(tenant_support::prompt_tokens(&text) > FREE_MAX_PROMPT * 2);
    text
}
