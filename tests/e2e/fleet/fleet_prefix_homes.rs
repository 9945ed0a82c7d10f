//! Fleet mode's shared directory of prefix homes (`state.redis.prefix_homes`) end to end: two
//! `infergate gateway` replicas in front of four engines without KV events (approximate mode, as
//! in front of vLLM), sharing one real Redis. A new prefix is placed once for the fleet on the
//! worker with the least homed demand, the other replica follows that claim, and when two hot
//! prefixes share a worker the directory moves one and both replicas follow the move. With Redis
//! dead, both keep serving: known prefixes from their copies, new ones on computed homes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hyper::StatusCode;

use super::fleet_redis::Redis;
use crate::common::Engine;
use crate::tenant_support::{Gw, Setup, TempDir, completion, key_of, post};

/// Groups of requests, each with its own long prompt prefix.
const GROUPS: usize = 8;

/// A prompt of group `g`: about 3 KB shared by the group (a dozen prefix blocks), then a turn.
fn prompt(g: usize, turn: usize) -> String {
    let mut s = format!("You are the assistant of team {g}. Notes follow.");
    let mut n = g as u64 + 1;
    while s.len() < 3_000 {
        n = n.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        s.push_str(
            [" river", " stone", " lamp", " cloud", " field", " gate"][(n >> 61) as usize % 6],
        );
    }
    format!("{s}\nQuestion {turn}: what now?")
}

/// Sends one request of group `g` through `gw`; the worker that served it.
async fn send(gw: &Gw, g: usize, turn: usize) -> String {
    let reply = post(
        &gw.at("/v1/completions"),
        Some(&key_of("acme")),
        &completion(&prompt(g, turn), 2),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    reply
        .header("x-infergate-worker")
        .expect("debug_headers name the worker")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_prefix_homes_spread_by_demand_and_follow_a_move() {
    let dir = TempDir::new("fleet-homes");
    let mut redis = Redis::start(None, &dir.path);
    let args = ["--no-kv-events"];
    let (e1, e2, e3, e4) = tokio::join!(
        Engine::start(&args),
        Engine::start(&args),
        Engine::start(&args),
        Engine::start(&args)
    );
    let urls = [
        e1.url.as_str(),
        e2.url.as_str(),
        e3.url.as_str(),
        e4.url.as_str(),
    ];
    let extra = format!(
        "debug_headers: true\nstate: {{redis: {{url: \"{}\", key_prefix: homes, timeout: 1s, \
         prefix_homes: true}}}}\n",
        redis.url()
    );
    let setup = Setup {
        workers: &urls,
        extra: &extra,
        tenants: &[("acme", "fleet")],
        tiers: "tiers:\n  fleet: {priority: 1}\n",
        policy: Some("prefix"),
        ..Setup::default()
    };
    let config = setup.write(&dir).to_string_lossy().into_owned();
    let launch = ["gateway", "--config", config.as_str()];
    let (a, b) = tokio::join!(Gw::launch(&launch), Gw::launch(&launch));
    for gw in [&a, &b] {
        gw.expect_metric("infergate_state_fallback", 0.0, Duration::from_secs(15))
            .await;
    }

    // Eight new prefixes through one replica, one at a time: each is claimed where the least is
    // homed, so the four workers get two each (a hash of eight prefixes over four workers gives
    // that about 4% of the time).
    let mut home = Vec::new();
    for g in 0..GROUPS {
        home.push(send(&a, g, 0).await);
    }
    let mut per_worker: HashMap<&str, usize> = HashMap::new();
    for w in &home {
        *per_worker.entry(w.as_str()).or_default() += 1;
    }
    assert_eq!(
        (per_worker.len(), per_worker.values().max()),
        (4, Some(&2)),
        "homes {home:?}"
    );
    // The other replica follows every claim, whatever it would have computed itself.
    for (g, h) in home.iter().enumerate() {
        assert_eq!(&send(&b, g, 1).await, h, "group {g} on replica b");
    }

    // Group 0 and the other group homed with it take nearly all the traffic: their worker holds
    // far more than its share, so the directory moves one of the two, and both replicas follow.
    let partner = (1..GROUPS)
        .find(|&g| home[g] == home[0])
        .expect("two groups a worker");
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut turn = 2;
    loop {
        let mut now = Vec::new();
        for gw in [&a, &b] {
            for g in [0, partner] {
                now.push(send(gw, g, turn).await);
                turn += 1;
            }
        }
        // [a: 0, a: partner, b: 0, b: partner]
        if now[0] != now[1] && now[0] == now[2] && now[1] == now[3] {
            let moved = if now[0] == home[0] { &now[1] } else { &now[0] };
            assert_ne!(moved, &home[0]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no move after {turn} requests: {now:?} (home {})",
            home[0]
        );
    }
    // The groups nobody sent more of stay where they were claimed.
    for g in (1..GROUPS).filter(|&g| g != partner) {
        assert_eq!(send(&a, g, turn).await, home[g], "group {g}");
    }

    // Redis dies: known prefixes keep their homes from each replica's copy, and new ones are
    // served on the homes computed alike (`send` asserts 200 for each).
    redis.kill();
    for g in (1..GROUPS).filter(|&g| g != partner) {
        assert_eq!(
            send(&b, g, turn + 1).await,
            home[g],
            "group {g} without Redis"
        );
    }
    let fresh = (send(&a, GROUPS, 0).await, send(&b, GROUPS, 1).await);
    assert_eq!(fresh.0, fresh.1, "a new prefix without Redis");
}
