//! The Grafana dashboards under deploy/grafana are valid dashboard JSON, and every infergate
//! metric their queries name is one the gateway registers (a renamed metric breaks this test,
//! not a dashboard in production).

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

/// `infergate_*` names in `text`, without the histogram suffixes.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("infergate_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name);
        out.insert(base.to_string());
    }
    out
}

fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                if (k == "expr" || k == "definition") && v.is_string() {
                    out.push(v.as_str().unwrap_or_default().to_string());
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
fn dashboards_query_only_metrics_the_gateway_registers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let registered = std::fs::read_to_string(root.join("src/metrics.rs")).expect("metrics.rs");
    let registered: BTreeSet<String> = registered
        .split('"')
        .filter(|s| s.starts_with("infergate_"))
        .map(str::to_string)
        .collect();
    let dir = root.join("deploy/grafana");
    let mut seen = 0;
    let mut uids = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect("deploy/grafana") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        seen += 1;
        let text = std::fs::read_to_string(&path).expect("read");
        let dash: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
        let uid = dash["uid"].as_str().expect("a uid");
        assert!(uids.insert(uid.to_string()), "uid {uid} twice");
        assert!(dash["title"].is_string() && dash["schemaVersion"].is_u64());
        let panels = dash["panels"].as_array().expect("panels");
        assert!(!panels.is_empty());
        let mut ids = BTreeSet::new();
        for p in panels {
            assert!(
                ids.insert(p["id"].as_u64().expect("panel id")),
                "panel ids repeat"
            );
            assert!(p["gridPos"]["w"].is_u64() && p["targets"].is_array(), "{p}");
        }
        let mut all = Vec::new();
        exprs(&dash, &mut all);
        assert!(!all.is_empty());
        for expr in &all {
            for name in metric_names(expr) {
                assert!(
                    registered.contains(&name),
                    "{}: `{name}` (in `{expr}`) is not a metric the gateway registers",
                    path.display()
                );
            }
        }
    }
    assert!(seen > 0, "no dashboards in {}", dir.display());
}
