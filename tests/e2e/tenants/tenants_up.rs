//! `infergate up` with the embedded config (no tenants declared) makes a demo tenant with a
//! fresh key at every start and prints it: requests need that key, and only that start's key.

use crate::common;
use crate::tenant_support;

use hyper::StatusCode;
use serde_json::json;
use tenant_support::{Gw, MODEL, post};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_prints_a_fresh_demo_key_at_every_start() {
    let (first, second) = tokio::join!(
        Gw::launch(&["up", "--workers", "1"]),
        Gw::launch(&["up", "--workers", "1"]),
    );
    let key_of = |gw: &Gw| {
        gw.api_key
            .clone()
            .unwrap_or_else(|| panic!("no demo key printed; output:\n{}", gw.output()))
    };
    let (k1, k2) = (key_of(&first), key_of(&second));
    assert_ne!(k1, k2, "two starts printed the same key");
    for k in [&k1, &k2] {
        let random = k.strip_prefix("ig-").expect("keys start with ig-");
        assert_eq!(random.len(), 40, "{k}");
        assert!(
            random
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "{k}"
        );
    }

    let body = json!({
        "model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
    });
    for (gw, own, other) in [(&first, &k1, &k2), (&second, &k2, &k1)] {
        let url = gw.at("/v1/chat/completions");
        let r = post(&url, None, &body).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
        common::assert_error(StatusCode::UNAUTHORIZED, &r.json(), &["API key"]);
        // The other start's key is not valid here.
        let r = post(&url, Some(other), &body).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
        let r = post(&url, Some(own), &body).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(r.json()["object"], "chat.completion");
        // The demo tenant is on the default tier of the embedded policies (`paid`: 600 rpm).
        assert_eq!(r.header_u64("x-ratelimit-limit-requests"), 600);
        gw.expect_metric(
            "infergate_tenant_requests_total{tenant=\"demo\",outcome=\"ok\"}",
            1.0,
            std::time::Duration::from_secs(5),
        )
        .await;
    }
}

/// SIGKILLs the given processes when dropped (a failed assertion leaves no orphan behind).
struct KillOnDrop(Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in self.0.iter().filter(|p| common::process::is_running(**p)) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_workers_exit_when_the_gateway_is_killed() {
    let mut gw = Gw::launch(&["up", "--workers", "1"]).await;
    let workers = gw.children();
    // One per spawn entry: the stable, canary and cpu pools.
    assert_eq!(workers.len(), 3, "workers of `up --workers 1`: {workers:?}");
    let _cleanup = KillOnDrop(workers.clone());
    // A crash: the gateway cannot stop its workers, whose stdin (and stderr) pipes close.
    gw.crash().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while workers.iter().any(|p| common::process::is_running(*p)) {
        assert!(
            std::time::Instant::now() < deadline,
            "worker {workers:?} still running 5 s after its gateway was killed \
             (`--exit-with-stdin` did not fire)"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
