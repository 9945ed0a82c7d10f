//! Shape classes (routing.yaml `shape_classes:`): named match rules on a request's shape
//! (prompt tokens, `max_tokens`, choices, image parts, tier, model) that send it to a pool of
//! its own with a deadline of its own. A rare shape that leaves the engine's fast path (a long
//! prompt past the captured budget, many choices, images) then waits in, and is refused by, its
//! own pool's queue, whose drain rate makes its Retry-After: it neither slows the common
//! traffic's steps nor takes its turns. The first class that matches wins; a request no class
//! matches keeps its model's pool.

use std::time::Duration;

/// A bound on a number: inclusive at both ends, open where absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Range {
    /// Smallest matching value.
    pub min: Option<u64>,
    /// Largest matching value.
    pub max: Option<u64>,
}

impl Range {
    /// Whether `x` is within the bounds.
    pub fn contains(&self, x: u64) -> bool {
        self.min.is_none_or(|m| x >= m) && self.max.is_none_or(|m| x <= m)
    }
}

/// A feature of a request that changes its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeFeature {
    /// More than one choice (`n` > 1).
    N,
    /// Image, audio or file parts in the prompt.
    Images,
}

impl ShapeFeature {
    /// The feature's name in routing.yaml.
    pub fn name(self) -> &'static str {
        match self {
            ShapeFeature::N => "n",
            ShapeFeature::Images => "images",
        }
    }

    /// The feature named `name`, if there is one.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "n" => Some(ShapeFeature::N),
            "images" => Some(ShapeFeature::Images),
            _ => None,
        }
    }
}

/// What a class matches: every rule given must hold (an empty rule matches anything).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShapeMatch {
    /// The prompt's tokens (the gateway's count).
    pub prompt_tokens: Range,
    /// The completion bound the request goes upstream with.
    pub max_tokens: Range,
    /// Any one of these features (none listed: not a rule).
    pub features: Vec<ShapeFeature>,
    /// The caller's tier is one of these (none listed: any tier).
    pub tiers: Vec<String>,
    /// The model served (after a canary split) is one of these (none listed: any model).
    pub models: Vec<String>,
}

/// One request's shape as the gateway knows it before admission.
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion bound.
    pub max_tokens: u64,
    /// Choices asked for.
    pub n: u32,
    /// Image, audio and file parts.
    pub media_parts: u32,
    /// The caller's tier.
    pub tier: &'a str,
    /// The model that serves it.
    pub model: &'a str,
}

impl ShapeMatch {
    /// Whether `shape` meets every rule.
    pub fn matches(&self, shape: &Shape<'_>) -> bool {
        let has = |f: &ShapeFeature| match f {
            ShapeFeature::N => shape.n > 1,
            ShapeFeature::Images => shape.media_parts > 0,
        };
        self.prompt_tokens.contains(shape.prompt_tokens)
            && self.max_tokens.contains(shape.max_tokens)
            && (self.features.is_empty() || self.features.iter().any(has))
            && (self.tiers.is_empty() || self.tiers.iter().any(|t| t == shape.tier))
            && (self.models.is_empty() || self.models.iter().any(|m| m == shape.model))
    }
}

/// A named class: its rules, its pool and its deadline.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeClass {
    /// Name (a metric label: letters, digits, `-`, `_`).
    pub name: String,
    /// What it matches.
    pub rules: ShapeMatch,
    /// The pool its requests go to (by name; an index into the snapshot's pools in `pool`).
    pub pool_name: String,
    /// Index of that pool in the snapshot.
    pub pool: usize,
    /// The deadline of a request of the class that names none (`x-infergate-deadline-ms`).
    pub deadline: Option<Duration>,
}

/// The first class in `classes` that `shape` matches.
pub fn classify<'a>(classes: &'a [ShapeClass], shape: &Shape<'_>) -> Option<&'a ShapeClass> {
    classes.iter().find(|c| c.rules.matches(shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(prompt_tokens: u64) -> Shape<'static> {
        Shape {
            prompt_tokens,
            max_tokens: 64,
            n: 1,
            media_parts: 0,
            tier: "free",
            model: "m",
        }
    }

    fn class(name: &str, rules: ShapeMatch) -> ShapeClass {
        ShapeClass {
            name: name.into(),
            rules,
            pool_name: name.into(),
            pool: 0,
            deadline: None,
        }
    }

    #[test]
    fn the_first_matching_class_wins_and_unmatched_requests_keep_their_pool() {
        let long = ShapeMatch {
            prompt_tokens: Range {
                min: Some(4000),
                max: None,
            },
            ..ShapeMatch::default()
        };
        let multi = ShapeMatch {
            features: vec![ShapeFeature::N, ShapeFeature::Images],
            ..ShapeMatch::default()
        };
        let classes = [class("long", long), class("multi", multi)];
        assert_eq!(
            classify(&classes, &shape(4000)).map(|c| &*c.name),
            Some("long")
        );
        assert_eq!(classify(&classes, &shape(3999)).map(|c| &*c.name), None);
        let many = Shape { n: 4, ..shape(10) };
        assert_eq!(classify(&classes, &many).map(|c| &*c.name), Some("multi"));
        let image = Shape {
            media_parts: 1,
            ..shape(5000)
        };
        assert_eq!(
            classify(&classes, &image).map(|c| &*c.name),
            Some("long"),
            "file order decides"
        );
    }

    #[test]
    fn every_rule_given_must_hold() {
        let rules = ShapeMatch {
            max_tokens: Range {
                min: None,
                max: Some(64),
            },
            tiers: vec!["free".into()],
            models: vec!["m".into()],
            ..ShapeMatch::default()
        };
        assert!(rules.matches(&shape(1)));
        assert!(!rules.matches(&Shape {
            max_tokens: 65,
            ..shape(1)
        }));
        assert!(!rules.matches(&Shape {
            tier: "pro",
            ..shape(1)
        }));
        assert!(!rules.matches(&Shape {
            model: "other",
            ..shape(1)
        }));
        assert!(
            ShapeMatch::default().matches(&shape(0)),
            "no rule: any shape"
        );
        assert_eq!(ShapeFeature::parse("images"), Some(ShapeFeature::Images));
        assert_eq!(ShapeFeature::parse("tools"), None);
    }
}
