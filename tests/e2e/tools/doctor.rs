//! `infergate doctor` end to end: a real gateway polling real or scripted workers, load driven
//! through it, and `doctor --admin URL --json` run as its own process. A healthy light load on
//! `infergate up` names nothing; a pool of scripted workers showing each 3.2 mechanism's
//! dashboard is named with the right one (the gateway carries the workers' triage metrics into
//! its own `/metrics`); a real engine capped at two sequences under many concurrent requests is
//! 3.2 small batches.

use crate::common;
use crate::tools_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Engine;
use common::gateway::{FAST_HEALTH, Gateway, POOL, TempDir, chat, config_yaml, routing_yaml};
use common::rogue::{Rogue, Step, answer};
use hyper::{Method, StatusCode};
use serde_json::Value;
use tools_support::infergate;

/// The window doctor measures: long enough for a few polls at [`FAST_HEALTH`]'s 100 ms.
const WINDOW: &str = "3s";

/// Runs `infergate doctor --admin ADMIN --window 3s --json`, expects exit 0, returns its JSON.
async fn doctor(admin: &str) -> Value {
    let args = ["doctor", "--admin", admin, "--window", WINDOW, "--json"];
    let run = infergate(&args, Duration::from_secs(30)).await;
    let out = run.ok("infergate doctor");
    serde_json::from_str(out).unwrap_or_else(|e| panic!("doctor printed no JSON ({e}):\n{out}"))
}

fn names(report: &Value) -> Vec<String> {
    report["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no findings list in {report:#}"))
        .iter()
        .map(|f| f["name"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Keeps `clients` loops of streamed chats going through the gateway until dropped.
struct Load(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Load {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

fn load(url: String, key: Option<String>, clients: usize, max_tokens: u64) -> Load {
    let url = Arc::new(url);
    Load(
        (0..clients)
            .map(|i| {
                let (url, key) = (url.clone(), key.clone());
                tokio::spawn(async move {
                    let auth = key.map(|k| format!("Bearer {k}"));
                    let mut headers = vec![("content-type", "application/json")];
                    if let Some(a) = &auth {
                        headers.push(("authorization", a.as_str()));
                    }
                    loop {
                        let body = chat(
                            "You are brief.",
                            &format!("Question {i}?"),
                            max_tokens,
                            true,
                        );
                        let sent =
                            common::send(Method::POST, &url, &headers, Some(body.to_string()))
                                .await;
                        if sent.is_err() {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                })
            })
            .collect(),
    )
}

#[tokio::test]
async fn a_healthy_light_load_on_up_has_no_findings() {
    let gw = Gateway::up(None).await;
    let _load = load(gw.at("/v1/chat/completions"), gw.api_key.clone(), 1, 32);
    let report = doctor(&gw.admin).await;
    assert_eq!(names(&report), Vec::<String>::new(), "{report:#}");
    // It saw the traffic, so "no findings" is a judgement, not an empty window.
    let s = &report["snapshot"];
    assert!(s["requests"].as_f64().unwrap_or(0.0) > 0.0, "{s:#}");
    assert!(s["tpot_mean_s"].as_f64().is_some(), "{s:#}");
    assert!(s["itl_p99_s"].as_f64().is_some(), "{s:#}");
    assert!(s["workers"].as_u64().unwrap_or(0) >= 1, "{s:#}");
    assert!(report["missing"].is_array(), "{report:#}");
}

/// The dashboard a scripted worker shows, per second of its life.
#[derive(Clone, Copy)]
struct Shape {
    /// Busy seconds per second.
    busy: f64,
    /// Host seconds per second.
    host: f64,
    /// Sequences per step.
    batch: u64,
    /// `max_num_seqs`.
    cap: u64,
    /// Requests waiting.
    waiting: u64,
}

/// Our engine's triage metrics at `t` seconds for `shape`: 100 steps a second, 20 requests
/// finishing a second with 500-token prompts and 10 ms per token.
fn scripted_metrics(t: f64, s: Shape) -> String {
    let steps = (100.0 * t).floor();
    let done = (20.0 * t).floor();
    let tokens = (10.0 * t * 100.0).floor();
    format!(
        "vllm:num_requests_running {batch}\n\
vllm:num_requests_waiting {waiting}\n\
vllm:kv_cache_usage_perc 0.2\n\
infergate_engine_busy_seconds_total {busy}\n\
infergate_engine_host_seconds_total {host}\n\
infergate_engine_max_num_seqs {cap}\n\
infergate_engine_max_num_batched_tokens 8192\n\
vllm:num_preemptions_total 0\n\
infergate_engine_batch_size_bucket{{le=\"{batch}\"}} {steps}\n\
infergate_engine_batch_size_bucket{{le=\"+Inf\"}} {steps}\n\
infergate_engine_batch_size_sum {batch_sum}\n\
infergate_engine_batch_size_count {steps}\n\
vllm:request_prompt_tokens_bucket{{le=\"1000\"}} {done}\n\
vllm:request_prompt_tokens_bucket{{le=\"+Inf\"}} {done}\n\
vllm:request_prompt_tokens_sum {prompt_sum}\n\
vllm:request_prompt_tokens_count {done}\n\
vllm:request_time_per_output_token_seconds_bucket{{le=\"0.01\"}} {done}\n\
vllm:request_time_per_output_token_seconds_bucket{{le=\"+Inf\"}} {done}\n\
vllm:request_time_per_output_token_seconds_sum {tpot_sum}\n\
vllm:request_time_per_output_token_seconds_count {done}\n\
vllm:inter_token_latency_seconds_bucket{{le=\"0.01\"}} {tokens}\n\
vllm:inter_token_latency_seconds_bucket{{le=\"+Inf\"}} {tokens}\n\
vllm:inter_token_latency_seconds_sum {itl_sum}\n\
vllm:inter_token_latency_seconds_count {tokens}\n",
        batch = s.batch,
        waiting = s.waiting,
        cap = s.cap,
        busy = s.busy * t,
        host = s.host * t,
        batch_sum = steps * s.batch as f64,
        prompt_sum = done * 500.0,
        tpot_sum = done * 0.01,
        itl_sum = tokens * 0.01,
    )
}

/// A gateway over two scripted workers showing `shape` (they answer chats with a 503: only
/// their metrics matter here).
async fn scripted_pool(shape: Shape) -> (Gateway, [Rogue; 2], TempDir) {
    let start = Instant::now();
    let script = move |req: &common::rogue::RogueRequest| -> Vec<Step> {
        if req.path == "/metrics" {
            let t = start.elapsed().as_secs_f64();
            answer(200, "text/plain", scripted_metrics(t, shape))
        } else {
            answer(503, "application/json", "{}")
        }
    };
    let workers = [Rogue::start(script).await, Rogue::start(script).await];
    let dir = TempDir::new("doctor");
    dir.write_config(&config_yaml(
        &[&workers[0].url, &workers[1].url],
        FAST_HEALTH,
    ));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    // Both workers polled at least twice before the window opens.
    common::eventually(
        "both scripted workers polled",
        Duration::from_secs(10),
        || async { (workers.iter().all(|w| w.metrics_polls() >= 2)).then_some(()) },
    )
    .await;
    (gw, workers, dir)
}

#[tokio::test]
async fn scripted_workers_pinned_at_their_cap_are_3_2_small_batches() {
    let (gw, _workers, _dir) = scripted_pool(Shape {
        busy: 0.3,
        host: 0.02,
        batch: 2,
        cap: 2,
        waiting: 40,
    })
    .await;
    // The gateway carries the workers' triage metrics, per pool and worker.
    let metrics = gw.metrics().await;
    for name in [
        "infergate_worker_busy_seconds_total{pool=\"p\"",
        "infergate_worker_max_num_seqs{pool=\"p\"",
        "infergate_worker_batch_size_bucket{pool=\"p\"",
    ] {
        assert!(metrics.contains(name), "no {name} in\n{metrics}");
    }
    let report = doctor(&gw.admin).await;
    assert_eq!(names(&report), ["small-batches"], "{report:#}");
    let f = &report["findings"][0];
    assert_eq!(f["symptom"], "3.2");
    let busy = f["confirming"]["busy_fraction"].as_f64().unwrap();
    assert!(
        (0.2..0.4).contains(&busy),
        "busy {busy} for 0.3 scripted: {report:#}"
    );
    assert_eq!(f["confirming"]["max_num_seqs"], 2.0);
    assert_eq!(f["confirming"]["batch_size_mean"], 2.0);
    assert_eq!(f["confirming"]["queue_per_worker"], 40.0);
    assert!(f["falsifier"].as_str().unwrap().contains("3.2 (a)"));
    let missing = report["missing"].to_string();
    assert!(!missing.contains("busy fraction"), "{missing}");
    // The text report for a person: the same finding, its parts and values.
    let args = ["doctor", "--admin", &gw.admin, "--window", "1s"];
    let run = infergate(&args, Duration::from_secs(30)).await;
    let text = run.ok("infergate doctor (text)");
    assert!(text.contains("1. 3.2 small-batches"), "{text}");
    for part in [
        "mechanism:  small batches",
        "lever:",
        "confirming:",
        "max_num_seqs 2.00",
        "falsifier:",
    ] {
        assert!(text.contains(part), "no {part:?} in\n{text}");
    }
}

#[tokio::test]
async fn scripted_workers_idle_between_steps_are_3_2_host_bound() {
    let (gw, _workers, _dir) = scripted_pool(Shape {
        busy: 0.3,
        host: 0.6,
        batch: 24,
        cap: 256,
        waiting: 40,
    })
    .await;
    let report = doctor(&gw.admin).await;
    assert_eq!(names(&report), ["host-bound"], "{report:#}");
    let f = &report["findings"][0];
    assert_eq!(f["symptom"], "3.2");
    let host = f["confirming"]["host_share"].as_f64().unwrap();
    assert!(
        (0.6..0.75).contains(&host),
        "host share {host} for 0.6 / 0.9: {report:#}"
    );
}

#[tokio::test]
async fn an_engine_capped_at_two_sequences_under_load_is_3_2_small_batches() {
    let engine = Engine::start(&["--gpu", "l4", "--max-num-seqs", "2"]).await;
    let dir = TempDir::new("doctor-engine");
    dir.write_config(&config_yaml(&[&engine.url], FAST_HEALTH));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let _load = load(gw.at("/v1/chat/completions"), None, 32, 128);
    // Requests queue in the engine or, past an admission bound, in the gateway.
    queue_builds_up(&gw, "a queue behind the two-sequence cap").await;
    let report = doctor(&gw.admin).await;
    assert_eq!(
        names(&report).first().map(String::as_str),
        Some("small-batches"),
        "{report:#}"
    );
    assert_eq!(report["findings"][0]["confirming"]["max_num_seqs"], 2.0);
    assert!(
        !names(&report)
            .iter()
            .any(|n| n == "tpot-at-peak" || n == "host-bound"),
        "{report:#}"
    );
}

/// `prometheus` on a free loopback port scraping `target` (host:port) every second; killed on
/// drop.
struct Prometheus {
    url: String,
    _child: tokio::process::Child,
    _dir: TempDir,
}

impl Prometheus {
    async fn start(target: &str) -> Prometheus {
        let dir = TempDir::new("doctor-prom");
        let config = dir.path.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
scrape_configs:\n  - job_name: gateway\n    static_configs: [{{targets: [\"{target}\"]}}]\n"
            ),
        )
        .unwrap();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let mut cmd = common::process::command("prometheus");
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let (child, _stderr, _stdout) = common::process::spawn(&mut cmd);
        let url = format!("http://127.0.0.1:{port}");
        common::wait_ok(&format!("{url}/-/ready"), Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("prometheus never became ready: {e}"));
        Prometheus {
            url,
            _child: child,
            _dir: dir,
        }
    }

    /// The first value of an instant query, `None` for an empty answer.
    async fn value(&self, query: &str) -> Option<f64> {
        let url = format!(
            "{}/api/v1/query?query={}",
            self.url,
            infergate_cli::doctor::prom::encode(query)
        );
        let (status, body) = common::get(&url).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }
}

#[tokio::test]
async fn doctor_reads_the_same_window_through_prometheus() {
    let (gw, _workers, _dir) = scripted_pool(Shape {
        busy: 0.3,
        host: 0.02,
        batch: 2,
        cap: 2,
        waiting: 40,
    })
    .await;
    let target = gw.admin.trim_start_matches("http://").to_string();
    let prom = Prometheus::start(&target).await;
    // Enough scrapes for a 5 s window of rates.
    common::eventually(
        "six scrapes of the gateway",
        Duration::from_secs(30),
        || async {
            let n = prom
                .value("max(count_over_time(infergate_worker_busy_seconds_total[6s]))")
                .await;
            n.filter(|&n| n >= 6.0)
        },
    )
    .await;
    let args = [
        "doctor",
        "--prometheus",
        prom.url.as_str(),
        "--window",
        "5s",
        "--pool",
        POOL,
        "--json",
    ];
    let run = infergate(&args, Duration::from_secs(30)).await;
    let report: Value = serde_json::from_str(run.ok("infergate doctor --prometheus")).unwrap();
    assert_eq!(names(&report), ["small-batches"], "{report:#}");
    let f = &report["findings"][0];
    let busy = f["confirming"]["busy_fraction"].as_f64().unwrap();
    assert!(
        (0.2..0.4).contains(&busy),
        "busy {busy} for 0.3 scripted: {report:#}"
    );
    assert_eq!(f["confirming"]["max_num_seqs"], 2.0);
    // PromQL's extrapolated increases divide to 2 within rounding.
    let batch = f["confirming"]["batch_size_mean"].as_f64().unwrap();
    assert!((batch - 2.0).abs() < 1e-9, "{report:#}");
}

#[tokio::test]
async fn nonsense_triage_metrics_are_rejected_at_the_poll_and_never_exported() {
    let start = Instant::now();
    let honest = Rogue::start(move |req: &common::rogue::RogueRequest| {
        let t = start.elapsed().as_secs_f64();
        let shape = Shape {
            busy: 0.3,
            host: 0.02,
            batch: 2,
            cap: 2,
            waiting: 40,
        };
        answer(
            200,
            "text/plain",
            if req.path == "/metrics" {
                scripted_metrics(t, shape)
            } else {
                String::new()
            },
        )
    })
    .await;
    // Sane queue gauges, a busy counter that is not a number and a falling histogram.
    let liar = Rogue::start(|_req: &common::rogue::RogueRequest| {
        answer(
            200,
            "text/plain",
            "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n\
infergate_engine_busy_seconds_total NaN\n\
infergate_engine_batch_size_bucket{le=\"1\"} 9\ninfergate_engine_batch_size_bucket{le=\"2\"} 3\n",
        )
    })
    .await;
    let dir = TempDir::new("doctor-liar");
    dir.write_config(&config_yaml(&[&honest.url, &liar.url], FAST_HEALTH));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let invalid =
        format!("infergate_worker_poll_failures_total{{pool=\"{POOL}\",reason=\"invalid_value\"}}");
    common::eventually(
        "the liar's polls rejected",
        Duration::from_secs(10),
        || async { (gw.metric(&invalid).await >= 2.0).then_some(()) },
    )
    .await;
    common::eventually(
        "the honest worker's series",
        Duration::from_secs(10),
        || async {
            let m = gw.metrics().await;
            m.contains(&format!(
                "infergate_worker_busy_seconds_total{{pool=\"{POOL}\",worker=\"{}\"}}",
                honest.url
            ))
            .then_some(m)
        },
    )
    .await;
    let metrics = gw.metrics().await;
    assert!(
        !metrics.contains(&format!("worker=\"{}\"}} NaN", liar.url)),
        "{metrics}"
    );
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("infergate_worker_batch_size") && l.contains(&liar.url)),
        "{metrics}"
    );
    assert_eq!(
        gw.metric(&format!(
            "infergate_worker_healthy{{pool=\"{POOL}\",worker=\"{}\"}}",
            liar.url
        ))
        .await,
        0.0,
        "a worker that keeps lying is ejected"
    );
    // Doctor reads the honest worker alone, and still names its symptom.
    let report = doctor(&gw.admin).await;
    assert_eq!(names(&report), ["small-batches"], "{report:#}");
}

#[tokio::test]
async fn an_engine_whose_host_work_stalls_its_steps_is_3_2_host_bound() {
    // 20 ms of host work before every step, against steps of a few ms on an H100 at 32
    // sequences of an 8B model: the accelerator idles most of the loop.
    let engine = Engine::start(&[
        "--gpu",
        "h100",
        "--max-num-seqs",
        "32",
        "--sim-host-us-per-step",
        "20000",
    ])
    .await;
    let dir = TempDir::new("doctor-host");
    dir.write_config(&config_yaml(&[&engine.url], FAST_HEALTH));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let _load = load(gw.at("/v1/chat/completions"), None, 64, 64);
    queue_builds_up(&gw, "a queue behind the slow loop").await;
    let report = doctor(&gw.admin).await;
    assert_eq!(names(&report), ["host-bound"], "{report:#}");
    let f = &report["findings"][0];
    assert!(
        f["confirming"]["host_share"].as_f64().unwrap() >= 0.5,
        "{report:#}"
    );
    assert!(
        f["confirming"]["busy_fraction"].as_f64().unwrap() < 0.5,
        "{report:#}"
    );
}

/// Waits (against a deadline) until 16 requests wait, in the engine or in the gateway's queue.
async fn queue_builds_up(gw: &Gateway, what: &str) {
    common::eventually(what, Duration::from_secs(20), || async {
        let waiting = gw
            .metric(&format!("infergate_worker_waiting{{pool=\"{POOL}\"}}"))
            .await;
        let queued = gw
            .metric(&format!("infergate_queue_depth{{pool=\"{POOL}\"}}"))
            .await;
        (waiting + queued >= 16.0).then_some(())
    })
    .await;
}
