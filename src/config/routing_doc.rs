//! `policies/routing.yaml` read once into one raw document whose sections go to their owners'
//! checkers: `pools:` to `routing_file`, `models:` (canary splits) to `crate::canary`, `shadows:`
//! to `crate::shadow`. The checkers take the parsed sections, never the text.
//!
//! A schema error aborts a serde parse, yet an error in one section must not hide the problems
//! of the others. So only when the one parse fails does the error path read each section alone
//! (as if the others were not there), which reports exactly what each section's own reading
//! reports: a file that is not YAML once, at its place; a schema error in `pools:` or at the top
//! level at its place; one in `models:` or `shadows:` as a message about the file.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::pool_policy::RawPoolPolicy;
use super::raw::Text;
use super::shape_classes::RawShapeClass;
use crate::canary::spec::RawCanary;
use crate::diagnostics::ConfigError;
use crate::routing::PolicyConfig;
use crate::shadow::ShadowSpec;

/// routing.yaml's sections, each parsed or the error that stands for it.
pub(super) struct RoutingDoc {
    /// `pools:`: each pool's name and policy, in file order.
    pub pools: Result<Vec<(Text, RawPoolPolicy)>, ConfigError>,
    /// `models:`: each model's canary split as written.
    pub models: Result<BTreeMap<String, RawCanary>, ConfigError>,
    /// `shadows:`: each model's shadow as written.
    pub shadows: Result<BTreeMap<String, ShadowSpec>, ConfigError>,
    /// `shape_classes:`: the classes as written, in file order.
    pub shape_classes: Result<Vec<RawShapeClass>, ConfigError>,
}

/// The whole document: every section typed by its owner, nothing else allowed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Whole {
    pools: Option<HashMap<Text, RawPoolPolicy>>,
    models: Option<BTreeMap<String, RawCanary>>,
    #[serde(default)]
    shadows: BTreeMap<String, ShadowSpec>,
    #[serde(default)]
    shape_classes: Vec<RawShapeClass>,
}

/// Parses routing.yaml (named `file` in errors) once; see the module doc for the error path.
pub(super) fn parse(text: &str, file: &Path) -> RoutingDoc {
    match yaml::<Whole>(text) {
        Ok(whole) => {
            let pools = whole.pools.unwrap_or_default().into_iter().collect();
            RoutingDoc {
                pools: Ok(in_file_order(pools)),
                models: Ok(whole.models.unwrap_or_default()),
                shadows: Ok(whole.shadows),
                shape_classes: Ok(whole.shape_classes),
            }
        }
        Err(_) => each_alone(text, file),
    }
}

/// `pools:` read alone: the top level is strict, the other sections are not looked into.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolsAlone {
    pools: Option<HashMap<Text, PolicyConfig>>,
    #[serde(rename = "models")]
    _models: Option<IgnoredAny>,
    #[serde(rename = "shadows")]
    _shadows: Option<IgnoredAny>,
    #[serde(rename = "shape_classes")]
    _shape_classes: Option<IgnoredAny>,
}

/// `pools:` read leniently for the place of every key under each pool.
#[derive(Deserialize)]
struct PoolKeys {
    pools: Option<HashMap<Text, Option<HashMap<Text, IgnoredAny>>>>,
}

/// `models:` read alone; every other key is left to its owner.
#[derive(Deserialize)]
struct ModelsAlone {
    models: Option<BTreeMap<String, RawCanary>>,
}

/// `shadows:` read alone; every other key is left to its owner.
#[derive(Deserialize)]
struct ShadowsAlone {
    #[serde(default)]
    shadows: BTreeMap<String, ShadowSpec>,
}

/// `shape_classes:` read alone; every other key is left to its owner.
#[derive(Deserialize)]
struct ShapeClassesAlone {
    #[serde(default)]
    shape_classes: Vec<RawShapeClass>,
}

/// The error path: each section read alone. A blank file has no pools or models; a file that is
/// not YAML is reported once (by the pools' reading).
fn each_alone(text: &str, file: &Path) -> RoutingDoc {
    let blank = is_blank(text);
    let pools = if blank {
        Ok(Vec::new())
    } else {
        pools_alone(text, file)
    };
    if yaml::<IgnoredAny>(text).is_err() {
        return RoutingDoc {
            pools,
            models: Ok(BTreeMap::new()),
            shadows: Ok(BTreeMap::new()),
            shape_classes: Ok(Vec::new()),
        };
    }
    let models = if blank {
        Ok(BTreeMap::new())
    } else {
        yaml::<ModelsAlone>(text)
            .map(|m| m.models.unwrap_or_default())
            .map_err(|e| ConfigError::file(file, e.to_string()))
    };
    let shadows = yaml::<ShadowsAlone>(text)
        .map(|s| s.shadows)
        .map_err(|e| ConfigError::file(file, format!("shadows: {e}")));
    let shape_classes = yaml::<ShapeClassesAlone>(text)
        .map(|s| s.shape_classes)
        .map_err(|e| ConfigError::yaml(file, &e));
    RoutingDoc {
        pools,
        models,
        shadows,
        shape_classes,
    }
}

/// `pools:` read alone, each pool with the places of its keys (none when they cannot be read).
fn pools_alone(text: &str, file: &Path) -> Result<Vec<(Text, RawPoolPolicy)>, ConfigError> {
    let raw: PoolsAlone = yaml(text).map_err(|e| ConfigError::yaml(file, &e))?;
    let mut places: HashMap<String, HashMap<_, _>> = match yaml::<PoolKeys>(text) {
        Ok(keys) => keys
            .pools
            .unwrap_or_default()
            .into_iter()
            .map(|(pool, keys)| {
                let keys = keys.unwrap_or_default().into_keys();
                (pool.value, keys.map(|k| (k.value, k.referenced)).collect())
            })
            .collect(),
        Err(_) => HashMap::new(),
    };
    let pools = raw
        .pools
        .unwrap_or_default()
        .into_iter()
        .map(|(pool, policy)| {
            let places = places.remove(&pool.value).unwrap_or_default();
            (pool, RawPoolPolicy { policy, places })
        });
    Ok(in_file_order(pools.collect()))
}

/// Pools sorted by where their names were written.
fn in_file_order(mut pools: Vec<(Text, RawPoolPolicy)>) -> Vec<(Text, RawPoolPolicy)> {
    pools.sort_by_key(|(pool, _)| (pool.referenced.line(), pool.referenced.column()));
    pools
}

/// True when the text holds nothing but blank lines and comments.
fn is_blank(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .all(|l| l.is_empty() || l.starts_with('#') || l == "---")
}

/// Every parse of routing.yaml goes through here (counted in tests).
fn yaml<'de, T: Deserialize<'de>>(text: &'de str) -> Result<T, serde_saphyr::Error> {
    #[cfg(test)]
    PARSES.with(|n| n.set(n.get() + 1));
    serde_saphyr::from_str(text)
}

#[cfg(test)]
thread_local! {
    /// Parses of routing.yaml text on this thread.
    static PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Parses of routing.yaml text on this thread so far.
#[cfg(test)]
pub(super) fn parses() -> usize {
    PARSES.with(std::cell::Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::load_both;

    const CONFIG: &str = "\
models:
  - {name: m, pool: p}
  - {name: m-canary, pool: p}
  - {name: m-shadow, pool: q}
pools:
  - name: p
    workers: [{url: http://127.0.0.1:9000/}]
  - name: q
    workers: [{url: http://127.0.0.1:9001/}]
";

    /// routing.yaml with all three sections; `{tolerance}`, `{weight}` and `{share}` set.
    fn routing(tolerance: &str, weight: &str, share: &str) -> String {
        format!(
            "\
pools:
  p: {{policy: prefix, balance_tolerance: {tolerance}}}
  q: {{policy: round_robin}}
models:
  m:
    versions:
      - {{name: stable, model: m, weight: 90}}
      - {{name: canary, model: m-canary, weight: {weight}}}
shadows:
  m: {{model: m-shadow, share: {share}}}
"
        )
    }

    /// What `f` returns, and how many times it parsed routing.yaml text.
    fn counting<T>(f: impl FnOnce() -> T) -> (T, usize) {
        let before = parses();
        let value = f();
        (value, parses() - before)
    }

    #[test]
    fn a_routing_file_with_every_section_is_parsed_once() {
        let text = routing("0.5", "10", "0.25");
        let (snap, n) = counting(|| load_both(CONFIG, Some(&text)));
        let snap = snap.expect("valid");
        assert_eq!(n, 1, "routing.yaml parsed {n} times");
        let policy = |name: &str| {
            snap.pools
                .iter()
                .find(|p| p.name == name)
                .map(|p| p.policy.name())
        };
        assert_eq!(
            (policy("p"), policy("q")),
            (Some("prefix"), Some("round_robin"))
        );
        assert_eq!(snap.canaries["m"].versions[1].model, "m-canary");
        assert_eq!(snap.shadows["m"].share, 0.25);
    }

    #[test]
    fn an_error_in_each_section_is_reported_in_file_order_after_one_parse() {
        let text = routing("99", "20", "2");
        let (result, n) = counting(|| load_both(CONFIG, Some(&text)));
        assert_eq!(n, 1, "routing.yaml parsed {n} times");
        let Err(errors) = result else {
            panic!("three errors expected");
        };
        let got: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
        let file = "/etc/infergate/routing.yaml";
        let want = [
            format!("{file}:2:23: pool `p`: balance_tolerance must be a number in [0, 10], got 99"),
            format!("{file}:6:5: model `m`: weights sum to 110; they must sum to 100"),
            format!("{file}:10:24: shadows: `m`: share must be in 0..=1, got 2"),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn a_schema_error_in_one_section_reads_each_section_alone() {
        let text = routing("99", "-5", "2");
        let (result, n) = counting(|| load_both(CONFIG, Some(&text)));
        assert!(n > 1, "the error path reads each section alone");
        let Err(errors) = result else {
            panic!("three errors expected");
        };
        let messages: Vec<&str> = errors.0.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(messages.len(), 3, "{messages:#?}");
        assert!(messages[0].contains("balance_tolerance"), "{messages:#?}");
        assert!(messages[1].contains("invalid u32"), "{messages:#?}");
        assert!(
            messages[2].contains("share must be in 0..=1"),
            "{messages:#?}"
        );
    }

    #[test]
    fn a_pool_entry_notes_where_each_key_was_written() {
        let text = "p:\n  policy: session\n  min_match_blocks: 3\n";
        let pools: HashMap<String, RawPoolPolicy> = serde_saphyr::from_str(text).expect("valid");
        let place = |key: &str| pools["p"].places.get(key).map(|l| (l.line(), l.column()));
        assert_eq!(place("policy"), Some((2, 3)));
        assert_eq!(place("min_match_blocks"), Some((3, 3)));
        assert_eq!(pools["p"].policy, PolicyConfig::Session);
        // The list form names no keys: the one parse refuses it, the lenient reading takes it.
        let list = serde_saphyr::from_str::<HashMap<String, RawPoolPolicy>>("p: [session]\n");
        assert!(list.is_err());
    }
}
