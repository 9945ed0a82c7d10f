//! Precise mode fed by vLLM's KV events over ZMQ: `vllm_publisher.py` beside this file speaks
//! vLLM's documented format (multipart topic / 8-byte sequence / msgpack `KVEventBatch`; one
//! publisher with tagged arrays, the other with tagged maps) beside each of two engines that
//! have no events of their own. A prefix the publisher announces as stored on a worker draws
//! the request there; after `BlockRemoved` or `AllBlocksCleared` it no longer does; garbage and
//! oversize messages are refused and counted (the oversize one cuts the connection, which is
//! reopened) while the gateway keeps serving. The publisher
//! must start: a machine without pyzmq and msgpack fails here (tests/run.sh installs them).

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::gateway::{Gateway, MODEL, POOL, TempDir, config_yaml, routing_yaml, worker_of};
use common::process::{Kept, command, read_until, spawn};
use common::{Engine, eventually, post_json, random_text, settle};
use hyper::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// Token id of the special BOS token in the test vocabulary (ids below it are bytes).
const BOS: u64 = 256;
/// vLLM's block size in the announced events.
const BLOCK: usize = 16;
const TOPIC: &str = "kv";

/// A byte vocabulary in `tokenizer.json` form: id b < 256 is byte b, 256 a special BOS.
fn tokenizer_json() -> String {
    let vocab: Vec<String> = (0..256).map(|b| format!("\"<0x{b:02X}>\":{b}")).collect();
    format!(
        r#"{{"model":{{"type":"BPE","vocab":{{{}}}}},"added_tokens":[{{"id":{BOS},"content":"<s>","special":true}}]}}"#,
        vocab.join(",")
    )
}

/// A running `vllm_publisher.py`, killed on drop.
struct Publisher {
    port: u16,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    _child: Child,
    stderr: Kept,
}

impl Publisher {
    /// Starts it, with tagged-map events when `maps`, on `port` when given.
    async fn start(maps: bool, port: Option<u16>) -> Publisher {
        let script = Path::new(common::REPO).join("tests/e2e/gateway/vllm_publisher.py");
        let mut cmd = command("python3");
        cmd.arg(&script)
            .arg(TOPIC)
            .stdin(std::process::Stdio::piped());
        if maps {
            cmd.arg("--map");
        }
        if let Some(port) = port {
            cmd.arg("--port").arg(port.to_string());
        }
        let (mut child, stderr, mut stdout) = spawn(&mut cmd);
        let deadline = Instant::now() + Duration::from_secs(20);
        let port = read_until(&mut stdout, deadline, |l| {
            l.strip_prefix("port ")?.parse::<u16>().ok()
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the vLLM-format publisher did not start ({e}): {}\nit needs pyzmq and msgpack: \
                 run tests/run.sh, or pip install pyzmq==27.2.0 msgpack==1.1.2",
                stderr.lock().unwrap()
            )
        });
        let stdin = child.stdin.take().expect("piped stdin");
        Publisher {
            port,
            stdin,
            stdout,
            _child: child,
            stderr,
        }
    }

    /// Sends one command and waits for the publisher to say it went out.
    async fn send(&mut self, cmd: Value) {
        let line = format!("{cmd}\n");
        self.stdin.write_all(line.as_bytes()).await.expect("write");
        self.stdin.flush().await.expect("flush");
        let deadline = Instant::now() + Duration::from_secs(10);
        read_until(&mut self.stdout, deadline, |l| {
            l.starts_with("sent ").then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("publisher: {e}: {}", self.stderr.lock().unwrap()));
    }

    async fn events(&mut self, events: Value) {
        self.send(json!({ "events": events })).await;
    }
}

/// `BlockStored` events for `prompt` as vLLM would send them: BOS then its bytes as tokens,
/// full blocks only, hashes `base + i`.
fn stored(prompt: &str, base: u64) -> Value {
    let mut tokens = vec![BOS];
    tokens.extend(prompt.bytes().map(u64::from));
    tokens.truncate(tokens.len() / BLOCK * BLOCK);
    let blocks = tokens.len() / BLOCK;
    // Two events, the second chained on the first (as chunked prefill sends them).
    let half = blocks / 2;
    let event = |from: usize, to: usize| {
        let hashes: Vec<u64> = (from..to).map(|i| base + i as u64).collect();
        let parent = if from == 0 {
            Value::Null
        } else {
            json!(base + from as u64 - 1)
        };
        json!([
            "BlockStored",
            hashes,
            parent,
            tokens[from * BLOCK..to * BLOCK],
            BLOCK,
            null,
            "GPU"
        ])
    };
    json!([event(0, half), event(half, blocks)])
}

fn removed(prompt: &str, base: u64) -> Value {
    let blocks = (prompt.len() + 1) / BLOCK;
    let hashes: Vec<u64> = (0..blocks).map(|i| base + i as u64).rev().collect();
    json!([["BlockRemoved", hashes, "GPU"]])
}

fn completion(prompt: &str) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": 2, "ignore_eos": true})
}

/// A completion through the gateway: the worker that served it.
async fn ask(gw: &Gateway, prompt: &str) -> String {
    let (status, headers, res) = post_json(&gw.at("/v1/completions"), &completion(prompt)).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    worker_of(&headers)
}

/// The same completion straight to an engine, so it really holds the prompt.
async fn warm(engine: &str, prompt: &str) {
    let (status, _, res) =
        post_json(&format!("{engine}/v1/completions"), &completion(prompt)).await;
    assert_eq!(status, StatusCode::OK, "{res}");
}

const BATCHES: &str = "infergate_routing_vllm_kv_batches_total{pool=\"p\"}";

fn rejected(reason: &str) -> String {
    format!("infergate_routing_vllm_kv_rejected_total{{pool=\"{POOL}\",reason=\"{reason}\"}}")
}

/// A gateway over `engine` whose KV events come from `tcp://127.0.0.1:port`.
async fn gateway_with_events(dir: &TempDir, engine: &str, port: u16) -> Gateway {
    dir.write("tokenizer.json", &tokenizer_json());
    let mut config = config_yaml(&[engine], "");
    config.push_str(&format!(
        "    kv_events:\n      zmq: \"tcp://{{host}}:{port}\"\n      topic: {TOPIC}\n      tokenizer: tokenizer.json\n"
    ));
    dir.write_config(&config);
    dir.write_routing(&routing_yaml("prefix", &[]));
    Gateway::start(&dir.config(), &[]).await
}

/// A gateway over two workers, each with its own publisher on `ports`, the pool's `kv_events`
/// given `vocab` (its tokenizer and template lines); returns once both streams are live.
async fn gateway_per_worker(dir: &TempDir, urls: &[&str], ports: [u16; 2], vocab: &str) -> Gateway {
    let mut config = config_yaml(urls, "");
    config.push_str(&format!(
        "    kv_events:\n      topic: {TOPIC}\n      {vocab}\n      endpoints:\n\
         \x20       \"{}\": \"tcp://127.0.0.1:{}\"\n        \"{}\": \"tcp://127.0.0.1:{}\"\n",
        urls[0], ports[0], urls[1], ports[1]
    ));
    dir.write_config(&config);
    dir.write_routing(&routing_yaml("prefix", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    for url in urls {
        eventually("vLLM KV events live", Duration::from_secs(10), || async {
            (live(&gw, url).await == 1.0).then_some(())
        })
        .await;
    }
    gw
}

async fn live(gw: &Gateway, worker: &str) -> f64 {
    gw.metric(&format!(
        "infergate_routing_kv_events_live{{pool=\"{POOL}\",worker=\"{worker}\"}}"
    ))
    .await
}

/// Publishes `events` and waits until the gateway has applied them.
async fn publish(gw: &Gateway, p: &mut Publisher, events: Value) {
    let before = gw.metric(BATCHES).await;
    p.events(events).await;
    gw.wait_metric(BATCHES, |v| v > before).await;
}

/// Waits for the subscription to reach the publisher (ZMQ drops what a PUB socket sends before
/// the subscription arrives), publishing empty batches until one is applied.
async fn joined(gw: &Gateway, p: &mut Publisher) {
    let before = gw.metric(BATCHES).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        p.events(json!([])).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        if gw.metric(BATCHES).await > before {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no batch of the publisher applied within 10 s: {}",
            gw.stderr()
        );
    }
}

#[tokio::test]
async fn vllm_kv_events_over_zmq_feed_the_precise_index() {
    let started = Instant::now();
    let args: &[&str] = &["--gpu", "h100", "--no-kv-events"];
    let engines = [Engine::start(args).await, Engine::start(args).await];
    let mut pubs = [
        Publisher::start(false, None).await,
        Publisher::start(true, None).await,
    ];
    let dir = TempDir::new("vllm-zmq");
    dir.write("tokenizer.json", &tokenizer_json());
    let urls: Vec<&str> = engines.iter().map(|e| e.url.as_str()).collect();
    let ports = [pubs[0].port, pubs[1].port];
    let gw = gateway_per_worker(&dir, &urls, ports, "tokenizer: tokenizer.json").await;
    for p in &mut pubs {
        joined(&gw, p).await;
    }
    let index = |url: &str| urls.iter().position(|u| *u == url).expect("a known worker");

    // A cold prompt goes to its hash home, which the gateway then guesses holds it. That
    // worker's cache is reset (AllBlocksCleared), the other one really computes the prompt
    // (straight to its engine) and announces it (BlockStored): the prompt goes there. Once
    // removed from it (BlockRemoved), nobody holds it and it is cold again, at its hash home.
    for (seed, base) in [(71, 1000), (72, 5000)] {
        let prompt = random_text(2048, seed);
        let home = ask(&gw, &prompt).await;
        let h = index(&home);
        publish(&gw, &mut pubs[h], json!([["AllBlocksCleared"]])).await;
        let other = urls[1 - h].to_string();
        warm(&other, &prompt).await;
        publish(&gw, &mut pubs[1 - h], stored(&prompt, base)).await;
        assert_eq!(
            ask(&gw, &prompt).await,
            other,
            "announced as stored on {other}"
        );
        publish(&gw, &mut pubs[1 - h], removed(&prompt, base)).await;
        assert_eq!(
            ask(&gw, &prompt).await,
            home,
            "removed from {other}: cold again, to its hash home"
        );
    }

    // Garbage and an oversize message are refused and counted; the gateway keeps serving, and
    // the next good batch makes the worker precise again.
    pubs[0].send(json!({"raw": "c1c1c1"})).await;
    gw.wait_metric(&rejected("malformed"), |v| v >= 1.0).await;
    pubs[0].send(json!({"raw": "93010203"})).await;
    gw.wait_metric(&rejected("schema"), |v| v >= 1.0).await;
    pubs[0].send(json!({"oversize": 5 << 20})).await;
    gw.wait_metric(&rejected("oversize"), |v| v >= 1.0).await;
    eventually(
        "approximate after garbage",
        Duration::from_secs(5),
        || async { (live(&gw, urls[0]).await == 0.0).then_some(()) },
    )
    .await;
    ask(&gw, &random_text(1024, 73)).await;
    // The oversize message cut the connection: it is reopened, and then a good batch counts.
    joined(&gw, &mut pubs[0]).await;
    eventually("precise again", Duration::from_secs(5), || async {
        (live(&gw, urls[0]).await == 1.0).then_some(())
    })
    .await;
    // The cut message (at least) never arrived: the sequence gap after the reconnection says so.
    let missed = gw
        .metric(&format!(
            "infergate_routing_vllm_kv_missed_total{{pool=\"{POOL}\"}}"
        ))
        .await;
    assert!(missed >= 1.0, "{missed} batches counted missed");
    eprintln!("vLLM KV events test: {:?}", started.elapsed());
}

#[tokio::test]
async fn an_absent_publisher_keeps_the_approximate_index_until_it_comes() {
    let engine = Engine::start(&["--gpu", "h100", "--no-kv-events"]).await;
    // A port nobody listens on (yet).
    let port = free_port();
    let dir = TempDir::new("vllm-zmq-absent");
    let gw = gateway_with_events(&dir, &engine.url, port).await;
    // Several polls, so subscriptions were tried and failed: approximate, and serving.
    let polls = format!(
        "infergate_worker_polls_total{{pool=\"{POOL}\",worker=\"{}\"}}",
        engine.url
    );
    gw.wait_metric(&polls, |v| v >= 4.0).await;
    assert_eq!(live(&gw, &engine.url).await, 0.0);
    assert_eq!(ask(&gw, &random_text(1024, 81)).await, engine.url);
    // The publisher comes: the subscription is reopened (with backoff) and goes live.
    let mut publisher = Publisher::start(false, Some(port)).await;
    eventually("vLLM KV events live", Duration::from_secs(10), || async {
        (live(&gw, &engine.url).await == 1.0).then_some(())
    })
    .await;
    joined(&gw, &mut publisher).await;
}

/// A free loopback port (bound, then released) for an engine's `--kv-events-zmq`.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn chat(system: &str, question: &str) -> Value {
    json!({"model": MODEL, "max_tokens": 2, "ignore_eos": true, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": question}]})
}

/// Sends `body` straight to `engine`'s chat endpoint (so only that worker caches it) and waits
/// until the gateway has applied a KV-event batch published after it was sent.
async fn warm_chat(gw: &Gateway, engine: &str, body: &Value) {
    let before = gw.metric(BATCHES).await;
    let (status, _, res) = post_json(&format!("{engine}/v1/chat/completions"), body).await;
    assert_eq!(status, StatusCode::OK, "{res}");
    gw.wait_metric(BATCHES, |v| v > before).await;
}

#[tokio::test]
async fn our_engine_in_vllm_format_feeds_precise_chat_routing() {
    // Two engines without their own events, each publishing vLLM's ZMQ events; the gateway
    // reads them with the built-in cl100k vocabulary and hashes chat prompts as ChatML, as the
    // engines' default template writes them.
    let ports = [free_port(), free_port()];
    let mut engines = Vec::new();
    for port in ports {
        let endpoint = format!("tcp://127.0.0.1:{port}");
        let args = [
            "--gpu",
            "h100",
            "--no-kv-events",
            "--kv-events-zmq",
            endpoint.as_str(),
            "--kv-events-topic",
            TOPIC,
        ];
        engines.push(Engine::start(&args).await);
    }
    let urls: Vec<&str> = engines.iter().map(|e| e.url.as_str()).collect();
    let dir = TempDir::new("vllm-zmq-engine");
    let vocab = "tokenizer: builtin:cl100k\n      chat_template: chatml";
    let gw = gateway_per_worker(&dir, &urls, ports, vocab).await;
    // ZMQ drops what is published before a subscription arrives: warm each engine with
    // throwaway chats until one of its batches is applied.
    for (i, url) in urls.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut n = 0;
        loop {
            let before = gw.metric(BATCHES).await;
            let body = chat(&random_text(600, 900 + i as u64 * 100 + n), "join");
            let (status, _, res) = post_json(&format!("{url}/v1/chat/completions"), &body).await;
            assert_eq!(status, StatusCode::OK, "{res}");
            let every = Duration::from_millis(20);
            let read = || gw.metric(BATCHES);
            if settle(Duration::from_millis(500), every, read, |&v| v > before).await > before {
                break;
            }
            n += 1;
            assert!(
                Instant::now() < deadline,
                "no batch applied: {}",
                gw.stderr()
            );
        }
    }

    // Each system prompt is cached on one engine only, by a request straight to it; the same
    // conversation opening with another question, through the gateway, goes to that engine,
    // which routing predicted to hold about the system prompt's tokens.
    for round in 0..6u64 {
        let holder = urls[(round % 2) as usize];
        let system = random_text(3000, 500 + round);
        warm_chat(&gw, holder, &chat(&system, "What is first?")).await;
        let (status, headers, res) = post_json(
            &gw.at("/v1/chat/completions"),
            &chat(&system, "And what comes next?"),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{res}");
        assert_eq!(worker_of(&headers), holder, "round {round}: the holder");
        let cached = headers
            .get("x-infergate-route-cached")
            .and_then(|v| v.to_str().ok())
            .and_then(infergate_cli::bench::parse_route_cached);
        let predicted = cached.map_or(0, |(predicted, _)| predicted);
        assert!(predicted >= 300, "round {round}: predicted {cached:?}");
        // The engine itself reports the prefix as cached.
        let usage_cached = res["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        assert!(usage_cached >= 300, "round {round}: engine cached {res}");
    }
    assert_eq!(gw.metric(&rejected("vocab")).await, 0.0);
}
