//! Issue 48's drift scenario, live: `infergate up` on a copy of `config/scenarios/prompt-drift/`
//! (listeners on free ports, windows of 40 answers instead of 200), a real sim engine, two
//! tenants with their own keys. Both send the same mix of short prompts for one window; then
//! `alice`'s prompts grow tenfold while `bob`'s stay as they were. Each tenant's prompt-length
//! PSI against its first (pinned) window: `alice`'s crosses the 0.2 threshold, `bob`'s, scored
//! over two windows of his own, stays below it. About 3 s.

use std::time::Duration;

use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use serde_json::json;

use crate::common;
use common::gateway::{Gateway, MODEL, TempDir};

/// The scenario's directory in the repository.
const SCENARIO: &str = "config/scenarios/prompt-drift";
/// Answers per drift window in the test's copy.
const WINDOW: usize = 40;
/// Clients per tenant.
const CLIENTS: usize = 4;
/// The two tenants' keys (the scenario reads them from the environment).
const ALICE: &str = "prompt-drift-alice-key";
const BOB: &str = "prompt-drift-bob-key";
/// Words of one cl100k token each.
const WORDS: [&str; 16] = [
    "river", "stone", "sand", "forest", "valley", "town", "farm", "tide", "storm", "heron",
    "ferry", "ocean", "morning", "bridge", "garden", "window",
];

/// A prompt of about `words` tokens (plus the chat template's few).
fn prompt(words: usize) -> String {
    (0..words)
        .map(|i| WORDS[i % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// The steady mix: request `i` has about 30 prompt tokens when even, about 80 when odd (the
/// [32, 64) and [64, 128) bins with the template), so any window holds both halves alike.
fn steady(i: usize) -> usize {
    if i.is_multiple_of(2) { 30 } else { 80 }
}

/// Sends `count` requests as `key` from [`CLIENTS`] kept-alive clients, request `i` with a
/// prompt of `words(i)` words; every answer must be 200.
async fn send(gw: &Gateway, key: &'static str, count: usize, words: fn(usize) -> usize) {
    let clients = (0..CLIENTS).map(|c| {
        let url = gw.url.clone();
        tokio::spawn(async move {
            let mut conn = common::Conn::open(&url).await.expect("connect");
            for i in (c..count).step_by(CLIENTS) {
                let body = json!({
                    "model": MODEL,
                    "messages": [{"role": "user", "content": prompt(words(i))}],
                    "max_tokens": 4,
                });
                let reply = conn
                    .exchange(
                        Method::POST,
                        "/v1/chat/completions",
                        Some(key),
                        Bytes::from(body.to_string()),
                    )
                    .await
                    .expect("the gateway answers");
                assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
            }
        })
    });
    for c in clients.collect::<Vec<_>>() {
        c.await.expect("a client failed");
    }
}

fn psi(tenant: &str) -> String {
    format!("infergate_drift_tenant_psi{{tenant=\"{tenant}\",feature=\"prompt_tokens\"}}")
}

#[tokio::test]
async fn one_tenants_longer_prompts_raise_its_psi_and_not_the_other_tenants() {
    let root = std::path::Path::new(common::REPO).join(SCENARIO);
    let read = |name: &str| {
        std::fs::read_to_string(root.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let config = read("infergate.yaml");
    let windows = "    window: 200 ";
    let counts = "    min_count: 100 ";
    assert!(
        config.contains(windows) && config.contains(counts),
        "{config}"
    );
    let dir = TempDir::new("prompt-drift");
    dir.write_config(
        &config
            .replace(windows, &format!("    window: {WINDOW} "))
            .replace(counts, &format!("    min_count: {} ", WINDOW / 2)),
    );
    dir.write_routing(&read("policies/routing.yaml"));
    let cache = dir.path.join("cache").to_string_lossy().into_owned();
    let gw = Gateway::up_with(
        Some(&dir.config()),
        &[
            ("INFERGATE_CACHE_DIR", cache.as_str()),
            ("ALICE_API_KEY", ALICE),
            ("BOB_API_KEY", BOB),
        ],
    )
    .await;

    // One window each of the same steady mix: each tenant's pinned reference.
    tokio::join!(
        send(&gw, ALICE, WINDOW, steady),
        send(&gw, BOB, WINDOW, steady)
    );
    // Then alice's prompts grow to about 700 tokens ([512, 1024)); bob sends two more windows
    // of the same mix as before.
    tokio::join!(
        send(&gw, ALICE, 2 * WINDOW, |_| 700),
        send(&gw, BOB, 2 * WINDOW, steady)
    );

    let within = Duration::from_secs(5);
    let alice = gw.settle_metric(&psi("alice"), within, |v| v > 0.2).await;
    assert!(alice > 0.2, "alice's prompt-length PSI {alice}");
    // Bob's windows are scored too (the gauge exists), and show no shift.
    let bob = common::gateway::eventually("bob's PSI", within, || async {
        common::find_metric(&gw.metrics().await, &psi("bob"))
    })
    .await;
    assert!(bob < 0.2, "bob's prompt-length PSI {bob}");
    eprintln!("prompt-length PSI: alice {alice:.3}, bob {bob:.3}");
    assert_eq!(gw.metric("infergate_drift_psi_threshold").await, 0.2);
}
