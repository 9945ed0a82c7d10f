//! Tests that every kind of config error is reported with its file and line, all at once.

use super::tests::{MINIMAL, errors, load_both, one_error};

#[test]
fn a_broken_yaml_file_reports_its_line() {
    let errs = errors("models: []\npools:\n  - name: [p\n", None);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].0, "infergate.yaml");
    assert!(errs[0].1.is_some_and(|l| l >= 3), "{errs:?}");
    let errs = errors(MINIMAL, Some("pools:\n  p: {policy: prefix\n"));
    assert_eq!(
        (errs[0].0.as_str(), errs.len()),
        ("routing.yaml", 1),
        "{errs:?}"
    );
    assert!(errs[0].1.is_some_and(|l| l >= 2), "{errs:?}");
}

#[test]
fn schema_errors_report_their_line() {
    one_error(&format!("{MINIMAL}bogus: 1\n"), 7, "unknown field `bogus`");
    one_error(&format!("health: {{eject_after: -1}}\n{MINIMAL}"), 1, "u32");
    one_error(&format!("log: {{format: xml}}\n{MINIMAL}"), 1, "xml");
    one_error("pools: []\n", 1, "models");
    one_error(
        &format!("usage_check:\n  prompt_ratio: 0.5\n{MINIMAL}"),
        2,
        "usage_check.prompt_ratio must be a number ≥ 1",
    );
}

#[test]
fn value_errors_report_their_line() {
    one_error(
        &format!("listen: localhost:80\n{MINIMAL}"),
        1,
        "not a socket address",
    );
    one_error(
        &format!("\nhealth:\n  timeout: 10\n{MINIMAL}"),
        3,
        "no unit",
    );
    one_error(
        &format!("health:\n  poll_interval: 0ms\n{MINIMAL}"),
        2,
        "greater than zero",
    );
    one_error(
        &format!("forward: {{total_timeout: 5x}}\n{MINIMAL}"),
        1,
        "has an unknown unit",
    );
    one_error(
        &format!("limits: {{max_body_bytes: 0}}\n{MINIMAL}"),
        1,
        "max_body_bytes",
    );
    one_error(
        &format!("limits:\n  max_requests_in_flight: 0\n{MINIMAL}"),
        2,
        "limits.max_requests_in_flight must be ≥ 1",
    );
    one_error(
        &MINIMAL.replace("http://127.0.0.1:9000/", "ftp://x"),
        6,
        "http or https",
    );
    one_error(
        &MINIMAL.replace("url: http://127.0.0.1:9000/", "spawn: {count: 0}"),
        6,
        "count",
    );
    let dns = "dns: {name: w.svc, port: 8000, interval: 1y}";
    one_error(
        &MINIMAL.replace("url: http://127.0.0.1:9000/", dns),
        6,
        "dns interval",
    );
}

#[test]
fn reference_errors_report_their_line() {
    one_error(
        &MINIMAL.replace("pool: p}", "pool: q}"),
        2,
        "unknown pool `q`",
    );
    let dup_model = MINIMAL.replace("pools:", "  - {name: m, pool: p}\npools:");
    one_error(&dup_model, 3, "duplicate model name `m` (first on line 2)");
    let dup_pool = format!("{MINIMAL}  - name: p\n    workers: [{{url: http://x}}]\n");
    one_error(&dup_pool, 7, "duplicate pool name `p`");
    one_error(
        "models: []\npools:\n  - name: empty\n    workers: []\n",
        3,
        "no workers",
    );
}

#[test]
fn admin_and_tls_errors_report_their_line() {
    let open = format!("admin:\n  listen: 0.0.0.0:8081\n{MINIMAL}");
    one_error(&open, 2, "api_key_env");
    let unset = "INFERGATE_TEST_UNSET_ADMIN_KEY_7f3a";
    one_error(
        &format!("admin: {{api_key_env: {unset}}}\n{MINIMAL}"),
        1,
        "is not set",
    );
    let keyed = format!("admin:\n  listen: 0.0.0.0:8081\n  api_key_env: PATH\n{MINIMAL}");
    let snap = load_both(&keyed, None).expect("PATH is always set");
    assert!(snap.admin.api_key.is_some());
    let errs = errors(
        &format!("\ntls: {{cert: nope.pem, key: nope.key}}\n{MINIMAL}"),
        None,
    );
    assert_eq!(
        errs.iter().map(|e| e.1).collect::<Vec<_>>(),
        [Some(2), Some(2)]
    );
    assert!(
        errs[0].2.contains("tls.cert") && errs[1].2.contains("tls.key"),
        "{errs:?}"
    );
}

#[test]
fn routing_errors_report_their_line() {
    let routing = "\
pools:
  p:
    policy: prefix
    load_factor: 1.5
    balance_tolerance: -1
    index_capacity: 0
  ghost: {policy: least_load}
  q2: {policy: round_robin, balance_tolerance: 2}
";
    let config = format!("{MINIMAL}  - name: q2\n    workers: [{{url: http://x}}]\n");
    let errs = errors(&config, Some(routing));
    let lines: Vec<_> = errs.iter().map(|e| (e.0.as_str(), e.1)).collect();
    let expected = [4, 5, 6, 7, 8].map(|l| ("routing.yaml", Some(l)));
    assert_eq!(lines, expected, "{errs:#?}");
    assert!(
        errs[0].2.contains("`load_factor` was removed") && errs[0].2.contains("balance_tolerance"),
        "{errs:?}"
    );
    assert!(
        errs[1]
            .2
            .contains("balance_tolerance must be a number in [0, 10], got -1")
    );
    assert!(
        errs[2].2.contains("`index_capacity` was removed")
            && errs[2].2.contains("default_worker_kv_tokens")
    );
    assert!(errs[3].2.contains("pool `ghost` is not defined"));
    assert!(errs[4].2.contains("does not apply to policy round_robin"));
    let typo = errors(
        MINIMAL,
        Some("pools:\n  p: {policy: prefix, load_factr: 2}\n"),
    );
    assert_eq!(typo.len(), 1);
    assert!(typo[0].2.contains("load_factr"), "{typo:?}");
}

#[test]
fn a_pools_error_does_not_hide_canary_and_shadow_errors() {
    let routing = "\
pools:
  p: {policy: prefix, balance_tolerance: 99}
models:
  m:
    versions:
      - {name: stable, model: m, weight: -5}
shadows:
  ghost: {model: m, share: 0.1}
";
    let errs = errors(MINIMAL, Some(routing));
    let all: Vec<&str> = errs.iter().map(|e| e.2.as_str()).collect();
    assert_eq!(errs.len(), 3, "{errs:#?}");
    assert!(
        all.iter().any(|m| m.contains("balance_tolerance")),
        "{all:?}"
    );
    assert!(all.iter().any(|m| m.contains("invalid u32")), "{all:?}");
    assert!(all.iter().any(|m| m.contains("`ghost`")), "{all:?}");
    assert!(errs.iter().all(|e| e.0 == "routing.yaml"), "{errs:?}");
}

#[test]
fn several_errors_in_both_files_are_all_reported() {
    let config = "\
listen: nowhere
health: {poll_interval: fast, eject_after: 0}
models:
  - {name: m, pool: nope}
pools:
  - name: p
    workers:
      - url: not-a-url
      - spawn: {count: 0}
";
    let errs = errors(config, Some("pools:\n  ghost: {policy: session}\n"));
    let lines: Vec<_> = errs.iter().map(|e| (e.0.as_str(), e.1)).collect();
    let file = "infergate.yaml";
    let expected = [
        (file, Some(1)),
        (file, Some(2)),
        (file, Some(2)),
        (file, Some(4)),
        (file, Some(8)),
        (file, Some(9)),
        ("routing.yaml", Some(2)),
    ];
    assert_eq!(lines, expected, "{errs:#?}");
}

#[test]
fn outlier_settings_default_and_are_checked() {
    use crate::workers::state::OutlierSettings;
    use std::time::Duration;
    let snap = load_both(MINIMAL, None).expect("valid");
    assert_eq!(snap.outlier, OutlierSettings::default());
    let set = "outlier: {eject_after: 2, base_ejection_time: 1s, max_ejection_time: 4s}\n";
    let snap = load_both(&format!("{set}{MINIMAL}"), None).expect("valid");
    assert_eq!(
        snap.outlier,
        OutlierSettings {
            eject_after: 2,
            base_ejection: Duration::from_secs(1),
            max_ejection: Duration::from_secs(4),
        }
    );
    one_error(
        &format!("outlier: {{max_ejection_time: 1s}}\n{MINIMAL}"),
        1,
        "at least outlier.base_ejection_time",
    );
    one_error(
        &format!("outlier: {{eject_after: 0}}\n{MINIMAL}"),
        1,
        "outlier.eject_after must be ≥ 1",
    );
}

#[test]
fn vllm_kv_events_faults_report_their_lines() {
    let pool = |kv: &str| format!("{MINIMAL}    kv_events:\n{kv}");
    // Line 7 is `kv_events:`, its fields follow.
    one_error(
        &pool("      zmq: \"tcp://x:1\"\n      tokenizer: /dev/null/none.json\n"),
        9,
        "kv_events.tokenizer: cannot read",
    );
    let errs = errors(
        &pool(
            "      zmq: \"tcp://{host}\"\n      endpoints: {\"http://a:1\": \"tcp://a\"}\n      tokenizer: /dev/null/x\n",
        ),
        None,
    );
    let lines: Vec<_> = errs.iter().map(|e| e.1).collect();
    assert_eq!(lines, [Some(8), Some(9), Some(10)], "{errs:#?}");
    assert!(
        errs[0].2.contains("kv_events.zmq must be tcp://HOST:PORT"),
        "{errs:#?}"
    );
    assert!(
        errs[1].2.contains("kv_events.endpoints must be"),
        "{errs:#?}"
    );
    one_error(
        &pool(
            "      zmq: \"tcp://x:1\"\n      tokenizer: builtin:cl100k\n      chat_template: llama3\n",
        ),
        10,
        "kv_events.chat_template must be `chatml`",
    );
}

#[test]
fn vllm_kv_events_with_the_builtin_vocabulary_and_chatml() {
    let dir = std::env::temp_dir().join(format!("infergate-kv-builtin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("routing.yaml"), "").expect("write");
    let config = format!(
        "policies: .\n{MINIMAL}    kv_events:\n      zmq: \"tcp://{{host}}:5557\"\n      \
         tokenizer: builtin:cl100k\n      chat_template: chatml\n"
    );
    std::fs::write(dir.join("infergate.yaml"), config).expect("write");
    let snap = super::load(&dir.join("infergate.yaml"));
    let _ = std::fs::remove_dir_all(&dir);
    let snap = snap.expect("valid");
    let kv = snap.pools[0].kv_events.as_ref().expect("kv_events");
    assert!(kv.vocab.len() > 100_000);
    let chat = kv.chat.as_ref().expect("chatml");
    let text = chat.render(&crate::routing::features::canonical_chat(&[("user", "hi")]));
    assert!(text.starts_with(b"<|im_start|>user\nhi<|im_end|>"));
}

#[test]
fn vllm_kv_events_load_with_their_tokenizer() {
    let dir = std::env::temp_dir().join(format!("infergate-kv-events-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("tok.json"), r#"{"model":{"vocab":{"a":0,"b":1}}}"#).expect("write");
    std::fs::write(dir.join("routing.yaml"), "").expect("write");
    let config = format!(
        "policies: .\n{MINIMAL}    kv_events:\n      zmq: \"tcp://{{host}}:5557\"\n      \
         endpoints: {{\"http://10.0.0.9:8000/\": \"tcp://10.0.0.9:6000\"}}\n      \
         topic: kv\n      tokenizer: tok.json\n"
    );
    std::fs::write(dir.join("infergate.yaml"), config).expect("write");
    let snap = super::load(&dir.join("infergate.yaml"));
    let _ = std::fs::remove_dir_all(&dir);
    let snap = snap.expect("valid");
    let kv = snap.pools[0].kv_events.as_ref().expect("kv_events");
    assert_eq!(kv.topic, "kv");
    assert_eq!(kv.vocab.len(), 2);
    assert_eq!(
        kv.endpoint_for("http://127.0.0.1:9000").as_deref(),
        Some("tcp://127.0.0.1:5557")
    );
    assert_eq!(
        kv.endpoint_for("http://10.0.0.9:8000").as_deref(),
        Some("tcp://10.0.0.9:6000")
    );
}
