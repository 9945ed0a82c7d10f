//! DNS discovery end to end: a pool whose workers come from a name (as a Kubernetes headless
//! Service lists its pods) finds the engine behind it and serves through it.

use crate::common;

use std::time::Duration;

use common::gateway::{
    FAST_HEALTH, Gateway, MODEL, POOL, TempDir, chat, eventually, pool_workers, port_of,
    routing_yaml, worker_of,
};
use common::{Engine, post_json};
use hyper::StatusCode;

#[tokio::test]
async fn a_dns_name_resolves_to_the_workers_behind_it() {
    let engine = Engine::start(&["--gpu", "h100"]).await;
    let port = port_of(&engine.url);
    let dir = TempDir::new("dns");
    dir.write_config(&format!(
        "listen: \"127.0.0.1:0\"\nadmin:\n  listen: \"127.0.0.1:0\"\ndebug_headers: true\npolicies: policies\n{FAST_HEALTH}\
         models:\n  - name: {MODEL}\n    pool: {POOL}\npools:\n  - name: {POOL}\n    workers:\n      \
         - dns: {{name: localhost, port: {port}, interval: 200ms}}\n"
    ));
    dir.write_routing(&routing_yaml("least_load", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;

    // The name resolves (127.0.0.1, and ::1 where the resolver lists it) and the workers appear.
    let expected = format!("http://127.0.0.1:{port}");
    let workers = eventually(
        "the DNS name to resolve",
        Duration::from_secs(10),
        || async {
            let status = gw.status().await;
            let urls: Vec<String> = pool_workers(&status, POOL)
                .iter()
                .filter_map(|w| w["url"].as_str().map(str::to_owned))
                .collect();
            urls.contains(&expected).then_some(urls)
        },
    )
    .await;
    assert!(
        workers.iter().all(|u| u.ends_with(&format!(":{port}"))),
        "{workers:?}"
    );

    // Requests are served by the discovered engine (an address nothing listens on, such as ::1
    // here, is retried before the first byte and then ejected).
    for i in 0..4 {
        let (status, headers, res) = post_json(
            &gw.at("/v1/chat/completions"),
            &chat("You are terse.", &format!("question {i}"), 2, false),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{res}");
        assert_eq!(worker_of(&headers), expected);
    }
}
