//! `infergate up` and the gateway's public API end to end: the README's streamed request, a
//! non-streamed one, `/v1/models`, health endpoints, OpenAI-shaped client errors, the body limit,
//! and a SIGTERM that stops the gateway and every engine it spawned, within the grace plus a
//! second whatever its clients do.

use crate::common;

use std::time::{Duration, Instant};

use common::gateway::{
    Gateway, MODEL, TempDir, child_pids, cmdline, config_yaml, eventually, is_running,
    pool_workers, port_of, routing_yaml, send, stream_with,
};
use common::{Engine, assert_error, get, open_stream_with, post_json};
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[tokio::test]
async fn up_serves_the_readme_request_and_stops_its_workers_on_sigterm() {
    let mut gw = Gateway::up(None).await;

    // The embedded config spawns four engine workers as children of the gateway: two for the
    // stable pool, one for the canary pool, one real model on the CPU.
    let engines: Vec<u32> = child_pids(gw.pid)
        .into_iter()
        .filter(|&p| cmdline(p).contains(" engine "))
        .collect();
    assert_eq!(engines.len(), 4, "engine children of {}", gw.pid);
    assert_eq!(
        engines
            .iter()
            .filter(|&&p| cmdline(p).contains("--backend cpu"))
            .count(),
        1
    );
    let status = gw.status().await;
    assert_eq!(status["ready"], true, "{status}");
    let workers: Vec<String> = pool_workers(&status, "local")
        .iter()
        .map(|w| {
            assert_eq!(w["healthy"], true, "{w}");
            w["url"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(workers.len(), 2, "{status}");

    // A fresh demo key, shown in the ready-to-paste curl line, is required.
    let key = gw.api_key.clone().expect("up prints a demo API key");
    let auth = format!("Bearer {key}");
    let auth = [("authorization", auth.as_str())];
    let curl = gw.banner.last().expect("banner");
    assert!(
        curl.starts_with("curl -N http://") && curl.contains(&key),
        "{:?}",
        gw.banner
    );

    // The README's request, streamed, with a seed: unseeded, the sim may sample EOS as the very
    // first token (about 1 run in 256) and answer with no text at all.
    let readme = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 32,
        "stream": true,
        "seed": 7,
    });
    let anonymous = stream_with(&gw.at("/v1/chat/completions"), &[], &readme).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    // One session: the split keeps it on one version.
    let session = [auth[0], ("x-session-id", "readme-session")];
    let s = stream_with(&gw.at("/v1/chat/completions"), &session, &readme).await;
    assert_eq!(s.status, StatusCode::OK);
    let header = |name: &str| {
        s.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_else(|| panic!("no {name} in {:?}", s.headers))
            .to_owned()
    };
    assert!(header("content-type").starts_with("text/event-stream"));
    assert!(!header("x-request-id").is_empty());
    // The shipped config splits llama-3-8b into a stable and a canary version, each on its own
    // pool; the response names the version. Pool and worker (internal addresses) are debug
    // headers, off in the shipped config: the admin metrics below say which pool served.
    let version = header("x-infergate-version");
    assert!(
        ["stable", "canary"].contains(&version.as_str()),
        "unexpected version {version}"
    );
    for debug in ["x-infergate-pool", "x-infergate-worker"] {
        assert!(s.headers.get(debug).is_none(), "{debug} in {:?}", s.headers);
    }
    assert_eq!(s.last_data(), "[DONE]");
    let chunks = s.chunks();
    assert!(chunks.len() >= 3, "{chunks:?}");
    let id = chunks[0]["id"].as_str().expect("chunk id");
    assert!(id.starts_with("chatcmpl-"), "{id}");
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert_eq!(c["id"], id, "{c}");
        assert_eq!(c["model"], MODEL, "{c}");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let last = &chunks[chunks.len() - 1]["choices"][0];
    assert!(
        last["finish_reason"] == "length" || last["finish_reason"] == "stop",
        "{last}"
    );
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!text.trim().is_empty(), "{chunks:?}");

    // Non-streamed, with the client's request id echoed.
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello again"}],
        "max_tokens": 8,
        "ignore_eos": true,
    });
    let (status, headers, text) = send(
        Method::POST,
        &gw.at("/v1/chat/completions"),
        &[auth[0], session[1], ("x-request-id", "e2e-req-42")],
        Some(body.to_string()),
    )
    .await
    .expect("non-streamed request");
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(headers["x-request-id"], "e2e-req-42");
    // The same session: the same version as the streamed request (sticky).
    assert_eq!(headers["x-infergate-version"], version.as_str());
    assert!(headers.get("x-infergate-worker").is_none(), "{headers:?}");
    let res: Value = serde_json::from_str(&text).expect("JSON answer");
    assert_eq!(res["object"], "chat.completion", "{res}");
    assert_eq!(res["usage"]["completion_tokens"], 8, "{res}");
    assert_eq!(res["choices"][0]["finish_reason"], "length", "{res}");
    assert!(res["choices"][0]["message"]["content"].is_string(), "{res}");

    let (status, models) = get(&gw.at("/v1/models")).await;
    assert_eq!(status, StatusCode::OK);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["object"], "list");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, [MODEL, "infergate-tiny"], "{models}");
    assert_eq!(get(&gw.at("/readyz")).await.0, StatusCode::OK);
    assert_eq!(get(&gw.at("/healthz")).await.0, StatusCode::OK);
    let served = gw
        .metric(&format!(
            "infergate_requests_total{{model=\"{MODEL}\",pool=\"{}\",status=\"200\"}}",
            if version == "stable" {
                "local"
            } else {
                "canary"
            }
        ))
        .await;
    assert_eq!(served, 2.0);
    // Without a session or user, each request is split on its own by weight: the demo's 90/10
    // shows (the tenant alone no longer decides the version for all its requests).
    let plain =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
    let mut stable = 0;
    for _ in 0..200 {
        let (status, headers, text) = send(
            Method::POST,
            &gw.at("/v1/chat/completions"),
            &auth,
            Some(plain.to_string()),
        )
        .await
        .expect("request");
        assert_eq!(status, StatusCode::OK, "{text}");
        stable += usize::from(headers["x-infergate-version"] == "stable");
    }
    assert!(
        (160..=194).contains(&stable),
        "stable share {stable} of 200"
    );
    // /metrics names tenants and workers: only the admin listener serves it by default.
    assert_eq!(get(&gw.at("/metrics")).await.0, StatusCode::NOT_FOUND);
    // The canary arm is reached through the split only: asked for by name it does not exist
    // (so the kill switch cannot be bypassed).
    let direct = json!({
        "model": "llama-3-8b-canary",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
    });
    let (status, _, text) = send(
        Method::POST,
        &gw.at("/v1/chat/completions"),
        &auth,
        Some(direct.to_string()),
    )
    .await
    .expect("direct canary request");
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    let err: Value = serde_json::from_str(&text).expect("JSON error");
    assert_error(status, &err, &["llama-3-8b-canary", "does not exist"]);

    // Client errors, OpenAI-shaped.
    let unknown = json!({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]});
    let chat_url = gw.at("/v1/chat/completions");
    let (status, _, text) = send(Method::POST, &chat_url, &auth, Some(unknown.to_string()))
        .await
        .expect("unknown model request");
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(
        status,
        &serde_json::from_str(&text).unwrap(),
        &["no-such-model"],
    );
    let bad = Some("{\"model\": ".to_owned());
    let (status, _, text) = send(Method::POST, &chat_url, &auth, bad)
        .await
        .expect("invalid JSON request");
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let err: Value = serde_json::from_str(&text).expect("error body is JSON");
    assert_error(status, &err, &["JSON"]);

    // SIGTERM: exit 0 and no engine left behind.
    gw.signal("TERM");
    let exit = gw.wait_exit(Duration::from_secs(30)).await;
    eventually("spawned engines gone", Duration::from_secs(15), || async {
        engines.iter().all(|&p| !is_running(p)).then_some(())
    })
    .await;
    for w in &workers {
        let refused = tokio::net::TcpStream::connect(("127.0.0.1", port_of(w))).await;
        assert!(refused.is_err(), "worker {w} still accepts connections");
    }
    assert!(exit.success(), "exit {exit}; stderr:\n{}", gw.stderr());
}

#[tokio::test]
async fn bodies_over_the_limit_get_413() {
    let engine = Engine::start(&["--gpu", "h100"]).await;
    let dir = TempDir::new("limits");
    dir.write_config(&config_yaml(
        &[&engine.url],
        "limits: {max_body_bytes: 1024}\n",
    ));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let url = gw.at("/v1/chat/completions");

    let small = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2});
    let (status, _, res) = post_json(&url, &small).await;
    assert_eq!(status, StatusCode::OK, "{res}");

    let big = json!({"model": MODEL, "messages": [{"role": "user", "content": "x".repeat(2000)}],
                     "max_tokens": 2});
    let (status, _, err) = post_json(&url, &big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_error(status, &err, &["1024"]);
    // Nothing of the oversize request reached the engine.
    let engine_requests = engine
        .metric_or_zero("vllm:request_success_total{finished_reason=\"length\"}")
        .await;
    assert_eq!(engine_requests, 1.0);
}

/// SIGTERM to `up` with a stream longer than the grace, an idle connection and a client still
/// trickling its headers: the stream gets its error event and `[DONE]` at the grace, and the
/// gateway and its spawned engine are gone within the grace plus a second (the idle and unfinished
/// connections do not hold the exit).
#[tokio::test]
async fn up_exits_within_the_grace_plus_a_second_whatever_its_clients_do() {
    const GRACE: Duration = Duration::from_secs(2);
    let dir = TempDir::new("up-exit");
    dir.write_config(
        "listen: \"127.0.0.1:0\"\nadmin: {listen: \"127.0.0.1:0\"}\npolicies: policies\n\
         drain: {grace: 2s}\n\
         models:\n  - {name: llama-3-8b, pool: local}\n\
         pools:\n  - name: local\n    dialect: infergate\n    workers:\n      \
         - spawn: {count: 1, args: [\"--backend\", \"sim\", \"--gpu\", \"l4\", \"--model\", \"llama-3-8b\"]}\n",
    );
    dir.write_routing("pools:\n  local: {policy: least_load}\n");
    let mut gw = Gateway::up(Some(&dir.config())).await;
    let engines = child_pids(gw.pid);
    assert_eq!(engines.len(), 1, "engine children of {}", gw.pid);
    let key = format!("Bearer {}", gw.api_key.clone().expect("demo key"));
    let long = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 4000,
        "ignore_eos": true,
        "stream": true,
    });
    let mut s = open_stream_with(
        &gw.at("/v1/chat/completions"),
        &[("authorization", key.as_str())],
        &long,
    )
    .await;
    assert_eq!(s.status, StatusCode::OK);
    let first = s.next_event().await.expect("first event");
    let _idle = TcpStream::connect(gw.addr).await.expect("idle connection");
    let mut slow = TcpStream::connect(gw.addr).await.expect("slow connection");
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
        .await
        .expect("half a header");

    let signalled = Instant::now();
    gw.signal("TERM");
    let mut events = vec![first];
    while let Some(ev) = s.next_event().await {
        events.push(ev);
    }
    let n = events.len();
    assert_eq!(
        events[n - 1].data.as_deref(),
        Some("[DONE]"),
        "{:?}",
        &events[n.saturating_sub(2)..]
    );
    assert!(
        events[n - 2].json().is_some_and(|e| e["error"].is_object()),
        "{:?}",
        events[n - 2]
    );
    let exit = gw.wait_exit(GRACE + Duration::from_secs(5)).await;
    let took = signalled.elapsed();
    eprintln!("up exited {took:?} after SIGTERM with a {GRACE:?} grace");
    assert!(exit.success(), "{exit}");
    // It takes about the grace plus half a second; the bound is the grace plus a second.
    assert!(
        took < GRACE + Duration::from_secs(1),
        "up exited {took:?} after SIGTERM with a {GRACE:?} grace"
    );
    for pid in engines {
        eventually(
            "the spawned engine to exit",
            Duration::from_secs(1),
            || async move { (!is_running(pid)).then_some(()) },
        )
        .await;
    }
}

/// With tenants declared, the printed curl carries the auth header (a key only the operator
/// has, from `$INFERGATE_API_KEY`), so pasting it after setting the variable works.
#[tokio::test]
async fn the_try_curl_has_the_auth_header_when_tenants_are_declared() {
    let engine = Engine::start(&["--gpu", "h100"]).await;
    let dir = TempDir::new("try-auth");
    dir.write_config(&config_yaml(
        &[&engine.url],
        "tenants:\n  - name: acme\n    tier: default\n    key_env: TRY_AUTH_KEY\n",
    ));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[("TRY_AUTH_KEY", "sk-try-auth-0123456789")]).await;
    let curl = gw.banner.last().expect("banner");
    assert!(
        curl.starts_with("curl -N http://")
            && curl.contains("-H \"authorization: Bearer $INFERGATE_API_KEY\""),
        "{:?}",
        gw.banner
    );
    assert!(
        gw.banner
            .iter()
            .any(|l| l.contains("set INFERGATE_API_KEY")),
        "{:?}",
        gw.banner
    );
    // The printed request works once the variable holds a tenant's key.
    let (status, _, text) = send(
        Method::POST,
        &gw.at("/v1/chat/completions"),
        &[
            ("authorization", "Bearer sk-try-auth-0123456789"),
            ("content-type", "application/json"),
        ],
        Some(
            json!({"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
                .to_string(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
}
