//! Validation of the request-shape sections (classes or top-level lengths, prefix groups,
//! sessions, tenants) into a `Mix`, each problem at the line of its section.

use serde_saphyr::Spanned;

use super::build::{Problems, line};
use super::dist;
use super::model::{Mix, PrefixGroups, RequestClass, Sessions, Tenant};
use super::spec::{RawDist, RawWorkload};

/// Checks the request-shape sections into a `Mix`.
pub(super) fn mix(raw: &RawWorkload, p: &mut Problems) -> Option<Mix> {
    let classes = classes(raw, p);
    let prefix_groups = raw.prefix_groups.as_ref().map(|g| {
        let (at, v) = (line(g), &g.value);
        let groups = PrefixGroups {
            count: v.count,
            tokens: v.tokens,
            zipf: v.zipf.unwrap_or(1.0),
            share: v.share.unwrap_or(1.0),
        };
        if groups.count == 0 {
            p.push((at, "prefix_groups.count must be ≥ 1".into()));
        }
        if !(groups.zipf.is_finite() && groups.zipf >= 0.0) {
            p.push((
                at,
                format!("prefix_groups.zipf must be ≥ 0, got {}", groups.zipf),
            ));
        }
        if !(0.0..=1.0).contains(&groups.share) {
            p.push((
                at,
                format!(
                    "prefix_groups.share must be in [0, 1], got {}",
                    groups.share
                ),
            ));
        }
        groups
    });
    let sessions = raw.sessions.as_ref().and_then(|s| {
        if s.value.count == 0 {
            p.push((line(s), "sessions.count must be ≥ 1".into()));
        }
        let turns = dist::build(&s.value.turns, "sessions.turns", line(s), p);
        let first_turn = match &s.value.first_turn {
            Some(d) => Some(dist::build(d, "sessions.first_turn", line(s), p)?),
            None => None,
        };
        Some(Sessions {
            count: s.value.count,
            turns: turns?,
            first_turn,
        })
    });
    let tenants = raw.tenants.as_ref().map_or(Vec::new(), |t| {
        let list: Vec<Tenant> = t
            .value
            .iter()
            .map(|r| Tenant {
                name: r.name.clone(),
                weight: r.weight,
            })
            .collect();
        if list
            .iter()
            .any(|x| !(x.weight.is_finite() && x.weight > 0.0))
        {
            p.push((line(t), "tenants: every weight must be a number > 0".into()));
        }
        list
    });
    Some(Mix {
        classes: classes?,
        prefix_groups,
        sessions,
        tenants,
    })
}

/// The request classes: `classes:` or the top-level lengths as one class named `default`.
fn classes(raw: &RawWorkload, p: &mut Problems) -> Option<Vec<RequestClass>> {
    let corr = |c: f64, at: Option<u64>, key: &str, p: &mut Problems| {
        if !(-1.0..=1.0).contains(&c) {
            p.push((at, format!("{key} must be in [-1, 1], got {c}")));
        }
        c
    };
    let Some(list) = &raw.classes else {
        let length = |d: &Option<Spanned<RawDist>>, key: &str, p: &mut Problems| match d {
            Some(s) => dist::build(&s.value, key, line(s), p),
            None => {
                p.push((
                    None,
                    format!("`{key}` is required (or give `classes` or a `trace`)"),
                ));
                None
            }
        };
        let prompt_tokens = length(&raw.prompt_tokens, "prompt_tokens", p);
        let output_tokens = length(&raw.output_tokens, "output_tokens", p);
        let correlation = raw
            .correlation
            .as_ref()
            .map_or(0.0, |c| corr(c.value, line(c), "correlation", p));
        return Some(vec![RequestClass {
            name: "default".into(),
            weight: 1.0,
            prompt_tokens: prompt_tokens?,
            output_tokens: output_tokens?,
            correlation,
        }]);
    };
    let at = line(list);
    for (present, key) in [
        (raw.prompt_tokens.is_some(), "prompt_tokens"),
        (raw.output_tokens.is_some(), "output_tokens"),
        (raw.correlation.is_some(), "correlation"),
    ] {
        if present {
            let msg = format!("`{key}` goes inside each class when `classes` is given");
            p.push((at, msg));
        }
    }
    if list.value.is_empty() {
        p.push((at, "classes: list at least one class".into()));
    }
    let before = p.len();
    let mut out = Vec::new();
    for (i, c) in list.value.iter().enumerate() {
        let name = c.name.clone().unwrap_or_else(|| format!("class{i}"));
        let key = format!("classes[{i}]");
        if !(c.weight.is_finite() && c.weight > 0.0) {
            p.push((
                at,
                format!("{key}.weight must be a number > 0, got {}", c.weight),
            ));
        }
        let prompt = dist::build(&c.prompt_tokens, &format!("{key}.prompt_tokens"), at, p);
        let output = dist::build(&c.output_tokens, &format!("{key}.output_tokens"), at, p);
        let correlation = corr(
            c.correlation.unwrap_or(0.0),
            at,
            &format!("{key}.correlation"),
            p,
        );
        if let (Some(prompt_tokens), Some(output_tokens)) = (prompt, output) {
            out.push(RequestClass {
                name,
                weight: c.weight,
                prompt_tokens,
                output_tokens,
                correlation,
            });
        }
    }
    (p.len() == before).then_some(out)
}
