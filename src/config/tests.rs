//! Tests of the config loader that succeed: the shipped files, defaults, routing, paths, plus the
//! helpers shared with `error_tests`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::routing::{PolicyConfig, PrefixConfig};

pub(super) const CONFIG: &str = "/etc/infergate/infergate.yaml";
pub(super) const ROUTING: &str = "/etc/infergate/routing.yaml";

/// A valid minimal config: one model on one pool with one URL worker.
pub(super) const MINIMAL: &str = "\
models:
  - {name: m, pool: p}
pools:
  - name: p
    workers:
      - url: http://127.0.0.1:9000/
";

/// Compiles config (and routing) text named as files under /etc/infergate.
pub(super) fn load_both(config: &str, routing: Option<&str>) -> Result<Snapshot, ConfigErrors> {
    load_str(
        config,
        Path::new(CONFIG),
        routing.map(|r| (r, Path::new(ROUTING))),
    )
}

/// The errors of a config that must fail, as (file, line, message).
pub(super) fn errors(config: &str, routing: Option<&str>) -> Vec<(String, Option<u64>, String)> {
    let Err(errors) = load_both(config, routing) else {
        panic!("expected errors for:\n{config}");
    };
    let file = |p: &PathBuf| p.file_name().map(|n| n.to_string_lossy().into_owned());
    errors
        .0
        .iter()
        .map(|e| (file(&e.file).unwrap_or_default(), e.line, e.message.clone()))
        .collect()
}

/// Asserts the config has exactly one error, on `line`, whose message contains `needle`.
pub(super) fn one_error(config: &str, line: u64, needle: &str) {
    let errs = errors(config, None);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].1, Some(line), "{errs:#?}");
    assert!(errs[0].2.contains(needle), "{needle:?} not in {errs:#?}");
}

#[test]
fn the_shipped_files_load() {
    let snap = load_default().expect("shipped config is valid");
    assert_eq!(snap.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(snap.admin.listen.to_string(), "127.0.0.1:8081");
    assert_eq!(snap.admin.api_key, None);
    assert_eq!(snap.tls, None);
    assert_eq!(snap.log.format, LogFormat::Text);
    assert_eq!(snap.health.poll_interval, Duration::from_millis(250));
    assert_eq!(snap.forward.total_timeout, Duration::from_secs(600));
    assert_eq!(snap.drain_grace, Duration::from_secs(30));
    assert_eq!(snap.max_body_bytes, 8 * 1024 * 1024);
    let route = snap.model("llama-3-8b").expect("model");
    assert_eq!(route.upstream_name(), "llama-3-8b");
    let (index, pool) = snap.pool("local").expect("pool");
    assert_eq!(route.pool, index);
    assert_eq!(pool.dialect, Dialect::Infergate);
    assert_eq!(pool.policy, PolicyConfig::Prefix(PrefixConfig::default()));
    let WorkerSource::Spawn { count, args } = &pool.workers[0] else {
        panic!("{:?}", pool.workers);
    };
    assert_eq!(*count, 2);
    assert!(args.contains(&"sim".to_string()));
}

#[test]
fn the_shipped_files_load_from_disk() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let snap = load(&root.join("config/infergate.yaml")).expect("shipped config is valid");
    assert_eq!(
        snap,
        load_default()
            .map(|s| Snapshot {
                files: snap.files.clone(),
                ..s
            })
            .expect("default")
    );
    assert_eq!(snap.files.len(), 5);
    assert!(snap.files[1].ends_with("policies/routing.yaml"));
    assert!(snap.files[2].ends_with("policies/tenants.yaml"));
    assert!(snap.files[3].ends_with("policies/degradation.yaml"));
    assert!(snap.files[4].ends_with("policies/prices.yaml"));
    assert_eq!(snap.prices.version, 1);
    assert!(snap.prices.models.contains_key("llama-3-8b"));
    assert!(snap.degradation.contains_key("local"));
    assert!(snap.files.iter().all(|f| f.is_absolute() && f.is_file()));
}

#[test]
fn defaults_fill_every_optional_section() {
    let snap = load_both(MINIMAL, None).expect("valid");
    assert_eq!(snap.health.eject_after, 3);
    assert_eq!(snap.forward.retries, 2);
    assert_eq!(snap.log.level, "info");
    assert_eq!(
        snap.pools[0].workers,
        [WorkerSource::Url("http://127.0.0.1:9000".into())]
    );
    assert_eq!(snap.files, [PathBuf::from(CONFIG)]);
}

#[test]
fn routing_sets_a_pools_policy() {
    let snap = load_both(MINIMAL, Some("pools:\n  p: {policy: round_robin}\n")).expect("valid");
    assert_eq!(snap.pools[0].policy, PolicyConfig::RoundRobin);
    assert_eq!(snap.files.len(), 2);
    assert!(load_both(MINIMAL, Some("# nothing yet\n")).is_ok());
}

#[test]
fn tls_files_resolve_against_the_config_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = format!("tls: {{cert: ../Cargo.toml, key: ../Cargo.toml}}\n{MINIMAL}");
    let snap = load_str(&config, &root.join("config/infergate.yaml"), None).expect("valid");
    let tls = snap.tls.expect("tls");
    assert!(
        tls.cert.is_absolute() && tls.cert.ends_with("Cargo.toml"),
        "{tls:?}"
    );
}

#[test]
fn errors_display_as_file_line_column_message() {
    let Err(errs) = load_both("listen: nowhere\npools: []\nmodels: []\n", None) else {
        panic!("expected an error");
    };
    let text = errs.to_string();
    assert!(
        text.starts_with(&format!("{CONFIG}:1:9: listen: `nowhere`")),
        "{text}"
    );
    let whole = ConfigError::file(Path::new("a.yaml"), "cannot read");
    assert_eq!(whole.to_string(), "a.yaml: cannot read");
    let two = ConfigErrors(vec![whole.clone(), whole]);
    assert_eq!(two.to_string(), "a.yaml: cannot read\na.yaml: cannot read");
}

#[test]
fn a_missing_file_is_one_file_level_error() {
    let Err(errs) = load(Path::new("/nonexistent/infergate.yaml")) else {
        panic!("expected an error");
    };
    assert_eq!(errs.0.len(), 1);
    assert_eq!(errs.0[0].line, None);
    let explicit = format!("policies: /nonexistent/policies\n{MINIMAL}");
    let dir = std::env::temp_dir().join(format!("infergate-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("infergate.yaml");
    std::fs::write(&path, explicit).expect("write");
    let errs = load(&path).expect_err("routing.yaml missing");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!((errs.0.len(), errs.0[0].line), (1, Some(1)), "{errs}");
}

#[test]
fn canary_arms_are_version_only_unless_direct() {
    let config = |direct: &str| {
        format!(
            "models:\n  - {{name: m, pool: p}}\n  - {{name: m-canary, pool: p{direct}}}\n\
             pools:\n  - name: p\n    workers:\n      - url: http://127.0.0.1:9000/\n\
             debug_headers: true\nmetrics: {{public: true}}\n"
        )
    };
    let routing = "models:\n  m:\n    versions:\n      - {name: stable, model: m, weight: 90}\n      \
                   - {name: canary, model: m-canary, weight: 10}\n";
    let s = load_both(&config(""), Some(routing)).unwrap();
    assert!(s.is_version_only("m-canary"));
    assert!(
        !s.is_version_only("m"),
        "the stable arm is the model itself"
    );
    assert!(!s.model("m-canary").unwrap().direct);
    assert!(s.debug_headers && s.metrics_public);
    let s = load_both(&config(", direct: true"), Some(routing)).unwrap();
    assert!(s.model("m-canary").unwrap().direct);
    let s = load_both(MINIMAL, None).unwrap();
    assert!(!s.debug_headers && !s.metrics_public, "both default off");
}

#[test]
fn fleet_urls_come_inline_or_from_an_environment_variable() {
    let with = |extra: &str| format!("{extra}{MINIMAL}");
    let s = load_str(
        &with("state: {redis: {url: \"redis://r:6379/\"}}\nledger: {postgres: {url: \"postgres://u@db/l\"}}\n"),
        Path::new(CONFIG),
        None,
    )
    .expect("valid");
    assert_eq!(s.redis.map(|r| r.url), Some("redis://r:6379/".to_string()));
    // PATH is set but is no URL: read from the variable, checked, and never repeated.
    let path = std::env::var("PATH").unwrap_or_default();
    let errs = errors(&with("state: {redis: {url_env: PATH}}\n"), None);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].2.contains("must start with redis://"), "{errs:#?}");
    assert!(path.is_empty() || !errs[0].2.contains(&path));
    one_error(
        &with("ledger: {postgres: {url_env: INFERGATE_TEST_SURELY_UNSET}}\n"),
        1,
        "environment variable `INFERGATE_TEST_SURELY_UNSET` is not set",
    );
    one_error(
        &with("state: {redis: {url: \"redis://a/\", url_env: X}}\n"),
        1,
        "give `url` or `url_env`, not both",
    );
}

#[test]
fn quota_leasing_is_off_unless_asked_for_and_its_blocks_are_checked() {
    let with = |extra: &str| format!("{extra}{MINIMAL}");
    let load = |extra: &str| load_str(&with(extra), Path::new(CONFIG), None).expect("valid");
    let off = load("state: {redis: {url: \"redis://r:6379/\"}}\n");
    assert_eq!(off.redis.and_then(|r| r.lease), None);
    let on = load("state: {redis: {url: \"redis://r:6379/\", lease: {requests: 4}}}\n");
    assert_eq!(
        on.redis.and_then(|r| r.lease),
        Some(crate::limits::LeaseSettings {
            requests: 4,
            tokens: 4_000,
            slots: 2,
            hold: std::time::Duration::from_secs(10),
        })
    );
    one_error(
        &with("state: {redis: {url: \"redis://r/\", lease: {tokens: 0}}}\n"),
        1,
        "state.redis.lease.tokens must be ≥ 1",
    );
    one_error(
        &with("state: {redis: {url: \"redis://r/\", lease: {hold: 0s}}}\n"),
        1,
        "state.redis.lease.hold must be above 0",
    );
}

#[test]
fn the_shared_prefix_directory_is_off_unless_asked_for() {
    let with = |extra: &str| format!("{extra}{MINIMAL}");
    let load = |extra: &str| load_str(&with(extra), Path::new(CONFIG), None).expect("valid");
    let off = load("state: {redis: {url: \"redis://r:6379/\"}}\n");
    assert_eq!(off.redis.map(|r| r.prefix_homes), Some(false));
    let on = load("state: {redis: {url: \"redis://r:6379/\", prefix_homes: true}}\n");
    assert_eq!(on.redis.map(|r| r.prefix_homes), Some(true));
    assert!(
        load_str(
            &with("state: {redis: {url: \"redis://r/\", prefix_homes: 3}}\n"),
            Path::new(CONFIG),
            None
        )
        .is_err()
    );
}

#[test]
fn spawn_paths_resolve_against_the_config_directory() {
    let dir = std::env::temp_dir().join(format!("infergate-spawn-paths-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("models/m")).unwrap();
    let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let got = pools::spawn_args(
        &args(&[
            "--backend",
            "cpu",
            "--model",
            "models/m",
            "--chat-template=./t.jinja",
        ]),
        &dir,
    );
    let m = dir.join("models/m").to_string_lossy().into_owned();
    let t = dir.join("t.jinja").to_string_lossy().into_owned();
    assert_eq!(
        got,
        args(&[
            "--backend",
            "cpu",
            "--model",
            &m,
            &format!("--chat-template={t}")
        ])
    );
    // Preset names and Hugging Face ids stay as written; absolute paths too.
    for keep in ["llama-3-8b", "meta-llama/Llama-3.1-8B", "/abs/m.gguf"] {
        let same = pools::spawn_args(&args(&["--model", keep]), &dir);
        assert_eq!(same, args(&["--model", keep]));
    }
    // A `.gguf` or `./` value is a path even before the file exists: the worker's error then
    // names the place the config meant.
    let gguf = pools::spawn_args(&args(&["--model", "x.gguf"]), &dir);
    assert_eq!(gguf[1], dir.join("x.gguf").to_string_lossy());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_trace_section_resolves_its_path_and_checks_its_numbers() {
    let with = |extra: &str| format!("{extra}{MINIMAL}");
    let s = load_str(
        &with("trace: {path: t/trace.jsonl}\n"),
        Path::new(CONFIG),
        None,
    )
    .expect("valid");
    let t = s.trace.expect("trace set");
    assert!(t.path.is_absolute() && t.path.ends_with("t/trace.jsonl"));
    assert_eq!(
        (t.sample, t.max_bytes, t.keep),
        (
            1.0,
            crate::trace::DEFAULT_MAX_BYTES,
            crate::trace::DEFAULT_KEEP
        )
    );
    assert!(
        load_str(MINIMAL, Path::new(CONFIG), None)
            .unwrap()
            .trace
            .is_none()
    );
    one_error(
        &with("trace: {path: t.jsonl, sample: 1.5}\n"),
        1,
        "trace.sample must be between 0 and 1",
    );
    one_error(
        &with("trace: {path: t.jsonl, max_bytes: 10}\n"),
        1,
        "trace.max_bytes must be ≥ 4096",
    );
    let errs = errors(&with("trace: {sample: 0.5}\n"), None);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].2.contains("trace: give `path`"), "{errs:#?}");
}

#[test]
fn a_pools_fair_share_takes_weights_or_the_defaults() {
    let with = |fair: &str| format!("{MINIMAL}    admission: {{fair_share: {fair}}}\n");
    let snap = load_both(&with("{}"), None).unwrap();
    let weights = snap.pools[0].admission.fair_share.unwrap();
    assert_eq!((weights.input, weights.output), (1.0, 2.0));
    let snap = load_both(&with("{input_weight: 0.5, output_weight: 4}"), None).unwrap();
    let weights = snap.pools[0].admission.fair_share.unwrap();
    assert_eq!((weights.input, weights.output), (0.5, 4.0));
    assert_eq!(
        weights.locality_window,
        crate::admission::fair::DEFAULT_LOCALITY_WINDOW
    );
    let snap = load_both(&with("{locality_window: 0}"), None).unwrap();
    assert_eq!(
        snap.pools[0].admission.fair_share.unwrap().locality_window,
        0.0
    );
    one_error(
        &with("{locality_window: -5}"),
        7,
        "locality_window must be weighted tokens",
    );
    let snap = load_both(&with("{borrow_slots: 4}"), None).unwrap();
    assert_eq!(snap.pools[0].admission.fair_share.unwrap().borrow_slots, 4);
    one_error(
        &with("{borrow_slots: 100000}"),
        7,
        "borrow_slots must be 0 to 4096",
    );
    assert_eq!(
        load_both(MINIMAL, None).unwrap().pools[0]
            .admission
            .fair_share,
        None
    );
    one_error(
        &with("{input_weight: -1}"),
        7,
        "pool `p`: fair_share: input_weight and output_weight must be numbers in [0, 1e6]",
    );
    one_error(
        &with("{input_weight: 0, output_weight: 0}"),
        7,
        "not both 0",
    );
    one_error(&with("{weight: 1}"), 7, "weight");
}

#[test]
fn the_otlp_export_needs_only_an_endpoint_and_checks_the_rest_at_its_line() {
    let with = |extra: &str| format!("{extra}{MINIMAL}");
    let s = load_str(
        &with("trace:\n  otlp: {endpoint: \"http://otel:4318/v1/traces\"}\n"),
        Path::new(CONFIG),
        None,
    )
    .expect("valid without a file path");
    assert!(s.trace.is_none(), "no file");
    let o = s.otlp.expect("otlp set");
    assert_eq!(o.endpoint, "http://otel:4318/v1/traces");
    assert_eq!(
        (o.sample, o.timeout, o.max_queue, o.batch, o.batch_delay),
        (
            1.0,
            crate::trace::otlp::DEFAULT_TIMEOUT,
            crate::trace::otlp::DEFAULT_MAX_QUEUE,
            crate::trace::otlp::DEFAULT_BATCH,
            crate::trace::otlp::DEFAULT_BATCH_DELAY
        )
    );
    let s = load_str(
        &with(
            "trace:\n  path: t.jsonl\n  sample: 0.5\n  otlp:\n    endpoint: http://otel:4318/v1/traces\n    headers: {X-Api-Key: secret}\n    timeout: 250ms\n    max_queue: 64\n    batch: 8\n    batch_delay: 20ms\n",
        ),
        Path::new(CONFIG),
        None,
    )
    .expect("valid");
    assert!(s.trace.is_some(), "file and export together");
    let o = s.otlp.expect("otlp set");
    assert_eq!(
        o.headers,
        vec![("x-api-key".to_string(), "secret".to_string())]
    );
    assert_eq!(o.sample, 0.5, "the file's share by default");
    assert_eq!(
        (o.timeout, o.max_queue, o.batch, o.batch_delay),
        (
            std::time::Duration::from_millis(250),
            64,
            8,
            std::time::Duration::from_millis(20)
        )
    );
    let otlp = |body: &str| with(&format!("trace:\n  otlp:\n{body}"));
    let endpoint = "    endpoint: http://otel:4318/v1/traces\n";
    one_error(
        &otlp("    endpoint: https://otel/v1/traces\n"),
        3,
        "https is not supported",
    );
    one_error(
        &otlp(&format!("{endpoint}    sample: 2\n")),
        4,
        "trace.otlp.sample",
    );
    one_error(&otlp(&format!("{endpoint}    timeout: 0s\n")), 4, "above 0");
    one_error(
        &otlp(&format!("{endpoint}    batch_delay: soon\n")),
        4,
        "batch_delay",
    );
    one_error(
        &otlp(&format!("{endpoint}    max_queue: 0\n")),
        4,
        "max_queue",
    );
    one_error(
        &otlp(&format!("{endpoint}    max_queue: 4\n    batch: 5\n")),
        5,
        "batch must be between 1 and max_queue (4)",
    );
    one_error(
        &otlp(&format!("{endpoint}    headers: {{content-type: x}}\n")),
        4,
        "set by the exporter",
    );
    let errs = errors(
        &otlp(&format!("{endpoint}    headers: {{k: \"a\\nb\"}}\n")),
        None,
    );
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].2.contains("not a valid header value"), "{errs:#?}");
    one_error(
        &with(&format!("trace:\n  keep: 3\n  otlp:\n{endpoint}")),
        2,
        "trace.keep is a setting of the trace file: give `path` too",
    );
    let errs = errors(&otlp("    sample: 1\n"), None);
    assert!(errs[0].2.contains("give `endpoint`"), "{errs:#?}");
    let errs = errors(&otlp(&format!("{endpoint}    nonsense: 1\n")), None);
    assert!(errs[0].2.contains("nonsense"), "{errs:#?}");
}
