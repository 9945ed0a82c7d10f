//! The OTLP export end to end, against a real OTLP/HTTP receiver: `otlp_receiver.py` beside this
//! file parses every export with the `opentelemetry-proto` package's schema (it answers 400 to
//! what the schema rejects) and writes each span it took as a JSON line. A sim engine and a
//! worker that answers 503 stand behind the gateway (round robin), so some requests are retried:
//! each request must arrive as a SERVER span with GenAI attribute names and the engine's record,
//! with a CLIENT span per attempt as its children, a client's `traceparent` joined, and a 429
//! from the receiver retried after its `Retry-After`. A receiver that hangs, or none at all,
//! must not slow a request down: spans are dropped or failed, and counted. The receiver must
//! start: a machine without `opentelemetry-proto` fails here (tests/run.sh installs it).

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::gateway::{Gateway, MODEL, POOL, TempDir, chat, config_yaml, routing_yaml, send};
use common::process::{Kept, command, read_until, spawn};
use common::rogue::{IDLE_VLLM_METRICS, Rogue, RogueRequest, Step, answer};
use common::{Engine, eventually, stream_with};
use hyper::{Method, StatusCode};
use serde_json::Value;
use tokio::io::BufReader;
use tokio::process::{Child, ChildStdout};

/// The client's trace context in the first request.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";

/// A running `otlp_receiver.py`, killed on drop.
struct Receiver {
    /// `http://127.0.0.1:PORT/v1/traces`.
    url: String,
    out: PathBuf,
    _child: Child,
    _stdout: BufReader<ChildStdout>,
    _stderr: Kept,
}

impl Receiver {
    /// Starts the receiver in `mode` (`ok`, `busy-once`, `hang`), writing into `dir`; fails the
    /// test when it does not start.
    async fn start(dir: &Path, mode: &str) -> Receiver {
        let out = dir.join(format!("otlp-{mode}.jsonl"));
        let script = Path::new(common::REPO).join("tests/e2e/gateway/otlp_receiver.py");
        let mut cmd = command("python3");
        cmd.arg(&script).arg(&out).arg(mode);
        let (child, stderr, mut stdout) = spawn(&mut cmd);
        let deadline = Instant::now() + Duration::from_secs(20);
        let port = read_until(&mut stdout, deadline, |l| {
            l.strip_prefix("listening ")?.parse::<u16>().ok()
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the OTLP receiver did not start ({e}): {}\nit needs the opentelemetry-proto \
                 package: run tests/run.sh, or pip install opentelemetry-proto==1.45.2 \
                 protobuf==7.36.2",
                stderr.lock().unwrap()
            )
        });
        Receiver {
            url: format!("http://127.0.0.1:{port}/v1/traces"),
            out,
            _child: child,
            _stdout: stdout,
            _stderr: stderr,
        }
    }

    /// Every line it wrote: spans, and `{"refused"}` / `{"rejected"}` notes.
    fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {l:?}: {e}")))
            .collect()
    }

    fn spans(&self) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|l| l.get("spanId").is_some())
            .collect()
    }
}

/// A config over `workers` exporting to `endpoint` with `settings` (YAML flow members).
fn config(workers: &[&str], endpoint: &str, settings: &str) -> String {
    config_yaml(
        workers,
        &format!("trace:\n  otlp: {{endpoint: \"{endpoint}\", {settings}}}\n"),
    )
}

/// A worker that is busy for every generation request (healthy to the poller).
fn busy(req: &RogueRequest) -> Vec<Step> {
    if req.method == "GET" {
        return answer(200, "text/plain", IDLE_VLLM_METRICS);
    }
    answer(503, "application/json", r#"{"error":{"message":"busy"}}"#)
}

async fn whole(url: &str, id: &str, tokens: u64, extra: &[(&str, &str)]) -> Duration {
    let body = chat("Be brief.", "Say something.", tokens, false).to_string();
    let mut headers = vec![("x-request-id", id)];
    headers.extend_from_slice(extra);
    let began = Instant::now();
    let (status, _, text) = send(Method::POST, url, &headers, Some(body))
        .await
        .expect("answer");
    assert_eq!(status, StatusCode::OK, "{text}");
    began.elapsed()
}

/// The attribute `key` of a received span.
fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

fn port_of(url: &str) -> u64 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn each_request_is_a_server_span_with_a_client_span_per_attempt_at_a_real_receiver() {
    let dir = TempDir::new("otlp");
    let (receiver, engine) = tokio::join!(
        Receiver::start(&dir.path, "busy-once"),
        Engine::start(&["--gpu", "l4"])
    );
    let rogue = Rogue::start(busy).await;
    let urls = [rogue.url.as_str(), engine.url.as_str()];
    dir.write_config(&config(
        &urls,
        &receiver.url,
        "headers: {X-Test-Key: k1}, batch: 4, batch_delay: 50ms",
    ));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let url = gw.at("/v1/chat/completions");

    let traceparent = format!("00-{TRACE_ID}-{PARENT_SPAN}-01");
    whole(&url, "otlp-0", 4, &[("traceparent", traceparent.as_str())]).await;
    let s = stream_with(
        &url,
        &[("x-request-id", "otlp-1")],
        &chat("Be brief.", "Say more.", 5, true),
    )
    .await;
    assert_eq!(s.status, StatusCode::OK);
    whole(&url, "otlp-2", 3, &[]).await;
    whole(&url, "otlp-3", 2, &[]).await;
    let tokens = [4, 5, 3, 2];

    let ids = ["otlp-0", "otlp-1", "otlp-2", "otlp-3"];
    let servers = eventually(
        "a server span per request",
        Duration::from_secs(10),
        || async {
            let spans = receiver.spans();
            ids.iter()
                .map(|id| {
                    spans
                        .iter()
                        .find(|s| s["kind"] == 2 && attr(s, "infergate.request_id") == *id)
                        .cloned()
                })
                .collect::<Option<Vec<_>>>()
        },
    )
    .await;
    let spans = receiver.spans();
    let lines = receiver.lines();
    assert!(
        !lines.iter().any(|l| l.get("rejected").is_some()),
        "the schema rejected an export: {lines:#?}"
    );
    assert_eq!(
        lines.first().map(|l| l["refused"].clone()),
        Some(Value::from(429)),
        "the first export was refused once and retried"
    );

    let mut retried = 0;
    for (server, tokens) in servers.iter().zip(tokens) {
        assert_eq!(server["name"], format!("chat {MODEL}"), "{server:#}");
        assert_eq!(server["resource"]["service.name"], "infergate");
        assert_eq!(
            server["headers"]["x-test-key"], "k1",
            "configured headers sent"
        );
        assert_eq!(attr(server, "gen_ai.operation.name"), "chat");
        assert_eq!(attr(server, "gen_ai.request.model"), MODEL);
        assert_eq!(attr(server, "gen_ai.response.model"), MODEL);
        assert_eq!(attr(server, "gen_ai.request.max_tokens"), tokens);
        assert_eq!(attr(server, "gen_ai.usage.output_tokens"), tokens);
        assert!(attr(server, "gen_ai.usage.input_tokens").as_i64().unwrap() > 0);
        assert_eq!(attr(server, "http.response.status_code"), 200);
        assert_eq!(attr(server, "infergate.pool"), POOL);
        assert!(
            !attr(server, "infergate.tenant")
                .as_str()
                .unwrap()
                .is_empty()
        );
        assert_eq!(attr(server, "infergate.worker"), engine.url.as_str());
        assert_eq!(attr(server, "infergate.flight"), "ok");
        assert_eq!(attr(server, "infergate.engine.backend"), "sim");
        let (graph, eager) = (
            attr(server, "infergate.exec.graph_steps").as_i64().unwrap(),
            attr(server, "infergate.exec.eager_steps").as_i64().unwrap(),
        );
        assert_eq!(
            graph + eager,
            tokens as i64,
            "one step per token: {server:#}"
        );
        assert!(
            ["graph", "eager", "mixed"]
                .contains(&attr(server, "infergate.exec.path").as_str().unwrap())
        );
        assert!(attr(server, "infergate.batch.max").as_i64().unwrap() >= 1);
        assert!(server["end"].as_u64().unwrap() > server["start"].as_u64().unwrap());
        assert!(server.get("status").is_none_or(|s| s["code"] == 0));

        let mut children: Vec<&Value> = spans
            .iter()
            .filter(|s| s["parentSpanId"] == server["spanId"])
            .collect();
        children.sort_by_key(|c| attr(c, "infergate.attempt").as_i64());
        let last = children.last().expect("a client span per attempt");
        for c in &children {
            assert_eq!(c["kind"], 3, "{c:#}");
            assert_eq!(c["traceId"], server["traceId"]);
            assert_eq!(c["name"], server["name"]);
            // Within the request's span (to the microsecond the line keeps).
            let (start, end) = (c["start"].as_u64().unwrap(), c["end"].as_u64().unwrap());
            assert!(start >= server["start"].as_u64().unwrap(), "{c:#}");
            assert!(end <= server["end"].as_u64().unwrap() + 1_000, "{c:#}");
            assert_eq!(attr(c, "server.address"), "127.0.0.1");
        }
        for c in &children[..children.len() - 1] {
            retried += 1;
            assert_eq!(attr(c, "infergate.retried"), true);
            assert_eq!(attr(c, "error.type"), "status_503");
            assert_eq!(attr(c, "http.response.status_code"), 503);
            assert_eq!(attr(c, "server.port"), port_of(&rogue.url));
            assert_eq!(c["status"]["code"], 2, "an error span");
        }
        assert_eq!(attr(last, "infergate.retried"), false);
        assert_eq!(attr(last, "http.response.status_code"), 200);
        assert_eq!(attr(last, "server.port"), port_of(&engine.url));
    }
    assert!(
        retried >= 1,
        "round robin sent some request to the busy worker first"
    );

    // The client's trace context: the first request joined it, the others began their own.
    assert_eq!(servers[0]["traceId"], TRACE_ID);
    assert_eq!(servers[0]["parentSpanId"], PARENT_SPAN);
    for s in &servers[1..] {
        assert_eq!(s["parentSpanId"], "", "a root span");
        assert_ne!(s["traceId"], TRACE_ID);
    }
    assert_ne!(servers[1]["traceId"], servers[2]["traceId"]);

    let exported = gw
        .wait_metric("infergate_otlp_spans_total{result=\"exported\"}", |v| {
            v >= spans.len() as f64
        })
        .await;
    assert_eq!(exported, receiver.spans().len() as f64);
    assert_eq!(
        gw.metric("infergate_otlp_spans_total{result=\"failed\"}")
            .await,
        0.0
    );
    assert_eq!(
        gw.metric("infergate_otlp_spans_total{result=\"dropped\"}")
            .await,
        0.0
    );
}

#[tokio::test]
async fn a_hung_or_missing_receiver_never_slows_a_request() {
    let dir = TempDir::new("otlp-hang");
    let (hung, engine) = tokio::join!(
        Receiver::start(&dir.path, "hang"),
        Engine::start(&["--gpu", "l4"])
    );
    // A collector that is down: a port bound, then freed.
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}/v1/traces", l.local_addr().expect("address"))
    };
    // Each export may take 5 s: a request that waited for one would show it.
    let settings = "timeout: 5s, max_queue: 2, batch: 1, batch_delay: 10ms";
    dir.write_config(&config(&[engine.url.as_str()], &hung.url, settings));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let down_dir = TempDir::new("otlp-down");
    down_dir.write_config(&config(&[engine.url.as_str()], &down, settings));
    down_dir.write_routing(&routing_yaml("round_robin", &[]));
    let (config_hung, config_down) = (dir.config(), down_dir.config());
    let (gw, gw_down) = tokio::join!(
        Gateway::start(&config_hung, &[]),
        Gateway::start(&config_down, &[])
    );

    let n = 8;
    let mut slowest = Duration::ZERO;
    let (hung_url, down_url) = (
        gw.at("/v1/chat/completions"),
        gw_down.at("/v1/chat/completions"),
    );
    for i in 0..n {
        let (hung_id, down_id) = (format!("hang-{i}"), format!("down-{i}"));
        let (a, b) = tokio::join!(
            whole(&hung_url, &hung_id, 2, &[]),
            whole(&down_url, &down_id, 2, &[])
        );
        slowest = slowest.max(a).max(b);
    }
    assert!(
        slowest < Duration::from_secs(2),
        "a request waited on the exporter: {slowest:?}"
    );
    // The hung receiver holds one export; two more records wait; the rest are dropped (a
    // server and a client span each).
    let dropped = gw
        .wait_metric("infergate_otlp_spans_total{result=\"dropped\"}", |v| {
            v >= 2.0 * (n - 3) as f64
        })
        .await;
    assert!(dropped <= 2.0 * n as f64, "{dropped}");
    assert_eq!(
        gw.metric("infergate_otlp_spans_total{result=\"exported\"}")
            .await,
        0.0
    );
    assert!(hung.spans().is_empty());
    // The missing one refuses each connection at once: every span failed, none exported.
    let failed = gw_down
        .wait_metric("infergate_otlp_spans_total{result=\"failed\"}", |v| {
            v >= 2.0
        })
        .await;
    assert!(failed >= 2.0);
    assert_eq!(
        gw_down
            .metric("infergate_otlp_spans_total{result=\"exported\"}")
            .await,
        0.0
    );
}
