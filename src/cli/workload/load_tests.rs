//! Loading tests: shipped workloads, names and paths, errors with lines, trace replay, text.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

fn parse_err(yaml: &str) -> String {
    parse(yaml, Path::new("bad.yaml"), "bad", None).expect_err("must not parse")
}

/// A fresh scratch directory for this test.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("infergate-workload-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[test]
fn every_shipped_workload_loads_and_plans() {
    let o = Overrides {
        duration: Some(Duration::from_secs(20)),
        ..Overrides::default()
    };
    for name in shipped() {
        let w = load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(w.name, name);
        let plan = w.plan(&o).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(plan.len() > 10, "{name}: {} requests", plan.len());
        // Tests run in this crate's directory, two below the repository root.
        let file = format!(
            "{}/../../{WORKLOAD_DIR}/{name}.yaml",
            env!("CARGO_MANIFEST_DIR")
        );
        let by_path = load(&file).expect("by path");
        assert_eq!(by_path, w);
    }
    let chat = load("chat").expect("chat");
    assert_eq!(chat.slo.ttft, Duration::from_millis(500));
    let first = &chat.plan(&o).expect("plan")[0];
    assert!(first.prompt.len() > 1800 && first.group.is_some());
    let rag = load("rag").expect("rag").plan(&o).expect("plan");
    assert!(rag.iter().all(|r| r.prompt.len() >= 3400));
    let err = load("no-such-workload").expect_err("unknown");
    assert!(err.contains("chat") && err.contains("mixed-long"), "{err}");
}

#[test]
fn errors_name_file_and_line() {
    let unknown = parse_err("seed: 1\narrival: {poisson: {rate: 1}}\nsurprise: 3\n");
    assert!(unknown.starts_with("bad.yaml:3:"), "{unknown}");
    let nested = parse_err("arrival:\n  poisson: {rate: 1, burst: 2}\n");
    assert!(nested.starts_with("bad.yaml:2:"), "{nested}");
    let many = parse_err(
        "duration: 10 parsecs\narrival: {poisson: {rate: -1}}\n\
         prompt_tokens: {dist: gamma, mean: 1}\noutput_tokens: {dist: fixed, value: 1}\n\
         correlation: 2\n",
    );
    let lines: Vec<&str> = many.lines().collect();
    assert_eq!(lines.len(), 4, "{many}");
    for (line, what) in [
        (1, "duration"),
        (2, "rate"),
        (3, "gamma"),
        (5, "correlation"),
    ] {
        let found = lines
            .iter()
            .any(|l| l.starts_with(&format!("bad.yaml:{line}:")) && l.contains(what));
        assert!(found, "line {line} ({what}) in:\n{many}");
    }
    let two_kinds = parse_err("arrival: {poisson: {rate: 1}, closed: {concurrency: 2}}\n");
    assert!(two_kinds.contains("exactly one"), "{two_kinds}");
    let stray = parse_err(
        "arrival: {poisson: {rate: 1}}\nprompt_tokens: {dist: fixed, value: 1, sigma: 2}\n\
         output_tokens: {dist: uniform, min: 5, max: 2}\n",
    );
    assert!(
        stray.contains("bad.yaml:2:") && stray.contains("`sigma` does not apply"),
        "{stray}"
    );
    assert!(
        stray.contains("bad.yaml:3:") && stray.contains("above max"),
        "{stray}"
    );
    let closed = parse_err(
        "arrival: {closed: {concurrency: 2}}\nprompt_tokens: {dist: fixed, value: 1}\n\
         output_tokens: {dist: fixed, value: 1}\n",
    );
    assert!(closed.contains("`duration` or `requests`"), "{closed}");
    let file = scratch("bad");
    let path = file.join("typo.yaml");
    std::fs::write(&path, "name: x\narrivals: {}\n").expect("write");
    let err = load(path.to_str().expect("utf-8 path")).expect_err("typo");
    assert!(err.contains("typo.yaml:2:"), "{err}");
}

#[test]
fn trace_replay_keeps_times_tenants_and_sessions() {
    let dir = scratch("trace");
    let lines = [
        r#"{"timestamp": 0.5, "tenant": "a", "session": "x", "prompt_tokens": 100, "output_tokens": 10}"#,
        r#"{"timestamp": 0.0, "prompt": "Summarize the meeting notes.", "output_tokens": 30}"#,
        r#"{"timestamp": 2.0, "tenant": "a", "session": "x", "prompt_tokens": 150, "output_tokens": 8}"#,
        r#"{"timestamp": 3.0, "tenant": "b", "prompt_tokens": 40, "output_tokens": 4}"#,
    ];
    std::fs::write(dir.join("t.jsonl"), lines.join("\n")).expect("write trace");
    std::fs::write(dir.join("replay.yaml"), "trace: t.jsonl\nseed: 2\n").expect("write yaml");
    let w = load_file(&dir.join("replay.yaml")).expect("trace workload");
    assert_eq!(w.duration, Duration::from_millis(3001));
    let plan = w.plan(&Overrides::default()).expect("plan");
    let at: Vec<f64> = plan.iter().map(|r| r.at.as_secs_f64()).collect();
    assert_eq!(at, vec![0.0, 0.5, 2.0, 3.0]);
    assert_eq!(prompt_text(&plan[0]), "Summarize the meeting notes.");
    assert_eq!(plan[1].tenant.as_deref(), Some("a"));
    assert_eq!((plan[1].prompt.len(), plan[2].prompt.len()), (100, 150));
    assert!(
        plan[2].prompt.starts_with(&plan[1].prompt),
        "turn 2 extends turn 1"
    );
    assert_eq!(plan[3].output_tokens, 4);
    let faster = Overrides {
        rate: Some(2.0 * 4.0 / 3.0),
        ..Overrides::default()
    };
    let sped: Vec<f64> = w
        .plan(&faster)
        .expect("plan")
        .iter()
        .map(|r| r.at.as_secs_f64())
        .collect();
    assert!((sped[2] - 1.0).abs() < 1e-9, "{sped:?}");
    std::fs::write(dir.join("t.jsonl"), "{\"timestamp\": 1}\n").expect("write");
    let err = load_file(&dir.join("replay.yaml")).expect_err("bad trace");
    assert!(
        err.contains("replay.yaml:1:") && err.contains("t.jsonl:1:"),
        "{err}"
    );
}

#[test]
fn prompt_text_retokenizes_to_about_the_same_length() {
    let tokenizer = infergate_engine::tokenizer::SimTokenizer::shared().expect("tokenizer");
    let o = Overrides {
        duration: Some(Duration::from_secs(5)),
        ..Overrides::default()
    };
    for r in load("chat")
        .expect("chat")
        .plan(&o)
        .expect("plan")
        .iter()
        .take(5)
    {
        let text = prompt_text(r);
        let n = tokenizer.encode(&text).len() as f64;
        let want = r.prompt.len() as f64;
        assert!((n - want).abs() <= 0.1 * want, "{n} tokens, planned {want}");
    }
}

/// Tokens the engine's ChatML template adds around one user message (as the simulator counts).
fn chat_wrap() -> usize {
    let tok = infergate_engine::tokenizer::SimTokenizer::shared().expect("tokenizer");
    tok.encode("<|im_start|>user\n").len() + tok.encode("<|im_end|>\n<|im_start|>assistant\n").len()
}

#[test]
fn shipped_workloads_fit_the_default_model_except_mixed_long_summaries() {
    let context = infergate_engine::presets::model("llama-3-8b")
        .expect("preset")
        .max_model_len;
    let longest = |name: &str, seed: u64| {
        let o = Overrides {
            duration: Some(Duration::from_secs(600)),
            seed: Some(seed),
            ..Overrides::default()
        };
        let plan = load(name).expect("shipped").plan(&o).expect("plan");
        let need = |r: &PlannedRequest| r.prompt.len() + chat_wrap() + r.output_tokens as usize;
        let over = plan.iter().filter(|r| need(r) > context).count();
        (plan.iter().map(need).max().unwrap_or(0), over, plan.len())
    };
    // These carry 30k-token prompts on purpose (mixed-long's summaries; the itl-freeze and
    // long-context scenarios): they are served by a 32k model.
    let long_context = ["mixed-long", "itl-freeze", "long-context"];
    for name in shipped().filter(|n| !long_context.contains(n)) {
        for seed in [1, 2] {
            let (max, over, n) = longest(name, seed);
            assert_eq!(
                over, 0,
                "{name} seed {seed}: {over} of {n} over {context} (max {max})"
            );
        }
    }
    // rag's requests stay long (the retrieved context alone is 3,000 to 5,000 tokens) under its
    // bound of about 8,060 tokens.
    let (max, _, _) = longest("rag", 1);
    assert!(max > 5400 && max <= 8062, "rag's longest request {max}");
    // mixed-long's summaries need a 32k model (mistral-7b), and fit it.
    let (max, over, n) = longest("mixed-long", 1);
    let long = infergate_engine::presets::model("mistral-7b")
        .expect("preset")
        .max_model_len;
    assert!(over > 0 && over * 20 < n, "{over} of {n}");
    assert!(max <= long, "{max} > {long}");
}
