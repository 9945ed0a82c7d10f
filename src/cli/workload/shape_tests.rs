//! Tests of request content: prefix groups, multi-turn sessions, tenant mix, request classes.

use std::collections::HashMap;

use super::tests::{within_3_sigma, workload};
use super::*;

const LENGTHS: &str = "prompt_tokens: {dist: fixed, value: 20}\n\
                       output_tokens: {dist: fixed, value: 5}\n";

fn plan_of(yaml: &str) -> Vec<PlannedRequest> {
    workload(yaml).plan(&Overrides::default()).expect("plan")
}

#[test]
fn group_prefixes_are_shared_within_and_differ_across() {
    let plan = plan_of(&format!(
        "seed: 4\nduration: 100s\narrival: {{poisson: {{rate: 10}}}}\n{LENGTHS}\
         prefix_groups: {{count: 4, tokens: 50, zipf: 1.0, share: 0.5}}\n"
    ));
    let mut prefixes: HashMap<usize, &[u32]> = HashMap::new();
    let mut per_group = [0usize; 4];
    let mut without = 0;
    for r in &plan {
        let Some(g) = r.group else {
            without += 1;
            assert_eq!(r.prompt.len(), 20);
            continue;
        };
        per_group[g] += 1;
        assert_eq!(r.prompt.len(), 70);
        let prefix = &r.prompt[..50];
        assert_eq!(*prefixes.entry(g).or_insert(prefix), prefix, "group {g}");
    }
    assert_eq!(prefixes.len(), 4);
    let distinct: std::collections::HashSet<_> = prefixes.values().collect();
    assert_eq!(distinct.len(), 4, "every group has its own prefix");
    within_3_sigma(without, plan.len() as f64 * 0.5);
    assert!(per_group.windows(2).all(|w| w[0] > w[1]), "{per_group:?}");
    // The same seed gives the same prefix to a group regardless of the rest of the plan.
    let other = plan_of(&format!(
        "seed: 4\nduration: 5s\narrival: {{poisson: {{rate: 3}}}}\n{LENGTHS}\
         prefix_groups: {{count: 4, tokens: 50}}\n"
    ));
    let r = other
        .iter()
        .find(|r| r.group == Some(0))
        .expect("group 0 used");
    assert_eq!(&r.prompt[..50], prefixes[&0]);
}

#[test]
fn session_turns_grow_and_share_prefixes() {
    let plan = plan_of(&format!(
        "seed: 8\nduration: 60s\narrival: {{poisson: {{rate: 5}}}}\n{LENGTHS}\
         prefix_groups: {{count: 2, tokens: 30}}\n\
         sessions: {{count: 5, turns: {{dist: uniform, min: 2, max: 5}}, \
         first_turn: {{dist: fixed, value: 100}}}}\n"
    ));
    let mut by_session: HashMap<&str, Vec<&PlannedRequest>> = HashMap::new();
    for r in &plan {
        by_session
            .entry(r.session.as_deref().expect("every request is a turn"))
            .or_default()
            .push(r);
    }
    let mut multi_turn = 0;
    for turns in by_session.values() {
        assert!(turns.len() <= 5);
        assert_eq!(
            turns[0].prompt.len(),
            30 + 100,
            "first turn: prefix + document"
        );
        let group = turns[0].group.expect("share defaults to 1");
        assert!(turns.iter().all(|t| t.group == Some(group)));
        for pair in turns.windows(2) {
            let (prev, next) = (pair[0], pair[1]);
            assert!(next.prompt.starts_with(&prev.prompt));
            let grown = prev.prompt.len() + prev.output_tokens as usize + 20;
            assert_eq!(next.prompt.len(), grown);
            multi_turn += 1;
        }
    }
    assert!(multi_turn > 50, "{multi_turn} follow-up turns");
    assert!(by_session.len() > 10);
}

#[test]
fn tenant_mix_follows_weights() {
    let plan = plan_of(&format!(
        "duration: 100s\narrival: {{poisson: {{rate: 30}}}}\n{LENGTHS}\
         tenants: [{{name: free, weight: 0.8}}, {{name: paid, weight: 0.2}}]\n"
    ));
    let paid = plan
        .iter()
        .filter(|r| r.tenant.as_deref() == Some("paid"))
        .count();
    let free = plan
        .iter()
        .filter(|r| r.tenant.as_deref() == Some("free"))
        .count();
    assert_eq!(paid + free, plan.len());
    let n = plan.len() as f64;
    let sigma = (n * 0.2 * 0.8).sqrt();
    assert!((paid as f64 - 0.2 * n).abs() < 3.0 * sigma, "{paid} of {n}");
    let none = plan_of(&format!("arrival: {{poisson: {{rate: 3}}}}\n{LENGTHS}"));
    assert!(none.iter().all(|r| r.tenant.is_none() && r.group.is_none()));
}

#[test]
fn request_classes_keep_prompt_and_output_together() {
    let w = load("mixed-long").expect("mixed-long loads");
    let plan = w.plan(&Overrides::default()).expect("plan");
    let long: Vec<_> = plan.iter().filter(|r| r.prompt.len() >= 28_000).collect();
    within_3_sigma(long.len(), plan.len() as f64 * 0.02);
    assert!(long.iter().all(|r| r.output_tokens == 500));
    let short = plan.len() - long.len();
    let mean = plan
        .iter()
        .filter(|r| r.prompt.len() < 28_000)
        .map(|r| r.prompt.len() as f64)
        .sum::<f64>()
        / short as f64;
    assert!((mean - 300.0).abs() < 30.0, "short prompts mean {mean}");
}
