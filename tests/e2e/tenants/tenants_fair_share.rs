//! Fair share under contention: a pool with one slow worker, one request in flight at a time and
//! `admission.fair_share` on. A tenant that floods the queue does not keep a neighbour of the
//! same tier waiting behind its whole backlog: the neighbour's requests go in turn with it.

use crate::common;
use crate::tenant_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::StatusCode;
use tenant_support::{Gw, POOL, Reply, Setup, completion, key_of, post};
use tokio::task::JoinSet;

use common::Engine;
use common::gateway::eventually;

/// Where `name` finished in `order`.
fn rank(order: &[String], name: &str) -> usize {
    order
        .iter()
        .position(|n| n == name)
        .unwrap_or_else(|| panic!("{name} never finished: {order:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_tenant_does_not_take_its_neighbours_turns() {
    // An L4 decodes llama-3-8b at ~70 ms a token: the first request holds the only slot for
    // seconds while the others queue behind it.
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let gw = Gw::start(&Setup {
        workers: &[&engine.url],
        admission: Some(
            "{max_in_flight_per_worker: 1, max_queue: 50, max_wait: 60s, fair_share: {input_weight: 1, output_weight: 2}}",
        ),
        tenants: &[("noisy", "std"), ("quiet", "std")],
        tiers: "tiers:\n  std: {priority: 1}\n",
        ..Setup::default()
    })
    .await;
    let url = gw.at("/v1/completions");
    let depth = format!("infergate_queue_depth{{pool=\"{POOL}\"}}");
    let finished: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut tasks = JoinSet::new();
    let mut send = |name: String, tenant: &str, max_tokens: u64| {
        let (url, key, finished) = (url.clone(), key_of(tenant), finished.clone());
        let body = completion(&format!("request {name} of the same length"), max_tokens);
        tasks.spawn(async move {
            let reply = post(&url, Some(&key), &body).await;
            assert_eq!(reply.status, StatusCode::OK, "{name}: {}", reply.text);
            finished.lock().unwrap().push(name);
        });
    };

    // The noisy tenant takes the only slot for ~3 s, then queues six more requests before the
    // quiet one queues two, one at a time so that their arrival order is known.
    send("occupier".into(), "noisy", 40);
    engine
        .wait_metric("vllm:num_requests_running", Duration::from_secs(10), |v| {
            v == 1.0
        })
        .await;
    let queued = [("noisy", 6), ("quiet", 2)];
    let mut n = 0.0;
    for (tenant, count) in queued {
        for i in 1..=count {
            send(format!("{tenant}-{i}"), tenant, 4);
            n += 1.0;
            gw.expect_metric(&depth, n, Duration::from_secs(10)).await;
        }
    }
    // `/admin/status` shows the pool's backlog: both tenants, their waiters, the occupier's
    // estimate charged to the noisy one (so the quiet one, lifted level when it joined, leads).
    let status = gw.status().await;
    let fair = &status["pools"][0]["admission"]["fair_share"];
    let backlogged: Vec<(&str, u64)> = fair["backlogged"]
        .as_array()
        .unwrap_or_else(|| panic!("no backlog in {status}"))
        .iter()
        .map(|t| {
            (
                t["tenant"].as_str().unwrap(),
                t["waiting"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(
        finished.lock().unwrap().is_empty(),
        "the occupier finished before all eight were queued: the test cannot tell the order"
    );
    assert_eq!(backlogged.len(), 2, "{fair}");
    assert!(
        backlogged.contains(&("noisy", 6)) && backlogged.contains(&("quiet", 2)),
        "{fair}"
    );
    assert!(
        fair["backlogged"][0]["counter"].as_f64().is_some(),
        "{fair}"
    );

    tasks.join_all().await;
    let order = finished.lock().unwrap().clone();
    assert_eq!(order.len(), 9, "{order:?}");
    // First come would serve all six noisy requests first. With fair share the quiet tenant,
    // level with the noisy one when it starts waiting, alternates with it (give or take one
    // turn for the difference between the estimated and the reported prompt tokens).
    assert!(
        rank(&order, "quiet-1") < rank(&order, "noisy-3"),
        "quiet-1 waited behind the noisy backlog: {order:?}"
    );
    assert!(
        rank(&order, "quiet-2") < rank(&order, "noisy-5"),
        "quiet-2 waited behind the noisy backlog: {order:?}"
    );
    gw.expect_metric(&depth, 0.0, Duration::from_secs(5)).await;
    // Each tenant's waits are its own series: the quiet tenant's two waited less, in all, than
    // the noisy tenant's six.
    let wait = |tenant: &str, what: &str| {
        format!("infergate_tenant_queue_wait_seconds_{what}{{tenant=\"{tenant}\"}}")
    };
    assert_eq!(gw.metric(&wait("quiet", "count")).await, 2.0);
    assert_eq!(gw.metric(&wait("noisy", "count")).await, 7.0);
    let (quiet, noisy) = (
        gw.metric(&wait("quiet", "sum")).await,
        gw.metric(&wait("noisy", "sum")).await,
    );
    assert!(quiet < noisy, "quiet waited {quiet} s, noisy {noisy} s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_under_its_share_borrows_a_slot_instead_of_waiting_for_the_heavy_one() {
    // One slot, one more to lend: the noisy tenant's request holds the slot for seconds and
    // its second waits; the quiet tenant, holding nothing, is served at once past the capacity.
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let gw = Gw::start(&Setup {
        workers: &[&engine.url],
        admission: Some(
            "{max_in_flight_per_worker: 1, max_queue: 50, max_wait: 60s, fair_share: {borrow_slots: 1}}",
        ),
        tenants: &[("noisy", "std"), ("quiet", "std")],
        tiers: "tiers:\n  std: {priority: 1}\n",
        ..Setup::default()
    })
    .await;
    let url = gw.at("/v1/completions");
    let depth = format!("infergate_queue_depth{{pool=\"{POOL}\"}}");
    let occupier = occupy(&engine, &url, "noisy", 40).await;
    // The noisy tenant holds its share (all of one slot): its second request waits.
    let second = send_same(&url, "noisy", 4);
    gw.expect_metric(&depth, 1.0, Duration::from_secs(10)).await;
    let quiet = post(&url, Some(&key_of("quiet")), &completion("a quick one", 2)).await;
    assert_eq!(quiet.status, StatusCode::OK, "{}", quiet.text);
    assert!(
        !occupier.is_finished() && !second.is_finished(),
        "the quiet request was served while the noisy ones held and waited"
    );
    let wait = "infergate_tenant_queue_wait_seconds_sum{tenant=\"quiet\"}";
    assert_eq!(gw.metric(wait).await, 0.0, "it did not queue");
    for task in [occupier, second] {
        let reply = task.await.expect("noisy request");
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    }
}

/// `tenant`'s request of the same prompt as the others, `max_tokens` long, sent in a task.
fn send_same(url: &str, tenant: &str, max_tokens: u64) -> tokio::task::JoinHandle<Reply> {
    let (url, key) = (url.to_owned(), key_of(tenant));
    let body = completion("a request of the same length", max_tokens);
    tokio::spawn(async move { post(&url, Some(&key), &body).await })
}

/// Sends `tenant`'s request that takes the pool's only slot; returns once the engine runs it.
async fn occupy(
    engine: &Engine,
    url: &str,
    tenant: &str,
    max_tokens: u64,
) -> tokio::task::JoinHandle<Reply> {
    let occupier = send_same(url, tenant, max_tokens);
    engine
        .wait_metric("vllm:num_requests_running", Duration::from_secs(10), |v| {
            v == 1.0
        })
        .await;
    occupier
}

/// Queues `flood` (tenant names in arrival order, each waiting before the next is sent) behind
/// a request that holds the pool's only slot, lets it drain, and returns the pool's
/// `admission.jain` from `/admin/status` and `infergate_fair_share_jain_index` from `/metrics`.
async fn jain_after(fair_share: bool, flood: &[&str]) -> (serde_json::Value, f64) {
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let fair = if fair_share { ", fair_share: {}" } else { "" };
    let admission = format!("{{max_in_flight_per_worker: 1, max_queue: 200, max_wait: 60s{fair}}}");
    let gw = Gw::start(&Setup {
        workers: &[&engine.url],
        admission: Some(&admission),
        tenants: &[("a", "std"), ("b", "std"), ("c", "std")],
        tiers: "tiers:\n  std: {priority: 1}\n",
        ..Setup::default()
    })
    .await;
    let url = gw.at("/v1/completions");
    let depth = format!("infergate_queue_depth{{pool=\"{POOL}\"}}");
    // ~4 s on an L4: long enough to queue the whole flood behind it in a known order.
    let occupier = occupy(&engine, &url, "a", 60).await;
    let mut waiting = Vec::new();
    for (n, tenant) in flood.iter().enumerate() {
        waiting.push(send_same(&url, tenant, 1));
        gw.expect_metric(&depth, (n + 1) as f64, Duration::from_secs(10))
            .await;
    }
    assert!(
        !occupier.is_finished(),
        "the slot was free before the flood was queued: the order is unknown"
    );
    for task in waiting.into_iter().chain([occupier]) {
        let reply = task.await.expect("request");
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    }
    let status = gw.status().await;
    let jain = status["pools"][0]["admission"]["jain"].clone();
    let gauge = format!("infergate_fair_share_jain_index{{pool=\"{POOL}\"}}");
    (jain, gw.metric(&gauge).await)
}

/// The queue measures how evenly it serves the tenants it keeps waiting (Jain's index over a
/// window of 64 starts): first come, serving a flood in arrival order, scores low; fair share,
/// giving the same three backlogged tenants equal turns, scores 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_measures_how_evenly_it_serves_its_backlogged_tenants() {
    // First come: `a` sent four of every six; when the window closes `b` and `c` still wait.
    let flood: Vec<&str> = ["a", "a", "a", "a", "b", "c"]
        .iter()
        .copied()
        .cycle()
        .take(72)
        .collect();
    let (jain, gauge) = jain_after(false, &flood).await;
    let last = &jain["last"];
    assert_eq!(last["tenants"], 3, "{jain}");
    let index = last["index"].as_f64().expect("an index");
    assert!(index < 0.8, "first come scored {index}: {jain}");
    assert_eq!(gauge, index, "the gauge shows the last window");

    // Fair share: the same kind of flood, `b` and `c` with enough to stay backlogged.
    let flood: Vec<&str> = ["a", "a", "b", "c"]
        .iter()
        .copied()
        .cycle()
        .take(96)
        .collect();
    let (jain, gauge) = jain_after(true, &flood).await;
    assert!(jain["windows"].as_u64() >= Some(1), "{jain}");
    assert!(jain["min"].as_f64() > Some(0.95), "fair share: {jain}");
    assert!(gauge > 0.95, "{gauge}");
}

/// Which of two waiting requests a freed slot goes to: tenant `a`'s, cold, queued first and
/// first in the turn order, or `b`'s, whose prompt prefix the freed worker holds. Two workers of
/// one slot, both held by `a` (the one holding `b`'s prefix for the shorter time). Returns the
/// tenants in the order their queued requests finished.
async fn locality_order(window: u32) -> Vec<&'static str> {
    let engines = [
        Engine::start(&["--gpu", "l4"]).await,
        Engine::start(&["--gpu", "l4"]).await,
    ];
    let admission = format!(
        "{{max_in_flight_per_worker: 1, max_queue: 10, max_wait: 60s, \
         fair_share: {{locality_window: {window}}}}}"
    );
    let gw = Gw::start(&Setup {
        workers: &[&engines[0].url, &engines[1].url],
        admission: Some(&admission),
        tenants: &[("a", "std"), ("b", "std")],
        tiers: "tiers:\n  std: {priority: 1}\n",
        // The policy whose prefix index is the queue's view.
        policy: Some("prefix"),
        ..Setup::default()
    })
    .await;
    let url = gw.at("/v1/completions");
    let depth = format!("infergate_queue_depth{{pool=\"{POOL}\"}}");
    let running = || async {
        let mut n = 0.0;
        for e in &engines {
            n += e.metric_or_zero("vllm:num_requests_running").await;
        }
        n
    };
    let spawn = |tenant: &'static str, prompt: String, max_tokens: u64| {
        let (url, key) = (url.clone(), key_of(tenant));
        let body = completion(&prompt, max_tokens);
        tokio::spawn(async move { (tenant, post(&url, Some(&key), &body).await) })
    };
    let shared: String = (0..60)
        .map(|i| format!("clause{i} of the shared contract "))
        .collect();
    // `b` warms one worker with its long prefix (the router indexes it there).
    let (_, warm) = spawn("b", format!("{shared} summary one"), 1)
        .await
        .expect("warm-up");
    assert_eq!(warm.status, StatusCode::OK, "{}", warm.text);
    // `a` holds that worker (its prompt has the prefix, so it goes there) for ~2 s, and the
    // other for ~4 s. Its settled usage leaves it just ahead of `b` in the turn order.
    let near = spawn("a", format!("{shared} hold this one"), 30);
    eventually(
        "a's first request running",
        Duration::from_secs(10),
        || async { (running().await == 1.0).then_some(()) },
    )
    .await;
    let far = spawn("a", "hold the other slot".into(), 60);
    eventually("both slots held", Duration::from_secs(10), || async {
        (running().await == 2.0).then_some(())
    })
    .await;
    let cold = spawn("a", "an unrelated question about rivers".into(), 2);
    gw.expect_metric(&depth, 1.0, Duration::from_secs(10)).await;
    let hot = spawn("b", format!("{shared} summary two"), 2);
    gw.expect_metric(&depth, 2.0, Duration::from_secs(10)).await;
    assert!(
        !near.is_finished() && !far.is_finished(),
        "a slot freed before both were queued"
    );
    let mut order = Vec::new();
    let mut tasks = JoinSet::from_iter([cold, hot]);
    while let Some(done) = tasks.join_next().await {
        let (tenant, reply) = done.expect("join").expect("request");
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        order.push(tenant);
    }
    for task in [near, far] {
        let (_, reply) = task.await.expect("request");
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    }
    order
}

/// Locality within fairness, live: when `b`'s first request frees its worker, with strict turns
/// (`locality_window: 0`) the slot goes to `a`, ahead in the turn order, and `b` waits for the
/// other worker; within a window it goes to `b`, whose prefix the freed worker holds by the
/// router's own index (a cache hit instead of a cold prefill elsewhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn within_the_window_the_freed_slot_goes_to_the_request_whose_prefix_it_holds() {
    assert_eq!(locality_order(0).await, ["a", "b"], "strict turns");
    assert_eq!(
        locality_order(100_000).await,
        ["b", "a"],
        "locality within the window"
    );
}
