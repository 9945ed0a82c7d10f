//! Parsing and validation of `policies/degradation.yaml`.

use std::time::Duration;

use super::*;
use crate::degrade::Actions;

/// A one-pool file whose single level has the given YAML body (indented under `- `).
fn one_level(level: &str) -> String {
    format!("pools:\n  local:\n    levels:\n      - {level}\n")
}

/// The errors of a text that must not validate.
fn errors(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(p) => panic!("validated: {p:?}"),
        Err(e) => e,
    }
}

#[test]
fn the_shipped_file_validates_and_protects_paid_longest() {
    let pools = parse(include_str!("../../policies/degradation.yaml")).expect("valid");
    let local = &pools["local"];
    assert_eq!(local.window, Duration::from_secs(10));
    assert_eq!(local.tick, Duration::from_secs(1));
    assert_eq!(local.levels.len(), 3);
    let at = |level| Actions::at(local, level);
    assert!(at(1).for_tier("free").cap_max_tokens.is_some());
    assert!(!at(1).for_tier("paid").is_degraded());
    assert!(at(2).for_tier("free").max_prompt_tokens.is_some());
    assert!(at(2).for_tier("paid").cap_max_tokens.is_some());
    assert!(at(3).for_tier("free").shed);
    assert!(!at(3).for_tier("paid").shed);
    assert!(!at(3).for_tier("enterprise").is_degraded());
}

#[test]
fn defaults_fill_window_tick_and_dwell() {
    let text = one_level("{name: a, enter: {queue_depth: 10}, exit: {queue_depth: 5}}");
    let pools = parse(&text).expect("valid");
    let p = &pools["local"];
    assert_eq!((p.window, p.tick), (DEFAULT_WINDOW, DEFAULT_TICK));
    assert_eq!(p.levels[0].min_dwell, DEFAULT_MIN_DWELL);
    assert!(p.levels[0].actions.is_empty());
    assert_eq!(p.levels[0].enter.signals(), ["queue_depth"]);
}

#[test]
fn every_action_shape_parses() {
    let text = one_level(
        "name: a\n        enter: {kv_usage: 0.9, ttft_p95: 2s}\n        exit: {kv_usage: 0.9, \
         ttft_p95: 250ms}\n        min_dwell: 0s\n        actions:\n          - cap_max_tokens: \
         {tiers: [free], max_tokens: 64}\n          - refuse_long_prompts: {tiers: [free], \
         max_prompt_tokens: 100}\n          - fallback: {tiers: [free, paid], model: small}\n          \
         - shed: {tiers: [free]}",
    );
    let pools = parse(&text).expect("valid");
    let level = &pools["local"].levels[0];
    assert_eq!(level.min_dwell, Duration::ZERO);
    assert_eq!(level.exit.ttft_p95, Some(Duration::from_millis(250)));
    let labels: Vec<&str> = level.actions.iter().map(Action::label).collect();
    assert_eq!(
        labels,
        ["cap_max_tokens", "refuse_long_prompts", "fallback", "shed"]
    );
}

#[test]
fn exit_above_entry_is_refused_per_signal() {
    let text = one_level(
        "{name: a, enter: {queue_depth: 10, kv_usage: 0.8, queue_wait_p95: 1s}, \
         exit: {queue_depth: 11, kv_usage: 0.8, queue_wait_p95: 2s}}",
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(errs[0].starts_with("pool `local` level 1 `a`: exit.queue_depth 11 is above"));
    assert!(errs[1].contains("exit.queue_wait_p95 2s is above enter.queue_wait_p95 1s"));
}

#[test]
fn every_error_is_reported_at_once() {
    let text = "pools:\n  local:\n    window: 1s\n    tick: 2s\n    levels:\n      \
                - {name: a, enter: {}, exit: {kv_usage: 0.5}, min_dwell: soon, actions: \
                [{shed: {tiers: []}}, {cap_max_tokens: {tiers: [free], max_tokens: 0}}]}\n      \
                - {name: a, enter: {kv_usage: 1.5, ttft_p95: 3}, exit: {kv_usage: 0.5}}\n  \
                other:\n    levels: []\n";
    let errs = errors(text);
    let expect = [
        "pool `local`: tick 2s is longer than window 1s",
        "level 1 `a`: enter gives no threshold",
        "level 1 `a`: exit.kv_usage has no matching enter.kv_usage",
        "level 1 `a`: min_dwell: `soon` is not a duration",
        "level 1 `a` action 1 (shed): tiers is empty",
        "level 1 `a` action 2 (cap_max_tokens): max_tokens must be ≥ 1",
        "level 2 `a`: enter.kv_usage 1.5 is outside 0..=1",
        "level 2 `a`: enter.ttft_p95: duration `3` has no unit",
        "level 2 `a`: exit gives no ttft_p95 threshold",
        "level 2: name `a` is used twice",
        "pool `other`: levels is empty",
    ];
    for e in expect {
        assert!(
            errs.iter().any(|m| m.contains(e)),
            "missing {e:?} in {errs:#?}"
        );
    }
    assert_eq!(errs.len(), expect.len(), "{errs:#?}");
}

#[test]
fn unknown_keys_and_actions_are_yaml_errors() {
    for bad in [
        "pools: {local: {levels: [], windo: 1s}}",
        "pools:\n  local:\n    levels:\n      - {name: a, enter: {queue_depth: 1}, exit: \
         {queue_depth: 1}, actions: [{throttle: {tiers: [free]}}]}\n",
        "pools:\n  local:\n    levels:\n      - {name: a, enter: {depth: 1}, exit: {}}\n",
    ] {
        assert_eq!(errors(bad).len(), 1, "{bad}");
    }
}

#[test]
fn durations_in_every_unit() {
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration(" 2s "), Ok(Duration::from_secs(2)));
    assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    for bad in ["", "s", "10", "-1s", "3d", "1e400h"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}
