//! Fleet mode end to end: two `infergate gateway` replicas sharing one real Redis (Debian's
//! `redis-server`, started here on a free port and stopped by PID) admit a tenant's requests per
//! minute, concurrency and tokens per minute once across both; with Redis killed mid-run each
//! keeps serving from its local share (the limit divided by the replicas it counted) and never
//! more; both recover when Redis comes back.

use crate::common;
use crate::tenant_support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde_json::json;
use tenant_support::{Gw, MODEL, Setup, TempDir, completion, key_of, post};
use tokio::task::JoinSet;

use common::Engine;

/// A `redis-server` on a free loopback port, killed on drop.
pub(super) struct Redis {
    port: u16,
    child: Child,
    dir: std::path::PathBuf,
}

impl Redis {
    /// Starts redis-server (no persistence) on `port` (a free one when `None`) and waits for PING.
    pub(super) fn start(port: Option<u16>, dir: &std::path::Path) -> Redis {
        let bin = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
            .into_iter()
            .find(|p| std::path::Path::new(p).is_file())
            .unwrap_or_else(|| {
                panic!("redis-server is not installed: `apt-get install -y redis-server` (.ci/run does)")
            });
        let port = port.unwrap_or_else(|| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        });
        let child = Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let redis = Redis {
            port,
            child,
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if redis.ping() {
                return redis;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server never answered PING"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn ping(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 16];
        s.write_all(b"PING\r\n").is_ok()
            && s.read(&mut buf)
                .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
    }

    pub(super) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// SIGKILLs it, as a crash would.
    pub(super) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A fresh server on the same port.
    fn restart(&mut self) {
        self.kill();
        *self = Redis::start(Some(self.port), &self.dir.clone());
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two replicas of one config (fleet mode on `redis`), in front of `engine`.
async fn replicas(dir: &TempDir, engine: &Engine, redis: &Redis, tiers: &str) -> (Gw, Gw) {
    // A generous Redis timeout: on 2 loaded cores a 100 ms call can time out, and the replica
    // then rightly falls back to its local share, which admits more than the shared limit.
    let extra = format!(
        "state: {{redis: {{url: \"{}\", key_prefix: test, timeout: 1s}}}}\n",
        redis.url()
    );
    let setup = Setup {
        workers: &[&engine.url],
        extra: &extra,
        tenants: &[("acme", "fleet")],
        tiers,
        ..Setup::default()
    };
    let config = setup.write(dir).to_string_lossy().into_owned();
    let a = Gw::launch(&["gateway", "--config", &config]).await;
    let b = Gw::launch(&["gateway", "--config", &config]).await;
    // Both count each other through their heartbeats before the test leans on the share.
    for gw in [&a, &b] {
        gw.expect_metric("infergate_state_replicas", 2.0, Duration::from_secs(15))
            .await;
        gw.expect_metric("infergate_state_fallback", 0.0, Duration::from_secs(15))
            .await;
    }
    (a, b)
}

/// Sends `n` copies of `body` at once, alternating replicas; the statuses by replica, and the
/// `Retry-After` of every refusal.
async fn burst(
    a: &Gw,
    b: &Gw,
    body: &serde_json::Value,
    n: usize,
) -> (Vec<StatusCode>, Vec<StatusCode>, Vec<u64>) {
    let mut set = JoinSet::new();
    for i in 0..n {
        let url = if i % 2 == 0 {
            a.at("/v1/completions")
        } else {
            b.at("/v1/completions")
        };
        let body = body.clone();
        set.spawn(async move { (i % 2, post(&url, Some(&key_of("acme")), &body).await) });
    }
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for (side, reply) in set.join_all().await {
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            out.2.push(reply.header_u64("retry-after"));
        }
        assert!(
            matches!(reply.status, StatusCode::OK | StatusCode::TOO_MANY_REQUESTS),
            "{}: {}",
            reply.status,
            reply.text
        );
        if side == 0 { &mut out.0 } else { &mut out.1 }.push(reply.status);
    }
    out
}

fn oks(v: &[StatusCode]) -> usize {
    v.iter().filter(|s| **s == StatusCode::OK).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_admit_a_tenants_rpm_once_and_fall_back_to_their_share_without_redis() {
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("fleet-rpm");
    let mut redis = Redis::start(None, &dir.path);
    let tiers = "tiers:\n  fleet: {priority: 1, requests_per_minute: 30, max_tokens: 16}\n";
    let (a, b) = replicas(&dir, &engine, &redis, tiers).await;
    let body = completion("hello fleet", 1);

    // 40 at once over both replicas: the tenant's 30 pass in total, not 30 on each.
    let (on_a, on_b, retries) = burst(&a, &b, &body, 40).await;
    let admitted = oks(&on_a) + oks(&on_b);
    assert!(
        (29..=31).contains(&admitted),
        "admitted {admitted} across both (a {on_a:?}, b {on_b:?})"
    );
    // Every refusal's Retry-After is the shared cell's: one request refills in 2 s.
    assert!(
        !retries.is_empty() && retries.iter().all(|r| (1..=2).contains(r)),
        "{retries:?}"
    );

    // Redis dies: each replica serves from its share of 30 / 2 = 15 a minute, never more.
    redis.kill();
    let body2 = completion("hello again", 1);
    let mut by_replica = Vec::new();
    for gw in [&a, &b] {
        let mut ok = 0;
        for _ in 0..20 {
            let r = post(&gw.at("/v1/completions"), Some(&key_of("acme")), &body2).await;
            assert!(
                matches!(r.status, StatusCode::OK | StatusCode::TOO_MANY_REQUESTS),
                "{}: {}",
                r.status,
                r.text
            );
            ok += usize::from(r.status == StatusCode::OK);
        }
        by_replica.push(ok);
        gw.expect_metric("infergate_state_fallback", 1.0, Duration::from_secs(5))
            .await;
    }
    assert!(
        by_replica.iter().all(|&n| (14..=16).contains(&n)),
        "each replica admits its share of 15 without Redis: {by_replica:?}"
    );
    assert!(a.metric("infergate_state_errors_total").await >= 1.0);

    // Redis is back (empty): both return to shared limits by themselves.
    redis.restart();
    for gw in [&a, &b] {
        gw.expect_metric("infergate_state_fallback", 0.0, Duration::from_secs(15))
            .await;
    }
    let (on_a, on_b, _) = burst(&a, &b, &body, 40).await;
    let admitted = oks(&on_a) + oks(&on_b);
    assert!((29..=31).contains(&admitted), "after recovery: {admitted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_and_tokens_are_counted_once_across_replicas() {
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("fleet-conc");
    let redis = Redis::start(None, &dir.path);
    let tiers = "tiers:\n  fleet: {priority: 1, max_concurrent: 4, tokens_per_minute: 1600, max_tokens: 900}\n";
    let (a, b) = replicas(&dir, &engine, &redis, tiers).await;

    // 12 long answers at once over both replicas: 4 run, the others are refused at once.
    let long = completion("a long answer please", 300);
    let t0 = Instant::now();
    let (on_a, on_b, _) = burst(&a, &b, &long, 12).await;
    let errors = (
        a.metric("infergate_state_errors_total").await,
        b.metric("infergate_state_errors_total").await,
    );
    assert_eq!(
        oks(&on_a) + oks(&on_b),
        4,
        "a {on_a:?}, b {on_b:?} ({:?}; Redis errors on a and b: {errors:?})",
        t0.elapsed()
    );

    // Token budget: 1,600 a minute. The four answers above took about 4 × 305. Their slots go
    // back to Redis in the background after the answers end: until then the refusal may still
    // be the concurrency one.
    let ask = completion("x", 900);
    let (url, key) = (b.at("/v1/completions"), key_of("acme"));
    let over = common::settle(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || post(&url, Some(&key), &ask),
        |over| !over.text.contains("in flight"),
    )
    .await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS, "{}", over.text);
    assert!(over.text.contains("tokens"), "{}", over.text);

    // A stream the client drops after two events settles with what it used: the reserved rest
    // comes back to the shared cell, so a request on the other replica fits again.
    let fresh_dir = TempDir::new("fleet-tok");
    let redis2 = Redis::start(None, &fresh_dir.path);
    let tiers = "tiers:\n  fleet: {priority: 1, tokens_per_minute: 1000, max_tokens: 900}\n";
    let (c, d) = replicas(&fresh_dir, &engine, &redis2, tiers).await;
    let stream = json!({"model": MODEL, "prompt": "count slowly", "max_tokens": 900, "stream": true, "ignore_eos": true});
    let mut s = common::open_stream_with(
        &c.at("/v1/completions"),
        &[("authorization", &format!("Bearer {}", key_of("acme")))],
        &stream,
    )
    .await;
    assert_eq!(s.status, StatusCode::OK);
    for _ in 0..2 {
        s.next_event().await.expect("an event");
    }
    // While the stream holds its ~905 tokens, the other replica has no room.
    let blocked = post(&d.at("/v1/completions"), Some(&key_of("acme")), &ask).await;
    assert_eq!(
        blocked.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        blocked.text
    );
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = post(
            &d.at("/v1/completions"),
            Some(&key_of("acme")),
            &completion("x", 800),
        )
        .await;
        if r.status == StatusCode::OK {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dropped stream's tokens never came back: {}",
            r.text
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_choose_the_same_worker_and_version_for_the_same_request() {
    let engines = [
        Engine::start(&[]).await,
        Engine::start(&[]).await,
        Engine::start(&[]).await,
    ];
    let urls: Vec<&str> = engines.iter().map(|e| e.url.as_str()).collect();
    let dir = TempDir::new("fleet-agree");
    let redis = Redis::start(None, &dir.path);
    let extra = format!(
        "debug_headers: true\nstate: {{redis: {{url: \"{}\", key_prefix: agree}}}}\n",
        redis.url()
    );
    let setup = Setup {
        workers: &urls,
        aliases: &["llama-3-8b-canary"],
        extra: &extra,
        tenants: &[("acme", "fleet")],
        tiers: "tiers:\n  fleet: {priority: 1}\n",
        ..Setup::default()
    };
    let config = setup.write(&dir);
    // Prefix routing, and a 50/50 split sticky per user whose analysis never moves in the test.
    let routing = format!(
        "pools:\n  main:\n    policy: prefix\nmodels:\n  {MODEL}:\n    versions:\n      \
         - {{name: stable, model: {MODEL}, weight: 50}}\n      \
         - {{name: canary, model: llama-3-8b-canary, weight: 50}}\n    sticky: user\n    \
         analysis: {{window: 1h, min_samples: 1000000}}\n"
    );
    std::fs::write(dir.path.join("policies/routing.yaml"), routing).expect("routing.yaml");
    let config = config.to_string_lossy().into_owned();
    let a = Gw::launch(&["gateway", "--config", &config]).await;
    let b = Gw::launch(&["gateway", "--config", &config]).await;
    const N: usize = 1_000;
    let (mut same, mut versions) = (0, [0usize; 2]);
    let mut differ = Vec::new();
    for i in 0..N {
        let body = json!({
            "model": MODEL, "max_tokens": 1, "user": format!("user-{i}"),
            "prompt": format!("{} {}", common::words(80, i), i),
        });
        let ra = post(&a.at("/v1/completions"), Some(&key_of("acme")), &body).await;
        let rb = post(&b.at("/v1/completions"), Some(&key_of("acme")), &body).await;
        assert_eq!(
            (ra.status, rb.status),
            (StatusCode::OK, StatusCode::OK),
            "{} / {}",
            ra.text,
            rb.text
        );
        let pick = |r: &tenant_support::Reply| {
            (
                r.header("x-infergate-worker")
                    .unwrap_or_default()
                    .to_string(),
                r.header("x-infergate-version")
                    .unwrap_or_default()
                    .to_string(),
            )
        };
        let (pa, pb) = (pick(&ra), pick(&rb));
        versions[usize::from(pa.1 == "canary")] += 1;
        if pa == pb {
            same += 1;
        } else if differ.len() < 5 {
            differ.push((i, pa, pb));
        }
    }
    eprintln!("agreement: {same} of {N}; versions {versions:?}");
    assert!(
        same * 100 >= N * 99,
        "{same} of {N} agree; first differences: {differ:?}"
    );
    // The split really splits (hashing, not one arm for everyone).
    assert!(versions.iter().all(|&n| n > N / 4), "{versions:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_spent_on_one_replica_refuses_on_the_other() {
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("fleet-budget");
    let redis = Redis::start(None, &dir.path);
    std::fs::write(
        dir.path.join("policies/prices.yaml"),
        format!("version: 1\nmodels:\n  {MODEL}: {{input: 2.0, output: 8.0}}\n"),
    )
    .expect("prices.yaml");
    // One answer of 16 tokens costs 128,000+ nano-USD: over the $0.0001 day budget at once.
    let tiers = "tiers:\n  fleet:\n    priority: 1\n    budgets: [{period: day, usd: 0.0001, kind: hard}]\n";
    let (a, b) = replicas(&dir, &engine, &redis, tiers).await;
    let body = completion("what does it cost", 16);
    let first = post(&a.at("/v1/completions"), Some(&key_of("acme")), &body).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text);
    // Replica b learns a's spend within a heartbeat or two.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut answered = 0;
    loop {
        let r = post(
            &b.at("/v1/completions"),
            Some(&key_of("acme")),
            &completion("x", 1),
        )
        .await;
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(
                r.json()["error"]["type"],
                "insufficient_quota",
                "{}",
                r.text
            );
            break;
        }
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        answered += 1;
        assert!(Instant::now() < deadline, "replica b never saw a's spend");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each request b admitted before it knew is spend too, but only a heartbeat's worth.
    assert!(
        answered <= 30,
        "b admitted {answered} before it learned of the budget"
    );
    let status = admin(&b, "/admin/budgets?tenant=acme").await;
    assert!(
        status["budgets"][0]["spent_nanousd"].as_u64() >= Some(128_000),
        "{status}"
    );
}

async fn admin(gw: &Gw, path: &str) -> serde_json::Value {
    let (status, text) = common::get(&format!("{}{path}", gw.admin)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    serde_json::from_str(&text).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_fails_readiness_while_redis_is_down() {
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("fleet-closed");
    // A port with nothing behind it yet; Redis starts there later.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let extra = format!(
        "state: {{redis: {{url: \"redis://127.0.0.1:{port}/\", timeout: 100ms, fail_closed: true}}}}\n"
    );
    let setup = Setup {
        workers: &[&engine.url],
        extra: &extra,
        tenants: &[("acme", "fleet")],
        tiers: "tiers:\n  fleet: {priority: 1, requests_per_minute: 30}\n",
        ..Setup::default()
    };
    let config = setup.write(&dir).to_string_lossy().into_owned();
    let mut cmd = common::process::infergate();
    cmd.args(["gateway", "--config", &config, "--listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"]);
    // Not `Gw::launch`: that waits for a `/readyz` this gateway must not give yet.
    let (mut child, _stderr, mut stdout) = common::process::spawn(&mut cmd);
    let deadline = Instant::now() + Duration::from_secs(60);
    let admin = common::process::read_until(&mut stdout, deadline, |line| {
        line.strip_prefix("admin listening on ").map(str::to_owned)
    })
    .await
    .expect("the gateway printed its admin address");
    let readyz = format!("{admin}/readyz");
    let wait_for = |want: StatusCode| {
        let readyz = readyz.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let (status, _) = common::get(&readyz).await;
                if status == want {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "/readyz stayed {status}, wanted {want}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // Redis unreachable: not ready, though the engine is healthy.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, text) = common::get(&format!("{admin}/metrics")).await;
        let healthy = common::find_metric(&text, "infergate_worker_healthy") == Some(1.0);
        if healthy && common::find_metric(&text, "infergate_state_fallback") == Some(1.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker never became healthy:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _) = common::get(&readyz).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let _redis = Redis::start(Some(port), &dir.path);
    wait_for(StatusCode::OK).await;
    let _ = child.start_kill();
}
