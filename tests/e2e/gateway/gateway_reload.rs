//! Live configuration reload while traffic flows: a policy change and an added worker take effect,
//! a broken file is rejected with its line (admin status, logs, `config check`) while the old
//! snapshot keeps serving, and the admin endpoint and SIGHUP reload too. No request may fail.

use crate::common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Engine;
use common::gateway::{
    FAST_HEALTH, Gateway, TempDir, chat, config_yaml, eventually, line_of, pool_policy,
    pool_workers, random_text, routing_yaml, send, worker_of,
};
use hyper::{Method, StatusCode};
use serde_json::Value;

/// One request of the background traffic.
struct Outcome {
    at: Instant,
    worker: Result<String, String>,
}

/// Sequential requests sharing one long system prompt, until stopped.
struct Traffic {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Outcome>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    fn start(url: String) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (flag, sink) = (stop.clone(), log.clone());
        let task = tokio::spawn(async move {
            let system = random_text(2048, 42);
            let mut n = 0u64;
            while !flag.load(Ordering::Relaxed) {
                n += 1;
                let body = chat(&system, &format!("Request {n}."), 2, false).to_string();
                let worker = match send(Method::POST, &url, &[], Some(body)).await {
                    Ok((StatusCode::OK, headers, _)) => Ok(worker_of(&headers)),
                    Ok((status, _, text)) => Err(format!("request {n}: {status} {text}")),
                    Err(e) => Err(format!("request {n}: {e}")),
                };
                let at = Instant::now();
                sink.lock().unwrap().push(Outcome { at, worker });
            }
        });
        Traffic { stop, log, task }
    }

    /// Workers that answered requests completed after `since`.
    fn workers_since(&self, since: Instant) -> HashSet<String> {
        let log = self.log.lock().unwrap();
        let ok = log.iter().filter(|o| o.at > since);
        ok.filter_map(|o| o.worker.clone().ok()).collect()
    }

    /// Waits until requests completed after `since` reached every one of `urls`.
    async fn wait_spread(&self, since: Instant, urls: &[&str]) {
        eventually(
            &format!("traffic on {urls:?}"),
            Duration::from_secs(10),
            || async {
                let seen = self.workers_since(since);
                urls.iter().all(|u| seen.contains(*u)).then_some(())
            },
        )
        .await;
    }

    /// Stops the loop; returns (requests, failures).
    async fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("traffic task");
        let log = self.log.lock().unwrap();
        let failures = log.iter().filter_map(|o| o.worker.clone().err()).collect();
        (log.len(), failures)
    }
}

/// Successful and rejected reloads as the admin status counts them.
async fn reloads(gw: &Gateway) -> (u64, u64, String) {
    let s = gw.status().await;
    let r = &s["reloads"];
    let last = r["last_error"].as_str().unwrap_or_default().to_owned();
    (
        r["ok"].as_u64().unwrap(),
        r["failed"].as_u64().unwrap(),
        last,
    )
}

/// `infergate config check --config FILE` → (exit code, stdout + stderr).
async fn config_check(config: &Path) -> (i32, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(["config", "check", "--config"])
        .arg(config)
        .output()
        .await
        .expect("run config check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test]
async fn config_edits_apply_live_and_broken_files_are_rejected_without_failing_requests() {
    let mut engines = Vec::new();
    for _ in 0..3 {
        engines.push(Engine::start(&["--gpu", "h100"]).await);
    }
    let [e1, e2, e3] = [&engines[0].url, &engines[1].url, &engines[2].url];
    let extra = format!("{FAST_HEALTH}forward:\n  retries: 2\n");
    let two = config_yaml(&[e1, e2], &extra);
    let dir = TempDir::new("reload");
    dir.write_config(&two);
    dir.write_routing(&routing_yaml("prefix", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    assert!(pool_policy(&gw.status().await).starts_with("Prefix"));

    let traffic = Traffic::start(gw.at("/v1/chat/completions"));
    // prefix: one shared system prompt → one worker.
    let start = Instant::now();
    eventually("traffic flowing", Duration::from_secs(10), || async {
        (traffic.log.lock().unwrap().len() >= 10).then_some(())
    })
    .await;
    assert_eq!(traffic.workers_since(start).len(), 1);

    // 1. routing.yaml: prefix → round_robin. The shared prompt now spreads.
    dir.write_routing(&routing_yaml("round_robin", &[]));
    eventually("policy round_robin", Duration::from_secs(5), || async {
        pool_policy(&gw.status().await)
            .contains("RoundRobin")
            .then_some(())
    })
    .await;
    traffic.wait_spread(Instant::now(), &[e1, e2]).await;

    // 2. Add a worker: it starts taking requests.
    let three = config_yaml(&[e1, e2, e3], &extra);
    dir.write_config(&three);
    eventually("three workers", Duration::from_secs(5), || async {
        (pool_workers(&gw.status().await, "p").len() == 3).then_some(())
    })
    .await;
    traffic.wait_spread(Instant::now(), &[e1, e2, e3]).await;

    // 3. A broken config (unknown field on a known line) is rejected; the old one serves on.
    let (ok_before, failed_before, _) = reloads(&gw).await;
    let rejected_before = gw
        .metric("infergate_config_reloads_total{result=\"rejected\"}")
        .await;
    let broken = three.replace("  retries: 2", "  retrys: 2");
    let line = line_of(&broken, "retrys");
    let place = format!("infergate.yaml:{line}:");
    dir.write_config(&broken);
    let last_error = eventually("broken config rejected", Duration::from_secs(5), || async {
        let (_, failed, last) = reloads(&gw).await;
        (failed > failed_before).then_some(last)
    })
    .await;
    assert!(last_error.contains(&place), "{last_error:?} lacks {place}");
    assert!(last_error.contains("retrys"), "{last_error:?}");
    let rejected = gw
        .metric("infergate_config_reloads_total{result=\"rejected\"}")
        .await;
    assert!(rejected > rejected_before, "rejected reloads {rejected}");
    eventually("rejection logged", Duration::from_secs(5), || async {
        gw.stderr().contains(&place).then_some(())
    })
    .await;
    assert_eq!(pool_workers(&gw.status().await, "p").len(), 3);
    traffic.wait_spread(Instant::now(), &[e1, e2, e3]).await;

    let (code, out) = config_check(&dir.config()).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&place),
        "config check output lacks {place}:\n{out}"
    );

    // The admin endpoint reports the same errors and rejects too.
    let (status, _, text) = send(Method::POST, &gw.admin_at("/admin/reload"), &[], None)
        .await
        .expect("admin reload");
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text}");
    let res: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(res["reloaded"], false);
    assert!(res["errors"][0].as_str().unwrap().contains(&place), "{res}");

    // 4. A policy parameter out of range in routing.yaml: rejected with its line too.
    dir.write_config(&three);
    let bad_routing = routing_yaml("prefix", &["load_factor: 0.5"]);
    let routing_place = format!("routing.yaml:{}:", line_of(&bad_routing, "load_factor"));
    dir.write_routing(&bad_routing);
    eventually("bad routing rejected", Duration::from_secs(5), || async {
        let (_, _, last) = reloads(&gw).await;
        last.contains(&routing_place).then_some(())
    })
    .await;
    assert!(pool_policy(&gw.status().await).contains("RoundRobin"));

    // 5. Fixed files load; admin reload and SIGHUP reload as well.
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let (ok_fixed, _, _) = eventually("fixed files reloaded", Duration::from_secs(5), || async {
        let r = reloads(&gw).await;
        (r.0 > ok_before && r.2.is_empty()).then_some(r)
    })
    .await;
    let (code, out) = config_check(&dir.config()).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("OK"), "{out}");
    let (status, _, text) = send(Method::POST, &gw.admin_at("/admin/reload"), &[], None)
        .await
        .expect("admin reload");
    assert_eq!(status, StatusCode::OK, "{text}");
    let (ok_admin, _, _) = reloads(&gw).await;
    assert!(ok_admin > ok_fixed);
    gw.signal("HUP");
    eventually("SIGHUP reload", Duration::from_secs(5), || async {
        (reloads(&gw).await.0 > ok_admin).then_some(())
    })
    .await;
    let ok_metric = gw
        .metric("infergate_config_reloads_total{result=\"ok\"}")
        .await;
    assert!(ok_metric >= (ok_admin + 1) as f64, "ok reloads {ok_metric}");
    traffic.wait_spread(Instant::now(), &[e1, e2, e3]).await;

    let (requests, failures) = traffic.finish().await;
    assert!(
        failures.is_empty(),
        "{} of {requests} failed: {failures:?}",
        failures.len()
    );
    assert!(requests >= 30, "only {requests} requests ran");
}

/// A file the gateway does not read, changing in the config directory (its own log, an editor's
/// swap file), triggers no reload; an edit of the config itself still does.
#[tokio::test]
async fn only_the_config_files_themselves_trigger_a_reload() {
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("reload-noise");
    dir.write_config(&config_yaml(&[&engine.url], ""));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let config_dir = dir.config().parent().expect("config dir").to_path_buf();
    let log = config_dir.join("gateway.log");
    for i in 0..20 {
        std::fs::write(&log, format!("line {i}\n")).expect("write log");
        std::fs::write(config_dir.join(".infergate.yaml.swp"), "x").expect("write swap");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The noise lasted 1 s, far past the watcher's 150 ms settle: reloads it triggered would be
    // counted before the real edit's, which must reload exactly once.
    dir.write_config(&format!("{}# edited\n", config_yaml(&[&engine.url], "")));
    eventually("the edit reloaded", Duration::from_secs(10), || async {
        (reloads(&gw).await.0 >= 1).then_some(())
    })
    .await;
    assert_eq!(
        reloads(&gw).await.0,
        1,
        "noise in the directory reloaded the config"
    );
}

/// Listeners are bound once: a reload that moves `listen` is refused with a message saying a
/// restart is needed, and the gateway keeps serving on its address.
#[tokio::test]
async fn a_reload_that_moves_the_listener_is_refused_and_says_restart() {
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("reload-listen");
    let config = config_yaml(&[&engine.url], "");
    dir.write_config(&config);
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let path = dir.config().to_string_lossy().into_owned();
    // No --listen on the command line: the file's address is the one in force.
    let gw = Gateway::launch(&["gateway", "--config", &path], &[]).await;
    dir.write_config(&config.replace(
        "listen: \"127.0.0.1:0\"\nadmin",
        "listen: \"127.0.0.1:1\"\nadmin",
    ));
    eventually("the reload refused", Duration::from_secs(10), || async {
        let (ok, failed, last) = reloads(&gw).await;
        (failed == 1).then_some((ok, last))
    })
    .await;
    let (ok, failed, last) = reloads(&gw).await;
    assert_eq!((ok, failed), (0, 1));
    assert!(
        last.contains("`listen`") && last.contains("restart"),
        "{last}"
    );
    let (status, _) = common::get(&gw.at("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
}
