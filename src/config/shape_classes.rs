//! `shape_classes:` of `policies/routing.yaml` (see [`crate::routing::shape_class`]): each class
//! checked where it was written (name, pool, ranges, features, tiers, models, deadline) and its
//! pool resolved against the main config's pools.

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::raw::Text;
use crate::diagnostics::Sink;
use crate::routing::shape_class::{Range, ShapeClass, ShapeFeature, ShapeMatch};

/// Longest class name (it labels metrics).
const MAX_NAME: usize = 64;
/// Most classes a file may declare (each one is a metric label value).
pub(super) const MAX_CLASSES: usize = 32;

/// One class as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawShapeClass {
    name: Text,
    #[serde(rename = "match", default)]
    rules: RawMatch,
    pool: Text,
    deadline: Option<Text>,
}

/// A class's rules as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatch {
    prompt_tokens: Option<RawRange>,
    max_tokens: Option<RawRange>,
    #[serde(default)]
    features: Vec<Text>,
    #[serde(default)]
    tiers: Vec<Text>,
    #[serde(default)]
    models: Vec<Text>,
}

/// `{min, max}` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRange {
    min: Option<Spanned<u64>>,
    max: Option<Spanned<u64>>,
}

/// What the checks know of the rest of the config.
pub(super) struct Known<'a> {
    /// Pool names, in the snapshot's order.
    pub pools: &'a [&'a str],
    /// Tier names (empty: tiers are not known, not checked).
    pub tiers: &'a [&'a str],
    /// Model names.
    pub models: &'a [&'a str],
}

/// Checks the section: a class with any problem is reported (at its place) and dropped.
pub(super) fn check(
    raw: Vec<RawShapeClass>,
    known: &Known<'_>,
    sink: &mut Sink<'_>,
) -> Vec<ShapeClass> {
    let mut classes: Vec<ShapeClass> = Vec::new();
    for (i, c) in raw.into_iter().enumerate() {
        let mut clean = true;
        let mut fail = |at: &serde_saphyr::Location, message: String| {
            sink.at(at, format!("shape class `{}`: {message}", c.name.value));
            clean = false;
        };
        if i >= MAX_CLASSES {
            fail(
                &c.name.referenced,
                format!("at most {MAX_CLASSES} shape classes"),
            );
        }
        let name = &c.name.value;
        let label_ok = !name.is_empty()
            && name.len() <= MAX_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !label_ok {
            fail(
                &c.name.referenced,
                format!("a name is 1 to {MAX_NAME} letters, digits, `-` or `_`"),
            );
        }
        if classes.iter().any(|k| &k.name == name) {
            fail(&c.name.referenced, "named twice".into());
        }
        let pool = known.pools.iter().position(|p| *p == c.pool.value);
        if pool.is_none() {
            fail(
                &c.pool.referenced,
                format!("pool `{}` is not a pool of the config", c.pool.value),
            );
        }
        let mut range = |r: &Option<RawRange>, key: &str| -> Range {
            let Some(r) = r else {
                return Range::default();
            };
            if let (Some(lo), Some(hi)) = (&r.min, &r.max)
                && lo.value > hi.value
            {
                fail(
                    &lo.referenced,
                    format!("{key}: min {} is above max {}", lo.value, hi.value),
                );
            }
            Range {
                min: r.min.as_ref().map(|m| m.value),
                max: r.max.as_ref().map(|m| m.value),
            }
        };
        let prompt_tokens = range(&c.rules.prompt_tokens, "prompt_tokens");
        let max_tokens = range(&c.rules.max_tokens, "max_tokens");
        let mut features = Vec::new();
        for f in &c.rules.features {
            match ShapeFeature::parse(&f.value) {
                Some(x) => features.push(x),
                None => fail(
                    &f.referenced,
                    format!("unknown feature `{}` (known: n, images)", f.value),
                ),
            }
        }
        for (list, known_names, what) in [
            (&c.rules.tiers, known.tiers, "tier"),
            (&c.rules.models, known.models, "model"),
        ] {
            for item in list {
                if !known_names.is_empty() && !known_names.contains(&item.value.as_str()) {
                    fail(
                        &item.referenced,
                        format!("{what} `{}` is not defined", item.value),
                    );
                }
            }
        }
        let deadline = c
            .deadline
            .as_ref()
            .and_then(|d| match crate::duration::parse(&d.value) {
                Ok(x) if !x.is_zero() => Some(x),
                Ok(_) => {
                    fail(&d.referenced, "deadline must be above 0".into());
                    None
                }
                Err(e) => {
                    fail(&d.referenced, format!("deadline: {e}"));
                    None
                }
            });
        let (Some(pool), true) = (pool, clean) else {
            continue;
        };
        classes.push(ShapeClass {
            name: name.clone(),
            rules: ShapeMatch {
                prompt_tokens,
                max_tokens,
                features,
                tiers: c.rules.tiers.iter().map(|t| t.value.clone()).collect(),
                models: c.rules.models.iter().map(|m| m.value.clone()).collect(),
            },
            pool_name: c.pool.value.clone(),
            pool,
            deadline,
        });
    }
    classes
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn checked(yaml: &str) -> (Vec<ShapeClass>, Vec<String>) {
        let raw: Vec<RawShapeClass> = serde_saphyr::from_str(yaml).expect("valid YAML");
        let file = Path::new("routing.yaml");
        let mut sink = Sink::new(file);
        let known = Known {
            pools: &["main", "long"],
            tiers: &["free", "pro"],
            models: &["m"],
        };
        let classes = check(raw, &known, &mut sink);
        let errors = sink.into_sorted().iter().map(ToString::to_string).collect();
        (classes, errors)
    }

    #[test]
    fn a_class_resolves_its_pool_and_reads_its_rules() {
        let (classes, errors) = checked(
            "- name: long\n  match: {prompt_tokens: {min: 4000}, features: [images], tiers: [pro]}\n  pool: long\n  deadline: 30s\n",
        );
        assert!(errors.is_empty(), "{errors:?}");
        let c = &classes[0];
        assert_eq!(
            (c.name.as_str(), c.pool, c.pool_name.as_str()),
            ("long", 1, "long")
        );
        assert_eq!(c.rules.prompt_tokens.min, Some(4000));
        assert_eq!(c.rules.features, vec![ShapeFeature::Images]);
        assert_eq!(c.deadline, Some(std::time::Duration::from_secs(30)));
    }

    #[test]
    fn each_problem_is_reported_at_its_line() {
        let (classes, errors) = checked(
            "- name: a b\n  pool: nowhere\n- name: c\n  match:\n    prompt_tokens: {min: 9, max: 3}\n    features: [tools]\n    tiers: [gold]\n  pool: main\n  deadline: 0s\n",
        );
        assert!(classes.is_empty());
        let want = [
            "routing.yaml:1:9: shape class `a b`: a name is 1 to 64 letters, digits, `-` or `_`",
            "routing.yaml:2:9: shape class `a b`: pool `nowhere` is not a pool of the config",
            "routing.yaml:5:26: shape class `c`: prompt_tokens: min 9 is above max 3",
            "routing.yaml:6:16: shape class `c`: unknown feature `tools` (known: n, images)",
            "routing.yaml:7:13: shape class `c`: tier `gold` is not defined",
            "routing.yaml:9:13: shape class `c`: deadline must be above 0",
        ];
        assert_eq!(errors, want);
    }
}
