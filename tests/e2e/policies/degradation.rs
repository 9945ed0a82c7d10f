//! Graded degradation end to end: a real gateway in front of a real sim engine that serves one
//! request at a time, so the number of flood clients sets the queue depth the policy reads.
//! A growing flood raises the level one step at a time, each level's action shows in the free
//! tier's answers while paid is served untouched, and the end of the flood lowers the level in
//! reverse order; a queue held inside the hysteresis band never moves the level; the admin
//! override pins a level and its release steps back down; a reloaded policy takes effect while
//! serving, `config check` names an unknown tier, and a pool whose policy a reload removes reads
//! as normal again.

use crate::common;
use crate::degradation_support;
use crate::tenant_support;

use std::time::Duration;

use hyper::StatusCode;
use serde_json::json;

use common::Engine;
use common::gateway::eventually;
use degradation_support::{
    BANDS, DWELL, Degraded, FREE, FREE_CAP, Flood, Observer, PAID, SETTLE, WINDOW,
    assert_single_steps, completion_tokens, long_prompt, policy,
};
use tenant_support::{POOL, Reply};

/// A prompt far below level 2's limit.
const SHORT: &str = "Say hello.";
/// The policy's tick.
const TICK: Duration = Duration::from_millis(100);

/// The `error.message` of an error answer.
fn message(reply: &Reply) -> String {
    let json = reply.json();
    json["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error.message in {json}"))
        .to_owned()
}

/// Asserts a 200 whose `max_tokens` degradation lowered to [`FREE_CAP`].
fn assert_capped(reply: &Reply) {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(
        reply.header("x-infergate-degraded"),
        Some("cap_max_tokens"),
        "{:?}",
        reply.headers
    );
    // The request asked for 100 with `ignore_eos`: exactly the cap comes back.
    assert_eq!(completion_tokens(reply), FREE_CAP, "{}", reply.text);
}

/// Asserts a 200 that degradation did not touch, with all `max_tokens` completion tokens.
fn assert_untouched(reply: &Reply, max_tokens: u64) {
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    assert_eq!(
        reply.header("x-infergate-degraded"),
        None,
        "{:?}",
        reply.headers
    );
    assert_eq!(completion_tokens(reply), max_tokens, "{}", reply.text);
}

/// Asserts a shed answer: 429, Retry-After, `x-infergate-degraded: shed`, the level named.
fn assert_shed(reply: &Reply) {
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.text
    );
    assert_eq!(reply.header("x-infergate-degraded"), Some("shed"));
    assert!(reply.header_u64("retry-after") >= 1);
    let message = message(reply);
    for needle in ["degraded", "level 3", "shed_free", "`free`"] {
        assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_raises_the_level_step_by_step_and_its_end_lowers_it_in_reverse() {
    let engine = Engine::start(&[]).await;
    let d = Degraded::start(&engine.url, &policy(BANDS)).await;
    let observer = Observer::start(&d.gw).await;
    let mut flood = Flood::new(&d.gw);

    // Level 1 `cap_free`: three clients keep two waiting (enter 2).
    flood.resize(3);
    observer.wait_level(1).await;
    assert_capped(&d.ask(FREE, SHORT, 100).await);
    assert_eq!(observer.levels(), [0, 1]);

    // Level 2 `refuse_long`: six clients keep five waiting (enter 5).
    flood.resize(6);
    observer.wait_level(2).await;
    let long = d.ask(FREE, &long_prompt(), 10).await;
    assert_eq!(
        long.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        long.text
    );
    assert!(long.header_u64("retry-after") >= 1);
    let refusal = message(&long);
    for needle in ["degraded", "level 2", "refuse_long", "`free`", "50 tokens"] {
        assert!(refusal.contains(needle), "{refusal:?} lacks {needle:?}");
    }
    // A short free prompt still passes, with level 1's cap still on it.
    assert_capped(&d.ask(FREE, SHORT, 100).await);
    assert_eq!(observer.levels(), [0, 1, 2]);

    // Level 3 `shed_free`: nine clients keep eight waiting (enter 8). Free is shed; paid, which
    // no level names, waits its turn and is served whole.
    flood.resize(9);
    observer.wait_level(3).await;
    assert_shed(&d.ask(FREE, SHORT, 100).await);
    assert_untouched(&d.ask(PAID, SHORT, 16).await, 16);
    assert_eq!(observer.levels(), [0, 1, 2, 3]);
    assert_eq!(d.transitions("up").await, 3.0);
    assert_eq!(d.level_gauge().await, 3.0);

    // The flood ends: down one level at a time, in reverse order.
    let served = flood.ok();
    assert_eq!(
        flood.failures(),
        Vec::<String>::new(),
        "paid is never degraded"
    );
    flood.resize(0);
    observer.wait_level(0).await;
    assert_eq!(observer.levels(), [0, 1, 2, 3, 2, 1, 0]);
    assert_single_steps(&observer.seen());
    assert_eq!(d.transitions("down").await, 3.0);
    assert_eq!(d.transitions("up").await, 3.0);
    assert_eq!(d.level_gauge().await, 0.0);
    assert!(served > 0);

    // Every altered answer was counted, and every level change logged.
    assert_eq!(d.degraded("cap_max_tokens").await, 2.0);
    assert_eq!(d.degraded("refuse_long_prompts").await, 1.0);
    assert_eq!(d.degraded("shed").await, 1.0);
    assert_eq!(d.logged_changes(), 6, "{}", d.gw.stderr());
    // Back to normal: free is served whole again.
    assert_untouched(&d.ask(FREE, SHORT, 20).await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_held_inside_the_hysteresis_band_never_moves_the_level() {
    let engine = Engine::start(&[]).await;
    let d = Degraded::start(&engine.url, &policy(BANDS)).await;
    let observer = Observer::start(&d.gw).await;
    let mut flood = Flood::new(&d.gw);
    let depth = || async { d.state().await["signals"]["queue_depth"].as_u64() };

    // Two waiting: exactly level 1's entry, above its exit (1), below level 2's entry (5).
    flood.resize(3);
    observer.wait_level(1).await;
    let held = observer.hold(WINDOW + 10 * TICK).await;
    assert_eq!(held.level, 1);
    let q = depth().await;
    assert!(q.is_some_and(|q| (1..5).contains(&q)), "depth {q:?}");

    // Level 2, then three waiting: under level 2's entry (5) but not under its exit (3).
    flood.resize(6);
    observer.wait_level(2).await;
    flood.resize(4);
    eventually(
        "the window to forget the six-client depths",
        SETTLE,
        || async { depth().await.filter(|&q| q < 5).map(|_| ()) },
    )
    .await;
    let held = observer.hold(WINDOW + 5 * TICK).await;
    assert_eq!(held.level, 2);
    let q = depth().await;
    assert!(q.is_some_and(|q| (3..5).contains(&q)), "depth {q:?}");

    // Below the band the level does come down: the hold above was hysteresis, not a stall.
    flood.resize(2);
    observer.wait_level(1).await;
    flood.resize(0);
    observer.wait_level(0).await;
    assert_eq!(observer.levels(), [0, 1, 2, 1, 0]);
    assert_single_steps(&observer.seen());
    assert_eq!(flood.failures(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_override_pins_a_level_and_its_release_steps_back_down() {
    let engine = Engine::start(&[]).await;
    let d = Degraded::start(&engine.url, &policy(BANDS)).await;
    let observer = Observer::start(&d.gw).await;

    let (status, body) = d.force(3).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((&body["level"], &body["forced"]), (&json!(3), &json!(3)));
    // No load at all, yet free is shed at once and paid is served untouched.
    assert_shed(&d.ask(FREE, SHORT, 10).await);
    assert_untouched(&d.ask(PAID, SHORT, 10).await, 10);
    let state = d.state().await;
    assert_eq!(state["level"], 3, "{state}");
    assert_eq!(state["forced"], 3, "{state}");
    assert_eq!(state["name"], "shed_free", "{state}");
    assert_eq!(state["levels"], 3, "{state}");
    assert_eq!(d.transitions("up").await, 1.0);
    assert_eq!(d.level_gauge().await, 3.0);

    // The override holds well past the dwell although the empty queue would step it down.
    observer.hold(WINDOW + 3 * DWELL).await;

    let (status, body) = d.release().await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["forced"], serde_json::Value::Null, "{body}");
    observer.wait_level(0).await;
    assert_eq!(observer.levels(), [0, 3, 2, 1, 0]);
    assert_single_steps(&observer.seen()[1..]);
    assert_eq!(d.transitions("down").await, 3.0);
    assert_eq!(d.level_gauge().await, 0.0);
    assert_untouched(&d.ask(FREE, SHORT, 20).await, 20);

    // A level past the policy's last is refused and changes nothing.
    let (status, body) = d.force(4).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let refused = body["error"]["message"].as_str().unwrap_or_default();
    assert!(refused.contains("level 4"), "{body}");
    assert!(refused.contains("3 levels"), "{body}");
    let (status, body) = d
        .admin_post(
            "/admin/degradation/force",
            &json!({"pool": "nope", "level": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let state = d.state().await;
    assert_eq!(
        (&state["level"], &state["forced"]),
        (&json!(0), &json!(null))
    );
    assert_eq!(observer.levels(), [0, 3, 2, 1, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_policy_takes_effect_while_serving_and_an_unknown_tier_is_refused() {
    let engine = Engine::start(&[]).await;
    let d = Degraded::start(&engine.url, &policy(BANDS)).await;
    let observer = Observer::start(&d.gw).await;
    let mut flood = Flood::new(&d.gw);
    let depth = || async { d.state().await["signals"]["queue_depth"].as_u64() };

    // Three waiting: level 1 under the shipped bands.
    flood.resize(4);
    observer.wait_level(1).await;

    // Level 1 now needs 20 waiting (and the third level is gone): the same flood is normal load.
    let full = policy([(20, 10), (40, 20), (60, 30)]);
    let (raised, _) = full
        .split_once("      - name: shed_free")
        .expect("a third level");
    d.write_policy(raised);
    let (status, body) = d.reload().await;
    assert_eq!(status, StatusCode::OK, "{body}");
    eventually("the reloaded policy in force", SETTLE, || async {
        (d.state().await["levels"] == 2).then_some(())
    })
    .await;
    let served_before = flood.ok();
    observer.wait_level(0).await;
    observer.hold(WINDOW + 5 * TICK).await;
    let q = depth().await;
    assert!(
        q.is_some_and(|q| q >= 2),
        "the flood must still queue: {q:?}"
    );
    assert_untouched(&d.ask(FREE, SHORT, 20).await, 20);
    assert!(flood.ok() > served_before, "the flood kept being served");
    assert_eq!(flood.failures(), Vec::<String>::new());
    assert_eq!(observer.levels(), [0, 1, 0]);

    let (code, text) = d.config_check().await;
    assert_eq!(code, Some(0), "config check of the good policy: {text}");

    // A tier tenants.yaml does not define: `config check` exits 1 naming it and the file; a
    // reload is refused and the policy in force stays.
    d.write_policy(&raised.replace("tiers: [free], max_tokens", "tiers: [gold], max_tokens"));
    let (code, text) = d.config_check().await;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("unknown tier `gold`"), "{text}");
    assert!(text.contains("degradation.yaml"), "{text}");
    let (status, body) = d.reload().await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.to_string().contains("`gold`"), "{body}");
    let state = d.state().await;
    assert_eq!((&state["levels"], &state["level"]), (&json!(2), &json!(0)));
    assert_eq!(flood.failures(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_removes_the_pools_policy_returns_it_to_normal() {
    let engine = Engine::start(&[]).await;
    // A long dwell, so that nothing but the reload can take the pool off level 2 in this test.
    let slow = policy(BANDS).replace("min_dwell: 300ms", "min_dwell: 60s");
    let d = Degraded::start(&engine.url, &slow).await;
    let (status, body) = d.force(2).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = d.release().await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(d.state().await["level"], 2);

    // The pool leaves the policy file: it is never degraded any more, and says so.
    d.write_policy("pools: {}\n");
    let (status, body) = d.reload().await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_untouched(&d.ask(FREE, &long_prompt(), 20).await, 20);
    let mut last = (serde_json::Value::Null, 0.0);
    // A few ticks are plenty: the reload itself is done.
    let settled = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            last = (d.state().await, d.level_gauge().await);
            if last.0["level"] == 0 && last.1 == 0.0 {
                return;
            }
            tokio::time::sleep(TICK).await;
        }
    })
    .await;
    assert!(
        settled.is_ok(),
        "a pool without a policy still reads as degraded: admin {} and level gauge {}",
        last.0,
        last.1
    );
}

#[tokio::test]
async fn the_fallback_action_sends_a_tier_to_the_other_model() {
    let engine = Engine::start(&["--gpu", "h100"]).await;
    // One level, entered only by the admin here: free requests go to the small model.
    let policy = format!(
        "pools:\n  {POOL}:\n    window: 1s\n    tick: 100ms\n    levels:\n      - name: fallback_free\n        \
         enter: {{queue_depth: 1000}}\n        exit: {{queue_depth: 500}}\n        min_dwell: 0s\n        \
         actions:\n          - fallback: {{tiers: [free], model: small-model}}\n"
    );
    let d = Degraded::start_with(&engine.url, &policy, &["small-model"]).await;
    let (status, state) = d.force(1).await;
    assert_eq!(status, StatusCode::OK, "{state}");

    let free = d.ask(FREE, "Hello there", 4).await;
    assert_eq!(free.status, StatusCode::OK, "{}", free.text);
    assert_eq!(
        free.headers
            .get("x-infergate-degraded")
            .map(|v| v.to_str().unwrap()),
        Some("fallback"),
        "{:?}",
        free.headers
    );
    let paid = d.ask(PAID, "Hello there", 4).await;
    assert_eq!(paid.status, StatusCode::OK, "{}", paid.text);
    assert!(
        paid.headers.get("x-infergate-degraded").is_none(),
        "{:?}",
        paid.headers
    );
    assert_eq!(d.degraded("fallback").await, 1.0);
    let served =
        d.gw.metric(&format!(
            "infergate_requests_total{{model=\"small-model\",pool=\"{POOL}\",status=\"200\"}}"
        ))
        .await;
    assert_eq!(
        served, 1.0,
        "the free request is accounted under the fallback model"
    );
}
