//! Issue 44's done-when, live: `infergate up --config config/scenarios/NAME/infergate.yaml` (the
//! shipped file, listeners moved to free ports), loaded by `infergate bench --workload NAME` as
//! its own process, and `infergate doctor --admin URL --json` over a window of it names that
//! scenario's symptom (for 3.2 the right mechanism) and nothing else; `up`'s embedded config under
//! the `chat` workload names nothing.
//!
//! Each test waits (against a deadline) until its load has built up the way its scenario needs
//! (a grown batch, a queue, or requests answered), then gives doctor a window of a few seconds:
//! about 15-20 s a scenario. They take the whole machine: the sim engines run in real time, and a
//! busy neighbour would stretch their steps.

use crate::common;
use crate::tools_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::gateway::{Gateway, TempDir};
use serde_json::Value;
use tools_support::infergate;

/// The names doctor gives the symptoms (the scenarios' names).
const NAMES: [&str; 6] = [
    "tpot-at-peak",
    "host-bound",
    "small-batches",
    "long-context",
    "itl-freeze",
    "shared-system-prompt",
];

/// The pool every scenario (and the embedded config) serves its model from.
const POOL: &str = "local";

/// When the load has built up enough for doctor's window to open.
enum Ready {
    /// The first worker runs this many sequences (a peak's batch has grown).
    Running(f64),
    /// This many requests wait, in the first worker's engine and the gateway's admission queue
    /// together (a queue has formed).
    Queued(f64),
    /// The gateway has answered this many requests (traffic flows end to end).
    Answered(f64),
}

/// One live run: which config `up` serves, which workload loads it, and doctor's window.
struct Live {
    /// `config/scenarios/NAME/infergate.yaml`; `None`: `up`'s embedded config.
    scenario: Option<&'static str>,
    /// `config/workloads/NAME.yaml`.
    workload: &'static str,
    /// The model the config serves.
    model: &'static str,
    ready: Ready,
    /// Doctor's `--window`.
    window: &'static str,
}

fn root() -> PathBuf {
    PathBuf::from(crate::common::REPO)
}

/// Serves `live`, loads it, and returns doctor's JSON report over the window.
async fn doctor_on(live: Live) -> Value {
    let _machine = common::machine::whole_machine().await;
    let started = Instant::now();
    let dir = TempDir::new("doctor-scenario");
    // `up` keeps a usage ledger in its cache directory: a fresh one, so the scenario's prices
    // never meet another run's.
    let cache = dir.path.join("cache").to_string_lossy().into_owned();
    let config = live
        .scenario
        .map(|n| root().join(format!("config/scenarios/{n}/infergate.yaml")));
    let gw = Gateway::up_with(
        config.as_deref(),
        &[("INFERGATE_CACHE_DIR", cache.as_str())],
    )
    .await;
    let workload = root().join(format!("config/workloads/{}.yaml", live.workload));
    let out = dir.path.join("bench.json");
    let mut cmd = common::process::infergate();
    cmd.arg("bench")
        .args(["--url", gw.url.as_str(), "--model", live.model])
        .arg("--workload")
        .arg(&workload)
        .arg("--out")
        .arg(&out)
        // Longer than any test needs: the process is killed when the test ends.
        .args(["--duration", "120s"]);
    if let Some(key) = &gw.api_key {
        cmd.args(["--api-key", key.as_str()]);
    }
    let (mut bench, bench_err, _stdout) = common::process::spawn(&mut cmd);
    let (what, selectors, want) = match live.ready {
        Ready::Running(n) => (
            "the batch grown",
            vec![format!("infergate_worker_running{{pool=\"{POOL}\"}}")],
            n,
        ),
        Ready::Queued(n) => (
            "a queue",
            vec![
                format!("infergate_worker_waiting{{pool=\"{POOL}\"}}"),
                format!("infergate_queue_depth{{pool=\"{POOL}\"}}"),
            ],
            n,
        ),
        Ready::Answered(n) => (
            "requests answered",
            vec!["infergate_requests_total{status=\"200\"}".to_string()],
            n,
        ),
    };
    // Polled against a deadline, the bench checked at each poll so a load that died says why.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = bench.try_wait() {
            panic!(
                "infergate bench exited ({status}):\n{}",
                bench_err.lock().unwrap()
            );
        }
        let metrics = gw.metrics().await;
        let have: f64 = selectors
            .iter()
            .map(|sel| common::find_metric(&metrics, sel).unwrap_or(0.0))
            .sum();
        if have >= want {
            break;
        }
        assert!(Instant::now() < deadline, "{what}: not within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let args = [
        "doctor",
        "--admin",
        gw.admin.as_str(),
        "--window",
        live.window,
        "--json",
    ];
    let run = infergate(&args, Duration::from_secs(60)).await;
    let text = run.ok("infergate doctor");
    let report: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("doctor printed no JSON ({e}):\n{text}"));
    eprintln!(
        "{}: doctor named {:?} after {:.1} s",
        live.scenario.unwrap_or("chat on up"),
        names(&report),
        started.elapsed().as_secs_f64()
    );
    report
}

fn names(report: &Value) -> Vec<String> {
    report["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no findings list in {report:#}"))
        .iter()
        .map(|f| f["name"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Doctor named `name` (symptom `symptom`) first and none of the other symptoms; its finding.
fn named_alone<'a>(report: &'a Value, name: &str, symptom: &str) -> &'a Value {
    let named = names(report);
    assert_eq!(named.first().map(String::as_str), Some(name), "{report:#}");
    for other in NAMES.iter().filter(|n| **n != name) {
        assert!(!named.iter().any(|n| n == other), "{other} too: {report:#}");
    }
    let f = &report["findings"][0];
    assert_eq!(f["symptom"], symptom, "{report:#}");
    f
}

/// A confirming value of finding `f`.
fn confirming(f: &Value, key: &str) -> f64 {
    f["confirming"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("no confirming {key} in {f:#}"))
}

#[tokio::test]
async fn doctor_names_tpot_at_peak_on_its_scenario() {
    let report = doctor_on(Live {
        scenario: Some("tpot-at-peak"),
        workload: "tpot-at-peak",
        model: "llama-3-8b",
        ready: Ready::Running(96.0),
        window: "8s",
    })
    .await;
    let f = named_alone(&report, "tpot-at-peak", "3.1");
    assert!(confirming(f, "tpot_p95_s") >= 0.02, "{f:#}");
    assert!(confirming(f, "busy_fraction") >= 0.7, "{f:#}");
}

#[tokio::test]
async fn doctor_names_3_2_host_bound_on_its_scenario() {
    let report = doctor_on(Live {
        scenario: Some("host-bound"),
        workload: "host-bound",
        model: "llama-3-8b",
        ready: Ready::Queued(16.0),
        window: "5s",
    })
    .await;
    let f = named_alone(&report, "host-bound", "3.2");
    let mechanism = f["mechanism"].as_str().unwrap_or("");
    assert!(mechanism.starts_with("host-bound"), "{f:#}");
    assert!(confirming(f, "host_share") >= 0.3, "{f:#}");
    assert!(confirming(f, "busy_fraction") < 0.7, "{f:#}");
}

#[tokio::test]
async fn doctor_names_3_2_small_batches_on_its_scenario() {
    let report = doctor_on(Live {
        scenario: Some("small-batches"),
        workload: "small-batches",
        model: "qwen2.5-0.5b",
        ready: Ready::Queued(16.0),
        window: "5s",
    })
    .await;
    let f = named_alone(&report, "small-batches", "3.2");
    let mechanism = f["mechanism"].as_str().unwrap_or("");
    assert!(mechanism.starts_with("small batches"), "{f:#}");
    assert_eq!(confirming(f, "max_num_seqs"), 4.0, "{f:#}");
    assert!(confirming(f, "batch_size_mean") >= 3.6, "{f:#}");
}

#[tokio::test]
async fn doctor_names_long_context_on_its_scenario() {
    let report = doctor_on(Live {
        scenario: Some("long-context"),
        workload: "long-context",
        model: "mistral-7b",
        ready: Ready::Answered(20.0),
        window: "12s",
    })
    .await;
    let f = named_alone(&report, "long-context", "3.3");
    assert!(confirming(f, "preemptions") >= 1.0, "{f:#}");
}

#[tokio::test]
async fn doctor_names_itl_freeze_on_its_scenario() {
    let report = doctor_on(Live {
        scenario: Some("itl-freeze"),
        workload: "itl-freeze",
        model: "mistral-7b",
        ready: Ready::Answered(10.0),
        // The workload's first 30k-token prompts arrive 9.4-12.2 s into the run (seed 11) and
        // each freezes its worker for about 2.5 s: the window must reach well past 12 s + 2.5 s
        // plus a metrics poll, whenever the tenth answer opened it.
        window: "20s",
    })
    .await;
    let f = named_alone(&report, "itl-freeze", "3.4");
    assert!(confirming(f, "itl_max_s") >= 0.5, "{f:#}");
    assert!(confirming(f, "tpot_mean_s") < 0.02, "{f:#}");
}

#[tokio::test]
async fn doctor_names_shared_system_prompt_on_its_scenario() {
    let report = doctor_on(Live {
        scenario: Some("shared-system-prompt"),
        workload: "shared-system-prompt",
        model: "llama-3-8b",
        ready: Ready::Answered(20.0),
        window: "6s",
    })
    .await;
    let f = named_alone(&report, "shared-system-prompt", "3.5");
    assert!(confirming(f, "cached_share") < 0.3, "{f:#}");
    // The scenario's prices priced the window.
    assert!(confirming(f, "cost_usd_per_1k_tokens") > 0.0, "{f:#}");
}

#[tokio::test]
async fn doctor_names_nothing_on_the_chat_workload_on_up() {
    let report = doctor_on(Live {
        scenario: None,
        workload: "chat",
        model: "llama-3-8b",
        ready: Ready::Answered(5.0),
        window: "6s",
    })
    .await;
    assert_eq!(names(&report), Vec::<String>::new(), "{report:#}");
    // It saw the traffic: "nothing" is a judgement, not an empty window.
    let s = &report["snapshot"];
    assert!(s["requests"].as_f64().unwrap_or(0.0) >= 10.0, "{s:#}");
    assert!(s["busy_fraction"].as_f64().is_some(), "{s:#}");
    assert_eq!(report["missing"], Value::Array(vec![]), "{report:#}");
}
