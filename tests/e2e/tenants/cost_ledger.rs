//! Tenant cost end to end, against `infergate gateway` and real sim workers: ledger rows whose
//! costs equal the arithmetic on the usage each answer reported (cached tokens at their own
//! price, a tier multiplier), the daily rollup equal to the rows, refusals as rows, a hard budget
//! that refuses with the reset as `Retry-After` and a soft one that only flags, a ledger and
//! budget that survive a restart, a price reload that changes only later costs (and one that
//! changes prices without a new version is refused), and 5,000 requests at full speed with every
//! row written or counted as dropped.

use crate::common;
use crate::tenant_support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde_json::json;
use tenant_support::{
    Gw, MODEL, Reply, Setup, TempDir, completion, key_of, post, usage_by_tenant, wait_rows,
};
use tokio::task::JoinSet;

use common::{Engine, words};

/// How long the ledger may take to hold a test's rows (it flushes every second).
const FLUSHED: Duration = Duration::from_secs(30);

/// Nano-USD per 1M tokens of the test prices (input $2, cached $0.50, output $8 per 1M).
const P_IN: u128 = 2_000_000_000;
const P_CACHED: u128 = 500_000_000;
const P_OUT: u128 = 8_000_000_000;

const PRICES_V1: &str = "version: 1\nmodels:\n  llama-3-8b: {input: 2.0, cached_input: 0.5, output: 8.0}\ntiers:\n  half: 0.5\n";
/// The same prices without tier multipliers.
const PRICES_PLAIN: &str =
    "version: 1\nmodels:\n  llama-3-8b: {input: 2.0, cached_input: 0.5, output: 8.0}\n";

/// What the test computes by hand for one answer's usage, at `scale` × the v1 prices and a
/// multiplier in parts per million: integer nano-USD, rounded half up once.
fn hand_cost(prompt: u64, cached: u64, completion: u64, scale: u128, mult_ppm: u128) -> u64 {
    let scaled = (u128::from(prompt - cached) * P_IN
        + u128::from(cached) * P_CACHED
        + u128::from(completion) * P_OUT)
        * scale;
    let total = (scaled * mult_ppm + 500_000_000_000) / 1_000_000_000_000;
    u64::try_from(total).expect("fits")
}

/// A config directory with the given tiers and prices, a ledger at `usage.sqlite`.
fn write_setup(dir: &TempDir, setup: &Setup<'_>, prices: &str) -> PathBuf {
    let config = setup.write(dir);
    std::fs::write(dir.path.join("policies/prices.yaml"), prices).expect("write prices.yaml");
    config
}

fn setup<'a>(
    workers: &'a [&'a str],
    tenants: &'a [(&'a str, &'a str)],
    tiers: &'a str,
) -> Setup<'a> {
    Setup {
        workers,
        extra: "ledger: {path: usage.sqlite}\n",
        tenants,
        tiers,
        ..Setup::default()
    }
}

async fn launch(config: &std::path::Path) -> Gw {
    Gw::launch(&["gateway", "--config", &config.to_string_lossy()]).await
}

/// The ledger's raw rows (CSV export), by request id.
async fn rows(gw: &Gw) -> HashMap<String, HashMap<String, String>> {
    let (status, text) = common::get(&format!("{}/admin/usage.csv", gw.admin)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    lines
        .map(|l| {
            let fields: HashMap<String, String> = header
                .iter()
                .zip(l.split(','))
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect();
            (fields["request_id"].clone(), fields)
        })
        .collect()
}

/// A USD decimal of the CSV (`0.000128000`) as nano-USD.
fn nano(usd: &str) -> u64 {
    let (whole, frac) = usd.split_once('.').unwrap_or((usd, "0"));
    let frac = format!("{frac:0<9}");
    whole.parse::<u64>().expect("whole") * 1_000_000_000 + frac[..9].parse::<u64>().expect("frac")
}

/// SIGTERM, and waits for the gateway to drain and exit (the ledger writes what it queued).
async fn stop(gw: Gw) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &gw.pid.to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(40);
    while common::process::is_running(gw.pid) {
        assert!(
            Instant::now() < deadline,
            "the gateway did not exit on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn usage_of(reply: &Reply) -> (u64, u64, u64) {
    let v = reply.json();
    let u = &v["usage"];
    (
        u["prompt_tokens"].as_u64().expect("prompt_tokens"),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("our engine always reports cached_tokens"),
        u["completion_tokens"].as_u64().expect("completion_tokens"),
    )
}

fn request_id(reply: &Reply) -> String {
    reply
        .header("x-request-id")
        .expect("x-request-id")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_rows_cost_what_the_arithmetic_says_and_the_rollup_equals_them() {
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("cost");
    let tiers = "tiers:\n  full: {priority: 1}\n  half: {priority: 1}\n";
    let tenants = [("acme", "full"), ("globex", "half")];
    let config = write_setup(&dir, &setup(&[&engine.url], &tenants, tiers), PRICES_V1);
    let gw = launch(&config).await;
    let url = gw.at("/v1/completions");

    // The same long prompt twice: the second is partly served from the engine's prefix cache.
    let long = words(400, 1);
    let mut sent: Vec<(String, &str, Reply)> = Vec::new();
    for (tenant, prompt, max_tokens) in [
        ("acme", long.as_str(), 16),
        ("acme", long.as_str(), 8),
        ("acme", "a short question", 4),
        ("globex", long.as_str(), 16),
        ("globex", "another short question", 32),
    ] {
        let reply = post(&url, Some(&key_of(tenant)), &completion(prompt, max_tokens)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        sent.push((request_id(&reply), tenant, reply));
    }
    // Refusals are rows too: an unknown model and a bad request of a known tenant.
    let unknown = post(
        &url,
        Some(&key_of("acme")),
        &json!({"model": "no-such-model", "prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    // An unknown caller is not (a flood of bad keys must not fill the ledger).
    let stranger = post(&url, Some("ig-nobody"), &completion("x", 1)).await;
    assert_eq!(stranger.status, StatusCode::UNAUTHORIZED);

    wait_rows(&gw, 6, FLUSHED).await;
    let rows = rows(&gw).await;
    assert_eq!(rows.len(), 6, "{rows:?}");
    let mut cached_seen = 0;
    let mut per_tenant: HashMap<&str, u64> = HashMap::new();
    for (id, tenant, reply) in &sent {
        let (p, c, comp) = usage_of(reply);
        cached_seen += c;
        let mult = if *tenant == "globex" {
            500_000
        } else {
            1_000_000
        };
        let want = hand_cost(p, c, comp, 1, mult);
        let row = rows
            .get(id)
            .unwrap_or_else(|| panic!("no row for {id}: {rows:?}"));
        assert_eq!(nano(&row["cost_usd"]), want, "row {row:?}");
        assert_eq!(row["tenant"], *tenant);
        assert_eq!(row["prompt_tokens"], p.to_string());
        assert_eq!(row["cached_tokens"], c.to_string());
        assert_eq!(row["completion_tokens"], comp.to_string());
        assert_eq!(row["price_version"], "1");
        assert_eq!(row["status"], "200");
        assert_eq!(row["reason"], "");
        assert_eq!(row["worker"], engine.url);
        assert!(
            !row["ttft_ms"].is_empty() && !row["queue_ms"].is_empty(),
            "{row:?}"
        );
        assert_eq!(row["model"], MODEL);
        // The key id is the start of the key's sha256, never the key.
        let hash = infergate::tenants::format_hash(&infergate::tenants::hash_key(&key_of(tenant)));
        assert_eq!(row["key_id"], hash["sha256:".len().."sha256:".len() + 12]);
        assert!(!row.values().any(|v| v.contains(&key_of(tenant))));
        *per_tenant.entry(tenant).or_default() += want;
    }
    assert!(cached_seen > 0, "the repeated prompt hit the prefix cache");
    let refused = &rows[&request_id(&unknown)];
    assert_eq!(
        (
            refused["status"].as_str(),
            refused["reason"].as_str(),
            refused["cost_usd"].as_str()
        ),
        ("404", "validation", "0.000000000")
    );

    // Per-tenant totals, the daily rollup and the Prometheus counter all agree with the rows.
    let by_tenant = gw.admin_json("/admin/usage?group_by=tenant").await;
    for g in by_tenant["groups"].as_array().expect("groups") {
        let tenant = g["group"]["tenant"].as_str().expect("tenant");
        assert_eq!(
            g["cost_nanousd"].as_u64(),
            per_tenant.get(tenant).copied(),
            "{g}"
        );
        let metric = gw
            .metric(&format!(
                "infergate_tenant_cost_nanousd_total{{tenant=\"{tenant}\",model=\"{MODEL}\"}}"
            ))
            .await;
        assert_eq!(metric as u64, per_tenant[tenant]);
    }
    let dims = "group_by=day,tenant,model,key";
    let from_rows = gw.admin_json(&format!("/admin/usage?{dims}")).await;
    let from_rollup = gw.admin_json(&format!("/admin/usage/daily?{dims}")).await;
    assert_eq!(from_rows["groups"], from_rollup["groups"]);
    assert_eq!(from_rows["totals"]["requests"], 6);
    assert!(from_rows["totals"]["saved_nanousd"].as_u64() > Some(0));
    // Cached tokens are counted in their own class.
    let cached = gw
        .metric(&format!(
            "infergate_tenant_cached_tokens_total{{tenant=\"acme\",model=\"{MODEL}\"}}"
        ))
        .await;
    assert!(cached > 0.0);

    // `infergate usage` prints the same spend from the ledger file the config names.
    let table = usage_by_tenant(&config.to_string_lossy()).await;
    for (tenant, cost) in &per_tenant {
        let line = table
            .lines()
            .find(|l| l.starts_with(tenant))
            .unwrap_or_else(|| panic!("no {tenant} line in:\n{table}"));
        assert!(
            line.contains(&infergate::pricing::format_usd(*cost)),
            "{line}"
        );
    }
    assert!(table.lines().any(|l| l.starts_with("total")), "{table}");
    let csv = std::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args([
            "usage",
            "--config",
            &config.to_string_lossy(),
            "--by",
            "day,model",
            "--csv",
        ])
        .output()
        .expect("run infergate usage --csv");
    let csv = String::from_utf8_lossy(&csv.stdout);
    assert!(csv.starts_with("day,model,requests,"), "{csv}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_budget_refuses_until_the_reset_survives_a_restart_and_a_soft_one_only_flags() {
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("budget");
    // One answer of 16 output tokens costs 128,000+ nano-USD: over either budget at once.
    let tiers = "tiers:\n  capped:\n    priority: 1\n    budgets: [{period: day, usd: 0.0001, kind: hard}]\n  \
                 flagged:\n    priority: 1\n    budgets: [{period: month, usd: 0.0001, kind: soft}]\n";
    let tenants = [("capped", "capped"), ("flagged", "flagged")];
    let config = write_setup(&dir, &setup(&[&engine.url], &tenants, tiers), PRICES_PLAIN);
    let gw = launch(&config).await;
    let url = gw.at("/v1/completions");
    let body = completion("what does it cost", 16);

    // The request that crosses the budget completes; the next is refused.
    let first = post(&url, Some(&key_of("capped")), &body).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text);
    let refused = post(&url, Some(&key_of("capped")), &body).await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        refused.text
    );
    let err = &refused.json()["error"];
    assert_eq!(err["type"], "insufficient_quota");
    let message = err["message"].as_str().expect("message");
    let now = infergate::utc::now_ms();
    let reset = infergate::utc::day_start(now) + infergate::utc::DAY_MS;
    assert!(
        message.contains("day budget of $0.000100")
            && message.contains(&infergate::utc::iso_time(reset)),
        "{message}"
    );
    let retry = refused.header_u64("retry-after") as i64;
    let to_reset = (reset - now) / 1000;
    assert!(
        (to_reset - 2..=to_reset + 2).contains(&retry),
        "Retry-After {retry}, reset in {to_reset} s"
    );

    // The soft budget only flags: every request passes, and it is counted and shown.
    for _ in 0..3 {
        let r = post(&url, Some(&key_of("flagged")), &body).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let soft = gw
        .metric("infergate_budget_soft_exceeded_total{tenant=\"flagged\",period=\"month\"}")
        .await;
    assert_eq!(
        soft, 2.0,
        "the first request was under the budget, the next two over"
    );
    let budgets = gw.admin_json("/admin/budgets").await;
    let list = budgets["budgets"].as_array().expect("budgets");
    let of = |t: &str| {
        list.iter()
            .find(|b| b["tenant"] == t)
            .cloned()
            .expect("listed")
    };
    assert_eq!(
        (
            of("capped")["kind"].as_str(),
            of("capped")["reached"].as_bool()
        ),
        (Some("hard"), Some(true))
    );
    assert_eq!(
        (
            of("flagged")["kind"].as_str(),
            of("flagged")["period"].as_str(),
            of("flagged")["reached"].as_bool()
        ),
        (Some("soft"), Some("month"), Some(true))
    );
    wait_rows(&gw, 5, FLUSHED).await;
    let by_reason = gw
        .admin_json("/admin/usage?outcome=refused&group_by=tenant,reason")
        .await;
    assert_eq!(
        by_reason["groups"][0]["group"]["reason"], "budget",
        "{by_reason}"
    );

    // A graceful restart keeps the ledger, and the budget resumes from it: still refused.
    let spent = of("capped")["spent_nanousd"].as_u64();
    stop(gw).await;
    let gw = launch(&config).await;
    let page = gw.admin_json("/admin/usage?group_by=tenant").await;
    assert_eq!(page["totals"]["requests"], 5, "{page}");
    let again = post(&gw.at("/v1/completions"), Some(&key_of("capped")), &body).await;
    assert_eq!(
        again.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        again.text
    );
    let budgets = gw.admin_json("/admin/budgets?tenant=capped").await;
    assert_eq!(budgets["budgets"][0]["spent_nanousd"].as_u64(), spent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_price_reload_changes_only_later_costs_and_needs_a_new_version() {
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("reprice");
    let tiers = "tiers:\n  full: {priority: 1}\n  half: {priority: 1}\n";
    let tenants = [("acme", "full")];
    let config = write_setup(&dir, &setup(&[&engine.url], &tenants, tiers), PRICES_V1);
    let gw = launch(&config).await;
    let url = gw.at("/v1/completions");
    let key = key_of("acme");
    let before = post(&url, Some(&key), &completion("priced at version one", 8)).await;
    assert_eq!(before.status, StatusCode::OK);

    // Doubled prices under the same version: refused, the old prices keep serving.
    let prices_path = dir.path.join("policies/prices.yaml");
    let doubled = "models:\n  llama-3-8b: {input: 4.0, cached_input: 1.0, output: 16.0}\ntiers:\n  half: 0.5\n";
    std::fs::write(&prices_path, format!("version: 1\n{doubled}")).expect("write");
    let (status, _, text) = common::post_raw(&format!("{}/admin/reload", gw.admin), "").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    assert!(text.contains("raise it above 1"), "{text}");
    let same = post(&url, Some(&key), &completion("still version one", 8)).await;

    std::fs::write(&prices_path, format!("version: 2\n{doubled}")).expect("write");
    let (status, _, text) = common::post_raw(&format!("{}/admin/reload", gw.admin), "").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let after = post(&url, Some(&key), &completion("priced at version two", 8)).await;
    assert_eq!(after.status, StatusCode::OK);

    wait_rows(&gw, 3, FLUSHED).await;
    let rows = rows(&gw).await;
    for (reply, scale, version) in [(&before, 1, "1"), (&same, 1, "1"), (&after, 2, "2")] {
        let (p, c, comp) = usage_of(reply);
        let row = &rows[&request_id(reply)];
        assert_eq!(
            nano(&row["cost_usd"]),
            hand_cost(p, c, comp, scale, 1_000_000),
            "{row:?}"
        );
        assert_eq!(row["price_version"], version);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_requests_at_full_speed_lose_no_row() {
    const N: usize = 5_000;
    const CONCURRENCY: usize = 64;
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("flood");
    let tiers = "tiers:\n  full: {priority: 1}\n";
    let tenants = [("acme", "full"), ("globex", "full")];
    let config = write_setup(&dir, &setup(&[&engine.url], &tenants, tiers), PRICES_PLAIN);
    let gw = launch(&config).await;
    let url = gw.at("/v1/completions");
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (url, next) = (url.clone(), next.clone());
        set.spawn(async move {
            let mut conn = tenant_support::Conn::open(&url).await.expect("connect");
            let mut ok = 0usize;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= N {
                    return ok;
                }
                let key = key_of(if i % 2 == 0 { "acme" } else { "globex" });
                let body = completion("flood", 1).to_string();
                let reply = conn
                    .exchange(
                        hyper::Method::POST,
                        "/v1/completions",
                        Some(&key),
                        body.into(),
                    )
                    .await
                    .expect("request");
                ok += usize::from(reply.status == StatusCode::OK);
            }
        });
    }
    let ok: usize = set.join_all().await.into_iter().sum();
    assert_eq!(ok, N, "every request was answered");
    let page = wait_rows(&gw, N as u64, FLUSHED).await;
    let dropped = gw
        .metric("infergate_ledger_rows_total{result=\"dropped\"}")
        .await;
    let written = gw
        .metric("infergate_ledger_rows_total{result=\"written\"}")
        .await;
    assert_eq!((written as usize, dropped as usize), (N, 0), "{page}");
    let groups = page["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 2);
    assert!(groups.iter().all(|g| g["requests"] == N as u64 / 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_keeps_the_ledger_in_its_cache_directory() {
    use tokio::io::AsyncBufReadExt;
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("upcache");
    // The same config without a `ledger:` section.
    let (workers, tenants) = ([engine.url.as_str()], [("acme", "full")]);
    let mut s = setup(&workers, &tenants, "tiers:\n  full: {priority: 1}\n");
    s.extra = "";
    let config = write_setup(&dir, &s, PRICES_PLAIN);
    let cache = dir.path.join("cache");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(["up", "--config", &config.to_string_lossy()])
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .env("INFERGATE_CACHE_DIR", &cache)
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn infergate up");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let want = format!("usage ledger: {}", cache.join("ledger.sqlite").display());
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line == want {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "`up` never printed `{want}`");
    assert!(cache.join("ledger.sqlite").is_file());
    let _ = child.start_kill();
}

/// A worker whose usage has no `prompt_tokens_details` (as some engines answer): every POST gets
/// a completion with 7 prompt and 3 completion tokens.
async fn worker_without_cached_field() -> String {
    common::stand_in_worker(|_, _| {
        let body = json!({
            "id": "cmpl-1", "object": "text_completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "text": "a b c", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        });
        (hyper::StatusCode::OK, body.to_string())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_omits_cached_tokens_is_priced_uncached_and_counted() {
    let worker = worker_without_cached_field().await;
    let dir = TempDir::new("nocached");
    let tiers = "tiers:\n  full: {priority: 1}\n";
    let (workers, tenants) = ([worker.as_str()], [("acme", "full")]);
    let config = write_setup(&dir, &setup(&workers, &tenants, tiers), PRICES_PLAIN);
    let gw = launch(&config).await;
    let reply = post(
        &gw.at("/v1/completions"),
        Some(&key_of("acme")),
        &completion("hi", 3),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    wait_rows(&gw, 1, FLUSHED).await;
    let rows = rows(&gw).await;
    let row = &rows[&request_id(&reply)];
    assert_eq!(
        (
            row["prompt_tokens"].as_str(),
            row["cached_tokens"].as_str(),
            row["completion_tokens"].as_str()
        ),
        ("7", "0", "3")
    );
    assert_eq!(nano(&row["cost_usd"]), hand_cost(7, 0, 3, 1, 1_000_000));
    let unreported = gw
        .metric("infergate_routing_cached_tokens_unreported_total{pool=\"main\"}")
        .await;
    assert_eq!(unreported, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_before_the_answer_gets_a_row_and_prices_keep_their_version() {
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("gone");
    let tiers = "tiers:\n  full: {priority: 1}\n";
    let (workers, tenants) = ([engine.url.as_str()], [("acme", "full")]);
    let config = write_setup(&dir, &setup(&workers, &tenants, tiers), PRICES_PLAIN);
    let gw = launch(&config).await;
    // A whole (non-streamed) answer of 400 tokens takes the sim worker seconds; the client
    // gives up after 300 ms, before any byte of it.
    let slow = completion(&words(50, 3), 400);
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        post(&gw.at("/v1/completions"), Some(&key_of("acme")), &slow),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the answer came too fast to test a client leaving"
    );
    wait_rows(&gw, 1, FLUSHED).await;
    let rows = rows(&gw).await;
    let row = rows.values().next().expect("one row");
    assert_eq!(
        (
            row["status"].as_str(),
            row["reason"].as_str(),
            row["tenant"].as_str()
        ),
        ("499", "client_gone", "acme"),
        "{row:?}"
    );

    // Stopped, the prices edited under the same version: the next start is refused.
    stop(gw).await;
    std::fs::write(
        dir.path.join("policies/prices.yaml"),
        "version: 1\nmodels:\n  llama-3-8b: {input: 9.0, output: 9.0}\n",
    )
    .expect("write");
    let cfg = config.to_string_lossy().into_owned();
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(["gateway", "--config", &cfg, "--listen", "127.0.0.1:0"])
        .args(["--admin-listen", "127.0.0.1:0"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the gateway exits at once")
        .expect("run the gateway");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("version 1 already priced requests with different prices"),
        "{stderr}"
    );
}
