//! The tenant cost dashboard end to end: a gateway with a usage ledger and prices serves two
//! tenants' traffic to a sim engine, then headless Chromium loads `/admin/dashboard` from the
//! admin listener. The page, drawn by its own script, must show each tenant's spend exactly as
//! `/admin/usage` reports it, the budgets and the refusals, draw its SVG charts, and say it is
//! ready; a screenshot lands in `target/dashboard.png` for a person to look at.
//!
//! Needs Debian's `chromium` at `/usr/bin/chromium` (`.ci/run` installs it); without it the test
//! fails rather than pass unseen.

use crate::common;
use crate::tenant_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde_json::{Value, json};
use tenant_support::{Gw, MODEL, Setup, TempDir, key_of, post};

use common::Engine;

/// Where the test expects the browser.
const CHROMIUM: &str = "/usr/bin/chromium";
/// How long one Chromium run may take (it starts cold, and the page gets 15 s of virtual time).
const BROWSER_DEADLINE: Duration = Duration::from_secs(90);
/// How long the ledger may take to show every request (it flushes every second).
const LEDGER_DEADLINE: Duration = Duration::from_secs(30);

/// Chat requests sent per tenant: different counts so the spends differ.
const TRAFFIC: [(&str, usize); 2] = [("acme", 5), ("globex", 2)];

const TIERS: &str = "\
tiers:
  paid: {priority: 1, budgets: [{period: day, usd: 5, kind: hard}]}
budgets:
  # Soft and tiny: reached after the first request, and never refuses.
  globex: [{period: month, usd: 0.0000001, kind: soft}]
";

fn prices() -> String {
    format!("version: 1\nmodels:\n  {MODEL}: {{input: 2.0, cached_input: 0.5, output: 8.0}}\n")
}

/// A chat body whose long system prompt is the same every time (so the engine's prefix cache
/// serves part of it from the second request on).
fn chat(question: &str, max_tokens: u64) -> Value {
    let system = "You are the billing assistant of a small company. Answer briefly and precisely, \
                  in plain words, and never invent numbers you were not given. "
        .repeat(4);
    json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "max_tokens": max_tokens,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_each_tenants_spend_budgets_and_refusals() {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: this test renders the dashboard in headless Chromium; install \
         Debian's `chromium` package (apt-get install -y chromium)"
    );
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("dashboard");
    let setup = Setup {
        workers: &[&engine.url],
        extra: "ledger: {path: usage.sqlite}\n",
        tenants: &[("acme", "paid"), ("globex", "paid")],
        tiers: TIERS,
        ..Setup::default()
    };
    let config = setup.write(&dir);
    std::fs::write(dir.path.join("policies").join("prices.yaml"), prices())
        .expect("write prices.yaml");
    let gw = Gw::launch(&["gateway", "--config", &config.to_string_lossy()]).await;

    let url = gw.at("/v1/chat/completions");
    for (tenant, n) in TRAFFIC {
        for i in 0..n {
            let body = chat(&format!("What did invoice {i} of {tenant} cost?"), 8);
            let r = post(&url, Some(&key_of(tenant)), &body).await;
            assert_eq!(r.status, StatusCode::OK, "{tenant} request {i}: {}", r.text);
        }
    }
    // One refusal: a model the gateway does not serve.
    let mut bad = chat("Which model is this?", 8);
    bad["model"] = json!("no-such-model");
    let r = post(&url, Some(&key_of("globex")), &bad).await;
    assert!(r.status.is_client_error(), "{}: {}", r.status, r.text);

    // Globex: its 2 answers and the refusal.
    let usage = wait_for_ledger(&gw, &[("acme", 5), ("globex", 3)]).await;
    let (status, text) = common::get(&format!("{}/admin/budgets", gw.admin)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let budgets: Value = serde_json::from_str(&text).expect("budgets JSON");

    let page = format!("{}/admin/dashboard", gw.admin);
    let shot = Path::new(crate::common::REPO).join("target/dashboard.png");
    std::fs::create_dir_all(shot.parent().expect("target/")).expect("create target/");
    let _ = std::fs::remove_file(&shot);
    let dom_args = ["--dump-dom".to_string()];
    let shot_args = [
        format!("--screenshot={}", shot.display()),
        "--window-size=1400,1800".to_string(),
    ];
    // The tenant filter, picked from the fragment (the key there is sent, and ignored here).
    let globex_page = format!("{page}#tenant=globex&key=unused");
    let (dom, _, globex_dom) = tokio::join!(
        chromium(&dom_args, &page),
        chromium(&shot_args, &page),
        chromium(&dom_args, &globex_page),
    );

    // The page finished: every fetch answered and everything was drawn.
    assert_ready(&dom);
    let status_text = between(&dom, "id=\"status\">", "<").unwrap_or_default();
    assert!(
        status_text.starts_with("updated "),
        "#status: {status_text:?}"
    );
    assert!(dom.contains("<svg"), "no SVG chart in the DOM:\n{dom}");

    // Each tenant's row in the top-tenants table carries the ledger's exact spend, shown in USD.
    let table = between(&dom, "id=\"top-tenants\"", "</table>")
        .unwrap_or_else(|| panic!("no #top-tenants table in the DOM:\n{dom}"));
    for (tenant, _) in TRAFFIC {
        let want = usage[tenant];
        let row = row_of(table, &format!("data-tenant=\"{tenant}\""))
            .unwrap_or_else(|| panic!("no top-tenants row for {tenant}:\n{table}"));
        let (nano, text) = cost_cell(row).unwrap_or_else(|| panic!("no cost cell in {row}"));
        assert_eq!(nano, want, "{tenant}: data-cost-nanousd");
        assert_eq!(text, usd(want), "{tenant}: the shown spend");
        assert!(
            dom.contains(&format!("data-chart-tenant=\"{tenant}\"")),
            "no daily chart of {tenant}"
        );
    }
    assert_ne!(usage["acme"], usage["globex"], "spends should differ");

    // What caching saved, as the API reports it.
    let saved = usage_totals(&gw).await["saved_nanousd"]
        .as_u64()
        .expect("totals.saved_nanousd");
    assert!(
        dom.contains(&format!("data-saved-nanousd=\"{saved}\"")),
        "caching saved {saved} nano-USD, not on the page"
    );

    // Budgets: one row per budget, with the API's reached flag.
    for b in budgets["budgets"].as_array().expect("budgets array") {
        let tenant = b["tenant"].as_str().expect("budget tenant");
        let reached = if b["reached"] == json!(true) {
            "1"
        } else {
            "0"
        };
        let marker = format!("data-budget-tenant=\"{tenant}\" data-reached=\"{reached}\"");
        assert!(dom.contains(&marker), "no budget row {marker}");
    }
    assert!(
        budgets["budgets"].as_array().is_some_and(|l| l
            .iter()
            .any(|b| b["tenant"] == "globex" && b["reached"] == true)),
        "globex's tiny soft budget should read as reached: {budgets}"
    );

    // The refusal, by tenant and reason.
    let refusals = between(&dom, "id=\"refusals-table\"", "</table>")
        .unwrap_or_else(|| panic!("no refusals table:\n{dom}"));
    assert!(
        refusals.contains("data-reason=\"validation\"") && refusals.contains("globex"),
        "the refused request is not listed:\n{refusals}"
    );

    // Filtered to globex: its row only, and its chart only.
    assert_ready(&globex_dom);
    let table = between(&globex_dom, "id=\"top-tenants\"", "</table>")
        .unwrap_or_else(|| panic!("no #top-tenants table when filtered:\n{globex_dom}"));
    let row = row_of(table, "data-tenant=\"globex\"").expect("globex row when filtered");
    assert_eq!(cost_cell(row).map(|c| c.0), Some(usage["globex"]));
    assert!(
        row_of(table, "data-tenant=\"acme\"").is_none(),
        "acme shown under a globex filter"
    );
    assert!(
        !globex_dom.contains("data-chart-tenant=\"acme\""),
        "acme charted under a globex filter"
    );

    // The screenshot: a PNG of the window's size with something in it.
    let png =
        std::fs::read(&shot).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", shot.display()));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let dim = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().expect("4 bytes"));
    assert_eq!((dim(16), dim(20)), (1400, 1800), "screenshot size");
    assert!(png.len() > 20_000, "a {} B screenshot is blank", png.len());
}

/// Polls `/admin/usage?group_by=tenant` until each tenant shows `want` requests; returns each
/// tenant's cost in nano-USD.
async fn wait_for_ledger(gw: &Gw, want: &[(&str, u64)]) -> BTreeMap<String, u64> {
    let url = format!("{}/admin/usage?group_by=tenant", gw.admin);
    let deadline = Instant::now() + LEDGER_DEADLINE;
    loop {
        let (status, text) = common::get(&url).await;
        assert_eq!(status, StatusCode::OK, "GET {url}: {text}");
        let page: Value = serde_json::from_str(&text).expect("usage JSON");
        let groups = page["groups"].as_array().expect("groups");
        let field = |g: &Value, k: &str| g[k].as_u64().unwrap_or_else(|| panic!("{k} in {g}"));
        let requests: BTreeMap<&str, u64> = groups
            .iter()
            .map(|g| {
                (
                    g["group"]["tenant"].as_str().unwrap_or(""),
                    field(g, "requests"),
                )
            })
            .collect();
        if want.iter().all(|(t, n)| requests.get(t) == Some(n)) {
            return groups
                .iter()
                .map(|g| {
                    let tenant = g["group"]["tenant"].as_str().unwrap_or("").to_string();
                    (tenant, field(g, "cost_nanousd"))
                })
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "the ledger never showed {want:?} requests in {LEDGER_DEADLINE:?}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `totals` of `/admin/usage?group_by=tenant` over the page's default window: the last 7 UTC
/// days, today included.
async fn usage_totals(gw: &Gw) -> Value {
    use infergate::utc::{DAY_MS, iso_date, now_ms};
    let now = now_ms();
    let (from, to) = (iso_date(now - 6 * DAY_MS), iso_date(now));
    let url = format!(
        "{}/admin/usage?group_by=tenant&from={from}&to={to}",
        gw.admin
    );
    let (status, text) = common::get(&url).await;
    assert_eq!(status, StatusCode::OK, "GET {url}: {text}");
    let page: Value = serde_json::from_str(&text).expect("usage JSON");
    page["totals"].clone()
}

/// Runs headless Chromium on `url` with `args` in a fresh profile; returns its stdout (the DOM
/// with `--dump-dom`). Killed when it outlives [`BROWSER_DEADLINE`].
async fn chromium(args: &[String], url: &str) -> String {
    let profile = TempDir::new("chromium");
    let mut cmd = tokio::process::Command::new(CHROMIUM);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--virtual-time-budget=15000",
        "--run-all-compositor-stages-before-draw",
    ])
    .arg(format!("--user-data-dir={}", profile.path.display()))
    .args(args)
    .arg(url)
    .env("HOME", &profile.path)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    let out = tokio::time::timeout(BROWSER_DEADLINE, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("chromium {args:?} ran past {BROWSER_DEADLINE:?}"))
        .expect("run chromium");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "chromium {args:?}: {}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Asserts that the page's own script marked `<body>` ready (every fetch answered, all drawn).
fn assert_ready(dom: &str) {
    let body = dom
        .find("<body")
        .and_then(|at| between(&dom[at..], "<body", ">"))
        .unwrap_or_else(|| panic!("no <body> in the DOM:\n{dom}"));
    assert!(
        body.contains("data-ready=\"1\""),
        "<body{body}>: the page is not ready; #status: {:?}\nDOM:\n{dom}",
        between(dom, "id=\"status\">", "<")
    );
}

/// The text after `start` up to the next `end`.
fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = text.find(start)? + start.len();
    let len = text[from..].find(end)?;
    Some(&text[from..from + len])
}

/// The `<tr ...>...</tr>` of `table` whose opening tag holds `marker`.
fn row_of<'a>(table: &'a str, marker: &str) -> Option<&'a str> {
    table.split("<tr").find_map(|row| {
        let open = &row[..row.find('>')?];
        open.contains(marker)
            .then(|| &row[..row.find("</tr>").unwrap_or(row.len())])
    })
}

/// `data-cost-nanousd` of the cell in `row` that has it, and the cell's text.
fn cost_cell(row: &str) -> Option<(u64, String)> {
    let nano = between(row, "data-cost-nanousd=\"", "\"")?.parse().ok()?;
    let at = row.find("data-cost-nanousd=\"")?;
    let text = between(&row[at..], ">", "</td>")?;
    Some((nano, text.to_string()))
}

/// Nano-USD as the page's `usd()` shows it: cents from a cent up (with thousands separators),
/// millionths below.
fn usd(nano: u64) -> String {
    if nano < 10_000_000 {
        let micro = (nano + 500) / 1_000;
        if micro == 0 && nano > 0 {
            return "<$0.000001".into();
        }
        return format!("$0.{micro:06}");
    }
    let cents = (nano + 5_000_000) / 10_000_000;
    let dollars = (cents / 100).to_string();
    let mut grouped = String::new();
    for (i, c) in dollars.chars().enumerate() {
        if i > 0 && (dollars.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    format!("${grouped}.{:02}", cents % 100)
}
