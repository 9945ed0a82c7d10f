//! Fleet mode with quota leases (`state.redis.lease`): four `infergate gateway` replicas lease a
//! tenant's requests per minute in blocks out of one real Redis and admit locally. The fleet
//! stays within the README's bound (limit + replicas × block in a minute, plus what the cell
//! refills meanwhile), also when a replica is SIGKILLed holding a lease, and spends far fewer
//! Redis calls than requests.

use std::time::{Duration, Instant};

use hyper::StatusCode;
use tokio::task::JoinSet;

use super::fleet_redis::Redis;
use crate::common::Engine;
use crate::tenant_support::{Gw, Setup, TempDir, completion, key_of, post};

const RPM: u64 = 60;
const BLOCK: u64 = 5;
const REPLICAS: u64 = 4;

/// Redis calls a replica made for its leases (fetches and renewals).
async fn lease_calls(gw: &Gw) -> f64 {
    gw.metric("infergate_state_lease_calls_total{call=\"fetch\"}")
        .await
        + gw.metric("infergate_state_lease_calls_total{call=\"renew\"}")
            .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_leasing_replicas_stay_within_the_bound_when_one_dies_holding_a_lease() {
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("fleet-lease");
    let redis = Redis::start(None, &dir.path);
    // A generous timeout: a call timed out on 2 loaded cores falls back to the local share.
    let extra = format!(
        "state: {{redis: {{url: \"{}\", key_prefix: lease, timeout: 1s, \
         lease: {{requests: {BLOCK}, hold: 30s}}}}}}\n",
        redis.url()
    );
    let tiers =
        format!("tiers:\n  fleet: {{priority: 1, requests_per_minute: {RPM}, max_tokens: 16}}\n");
    let setup = Setup {
        workers: &[&engine.url],
        extra: &extra,
        tenants: &[("acme", "fleet")],
        tiers: &tiers,
        ..Setup::default()
    };
    let config = setup.write(&dir).to_string_lossy().into_owned();
    let args = ["gateway", "--config", config.as_str()];
    let (a, b, c, mut victim) = tokio::join!(
        Gw::launch(&args),
        Gw::launch(&args),
        Gw::launch(&args),
        Gw::launch(&args)
    );
    for gw in [&a, &b, &c, &victim] {
        gw.expect_metric(
            "infergate_state_replicas",
            REPLICAS as f64,
            Duration::from_secs(15),
        )
        .await;
        gw.expect_metric("infergate_state_fallback", 0.0, Duration::from_secs(15))
            .await;
    }
    let body = completion("hello lease", 1);
    let key = key_of("acme");

    // The victim's first request fetches itself plus a block; it dies holding those 5.
    let t0 = Instant::now();
    let first = post(&victim.at("/v1/completions"), Some(&key), &body).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text);
    assert_eq!(
        victim
            .metric("infergate_state_lease_calls_total{call=\"fetch\"}")
            .await,
        1.0
    );
    victim.crash().await;

    // The survivors are driven past the limit: 3 × RPM requests, 12 at a time.
    let survivors = [&a, &b, &c];
    let (mut admitted, mut retries, mut sent) = (1u64, Vec::new(), 1u64);
    for _ in 0..(3 * RPM / 12) {
        let mut set = JoinSet::new();
        for i in 0..12 {
            let url = survivors[i % 3].at("/v1/completions");
            let (key, body) = (key.clone(), body.clone());
            set.spawn(async move { post(&url, Some(&key), &body).await });
        }
        for reply in set.join_all().await {
            sent += 1;
            match reply.status {
                StatusCode::OK => admitted += 1,
                StatusCode::TOO_MANY_REQUESTS => retries.push(reply.header_u64("retry-after")),
                other => panic!("{other}: {}", reply.text),
            }
        }
    }
    let elapsed = t0.elapsed();
    // The cell refills one request a second while the test runs.
    let refilled = (elapsed.as_secs_f64() * RPM as f64 / 60.0).ceil() as u64;
    let bound = RPM + refilled + REPLICAS * BLOCK;
    eprintln!(
        "leases: admitted {admitted} of {sent} in {elapsed:?} (bound {bound}, {refilled} refilled)"
    );
    assert!(
        admitted <= bound,
        "admitted {admitted} > limit {RPM} + {refilled} refilled + {REPLICAS} × {BLOCK}"
    );
    // Leasing never starves the fleet: only the dead replica's block and what the survivors
    // still hold are missing.
    assert!(
        admitted >= RPM - REPLICAS * BLOCK,
        "admitted only {admitted} of a {RPM} limit"
    );
    // Refusals carry Redis's wait for the next unit (1 s at 60 a minute).
    assert!(
        !retries.is_empty() && retries.iter().all(|r| (1..=2).contains(r)),
        "{retries:?}"
    );
    // Admission did not cost a round trip each: a block of 5 needs about one call per 5.
    let mut calls = 0.0;
    for gw in survivors {
        calls += lease_calls(gw).await;
        assert_eq!(gw.metric("infergate_state_fallback").await, 0.0);
    }
    assert!(
        calls * 3.0 <= sent as f64,
        "{calls} lease calls for {sent} requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_concurrency_slots_never_exceed_the_fleet_limit() {
    let engine = Engine::start(&[]).await;
    let dir = TempDir::new("fleet-lease-conc");
    let redis = Redis::start(None, &dir.path);
    let extra = format!(
        "state: {{redis: {{url: \"{}\", key_prefix: lconc, timeout: 1s, lease: {{slots: 2}}}}}}\n",
        redis.url()
    );
    let setup = Setup {
        workers: &[&engine.url],
        extra: &extra,
        tenants: &[("acme", "fleet")],
        tiers: "tiers:\n  fleet: {priority: 1, max_concurrent: 4, max_tokens: 900}\n",
        ..Setup::default()
    };
    let config = setup.write(&dir).to_string_lossy().into_owned();
    let args = ["gateway", "--config", config.as_str()];
    let (a, b) = tokio::join!(Gw::launch(&args), Gw::launch(&args));
    for gw in [&a, &b] {
        gw.expect_metric("infergate_state_replicas", 2.0, Duration::from_secs(15))
            .await;
    }
    // 12 long answers at once over both replicas: at most 4 run; the slots a replica leased and
    // keeps idle may refuse a few more on the other.
    let long = completion("a long answer please", 300);
    let mut set = JoinSet::new();
    for i in 0..12 {
        let url = [&a, &b][i % 2].at("/v1/completions");
        let (key, body) = (key_of("acme"), long.clone());
        set.spawn(async move { post(&url, Some(&key), &body).await });
    }
    let statuses: Vec<StatusCode> = set.join_all().await.iter().map(|r| r.status).collect();
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert!((2..=4).contains(&ok), "{statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|s| matches!(*s, StatusCode::OK | StatusCode::TOO_MANY_REQUESTS)),
        "{statuses:?}"
    );
    // Once they end (each slot goes back as its answer's account closes), slots are free again
    // on either replica.
    for gw in [&a, &b] {
        let (url, key, short) = (gw.at("/v1/completions"), key_of("acme"), completion("x", 1));
        let r = crate::common::settle(
            Duration::from_secs(5),
            Duration::from_millis(50),
            || post(&url, Some(&key), &short),
            |r| r.status == StatusCode::OK,
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
}
