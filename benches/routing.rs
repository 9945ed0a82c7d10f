//! Routing policies compared on seeded workloads: 4 sim engine workers (H100, Llama-3-8B) behind
//! one `infergate gateway`, once per policy (`prefix`, `round_robin`, `least_load`, and an oracle
//! that hashes each request's group), workers and gateway fresh for each so every policy starts
//! with cold caches. Groups of sessions share long system prompts. Scenarios: KV room and
//! evictions (open-loop Poisson arrivals, Zipf group popularity; in evictions the four caches
//! together hold ~10 of the 16 prompts), overflow (the same with caches of ~5 prompts each and
//! plain LRU eviction, as vLLM's: all 16 fit only when spread by the caches' room), saturated (a closed loop of 32 clients against small KV
//! caches, every worker's KV nearly full), hot prefix (60% of a closed loop on one group), and two
//! gateway replicas in front of the same workers. `prefix` runs in precise mode (our engines' KV
//! events) and as `prefix_approx` with the events off. Measured: the engines' prefix-cache hit
//! rate, req/s, client-side TTFT, requests per worker, peak running, KV usage, and for two
//! replicas the share of placements both replicas used for the same group.
//! Run with `cargo bench --bench routing`. Arguments: words that pick scenarios by name
//! (`saturated evictions`), `policies=prefix,oracle` to run only those, and `trace` to print each
//! group's placements. `ROUTING_BENCH_POLICY_YAML` (extra lines under the pool's policy, e.g.
//! `"    balance_tolerance: 0.5\n"`) tries other knobs.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests and benches stop at the first thing that is not as it should be"
)]
#![forbid(unsafe_code)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{
    BoxError, Proc, Rng, SseSplitter, Table, TempDir, metric_sum, ms, percentile, sorted,
};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use infergate::routing::features::session_hash;
use infergate::routing::hash_ring;
use serde_json::json;
use xxhash_rust::xxh3::xxh3_64;

/// Engine workers behind the gateway.
const WORKERS: usize = 4;
/// Sessions per group.
const SESSIONS: usize = 32;
/// Size of each group's system prompt in bytes (≈1,500 cl100k tokens of common words).
const SYSTEM_BYTES: usize = 6 * 1024;
/// Workload seed; every policy sees the same requests at the same offsets.
const SEED: u64 = 0x1f3a_5eed;
/// How often the engines' `/metrics` are polled for running requests and KV usage.
const POLL: Duration = Duration::from_millis(100);
/// KV blocks per worker in the evictions scenario: 4,096 tokens, room for ~2.7 of the 16 system
/// prompts (~1,500 tokens = ~94 blocks of 16 each), so the four caches together hold ~10 of 16
/// and less while requests run.
const EVICTION_BLOCKS: &str = "256";
/// KV blocks per worker in the overflow scenario (issue 46): 7,680 tokens, room for ~5 of the
/// system prompts, so the four caches together hold ~20 prompts: all 16 groups fit only when
/// they are spread by the caches' room, not by hash. Its engines evict by plain LRU
/// (`--kv-protected-fraction 0`), as vLLM does, so a worker given more groups than it holds
/// churns them.
const OVERFLOW_BLOCKS: &str = "480";
/// KV blocks per worker in the saturated scenario: 6,144 tokens, so 32 concurrent 1,500-token
/// chats over 4 workers keep every worker's KV nearly full with a queue waiting.
const SATURATED_BLOCKS: &str = "384";

/// How the workload is sent.
#[derive(Clone, Copy)]
enum Load {
    /// Poisson arrivals at this rate (requests/s) for this long.
    Open(f64, Duration),
    /// This many clients, each sending its next request when its last one ends, until this many
    /// requests have been sent.
    Closed(usize, usize),
}

/// A worker setup and load the policies are compared on.
struct Scenario {
    name: &'static str,
    engine_args: &'static [&'static str],
    /// Groups of sessions, each with its own system prompt.
    groups: usize,
    /// Zipf exponent of group popularity (group k has weight 1/(k+1)^s).
    zipf: f64,
    load: Load,
    /// Tokens generated per request (`ignore_eos`).
    max_tokens: u32,
    /// Share of the traffic that goes to group 0 (the rest spread evenly), instead of Zipf.
    hot: Option<f64>,
    /// Gateway replicas in front of the same workers; requests alternate between them.
    replicas: usize,
    /// Policies compared.
    policies: &'static [&'static str],
}

/// Every policy: `prefix` on our engines' KV events (precise mode), `prefix_vllm` precise mode
/// fed instead by the engines' vLLM-format events over ZMQ (`--kv-events-zmq`, token ids the
/// gateway decodes and hashes itself, as in front of vLLM), `prefix_approx` the same
/// policy with the engines' events off (`--no-kv-events`, the approximate index, as in front of
/// vLLM), `hash`, each group pinned to the worker its name hashes to (a consistent hash of the
/// group that every replica computes alike, knowing nothing of popularity or load),
/// `prefix_shared`, `prefix_approx` with the gateway replicas sharing a directory of prefix homes
/// in a `redis-server` the run starts (`state.redis.prefix_homes`, fleet mode; replica scenarios
/// only), and `oracle`, a static placement that knows the groups: each group pinned to one
/// worker, assigned by popularity so the workers' shares are as even as a static map allows
/// (`policy: session`, with an `x-session-id` per group chosen to hash to its worker, so the
/// oracle is the same whatever ports the run's workers get).
const ALL: &[&str] = &[
    "prefix",
    "prefix_vllm",
    "prefix_approx",
    "round_robin",
    "least_load",
    "hash",
    "oracle",
];

const SCENARIOS: [Scenario; 7] = [
    Scenario {
        name: "KV room",
        engine_args: &[],
        groups: 16,
        zipf: 1.0,
        load: Load::Open(20.0, Duration::from_secs(20)),
        max_tokens: 16,
        hot: None,
        replicas: 1,
        policies: &["prefix", "round_robin", "least_load", "oracle"],
    },
    Scenario {
        name: "evictions (256 blocks)",
        engine_args: &["--num-gpu-blocks-override", EVICTION_BLOCKS],
        groups: 16,
        zipf: 1.0,
        load: Load::Open(20.0, Duration::from_secs(20)),
        max_tokens: 16,
        hot: None,
        replicas: 1,
        policies: ALL,
    },
    Scenario {
        name: "overflow (480 blocks, ~5 prompts each)",
        engine_args: &[
            "--num-gpu-blocks-override",
            OVERFLOW_BLOCKS,
            "--kv-protected-fraction",
            "0",
        ],
        groups: 16,
        zipf: 1.0,
        load: Load::Open(20.0, Duration::from_secs(20)),
        max_tokens: 16,
        hot: None,
        replicas: 1,
        policies: &[
            "prefix",
            "prefix_vllm",
            "prefix_approx",
            "prefix_shared",
            "hash",
            "oracle",
        ],
    },
    Scenario {
        name: "saturated (384 blocks, 32 clients)",
        engine_args: &["--num-gpu-blocks-override", SATURATED_BLOCKS],
        groups: 8,
        zipf: 0.0,
        load: Load::Closed(32, 400),
        max_tokens: 32,
        hot: None,
        replicas: 1,
        policies: ALL,
    },
    Scenario {
        name: "hot prefix (60% one group, 32 clients)",
        engine_args: &[],
        groups: 8,
        zipf: 0.0,
        load: Load::Closed(32, 400),
        max_tokens: 32,
        hot: Some(0.6),
        replicas: 1,
        policies: &["prefix", "round_robin", "least_load", "oracle"],
    },
    Scenario {
        name: "two gateway replicas (KV room)",
        engine_args: &[],
        groups: 16,
        zipf: 1.0,
        load: Load::Open(20.0, Duration::from_secs(20)),
        max_tokens: 16,
        hot: None,
        replicas: 2,
        policies: &["prefix", "prefix_approx", "prefix_shared", "oracle"],
    },
    Scenario {
        name: "four gateway replicas (KV room)",
        engine_args: &[],
        groups: 16,
        zipf: 1.0,
        load: Load::Open(20.0, Duration::from_secs(20)),
        max_tokens: 16,
        hot: None,
        replicas: 4,
        policies: &["prefix_approx", "prefix_shared", "prefix", "hash", "oracle"],
    },
];

/// One request of the workload, due at `at` after the start (open loop).
struct Arrival {
    at: Duration,
    group: usize,
    body: Bytes,
}

/// What the client saw of one request.
struct Outcome {
    ok: bool,
    ttft: f64,
    worker: Option<String>,
    error: Option<String>,
    group: usize,
    /// Gateway replica it was sent to.
    replica: usize,
}

/// One policy run, summarized.
struct RunResult {
    outcomes: Vec<Outcome>,
    /// Wall time of the replay, seconds.
    wall: f64,
    /// Mean over polls of the workers' mean `vllm:kv_cache_usage_perc`.
    kv_mean: f64,
    hits: f64,
    queries: f64,
    peak_running: f64,
    decisions: String,
    per_worker: Vec<usize>,
    /// The gateways' explained hit rate: cached prompt tokens predicted, delivered, available.
    explained: [f64; 3],
}

/// Share of placements on a worker that another replica also used for the same group: each
/// placement counts the share of the other replicas that sent the group anywhere and used that
/// worker for it too (with two replicas, whether the other one did).
fn agreement(outcomes: &[Outcome]) -> Option<f64> {
    use std::collections::{HashMap, HashSet};
    let mut used: HashMap<(usize, usize), HashSet<&str>> = HashMap::new();
    for o in outcomes.iter().filter(|o| o.ok) {
        if let Some(w) = o.worker.as_deref() {
            used.entry((o.replica, o.group)).or_default().insert(w);
        }
    }
    let replicas = used.keys().map(|&(r, _)| r + 1).max().unwrap_or(0);
    if replicas < 2 {
        return None;
    }
    let (mut agree, mut all) = (0.0f64, 0usize);
    for o in outcomes.iter().filter(|o| o.ok) {
        let Some(w) = o.worker.as_deref() else {
            continue;
        };
        let others: Vec<&HashSet<&str>> = (0..replicas)
            .filter(|&r| r != o.replica)
            .filter_map(|r| used.get(&(r, o.group)))
            .collect();
        if others.is_empty() {
            continue;
        }
        all += 1;
        agree += others.iter().filter(|set| set.contains(w)).count() as f64 / others.len() as f64;
    }
    (all > 0).then(|| agree / all as f64)
}

/// Prints each group's placements as one line of worker letters (a, b, ...), in workload order.
fn print_trace(scenario: &str, policy: &str, outcomes: &[Outcome]) {
    let mut names: Vec<&str> = outcomes
        .iter()
        .filter_map(|o| o.worker.as_deref())
        .collect();
    names.sort_unstable();
    names.dedup();
    let groups = outcomes.iter().map(|o| o.group + 1).max().unwrap_or(0);
    eprintln!("{scenario} / {policy}: placements per group ({names:?} = a, b, ...)");
    for g in 0..groups {
        let line: String = outcomes
            .iter()
            .filter(|o| o.group == g)
            .map(|o| {
                o.worker
                    .as_deref()
                    .and_then(|w| names.iter().position(|n| *n == w))
                    .map_or('-', |i| char::from(b'a' + i as u8))
            })
            .collect();
        eprintln!("  group {g:2}: {line}");
    }
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), BoxError> {
    let bin = common::infergate_bin();
    let mut table = Table::new(&[
        "workers",
        "policy",
        "ok / failed",
        "req/s",
        "prefix-cache hit rate",
        "TTFT p50 ms",
        "TTFT p90 ms",
        "TTFT p99 ms",
        "requests per worker",
        "max / mean",
        "peak running (one worker)",
        "KV usage mean",
        "replica agreement",
        "cached tokens predicted / delivered / available (k)",
        "routing decisions",
    ]);
    let mut notes = Vec::new();
    let mut prompt_tokens = None;
    // `cargo bench --bench routing -- saturated evictions` runs the scenarios whose names contain
    // one of the words (cargo's own `--bench` flag is not a filter).
    // `policies=prefix,oracle` runs only those policies of each scenario.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let only: Option<Vec<&str>> = args
        .iter()
        .find_map(|a| a.strip_prefix("policies="))
        .map(|list| list.split(',').collect());
    let filters: Vec<&String> = args
        .iter()
        .filter(|a| !a.starts_with("--") && !a.starts_with("policies=") && *a != "trace")
        .collect();
    // `trace` prints, per group, the workers its requests went to, in workload order.
    let trace = args.iter().any(|a| a == "trace");
    for scenario in SCENARIOS
        .iter()
        .filter(|s| filters.is_empty() || filters.iter().any(|f| s.name.contains(f.as_str())))
    {
        let workload = Arc::new(workload(scenario));
        eprintln!(
            "{}: {} requests per run, {} groups × {SESSIONS} sessions, \
             {SYSTEM_BYTES}-byte system prompts, {WORKERS} workers",
            scenario.name,
            workload.len(),
            scenario.groups,
        );
        for &policy in scenario
            .policies
            .iter()
            .filter(|p| only.as_ref().is_none_or(|o| o.contains(p)))
        {
            eprintln!("{}: {policy} ...", scenario.name);
            let r = run_policy(&bin, scenario, policy, workload.clone()).await?;
            let ok = r.outcomes.iter().filter(|o| o.ok).count();
            let ttft = sorted(r.outcomes.iter().filter(|o| o.ok).map(|o| o.ttft).collect());
            let mean = r.per_worker.iter().sum::<usize>() as f64 / WORKERS as f64;
            let max = r.per_worker.iter().copied().max().unwrap_or(0);
            table.row(vec![
                scenario.name.to_string(),
                format!("`{policy}`"),
                format!("{ok} / {}", r.outcomes.len() - ok),
                format!("{:.1}", ok as f64 / r.wall),
                format!("{:.1}%", 100.0 * r.hits / r.queries),
                ms(percentile(&ttft, 50.0)),
                ms(percentile(&ttft, 90.0)),
                ms(percentile(&ttft, 99.0)),
                r.per_worker
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(" / "),
                format!("{:.2}", max as f64 / mean),
                format!("{:.0}", r.peak_running),
                format!("{:.2}", r.kv_mean),
                agreement(&r.outcomes).map_or("—".into(), |a| format!("{:.1}%", 100.0 * a)),
                r.explained
                    .iter()
                    .map(|n| format!("{:.0}", n / 1000.0))
                    .collect::<Vec<_>>()
                    .join(" / "),
                r.decisions.clone(),
            ]);
            if trace {
                print_trace(scenario.name, policy, &r.outcomes);
            }
            if let Some(e) = r.outcomes.iter().find_map(|o| o.error.as_ref()) {
                notes.push(format!("{} / {policy}: first failure: {e}", scenario.name));
            }
            if prompt_tokens.is_none() && ok > 0 {
                prompt_tokens = Some(r.queries / r.outcomes.len() as f64);
            }
        }
    }
    println!("\n{}", table.render());
    println!(
        "machine: {}; client, gateway and the 4 sim engines share it",
        common::machine_note()
    );
    if let Some(t) = prompt_tokens {
        println!(
            "note: mean prompt length (engine prefix-cache queries per request): {t:.0} tokens"
        );
    }
    for n in notes {
        println!("note: {n}");
    }
    Ok(())
}

/// Popularity of each group (unnormalised).
fn group_weights(scn: &Scenario) -> Vec<f64> {
    (0..scn.groups)
        .map(|k| match scn.hot {
            Some(share) if k == 0 => share,
            Some(share) => (1.0 - share) / (scn.groups - 1).max(1) as f64,
            None => 1.0 / ((k + 1) as f64).powf(scn.zipf),
        })
        .collect()
}

/// The oracle's session name per group, and the worker index it pins the group to: groups,
/// most popular first, each go to the worker with the least popularity so far; the name is the
/// first `g{group}-{n}` whose rendezvous hash (the gateway's `session` policy over the worker
/// URLs) puts it on that worker.
fn oracle_sessions(scn: &Scenario, worker_urls: &[String]) -> Vec<(String, usize)> {
    let weights = group_weights(scn);
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]));
    let keys: Vec<u64> = worker_urls.iter().map(|u| xxh3_64(u.as_bytes())).collect();
    let mut share = vec![0.0f64; keys.len()];
    let mut out = vec![(String::new(), 0); weights.len()];
    for g in order {
        let target = (0..keys.len())
            .min_by(|&a, &b| share[a].total_cmp(&share[b]))
            .unwrap_or(0);
        share[target] += weights[g];
        let name = (0u32..)
            .map(|n| format!("g{g}-{n}"))
            .find(|name| {
                let key = session_hash(name);
                (0..keys.len()).max_by_key(|&w| (hash_ring::score(key, keys[w]), keys[w]))
                    == Some(target)
            })
            .unwrap_or_default();
        out[g] = (name, target);
    }
    out
}

/// The `hash` policy's session name per group (`g{group}`) and the worker its rendezvous hash
/// (the gateway's `session` policy over the worker URLs) puts it on.
fn hash_sessions(scn: &Scenario, worker_urls: &[String]) -> Vec<(String, usize)> {
    let keys: Vec<u64> = worker_urls.iter().map(|u| xxh3_64(u.as_bytes())).collect();
    (0..scn.groups)
        .map(|g| {
            let name = format!("g{g}");
            let key = session_hash(&name);
            let w = (0..keys.len())
                .max_by_key(|&w| (hash_ring::score(key, keys[w]), keys[w]))
                .unwrap_or(0);
            (name, w)
        })
        .collect()
}

/// The seeded request list: Poisson arrivals (or as many requests as the closed loop sends),
/// Zipf group, uniform session, fresh user turn.
fn workload(scn: &Scenario) -> Vec<Arrival> {
    let mut rng = Rng::new(SEED);
    let vocab = vocabulary();
    let groups = scn.groups;
    let prompts: Vec<String> = (0..groups)
        .map(|g| {
            let mut p = format!("You are the assistant of team {g}. Follow these notes.");
            for i in 1.. {
                if p.len() >= SYSTEM_BYTES {
                    break;
                }
                p.push(' ');
                p.push_str(vocab[rng.below(vocab.len())]);
                if i % 8 == 0 {
                    p.push('.');
                }
            }
            p
        })
        .collect();
    let weights = group_weights(scn);
    let total: f64 = weights.iter().sum();
    let mut turns = vec![0u32; groups * SESSIONS];
    let mut at = Duration::ZERO;
    let mut out = Vec::new();
    loop {
        match scn.load {
            Load::Open(rate, duration) => {
                at += Duration::from_secs_f64(-(1.0 - rng.unit()).ln() / rate);
                if at >= duration {
                    return out;
                }
            }
            Load::Closed(_, requests) => {
                if out.len() >= requests {
                    return out;
                }
            }
        }
        let mut pick = rng.unit() * total;
        let group = weights
            .iter()
            .position(|w| {
                pick -= w;
                pick < 0.0
            })
            .unwrap_or(groups - 1);
        let session = rng.below(SESSIONS);
        let turn = &mut turns[group * SESSIONS + session];
        *turn += 1;
        let question: Vec<&str> = (0..12).map(|_| vocab[rng.below(vocab.len())]).collect();
        let body = json!({
            "model": "llama-3-8b",
            "messages": [
                {"role": "system", "content": prompts[group]},
                {"role": "user", "content": format!("Session {session}, turn {turn}: {}?", question.join(" "))},
            ],
            "max_tokens": scn.max_tokens,
            "ignore_eos": true,
            "stream": true,
        });
        out.push(Arrival {
            at,
            group,
            body: Bytes::from(body.to_string()),
        });
    }
}

/// Short common English words (one cl100k token each).
fn vocabulary() -> Vec<&'static str> {
    "the of and to in is it you that he was for on are as with his they at be this have from or \
     one had by but not what all were we when your can said there use an each which she do how \
     their if will up other about out many then them these so some her would make like him into \
     time has look two more go see way could no than first been call who its now find long down \
     day did get come made may part over new sound take only little work know place year live me \
     back give most very after thing our just name good man think say great where help through \
     much before line right too mean old any same tell boy follow came want show also around form \
     three small set put end does another well large must big even such turn here why ask went \
     men read need land home us move try kind hand high air away play"
        .split_whitespace()
        .collect()
}

/// Starts fresh workers and a fresh gateway with `policy`, replays the workload, tears down.
async fn run_policy(
    bin: &Path,
    scenario: &Scenario,
    policy: &str,
    workload: Arc<Vec<Arrival>>,
) -> Result<RunResult, BoxError> {
    let mut engine_args: Vec<String> = [
        "engine",
        "--port",
        "0",
        "--gpu",
        "h100",
        "--model",
        "llama-3-8b",
    ]
    .map(String::from)
    .to_vec();
    engine_args.extend(scenario.engine_args.iter().map(|s| s.to_string()));
    if matches!(policy, "prefix_approx" | "prefix_vllm" | "prefix_shared") {
        engine_args.push("--no-kv-events".into());
    }
    let mut engines = Vec::new();
    let mut zmq_ports = Vec::new();
    for _ in 0..WORKERS {
        let mut args = engine_args.clone();
        if policy == "prefix_vllm" {
            let port = common::free_port();
            zmq_ports.push(port);
            args.extend(
                [
                    "--kv-events-zmq",
                    &format!("tcp://127.0.0.1:{port}"),
                    "--kv-events-topic",
                    "kv",
                ]
                .map(String::from),
            );
        }
        engines.push(Proc::start(bin, &args, Some("infergate engine listening on ")).await?);
    }
    let urls: Vec<String> = engines.iter().map(|e| e.url.clone()).collect();
    // `prefix_vllm`: the pool reads the engines' vLLM-format events (token ids, decoded with
    // the built-in cl100k the sim engines tokenize with; chat prompts hashed as ChatML).
    let kv_yaml = match policy {
        "prefix_vllm" => {
            let mut y = String::from(
                "    kv_events:\n      topic: kv\n      tokenizer: builtin:cl100k\n      chat_template: chatml\n      endpoints:\n",
            );
            for (url, port) in urls.iter().zip(&zmq_ports) {
                y.push_str(&format!("        \"{url}\": \"tcp://127.0.0.1:{port}\"\n"));
            }
            y
        }
        _ => String::new(),
    };
    for e in &engines {
        common::wait_ok(&format!("{}/health", e.url), Duration::from_secs(20))
            .await
            .map_err(|err| format!("{err}; engine stderr:\n{}", e.stderr()))?;
    }
    let client = client();
    // The first request of an engine builds its tokenizer: keep that out of the measurement.
    for url in &urls {
        let warm = json!({"model": "llama-3-8b", "prompt": "warm up", "max_tokens": 1});
        let req = post(&format!("{url}/v1/completions"), warm.to_string().into())?;
        client.request(req).await?.into_body().collect().await?;
    }
    let oracle = match policy {
        "oracle" => Some(Arc::new(oracle_sessions(scenario, &urls))),
        "hash" => Some(Arc::new(hash_sessions(scenario, &urls))),
        _ => None,
    };
    let gw_policy = match policy {
        "oracle" | "hash" => "session",
        "prefix_approx" | "prefix_vllm" | "prefix_shared" => "prefix",
        p => p,
    };
    // `prefix_shared`: the replicas share a directory of prefix homes in a Redis of their own.
    let redis = match (policy, common::find_program("redis-server")) {
        ("prefix_shared", Some(bin)) => {
            let dir = TempDir::new("routing-redis");
            let (child, port) = common::start_redis(&bin, &dir).await?;
            Some((Killed(child), port, dir))
        }
        ("prefix_shared", None) => return Err("prefix_shared needs redis-server".into()),
        _ => None,
    };
    let state_yaml = redis.as_ref().map_or_else(String::new, |(_, port, _)| {
        format!(
            "state: {{redis: {{url: \"redis://127.0.0.1:{port}/\", key_prefix: routing, \
             timeout: 1s, prefix_homes: true}}}}\n"
        )
    });
    let (mut gateways, mut dirs) = (Vec::new(), Vec::new());
    for r in 0..scenario.replicas {
        let dir = TempDir::new(&format!("routing-r{r}"));
        let gw = start_gateway(bin, &dir, &urls, gw_policy, (&kv_yaml, &state_yaml)).await?;
        dirs.push(dir);
        if matches!(policy, "prefix" | "prefix_vllm") {
            // Precise mode from the first request: wait for every worker's event stream.
            wait_kv_events(&gw.url, WORKERS).await?;
        }
        if policy == "prefix_vllm" {
            join_vllm_events(&client, &gw.url, &urls).await?;
        }
        gateways.push(gw);
    }
    let gateway_urls: Vec<String> = gateways.iter().map(|g| g.url.clone()).collect();

    let before = scrape_cache(&urls).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let poller = tokio::spawn(peak_running(urls.clone(), stop.clone()));
    let started = Instant::now();
    let outcomes = match scenario.load {
        Load::Open(..) => replay(&client, &gateway_urls, workload, oracle.clone()).await,
        Load::Closed(clients, _) => {
            replay_closed(&client, &gateway_urls, workload, oracle.clone(), clients).await
        }
    };
    let wall = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (peak, kv_mean) = poller.await?;
    let after = scrape_cache(&urls).await?;
    let mut by_reason: BTreeMap<String, f64> = BTreeMap::new();
    let mut explained = [0.0f64; 3];
    for url in &gateway_urls {
        let (_, gw_metrics) = common::get(&format!("{url}/metrics")).await?;
        for (reason, n) in
            common::metric_by_label(&gw_metrics, "infergate_routing_decisions_total", "reason")
        {
            *by_reason.entry(reason).or_default() += n;
        }
        for (why, n) in
            common::metric_by_label(&gw_metrics, "infergate_routing_prefix_lost_total", "reason")
        {
            *by_reason.entry(format!("(lost on {why})")).or_default() += n;
        }
        for (kind, n) in
            common::metric_by_label(&gw_metrics, "infergate_route_cached_tokens_total", "kind")
        {
            let slot = ["predicted", "delivered", "available"]
                .iter()
                .position(|k| *k == kind);
            if let Some(i) = slot {
                explained[i] += n;
            }
        }
        // The shared directory: prefixes claimed for the fleet and homes moved.
        for (event, n) in
            common::metric_by_label(&gw_metrics, "infergate_state_prefix_homes_total", "event")
        {
            if event != "sync" && n > 0.0 {
                *by_reason.entry(format!("(homes {event})")).or_default() += n;
            }
        }
        // vLLM-format events: batches applied and messages refused (proof precise mode ran).
        let batches = metric_sum(&gw_metrics, "infergate_routing_vllm_kv_batches_total");
        if batches > 0.0 {
            *by_reason.entry("(vLLM event batches)".into()).or_default() += batches;
            let refused = metric_sum(&gw_metrics, "infergate_routing_vllm_kv_rejected_total");
            *by_reason
                .entry("(vLLM messages refused)".into())
                .or_default() += refused;
        }
    }
    let decisions = by_reason
        .into_iter()
        .map(|(reason, n)| format!("{reason} {n:.0}"))
        .collect::<Vec<_>>()
        .join(", ");

    let mut per_worker: BTreeMap<&str, usize> = urls.iter().map(|u| (u.as_str(), 0)).collect();
    for o in outcomes.iter().filter(|o| o.ok) {
        if let Some(n) = o.worker.as_deref().and_then(|w| per_worker.get_mut(w)) {
            *n += 1;
        }
    }
    let per_worker = urls.iter().map(|u| per_worker[u.as_str()]).collect();
    if let Some(pins) = &oracle {
        // The oracle is only an oracle if the gateway put every group where it was pinned.
        let strays = outcomes
            .iter()
            .filter(|o| o.worker.as_deref() != Some(urls[pins[o.group].1].as_str()))
            .filter(|o| o.ok)
            .count();
        if strays > 0 {
            return Err(format!("{strays} oracle requests left their pinned worker").into());
        }
    }
    for gateway in gateways {
        gateway.stop().await;
    }
    drop((dirs, redis));
    for e in engines {
        e.stop().await;
    }
    Ok(RunResult {
        wall,
        kv_mean,
        hits: after.0 - before.0,
        queries: after.1 - before.1,
        peak_running: peak,
        decisions,
        per_worker,
        outcomes,
        explained,
    })
}

/// A child process killed when dropped (the run's `redis-server`, whatever way the run ends).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A pooled keep-alive client with `TCP_NODELAY`.
fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

fn post(url: &str, body: Bytes) -> Result<Request<Full<Bytes>>, BoxError> {
    Ok(Request::builder()
        .method(Method::POST)
        .uri(url)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body))?)
}

/// Sends every arrival at its offset (open loop) and waits for all answers.
async fn replay(
    client: &HttpClient,
    gateways: &[String],
    workload: Arc<Vec<Arrival>>,
    oracle: Option<Oracle>,
) -> Vec<Outcome> {
    let start = tokio::time::Instant::now();
    let urls: Vec<String> = gateways
        .iter()
        .map(|g| format!("{g}/v1/chat/completions"))
        .collect();
    let mut tasks = Vec::with_capacity(workload.len());
    for i in 0..workload.len() {
        tokio::time::sleep_until(start + workload[i].at).await;
        let replica = i % urls.len();
        let (client, url, workload) = (client.clone(), urls[replica].clone(), workload.clone());
        let oracle = oracle.clone();
        tasks.push(tokio::spawn(async move {
            send(
                &client,
                &url,
                &workload[i],
                oracle.as_deref().map(Vec::as_slice),
                replica,
            )
            .await
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.expect("a request task panicked"));
    }
    out
}

/// `clients` tasks each send the next unsent request when their last one ends (closed loop).
async fn replay_closed(
    client: &HttpClient,
    gateways: &[String],
    workload: Arc<Vec<Arrival>>,
    oracle: Option<Oracle>,
    clients: usize,
) -> Vec<Outcome> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(clients);
    for c in 0..clients {
        // Each client keeps to one replica, as behind a connection-level load balancer.
        let replica = c % gateways.len();
        let url = format!("{}/v1/chat/completions", gateways[replica]);
        let (client, workload, next) = (client.clone(), workload.clone(), next.clone());
        let oracle = oracle.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(arrival) = workload.get(i) else {
                    return done;
                };
                done.push(
                    send(
                        &client,
                        &url,
                        arrival,
                        oracle.as_deref().map(Vec::as_slice),
                        replica,
                    )
                    .await,
                );
            }
        }));
    }
    let mut out = Vec::with_capacity(workload.len());
    for t in tasks {
        out.extend(t.await.expect("a client task panicked"));
    }
    out
}

/// The oracle's session name and pinned worker index per group.
type Oracle = Arc<Vec<(String, usize)>>;

/// One request of the workload, timed; the oracle's requests carry their group's session.
async fn send(
    client: &HttpClient,
    url: &str,
    arrival: &Arrival,
    oracle: Option<&[(String, usize)]>,
    replica: usize,
) -> Outcome {
    let started = Instant::now();
    let session = oracle
        .and_then(|o| o.get(arrival.group))
        .map(|(s, _)| s.clone());
    let result = one_stream(client, url, arrival.body.clone(), session, started).await;
    let (ttft, worker, error) = match result {
        Ok((ttft, worker)) => (ttft, worker, None),
        Err(e) => (f64::NAN, None, Some(e.to_string())),
    };
    Outcome {
        ok: error.is_none(),
        ttft,
        worker,
        error,
        group: arrival.group,
        replica,
    }
}

/// Waits until the gateway reads KV events from `workers` workers (precise mode is live).
async fn wait_kv_events(gateway: &str, workers: usize) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, text) = common::get(&format!("{gateway}/metrics")).await?;
        if metric_sum(&text, "infergate_routing_kv_events_live") >= workers as f64 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("the gateway never subscribed to every worker's KV events".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// ZMQ drops what a publisher sends before a subscription reaches it: sends each engine small
/// completions straight (each caches a block) until the gateway has applied one of its batches.
async fn join_vllm_events(
    client: &HttpClient,
    gateway: &str,
    engines: &[String],
) -> Result<(), BoxError> {
    let batches = |text: &str| metric_sum(text, "infergate_routing_vllm_kv_batches_total");
    for (i, url) in engines.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(15);
        for n in 0.. {
            let before = batches(&common::get(&format!("{gateway}/metrics")).await?.1);
            let prompt = format!("join {i} {n} ") + &"words to fill a block ".repeat(8);
            let body = json!({"model": "llama-3-8b", "prompt": prompt, "max_tokens": 1});
            let req = post(&format!("{url}/v1/completions"), body.to_string().into())?;
            client.request(req).await?.into_body().collect().await?;
            let wait = Instant::now() + Duration::from_millis(500);
            let mut applied = false;
            while !applied && Instant::now() < wait {
                applied = batches(&common::get(&format!("{gateway}/metrics")).await?.1) > before;
                if !applied {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            if applied {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("no KV-event batch of {url} reached the gateway").into());
            }
        }
    }
    Ok(())
}

/// One streamed request read to `[DONE]`: TTFT (first `data:` event) and the serving worker.
async fn one_stream(
    client: &HttpClient,
    url: &str,
    body: Bytes,
    session: Option<String>,
    started: Instant,
) -> Result<(f64, Option<String>), BoxError> {
    let mut req = post(url, body)?;
    if let Some(s) = session
        && let Ok(v) = hyper::header::HeaderValue::from_str(&s)
    {
        req.headers_mut().insert("x-session-id", v);
    }
    let res = client.request(req).await?;
    let status = res.status();
    let worker = res
        .headers()
        .get("x-infergate-worker")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = res.into_body();
    if status != StatusCode::OK {
        let text = body.collect().await?.to_bytes();
        return Err(format!("{status}: {}", String::from_utf8_lossy(&text)).into());
    }
    let (mut sse, mut ttft, mut done) = (SseSplitter::default(), None, false);
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        let (n, end) = sse.push(&data);
        if n > 0 && ttft.is_none() {
            ttft = Some(started.elapsed().as_secs_f64());
        }
        done |= end;
    }
    match ttft {
        Some(t) if done => Ok((t, worker)),
        _ => Err("stream ended without data: [DONE]".into()),
    }
}

/// Summed `(hits, queries)` of the engines' prefix-cache counters.
async fn scrape_cache(urls: &[String]) -> Result<(f64, f64), BoxError> {
    let (mut hits, mut queries) = (0.0, 0.0);
    for url in urls {
        let (_, text) = common::get(&format!("{url}/metrics")).await?;
        hits += metric_sum(&text, "vllm:prefix_cache_hits_total");
        queries += metric_sum(&text, "vllm:prefix_cache_queries_total");
    }
    Ok((hits, queries))
}

/// Polls every engine's `/metrics` until `stop`: the highest `vllm:num_requests_running` one
/// worker showed, and the mean over polls of the workers' mean `vllm:kv_cache_usage_perc`.
async fn peak_running(urls: Vec<String>, stop: Arc<AtomicBool>) -> (f64, f64) {
    let (mut peak, mut kv_sum, mut kv_n): (f64, f64, f64) = (0.0, 0.0, 0.0);
    while !stop.load(Ordering::Relaxed) {
        for url in &urls {
            if let Ok((_, text)) = common::get(&format!("{url}/metrics")).await {
                peak = peak.max(metric_sum(&text, "vllm:num_requests_running"));
                kv_sum += metric_sum(&text, "vllm:kv_cache_usage_perc");
                kv_n += 1.0;
            }
        }
        tokio::time::sleep(POLL).await;
    }
    (peak, if kv_n > 0.0 { kv_sum / kv_n } else { 0.0 })
}

/// Starts `infergate gateway` with one pool of `urls` routed by `policy`.
async fn start_gateway(
    bin: &Path,
    dir: &TempDir,
    urls: &[String],
    policy: &str,
    (pool_extra, top_extra): (&str, &str),
) -> Result<Proc, BoxError> {
    let mut workers: String = urls.iter().map(|u| format!("      - url: {u}\n")).collect();
    workers.push_str(pool_extra);
    let config = dir.write(
        "infergate.yaml",
        &format!(
            "listen: \"127.0.0.1:0\"\n\
             admin: {{listen: \"127.0.0.1:0\"}}\n\
             log: {{format: text, level: warn}}\n\
             metrics: {{public: true}}\n\
             debug_headers: true\n\
             {top_extra}\
             policies: policies\n\
             models:\n  - {{name: llama-3-8b, pool: fleet}}\n\
             pools:\n  - name: fleet\n    dialect: infergate\n    workers:\n{workers}"
        ),
    );
    dir.write(
        "policies/routing.yaml",
        &format!(
            "pools:\n  fleet:\n    policy: {policy}\n{}",
            std::env::var("ROUTING_BENCH_POLICY_YAML").unwrap_or_default()
        ),
    );
    let args: Vec<String> = [
        "gateway",
        "--config",
        &config.to_string_lossy(),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    let gw = Proc::start(bin, &args, Some("infergate gateway listening on ")).await?;
    common::wait_ok(&format!("{}/readyz", gw.url), Duration::from_secs(10))
        .await
        .map_err(|e| format!("{e}; gateway stderr:\n{}", gw.stderr()))?;
    Ok(gw)
}
