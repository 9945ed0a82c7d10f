//! The files under deploy/ (other than k8s/, which tests/e2e/deploy/deploy_k8s.rs covers) are ones an
//! operator can use as they are:
//! - Prometheus: `promtool check config`, `promtool check rules` and `promtool test rules` (the
//!   fixture proves the alerts fire), every metric an alert or dashboard names is one the code
//!   registers, and every dashboard query parses as PromQL. promtool comes from Debian's
//!   `prometheus` package; without it the test fails and says so.
//! - Compose: `docker compose config -q` (or `docker-compose`) where one exists, and always a
//!   parse of compose.yaml checking services, profiles, image pins, bind mounts, published ports
//!   against the mounted gateway configs (which must pass `infergate config check`), worker URLs,
//!   Prometheus targets and the Grafana provisioning.
//! - Dockerfile: built where a container builder answers (`docker info`), else checked
//!   structurally (pinned stages, non-root user, healthcheck, entrypoint, every COPY source
//!   present and let through .dockerignore, every include_str! source copied, the image's
//!   default config valid). Each test prints which path it took.

use crate::common::skip;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(crate::common::REPO)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn yaml(rel: &str) -> Value {
    serde_saphyr::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: not YAML: {e}"))
}

/// A fresh directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("infergate-deploy-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd`; panics with its output unless it exits 0.
fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let t = text(&out);
    assert!(out.status.success(), "{what} failed ({}):\n{t}", out.status);
    t
}

/// True when `program args` runs and exits 0 (a probe for an optional tool).
fn probe(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn promtool() -> Command {
    if !probe("promtool", &["--version"]) {
        panic!(
            "promtool not found: install Debian's `prometheus` package (apt-get install -y \
             prometheus), which ships /usr/bin/promtool; the Prometheus files are not checked \
             without it"
        );
    }
    let mut cmd = Command::new("promtool");
    cmd.current_dir(root());
    cmd
}

/// Every quoted metric name registered in the gateway's and the engine's metrics.rs.
fn registered() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for file in ["src/metrics.rs", "engine/src/metrics.rs"] {
        for s in read(file).split('"') {
            let name_like = !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
            if name_like
                && ["infergate_", "vllm:", "process_"]
                    .iter()
                    .any(|p| s.starts_with(p))
            {
                out.insert(s.to_string());
            }
        }
    }
    out
}

/// `infergate_*` / `vllm:*` names in a PromQL expression, histogram suffixes removed.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut chars = expr.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if !(c.is_ascii_alphabetic() || c == '_') {
            continue;
        }
        let mut end = i + c.len_utf8();
        while let Some(&(j, d)) = chars.peek() {
            if d.is_ascii_alphanumeric() || d == '_' || d == ':' {
                end = j + d.len_utf8();
                chars.next();
            } else {
                break;
            }
        }
        let word = &expr[i..end];
        if word.starts_with("infergate_") || word.starts_with("vllm:") {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| word.strip_suffix(s))
                .unwrap_or(word);
            out.insert(base.to_string());
        }
    }
    out
}

/// Panics unless every `--flag` of `args` (a command line after the binary) is one that
/// `infergate <subcommand> --help` lists.
fn assert_flags(args: &[String], what: &str) {
    let sub = args
        .first()
        .unwrap_or_else(|| panic!("{what}: no subcommand"));
    let help = run_ok(
        Command::new(env!("CARGO_BIN_EXE_infergate")).args([sub.as_str(), "--help"]),
        &format!("infergate {sub} --help"),
    );
    let known: BTreeSet<&str> = help
        .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
        .filter(|w| w.starts_with("--"))
        .collect();
    for f in args.iter().filter(|a| a.starts_with("--")) {
        let f = f.split('=').next().unwrap();
        assert!(
            known.contains(f),
            "{what}: `infergate {sub}` has no {f} (it has {known:?})"
        );
    }
}

// ------------------------------------------------------------------------------------------------
// Prometheus

#[test]
fn prometheus_files_pass_promtool() {
    // The scrape config as shipped (the bearer key file exists only in the container)...
    let t = run_ok(
        promtool().args([
            "check",
            "config",
            "--syntax-only",
            "deploy/prometheus/prometheus.yml",
        ]),
        "promtool check config --syntax-only deploy/prometheus/prometheus.yml",
    );
    println!("{t}");
    // ...and fully (rule files resolved and checked too), with the key file where compose puts it
    // swapped for a scratch one.
    let scratch = Scratch::new("prom");
    let key = scratch.0.join("admin_key");
    std::fs::write(&key, "test-admin-key\n").expect("write key");
    let secret = "/run/secrets/infergate_admin_key";
    let config = read("deploy/prometheus/prometheus.yml");
    assert!(
        config.contains(secret),
        "prometheus.yml does not read {secret}"
    );
    std::fs::write(
        scratch.0.join("prometheus.yml"),
        config.replace(secret, &key.to_string_lossy()),
    )
    .expect("write config");
    for f in ["alerts.yml", "rules_test.yml"] {
        std::fs::copy(root().join("deploy/prometheus").join(f), scratch.0.join(f)).expect("copy");
    }
    let t = run_ok(
        promtool()
            .args(["check", "config"])
            .arg(scratch.0.join("prometheus.yml")),
        "promtool check config (full)",
    );
    assert!(t.contains("SUCCESS"), "{t}");
    println!("{t}");
    let t = run_ok(
        promtool().args(["check", "rules", "deploy/prometheus/alerts.yml"]),
        "promtool check rules deploy/prometheus/alerts.yml",
    );
    println!("{t}");
    let t = run_ok(
        promtool().args(["test", "rules", "deploy/prometheus/rules_test.yml"]),
        "promtool test rules deploy/prometheus/rules_test.yml",
    );
    assert!(t.contains("SUCCESS"), "{t}");
    println!("{t}");
}

#[test]
fn alerts_cover_the_issue_and_fire_in_the_fixture() {
    let alerts = yaml("deploy/prometheus/alerts.yml");
    let mut names = BTreeSet::new();
    let known = registered();
    for group in alerts["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let name = rule["alert"].as_str().expect("alerting rules only");
            assert!(names.insert(name.to_string()), "alert {name} twice");
            let expr = rule["expr"].as_str().expect("expr");
            let metrics = metric_names(expr);
            assert!(!metrics.is_empty(), "{name}: `{expr}` names no metric");
            for m in metrics {
                assert!(
                    known.contains(&m),
                    "{name}: `{m}` is not a metric the gateway or engine registers"
                );
            }
            assert!(
                rule["labels"]["severity"].is_string(),
                "{name}: no severity"
            );
            assert!(
                rule["annotations"]["summary"].is_string(),
                "{name}: no summary"
            );
        }
    }
    // The issue's list: worker ejected, queue wait p95 over SLO, degradation >= 2 for 10 min,
    // canary rolled back, error rate, ledger rows dropped, Redis fallback.
    for want in [
        "InfergateWorkerEjected",
        "InfergateQueueWaitP95OverSLO",
        "InfergateDegraded",
        "InfergateCanaryRolledBack",
        "InfergateErrorRateHigh",
        "InfergateLedgerRowsDropped",
        "InfergateRedisFallback",
    ] {
        assert!(names.contains(want), "no alert {want} in {names:?}");
    }
    let degraded = alerts["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .find(|r| r["alert"] == "InfergateDegraded")
        .unwrap();
    assert_eq!(degraded["for"], "10m");
    assert!(
        degraded["expr"]
            .as_str()
            .unwrap()
            .contains("infergate_degradation_level >= 2")
    );

    // The fixture makes at least two different alerts fire (promtool checks that they do).
    let tests = yaml("deploy/prometheus/rules_test.yml");
    let mut firing = BTreeSet::new();
    for t in tests["tests"].as_array().expect("tests") {
        for a in t["alert_rule_test"].as_array().into_iter().flatten() {
            if a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()) {
                firing.insert(a["alertname"].as_str().unwrap().to_string());
            }
        }
    }
    assert!(firing.len() >= 2, "fixture fires only {firing:?}");
    for name in &firing {
        assert!(names.contains(name), "fixture expects unknown alert {name}");
    }
    println!("alerts: {names:?}\nproved to fire by rules_test.yml: {firing:?}");
}

/// Query strings of a dashboard.
fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                if k == "expr" && v.is_string() {
                    out.push(v.as_str().unwrap().to_string());
                } else {
                    exprs(v, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

#[test]
fn dashboard_queries_parse_as_promql() {
    // promtool parses rule expressions: each panel query becomes a recording rule, with
    // Grafana's macros and variables replaced by what Grafana would send.
    let mut rules = Vec::new();
    let mut dir: Vec<PathBuf> = std::fs::read_dir(root().join("deploy/grafana"))
        .expect("deploy/grafana")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    dir.sort();
    for path in &dir {
        let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("read"))
            .expect("dashboard JSON");
        let mut all = Vec::new();
        exprs(&dash, &mut all);
        let stem = path
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .replace('-', "_");
        for (i, e) in all.iter().enumerate() {
            let mut e = e
                .replace("$__rate_interval", "1m")
                .replace("$__interval", "1m")
                .replace("$__range", "1h");
            for var in ["instance", "pool", "tenant", "model_name"] {
                e = e.replace(&format!("${var}"), ".*");
            }
            assert!(
                !e.contains('$'),
                "{}: unknown variable in `{e}`",
                path.display()
            );
            rules.push(serde_json::json!({"record": format!("dashboard:{stem}:{i}"), "expr": e}));
        }
    }
    let scratch = Scratch::new("promql");
    let file = scratch.0.join("dashboards.rules.json");
    let groups = serde_json::json!({"groups": [{"name": "dashboards", "rules": rules}]});
    std::fs::write(&file, groups.to_string()).expect("write");
    let t = run_ok(
        promtool().args(["check", "rules"]).arg(&file),
        "promtool check rules (dashboard queries)",
    );
    println!("{} dashboard queries parse as PromQL: {t}", rules.len());
}

// ------------------------------------------------------------------------------------------------
// Compose

/// A compose `services.<name>` entry.
fn service<'a>(compose: &'a Value, name: &str) -> &'a Value {
    let s = &compose["services"][name];
    assert!(s.is_object(), "compose.yaml: no service `{name}`");
    s
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|x| match x {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The value after `flag` in a command line.
fn flag(cmd: &[String], flag: &str) -> Option<String> {
    cmd.iter()
        .position(|a| a == flag)
        .and_then(|i| cmd.get(i + 1).cloned())
}

/// `(host path, container path)` of each bind mount of a service (short syntax).
fn binds(svc: &Value) -> Vec<(String, String)> {
    strings(&svc["volumes"])
        .into_iter()
        .filter_map(|v| {
            let mut parts = v.splitn(3, ':');
            let (src, dst) = (parts.next()?, parts.next()?);
            (src.starts_with('.') || src.starts_with('/'))
                .then(|| (src.to_string(), dst.to_string()))
        })
        .collect()
}

/// The host file (under deploy/) that a container path of `svc` is bind-mounted from.
fn host_path(svc: &Value, container: &str) -> Option<PathBuf> {
    binds(svc).into_iter().find_map(|(src, dst)| {
        let rest = container.strip_prefix(dst.trim_end_matches('/'))?;
        (rest.is_empty() || rest.starts_with('/')).then(|| {
            root()
                .join("deploy")
                .join(src.trim_start_matches("./"))
                .join(rest.trim_start_matches('/'))
        })
    })
}

/// `(host ip, host port, container port)` of each published port (short syntax).
fn published(svc: &Value) -> Vec<(String, u16, u16)> {
    strings(&svc["ports"])
        .into_iter()
        .map(|p| {
            let p = p.split('/').next().unwrap().to_string();
            let parts: Vec<&str> = p.split(':').collect();
            let port = |s: &str| s.parse::<u16>().unwrap_or_else(|_| panic!("port `{p}`"));
            match parts.as_slice() {
                [h, c] => ("0.0.0.0".to_string(), port(h), port(c)),
                [ip, h, c] => (ip.to_string(), port(h), port(c)),
                _ => panic!("unsupported port syntax `{p}`"),
            }
        })
        .collect()
}

/// Seconds of a duration like `30s`, `10m`, `250ms`.
fn seconds(d: &str) -> f64 {
    let d = d.trim();
    let (num, unit) = d.split_at(d.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(d.len()));
    let n: f64 = num.parse().unwrap_or_else(|_| panic!("duration `{d}`"));
    n * match unit {
        "ms" => 0.001,
        "s" | "" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => panic!("unit `{other}` in `{d}`"),
    }
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("address `{addr}`"))
}

/// Compose's interpolation of `${VAR:?message}` (a required variable: `required` stands in for
/// what the operator exports), `${VAR:-default}` (the default) and `${VAR}`.
fn interpolate(value: &str, required: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find('}').map(|e| i + e).expect("unclosed ${");
        let inner = &rest[i + 2..end];
        if let Some((_, default)) = inner.split_once(":-") {
            out.push_str(default);
        } else {
            out.push_str(required);
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The environment a service sets, interpolated as compose would with the required variables
/// exported.
fn service_env(svc: &Value) -> Vec<(String, String)> {
    let required = "compose-test-value";
    match &svc["environment"] {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    interpolate(v.as_str().unwrap_or_default(), required),
                )
            })
            .collect(),
        Value::Array(a) => a
            .iter()
            .filter_map(|v| v.as_str())
            .map(|s| {
                let (k, v) = s.split_once('=').unwrap_or((s, ""));
                (k.to_string(), interpolate(v, required))
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Names of the environment variables a service sets.
fn env_names(svc: &Value) -> Vec<String> {
    service_env(svc).into_iter().map(|(k, _)| k).collect()
}

/// Checks a gateway service against the config it mounts; returns (admin port, config).
fn check_gateway_service(compose: &Value, name: &str) -> (u16, Value) {
    let svc = service(compose, name);
    let cmd = strings(&svc["command"]);
    assert_eq!(
        cmd.first().map(String::as_str),
        Some("gateway"),
        "{name}: {cmd:?}"
    );
    assert_flags(&cmd, name);
    let in_container = flag(&cmd, "--config").expect("--config");
    assert!(
        flag(&cmd, "--listen").is_none() && flag(&cmd, "--admin-listen").is_none(),
        "{name}: the listen addresses come from the mounted config, not flags"
    );
    let host = host_path(svc, &in_container)
        .unwrap_or_else(|| panic!("{name}: {in_container} is not in a bind mount"));
    assert!(host.is_file(), "{name}: {} does not exist", host.display());
    // The config compose mounts must pass `infergate config check` with the environment the
    // service sets (interpolated as compose does it).
    let mut check = Command::new(env!("CARGO_BIN_EXE_infergate"));
    check.args(["config", "check", "--config"]).arg(&host);
    check.envs(service_env(svc));
    let t = run_ok(&mut check, &format!("infergate config check ({name})"));
    println!("{name}: {}", t.trim());

    let rel = host
        .strip_prefix(root())
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let config = yaml(&rel);
    let listen = port_of(config["listen"].as_str().expect("listen"));
    let admin_addr = config["admin"]["listen"].as_str().expect("admin.listen");
    assert!(
        config["listen"].as_str().unwrap().starts_with("0.0.0.0:")
            && admin_addr.starts_with("0.0.0.0:"),
        "{rel}: the listeners must bind 0.0.0.0 in a container"
    );
    let admin = port_of(admin_addr);
    let key_env = config["admin"]["api_key_env"]
        .as_str()
        .expect("api_key_env");
    assert!(
        env_names(svc).iter().any(|e| e == key_env),
        "{name}: sets no {key_env}"
    );
    let ports = published(svc);
    for (ip, host_port, container) in &ports {
        assert!(
            *container == listen || *container == admin,
            "{name}: publishes {host_port}:{container}, but {rel} listens on {listen} and {admin}"
        );
        if *container == admin {
            assert_eq!(
                ip, "127.0.0.1",
                "{name}: the admin port is published beyond loopback"
            );
        }
    }
    for want in [listen, admin] {
        assert!(
            ports.iter().any(|(_, _, c)| *c == want),
            "{name}: port {want} of {rel} is not published"
        );
    }
    // SIGTERM drains for drain.grace: compose must wait longer before it kills.
    let grace = config["drain"]["grace"].as_str().map_or(30.0, seconds);
    let stop = svc["stop_grace_period"].as_str().map_or(10.0, seconds);
    assert!(
        stop > grace,
        "{name}: stop_grace_period {stop}s ≤ drain.grace {grace}s"
    );
    (admin, config)
}

/// Port and `/health` probe of an engine service; returns its port.
fn check_engine_service(compose: &Value, name: &str, backend: &str) -> u16 {
    let svc = service(compose, name);
    let cmd = strings(&svc["command"]);
    assert_eq!(cmd.first().map(String::as_str), Some("engine"), "{name}");
    assert_eq!(flag(&cmd, "--backend").as_deref(), Some(backend), "{name}");
    assert_eq!(flag(&cmd, "--host").as_deref(), Some("0.0.0.0"), "{name}");
    let port: u16 = flag(&cmd, "--port").expect("--port").parse().expect("port");
    let health = strings(&svc["healthcheck"]["test"]).join(" ");
    assert!(
        health.contains(&format!("http://127.0.0.1:{port}/health")),
        "{name}: healthcheck `{health}` does not probe /health on {port}"
    );
    assert_flags(&cmd, name);
    port
}

#[test]
fn compose_stack_matches_its_configs() {
    let compose_file = root().join("deploy/compose.yaml");
    let env = [
        ("INFERGATE_ADMIN_KEY", "compose-test-admin"),
        ("INFERGATE_API_KEY", "compose-test-api"),
    ];
    let cli = if probe("docker", &["compose", "version"]) {
        Some(vec!["docker", "compose"])
    } else if probe("docker-compose", &["version"]) {
        Some(vec!["docker-compose"])
    } else {
        None
    };
    match &cli {
        Some(cli) => {
            for profile in [None, Some("fleet")] {
                let mut cmd = Command::new(cli[0]);
                cmd.args(&cli[1..]).arg("-f").arg(&compose_file);
                if let Some(p) = profile {
                    cmd.args(["--profile", p]);
                }
                cmd.args(["config", "-q"]).envs(env);
                run_ok(&mut cmd, &format!("{} config -q", cli.join(" ")));
            }
            println!(
                "compose: `{} config -q` passed (default and fleet profiles)",
                cli.join(" ")
            );
        }
        None => println!(
            "compose: neither `docker compose` nor `docker-compose` here: compose.yaml checked by \
             parsing it (below) only"
        ),
    }

    let compose = yaml("deploy/compose.yaml");
    let services = compose["services"].as_object().expect("services");
    let profiles = |name: &str| strings(&service(&compose, name)["profiles"]);
    for name in [
        "gateway",
        "engine-1",
        "engine-2",
        "engine-cpu",
        "prometheus",
        "grafana",
    ] {
        assert!(
            profiles(name).is_empty(),
            "{name} must run without a profile"
        );
    }
    for name in ["redis", "postgres", "gateway-fleet-1", "gateway-fleet-2"] {
        assert_eq!(
            profiles(name),
            ["fleet"],
            "{name} belongs to the fleet profile"
        );
    }

    let volumes = compose["volumes"].as_object().cloned().unwrap_or_default();
    for (name, svc) in services {
        // Images: pinned, or built here from deploy/Dockerfile.
        let image = svc["image"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no image"));
        if svc["build"].is_object() {
            let ctx = root()
                .join("deploy")
                .join(svc["build"]["context"].as_str().expect("context"));
            let dockerfile = ctx.join(svc["build"]["dockerfile"].as_str().expect("dockerfile"));
            assert_eq!(
                ctx.canonicalize().unwrap(),
                root().canonicalize().unwrap(),
                "{name}: the build context must be the repository root"
            );
            assert!(
                dockerfile.is_file(),
                "{name}: {} missing",
                dockerfile.display()
            );
        } else {
            let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
            assert!(
                !tag.is_empty() && tag != "latest" && tag.chars().any(|c| c.is_ascii_digit()),
                "{name}: image `{image}` is not pinned to a version"
            );
        }
        // Mounts: bind-mounted host paths exist; named volumes are declared.
        for v in strings(&svc["volumes"]) {
            let src = v.split(':').next().unwrap();
            if src.starts_with('.') || src.starts_with('/') {
                let host = root().join("deploy").join(src);
                assert!(
                    host.exists(),
                    "{name}: bind mount {src} ({}) missing",
                    host.display()
                );
            } else {
                assert!(
                    volumes.contains_key(src),
                    "{name}: volume `{src}` is not declared"
                );
            }
        }
        for dep in svc["depends_on"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_else(|| strings(&svc["depends_on"]))
        {
            assert!(
                services.contains_key(&dep),
                "{name} depends on unknown `{dep}`"
            );
        }
    }

    // Gateways against the configs they mount.
    let (admin, config) = check_gateway_service(&compose, "gateway");
    let mut fleet_configs = Vec::new();
    for name in ["gateway-fleet-1", "gateway-fleet-2"] {
        let (fleet_admin, fleet_config) = check_gateway_service(&compose, name);
        assert_eq!(
            fleet_admin, admin,
            "{name}: admin port differs from the gateway's"
        );
        fleet_configs.push(fleet_config);
    }
    // The image's HEALTHCHECK probes the admin port the gateway service's config sets.
    let dockerfile = read("deploy/Dockerfile");
    assert!(
        dockerfile.contains(&format!("http://127.0.0.1:{admin}/healthz")),
        "the image HEALTHCHECK does not probe the compose gateway's admin port {admin}"
    );

    // Engines, and the worker URLs of every gateway config naming them.
    let mut engine_ports = BTreeMap::new();
    for (name, backend) in [
        ("engine-1", "sim"),
        ("engine-2", "sim"),
        ("engine-cpu", "cpu"),
    ] {
        engine_ports.insert(
            name.to_string(),
            check_engine_service(&compose, name, backend),
        );
    }
    for cfg in std::iter::once(&config).chain(&fleet_configs) {
        let mut named = BTreeSet::new();
        for pool in cfg["pools"].as_array().expect("pools") {
            for w in pool["workers"].as_array().expect("workers") {
                let url = w["url"]
                    .as_str()
                    .expect("compose configs list workers by url");
                let hostport = url.strip_prefix("http://").expect("http:// worker");
                let (host, port) = hostport.split_once(':').expect("host:port");
                let want = engine_ports
                    .get(host)
                    .unwrap_or_else(|| panic!("worker {url}: no engine service `{host}`"));
                assert_eq!(port.parse::<u16>().ok(), Some(*want), "worker {url}");
                named.insert(host.to_string());
            }
        }
        assert_eq!(
            named.len(),
            engine_ports.len(),
            "every engine service is a worker"
        );
    }
    // Fleet: Redis and PostgreSQL are the profile's services.
    for cfg in &fleet_configs {
        let redis = cfg["state"]["redis"]["url"]
            .as_str()
            .expect("state.redis.url");
        assert!(redis.starts_with("redis://redis:6379"), "{redis}");
        assert_eq!(cfg["ledger"]["postgres"]["url_env"], "INFERGATE_LEDGER_URL");
    }
    let ledger_url = service(&compose, "gateway-fleet-1")["environment"]["INFERGATE_LEDGER_URL"]
        .as_str()
        .expect("INFERGATE_LEDGER_URL");
    assert!(ledger_url.contains("@postgres:5432/"), "{ledger_url}");

    // Prometheus: its config is the mounted one; every target is a service on the port it serves.
    let prom = service(&compose, "prometheus");
    let prom_cmd = strings(&prom["command"]);
    let config_flag = prom_cmd
        .iter()
        .find_map(|a| a.strip_prefix("--config.file="))
        .expect("--config.file");
    let prom_file = host_path(prom, config_flag).expect("prometheus config mounted");
    assert_eq!(
        prom_file.canonicalize().unwrap(),
        root()
            .join("deploy/prometheus/prometheus.yml")
            .canonicalize()
            .unwrap()
    );
    let scrape = yaml("deploy/prometheus/prometheus.yml");
    let secrets: Vec<String> = strings(&prom["secrets"]);
    let port_of_service = |host: &str| -> Option<u16> {
        if host.starts_with("gateway") {
            Some(admin)
        } else {
            engine_ports.get(host).copied()
        }
    };
    let mut scraped = BTreeSet::new();
    for job in scrape["scrape_configs"].as_array().expect("scrape_configs") {
        let job_name = job["job_name"].as_str().unwrap();
        let mut hosts: Vec<(String, u16)> = Vec::new();
        for sc in job["static_configs"].as_array().into_iter().flatten() {
            for t in strings(&sc["targets"]) {
                let (h, p) = t.split_once(':').expect("host:port target");
                hosts.push((h.to_string(), p.parse().expect("port")));
            }
        }
        for sd in job["dns_sd_configs"].as_array().into_iter().flatten() {
            let port = sd["port"].as_u64().expect("dns_sd port") as u16;
            for n in strings(&sd["names"]) {
                hosts.push((n, port));
            }
        }
        assert!(!hosts.is_empty(), "job {job_name} has no targets");
        for (host, port) in hosts {
            if host == "localhost" {
                continue;
            }
            assert!(
                services.contains_key(&host),
                "job {job_name}: no service `{host}`"
            );
            assert_eq!(
                port_of_service(&host),
                Some(port),
                "job {job_name}: {host}:{port} is not where {host} serves /metrics"
            );
            if host.starts_with("gateway") {
                // The admin listener wants the admin key: Prometheus reads it from the secret
                // compose fills from the gateway's admin key variable.
                let file = job["authorization"]["credentials_file"]
                    .as_str()
                    .unwrap_or_else(|| panic!("job {job_name}: no bearer key for {host}"));
                let secret = file
                    .strip_prefix("/run/secrets/")
                    .expect("a compose secret");
                assert!(
                    secrets.iter().any(|s| s == secret),
                    "prometheus lacks secret {secret}"
                );
                let from = compose["secrets"][secret]["environment"].as_str();
                assert_eq!(
                    from,
                    config["admin"]["api_key_env"].as_str(),
                    "secret {secret}"
                );
            }
            scraped.insert(host);
        }
    }
    for name in [
        "gateway",
        "engine-1",
        "engine-2",
        "engine-cpu",
        "gateway-fleet-1",
        "gateway-fleet-2",
    ] {
        assert!(scraped.contains(name), "Prometheus does not scrape {name}");
    }

    // Grafana: the provisioning is mounted, its dashboard path is where deploy/grafana is
    // mounted, and its datasource is the prometheus service.
    let grafana = service(&compose, "grafana");
    let prov = host_path(grafana, "/etc/grafana/provisioning").expect("provisioning mounted");
    let prov_rel = prov
        .strip_prefix(root())
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let providers = yaml(&format!("{prov_rel}/dashboards/infergate.yml"));
    let path = providers["providers"][0]["options"]["path"]
        .as_str()
        .expect("provider path");
    let dashboards = host_path(grafana, path).expect("dashboards mounted");
    assert_eq!(
        dashboards.canonicalize().unwrap(),
        root().join("deploy/grafana").canonicalize().unwrap()
    );
    let ds = yaml(&format!("{prov_rel}/datasources/prometheus.yml"));
    assert_eq!(ds["datasources"][0]["url"], "http://prometheus:9090");
    assert_eq!(ds["datasources"][0]["type"], "prometheus");
    println!(
        "compose: {} services, bind mounts, ports, worker URLs, Prometheus targets and Grafana \
         provisioning consistent",
        services.len()
    );
}

// ------------------------------------------------------------------------------------------------
// Dockerfile

/// One instruction of a Dockerfile: keyword and its text (continuations joined).
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if t.starts_with('#') {
            continue;
        }
        if let Some(body) = t.strip_suffix('\\') {
            cur.push_str(body);
            cur.push(' ');
            continue;
        }
        cur.push_str(t);
        let (kw, rest) = cur.split_once(char::is_whitespace).unwrap_or((&cur, ""));
        out.push((kw.to_ascii_uppercase(), rest.trim().to_string()));
        cur.clear();
    }
    out
}

/// Docker's .dockerignore rule: the last pattern that matches the path or one of its parent
/// directories decides; `!` lets a path back in. Patterns: `*` within a component, `**` for any
/// number of components.
fn ignored(patterns: &[String], path: &str) -> bool {
    fn component(p: &str, s: &str) -> bool {
        match p.split_once('*') {
            None => p == s,
            Some((head, tail)) => {
                s.starts_with(head)
                    && (0..=s.len() - head.len()).any(|i| {
                        s.is_char_boundary(head.len() + i) && component(tail, &s[head.len() + i..])
                    })
            }
        }
    }
    fn matches(p: &[&str], s: &[&str]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(&"**"), _) => matches(&p[1..], s) || (!s.is_empty() && matches(p, &s[1..])),
            (Some(pc), Some(sc)) => component(pc, sc) && matches(&p[1..], &s[1..]),
            _ => false,
        }
    }
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let mut excluded = false;
    for pat in patterns {
        let (negate, pat) = match pat.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, pat.as_str()),
        };
        let pp: Vec<&str> = pat.trim_matches('/').split('/').collect();
        if (1..=parts.len()).any(|n| matches(&pp, &parts[..n])) {
            excluded = !negate;
        }
    }
    excluded
}

/// Files the crates embed at compile time (`include_str!` / `include_bytes!` outside tests),
/// relative to the repository root.
fn embedded_files() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root().join("src"), root().join("engine/src")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let name = p.file_name().unwrap().to_string_lossy();
            if !name.ends_with(".rs") || name.ends_with("_tests.rs") || name == "tests.rs" {
                continue;
            }
            let text = std::fs::read_to_string(&p).expect("read");
            for mac in ["include_str!(", "include_bytes!("] {
                for piece in text.split(mac).skip(1) {
                    let Some(lit) = piece.trim_start().strip_prefix('"') else {
                        continue;
                    };
                    let rel = lit.split('"').next().unwrap();
                    let file = p.parent().unwrap().join(rel);
                    let file = file
                        .canonicalize()
                        .unwrap_or_else(|_| panic!("{}", file.display()));
                    let rel = file.strip_prefix(root().canonicalize().unwrap()).unwrap();
                    out.insert(rel.to_string_lossy().into_owned());
                }
            }
        }
    }
    out
}

/// The arguments of every `kw` instruction, in order.
fn all_of<'a>(ins: &'a [(String, String)], kw: &str) -> Vec<&'a String> {
    ins.iter()
        .filter(|(k, _)| k == kw)
        .map(|(_, r)| r)
        .collect()
}

/// The last `kw` of the runtime stage (everything after the last FROM).
fn in_runtime(ins: &[(String, String)], kw: &str) -> Option<String> {
    let last = ins.iter().rposition(|(k, _)| k == "FROM")?;
    ins[last..]
        .iter()
        .filter(|(k, _)| k == kw)
        .map(|(_, r)| r.clone())
        .next_back()
}

/// Builds `file` as image `tag` where a container builder answers (`docker info`); says so where
/// none does. Returns whether it built.
fn build_image(file: &str, tag: &str) -> bool {
    if !probe("docker", &["info"]) {
        skip::skipped(&format!(
            "the image build of {file} (no container builder: `docker info` fails); it is checked structurally instead"
        ));
        return false;
    }
    let t = run_ok(
        Command::new("docker")
            .current_dir(root())
            .args(["build", "-f", file, "-t", tag, "."]),
        &format!("docker build -f {file} ."),
    );
    println!("container builder found: {file} was built\n{t}");
    true
}

#[test]
fn dockerfile_builds_or_passes_structural_checks() {
    if build_image("deploy/Dockerfile", "infergate:deploy-test") {
        let t = run_ok(
            Command::new("docker").args(["run", "--rm", "infergate:deploy-test", "--version"]),
            "docker run infergate:deploy-test --version",
        );
        println!("{t}");
    }

    let text = read("deploy/Dockerfile");
    let ins = instructions(&text);
    let stages = all_of(&ins, "FROM");
    assert!(stages.len() >= 2, "a multi-stage build: {stages:?}");
    let mut stage_names = BTreeSet::new();
    for from in &stages {
        let words: Vec<&str> = from.split_whitespace().collect();
        let image = words[0];
        let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
        assert!(
            !tag.is_empty() && tag != "latest",
            "FROM {image}: pin the base image"
        );
        if let [_, as_kw, name] = words.as_slice() {
            assert!(as_kw.eq_ignore_ascii_case("as"));
            stage_names.insert(name.to_string());
        }
    }
    // The builder's Rust satisfies the crate's rust-version.
    let builder = stages[0].split_whitespace().next().unwrap();
    let rust = builder
        .strip_prefix("rust:")
        .expect("the first stage builds with rust:");
    let version = |s: &str| -> (u32, u32) {
        let mut it = s.split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
        (it.next().unwrap_or(0), it.next().unwrap_or(0))
    };
    let cargo = read("Cargo.toml");
    let needed = cargo
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .expect("rust-version")
        .trim_matches('"');
    assert!(
        version(rust) >= version(needed),
        "{builder} is older than rust-version {needed}"
    );
    assert!(
        text.contains("--locked") && text.contains("--bin infergate"),
        "the build uses Cargo.lock and builds the infergate binary"
    );

    // The runtime stage: everything after the last FROM.
    let last = ins.iter().rposition(|(k, _)| k == "FROM").unwrap();
    let runtime = &ins[last..];
    let get = |kw: &str| in_runtime(&ins, kw);
    let user = get("USER").expect("a USER in the runtime stage");
    let uid = user.split(':').next().unwrap();
    assert!(uid != "0" && uid != "root", "runs as root: USER {user}");
    let health = get("HEALTHCHECK").expect("a HEALTHCHECK");
    assert!(health.contains("/healthz"), "HEALTHCHECK {health}");
    let entry: Vec<String> = serde_json::from_str(&get("ENTRYPOINT").expect("ENTRYPOINT"))
        .expect("exec-form ENTRYPOINT");
    assert_eq!(entry, ["infergate"]);
    let cmd: Vec<String> = serde_json::from_str(&get("CMD").expect("CMD")).expect("exec-form CMD");
    assert_flags(&cmd, "Dockerfile CMD");
    let copies_binary = runtime.iter().any(|(k, r)| {
        k == "COPY" && r.contains("--from=") && r.ends_with("/usr/local/bin/infergate")
    });
    assert!(
        copies_binary,
        "the runtime stage copies the binary to /usr/local/bin/infergate"
    );

    // COPY sources exist and the build context lets them in.
    let ignore: Vec<String> = read(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    for p in [
        "target/debug/infergate",
        ".git/HEAD",
        "tests/e2e/deploy/deploy_files.rs",
    ] {
        assert!(
            ignored(&ignore, p),
            ".dockerignore lets {p} into the build context"
        );
    }
    let mut sources = Vec::new();
    for (k, r) in &ins {
        if k != "COPY" || r.contains("--from=") {
            continue;
        }
        let words: Vec<&str> = r
            .split_whitespace()
            .filter(|w| !w.starts_with("--"))
            .collect();
        for src in &words[..words.len() - 1] {
            let src = src.trim_end_matches('/');
            assert!(
                root().join(src).exists(),
                "COPY {src}: no such path in the repository"
            );
            assert!(
                !ignored(&ignore, src),
                "COPY {src}: excluded by .dockerignore"
            );
            sources.push(src.to_string());
        }
    }
    for f in embedded_files() {
        assert!(
            sources
                .iter()
                .any(|s| f == *s || f.starts_with(&format!("{s}/"))),
            "{f} is compiled in (include_str!) but the Dockerfile does not copy it"
        );
        assert!(
            !ignored(&ignore, &f),
            "{f} is compiled in but excluded by .dockerignore"
        );
    }

    // The image's default config, laid out as the Dockerfile lays it out, is valid.
    let scratch = Scratch::new("image-config");
    let etc = scratch.0.join("etc/infergate");
    std::fs::create_dir_all(etc.join("policies")).expect("mkdir");
    let shipped = read("config/infergate.yaml");
    assert!(
        shipped
            .lines()
            .any(|l| l.starts_with("policies: ../policies")),
        "config/infergate.yaml no longer has the `policies: ../policies` line the Dockerfile rewrites"
    );
    assert!(text.contains(r"s|^policies: \.\./policies|policies: policies|"));
    let rewritten: String = shipped
        .lines()
        .map(|l| match l.strip_prefix("policies: ../policies") {
            Some(rest) => format!("policies: policies{rest}\n"),
            None => format!("{l}\n"),
        })
        .collect();
    std::fs::write(etc.join("infergate.yaml"), rewritten).expect("write");
    for e in std::fs::read_dir(root().join("policies")).expect("policies") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, etc.join("policies").join(p.file_name().unwrap())).expect("copy");
    }
    let t = run_ok(
        Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["config", "check", "--config"])
            .arg(etc.join("infergate.yaml")),
        "infergate config check (the image's /etc/infergate/infergate.yaml)",
    );
    println!(
        "Dockerfile: stages {stage_names:?} pinned, USER {user}, HEALTHCHECK, ENTRYPOINT infergate, \
         CMD {cmd:?}; COPY sources {sources:?} present and in the context; image config: {}",
        t.trim()
    );
}

/// deploy/Dockerfile.cuda: the same builder as deploy/Dockerfile with the `cuda` feature, on a
/// CUDA runtime base that brings cuBLAS and NVRTC, running the cuda engine by default.
#[test]
fn cuda_dockerfile_builds_the_cuda_engine_on_a_cuda_runtime() {
    let text = read("deploy/Dockerfile.cuda");
    let ins = instructions(&text);
    let froms = all_of(&ins, "FROM");
    assert_eq!(froms.len(), 2, "builder and runtime: {froms:?}");
    // The builder is deploy/Dockerfile's, so the two images build the same code the same way.
    let plain = instructions(&read("deploy/Dockerfile"));
    let plain_builder = plain.iter().find(|(k, _)| k == "FROM").map(|(_, r)| r);
    assert_eq!(Some(froms[0]), plain_builder, "the builders differ");
    let builds: Vec<&String> = ins
        .iter()
        .filter(|(k, r)| k == "RUN" && r.contains("cargo build"))
        .map(|(_, r)| r)
        .collect();
    assert_eq!(builds.len(), 2, "dependency layer and source layer");
    for b in &builds {
        assert!(
            b.contains("cargo build --release --locked --features cuda --bin infergate"),
            "{b}"
        );
    }
    let cargo = read("src/cli/Cargo.toml");
    assert!(
        cargo.contains("cuda = [\"infergate-engine/cuda\"]"),
        "the binary's crate has no cuda feature"
    );
    // The runtime: a pinned CUDA 12 runtime image (cuBLAS 12 and NVRTC 12, what the backend
    // loads), non-root, the engine's health path, the cuda engine by default.
    let runtime = froms[1].split_whitespace().next().unwrap();
    assert!(
        runtime.starts_with("nvidia/cuda:12.") && runtime.contains("-runtime-"),
        "FROM {runtime}"
    );
    let get = |kw: &str| in_runtime(&ins, kw);
    let user = get("USER").expect("USER");
    assert!(
        !user.starts_with('0') && !user.starts_with("root"),
        "USER {user}"
    );
    let health = get("HEALTHCHECK").expect("HEALTHCHECK");
    assert!(health.contains("http://127.0.0.1:8000/health"), "{health}");
    let entry: Vec<String> =
        serde_json::from_str(&get("ENTRYPOINT").expect("ENTRYPOINT")).expect("exec form");
    assert_eq!(entry, ["infergate"]);
    let cmd: Vec<String> = serde_json::from_str(&get("CMD").expect("CMD")).expect("exec form");
    assert_eq!(&cmd[..3], ["engine", "--backend", "cuda"], "{cmd:?}");
    assert_flags(&cmd, "Dockerfile.cuda CMD");
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(&cmd)
        .arg("--help")
        .output()
        .expect("infergate --help");
    assert!(
        out.status.success(),
        "the CMD does not parse: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (k, r) in &ins {
        if k == "COPY" && !r.contains("--from=") {
            let words: Vec<&str> = r.split_whitespace().collect();
            for src in &words[..words.len() - 1] {
                assert!(
                    root().join(src).exists(),
                    "COPY {src}: not in the repository"
                );
            }
        }
    }
    build_image("deploy/Dockerfile.cuda", "infergate:deploy-test-cuda");
}
