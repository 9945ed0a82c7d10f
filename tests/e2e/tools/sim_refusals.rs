//! The simulator refuses what the live path refuses: one seeded workload whose prompts straddle
//! the default model's 8,192-token context, replayed live by `infergate bench` against
//! `infergate up` (the embedded config: gateway plus sim engine workers) and run offline by
//! `infergate sim` with the same defaults. Both see the same planned requests, so the 400s
//! (prompts over the gateway's `max_context`, and prompt + `max_tokens` over the engines'
//! context) must agree up to tokenizer rounding at the boundary.

use crate::common;
use crate::tools_support;

use std::time::Duration;

use common::gateway::{Gateway, TempDir};
use infergate_cli::workload::{self, Overrides};
use tools_support::{ShortWorkload, report_of, shared_machine};

/// ~25 requests over 10 s; prompts uniform in 2,000..12,000 tokens with 1,024-token answers:
/// prompts over ~8,190 tokens exceed the gateway's `max_context` (about 38%), and those over
/// ~7,150 leave no room for the answer in the engines' context (about 10% more).
const STRADDLING: ShortWorkload = ShortWorkload {
    rate: 3.0,
    seconds: 10,
    prompt: (2000, 12000),
    output: 1024,
    seed: 37,
};

#[tokio::test]
async fn sim_and_live_refuse_the_same_over_context_requests() {
    let _machine = shared_machine().await;
    let dir = TempDir::new("sim-refusals");
    let path = STRADDLING.write(&dir.path, "straddling");
    let path_s = path.to_string_lossy().into_owned();
    let planned = workload::load_file(&path)
        .and_then(|w| w.plan(&Overrides::default()))
        .expect("plan the workload");
    // What the plan alone says, with the chat template's 14 tokens: the expected refusals.
    let need = |r: &workload::PlannedRequest| r.prompt.len() + 14 + r.output_tokens as usize;
    let expected = planned.iter().filter(|r| need(r) > 8192).count() as u64;
    assert!(
        expected > 2 && expected + 2 < planned.len() as u64,
        "{expected} of {} planned over the context",
        planned.len()
    );

    let sim = ["sim", "--workload", &path_s, "--workers", "2"];
    let sim = report_of(&dir.path, "sim", &sim, Duration::from_secs(60)).await;

    let gw = Gateway::up(None).await;
    let key = gw.api_key.clone().expect("up prints a demo key");
    let bench = [
        "bench",
        "--url",
        &gw.url,
        "--api-key",
        &key,
        "--workload",
        &path_s,
        "--quiet",
    ];
    let limit = Duration::from_secs(u64::from(STRADDLING.seconds) + 90);
    let live = report_of(&dir.path, "live", &bench, limit).await;
    drop(gw);

    let numbers = format!(
        "planned {} (over the context: {expected})\n\
         live: requests {} ok {} 4xx {} 429 {} 5xx {}\n\
         sim:  requests {} ok {} 4xx {} 429 {} 5xx {} · extra {:?}",
        planned.len(),
        live.requests,
        live.ok,
        live.client_errors,
        live.rate_limited,
        live.server_errors,
        sim.requests,
        sim.ok,
        sim.client_errors,
        sim.rate_limited,
        sim.server_errors,
        sim.extra
    );
    println!("{numbers}");
    assert_eq!(live.requests, planned.len() as u64, "{numbers}");
    assert_eq!(sim.requests, live.requests, "{numbers}");
    assert_eq!(
        (live.rate_limited, live.server_errors),
        (0, 0),
        "only context refusals are expected{numbers}"
    );
    assert_eq!((sim.rate_limited, sim.server_errors), (0, 0), "{numbers}");
    assert!(
        live.client_errors > 0 && sim.client_errors > 0,
        "both refuse some{numbers}"
    );
    // Same requests on both sides: only a prompt within a token or two of a limit may land
    // differently (the gateway and the engine re-tokenize the prompt text).
    let diff = live.client_errors.abs_diff(sim.client_errors);
    assert!(diff <= 1, "400s differ by {diff}{numbers}");
    assert!(
        expected.abs_diff(sim.client_errors) <= 1,
        "the simulator refuses what the plan puts over the context{numbers}"
    );
    // Both of the simulator's checks took part: the gateway's and the engines'.
    let gateway = sim.extra.get("gateway_refused_context").copied();
    let engine = sim.extra.get("engine_refused_context").copied();
    assert!(
        gateway.is_some_and(|n| n > 0.0) && engine.is_some_and(|n| n > 0.0),
        "{numbers}"
    );
    assert_eq!(live.ok + live.client_errors, live.requests, "{numbers}");
}
