//! Per-request CPU cost of the gateway's front phases with 1,000 tenants: authenticate (API key →
//! tenant), validate (parse the body, check ranges and tier), estimate prompt tokens, and meter
//! (GCRA request and token cells, concurrency), then settle the reservation.
#![expect(
    clippy::expect_used,
    reason = "tests and benches stop at the first thing that is not as it should be"
)]

use std::fmt::Write as _;
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use hyper::HeaderMap;
use hyper::body::Bytes;
use infergate::config::{Snapshot, load_str_with};
use infergate::limits::{InProcessLimiter, Limiter, TierLimits};
use infergate::pipeline::validate::request::{Endpoint, PromptSize, validate};
use infergate::tenants::{KeyTable, bearer, format_hash, hash_key};

const TENANTS: usize = 1_000;

fn snapshot() -> Snapshot {
    let mut config = String::from(
        "models:\n  - {name: m, pool: p}\npools:\n  - name: p\n    workers: [{url: \"http://127.0.0.1:9\"}]\ntenants:\n",
    );
    for i in 0..TENANTS {
        let hash = format_hash(&hash_key(&format!("key-{i}")));
        let _ = writeln!(config, "  - {{name: t{i}, tier: paid, keys: [\"{hash}\"]}}");
    }
    let tiers = "tiers:\n  paid: {priority: 10, requests_per_minute: 1000000, tokens_per_minute: 1000000000, max_concurrent: 1000, max_tokens: 4096, default_max_tokens: 256}\n";
    match load_str_with(
        &config,
        Path::new("bench/infergate.yaml"),
        None,
        Some((tiers, Path::new("bench/tenants.yaml"))),
    ) {
        Ok(s) => s,
        Err(e) => panic!("bench config: {e}"),
    }
}

fn body(i: usize) -> Bytes {
    Bytes::from(format!(
        "{{\"model\":\"m\",\"messages\":[{{\"role\":\"system\",\"content\":\"You are a careful assistant for team {i}. Answer briefly and cite sources.\"}},{{\"role\":\"user\",\"content\":\"Summarize the quarterly report in three bullet points, focusing on revenue, costs and hiring.\"}}],\"max_tokens\":128,\"temperature\":0.7,\"stream\":true}}"
    ))
}

fn bench_front_phases(c: &mut Criterion) {
    let snap = snapshot();
    let keys = KeyTable::new(&snap.tenants);
    let limiter = InProcessLimiter::new();
    let tier = snap.tier("paid").cloned().expect("tier");
    let limits = TierLimits {
        requests_per_minute: tier.requests_per_minute,
        tokens_per_minute: tier.tokens_per_minute,
        max_concurrent: tier.max_concurrent,
    };
    let auth: Vec<String> = (0..TENANTS).map(|i| format!("Bearer key-{i}")).collect();
    let bodies: Vec<Bytes> = (0..TENANTS).map(body).collect();
    let headers = HeaderMap::new();
    let run = |i: usize, estimate: bool| {
        let i = i % TENANTS;
        let Some(tenant) = bearer(Some(&auth[i])).and_then(|k| keys.lookup(k)) else {
            panic!("unknown key");
        };
        let name = &snap.tenants[tenant].name;
        let valid = validate(
            Endpoint::ChatCompletions,
            &headers,
            bodies[i].clone(),
            &snap,
            &tier,
        )
        .expect("valid");
        let prompt = match (&valid.prompt, estimate) {
            (PromptSize::Text(t), true) => valid.estimator.count(t),
            (PromptSize::Text(t), false) => t.len() as u64 / 4,
            (PromptSize::Tokens(n), _) => *n,
        };
        let now = Instant::now();
        let reserve = prompt + valid.max_tokens;
        let r = limiter
            .acquire(name, &limits, reserve, now)
            .expect("within limits");
        limiter.reconcile(name, r.tokens, prompt + 20, now);
        limiter.release_concurrency(name);
        black_box(r.headers.header_pairs().len())
    };
    let mut i = 0;
    c.bench_function("auth_validate_limit_1000_tenants", |b| {
        b.iter(|| {
            i += 1;
            run(i, false)
        })
    });
    c.bench_function("auth_validate_estimate_limit_1000_tenants", |b| {
        b.iter(|| {
            i += 1;
            run(i, true)
        })
    });
}

criterion_group!(benches, bench_front_phases);
criterion_main!(benches);
