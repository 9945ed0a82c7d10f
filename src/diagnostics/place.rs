//! Where a problem sits in a YAML file: feature modules (degradation, canary, shadow) validate
//! typed values and name each problem's place as a path of keys and list indices
//! ([`YamlPath`]); the config loader turns the path into a line and column of the file's text
//! ([`placed`]), so every error of `config check` points into the file.

use std::path::Path;

use serde::Deserialize;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Location, Spanned};

use super::error::ConfigError;

/// One step of a path: a mapping key or a list index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// A mapping key.
    Key(String),
    /// A list index (0-based).
    Index(usize),
}

/// Keys and list indices from the document root, e.g. `pools.local.levels[2].enter`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct YamlPath(pub Vec<Seg>);

impl YamlPath {
    /// The root.
    pub fn root() -> Self {
        Self(Vec::new())
    }

    /// This path and then `key`.
    pub fn key(&self, key: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Key(key.to_string()));
        p
    }

    /// This path and then list index `i`.
    pub fn index(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Index(i));
        p
    }
}

/// A validation problem: what is wrong, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Where in the file.
    pub path: YamlPath,
    /// What is wrong, and what would be right.
    pub message: String,
}

impl Problem {
    /// A problem at `path`.
    pub fn at(path: &YamlPath, message: impl Into<String>) -> Self {
        Self {
            path: path.clone(),
            message: message.into(),
        }
    }
}

/// `value` when there are no problems, else their messages (for callers that report text only,
/// such as the simulator and unit tests).
pub fn into_messages<T>(value: T, problems: Vec<Problem>) -> Result<T, Vec<String>> {
    if problems.is_empty() {
        Ok(value)
    } else {
        Err(problems.into_iter().map(|p| p.message).collect())
    }
}

/// The shape of a document with every key's and item's place: just enough to find a path.
enum Node {
    Map(Vec<(Spanned<String>, Spanned<Node>)>),
    Seq(Vec<Spanned<Node>>),
    Leaf,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<String>>()? {
            entries.push((key, map.next_value::<Spanned<Node>>()?));
        }
        Ok(Node::Map(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Node>>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_str<E>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Leaf)
    }
}

/// The problems of `text` as errors of `file`, each at its line and column (the text is parsed
/// once for all of them), in line order; a problem whose place is not found is about the file.
pub fn placed(text: &str, file: &Path, problems: Vec<Problem>) -> Vec<ConfigError> {
    let root: Option<Node> = serde_saphyr::from_str(text).ok();
    let mut errors: Vec<ConfigError> = problems
        .into_iter()
        .map(
            |p| match root.as_ref().and_then(|r| locate_in(r, &p.path)) {
                Some(location) => ConfigError::at(file, &location, p.message),
                None => ConfigError::file(file, p.message),
            },
        )
        .collect();
    errors.sort_by_key(|e| (e.line, e.column));
    errors
}

/// The line and column of `path` in the document `root`: of its last key (or list item), or of
/// the deepest part of it the document has; `None` when not even the first step is there.
fn locate_in(root: &Node, path: &YamlPath) -> Option<Location> {
    let mut node = root;
    let mut found = None;
    for seg in &path.0 {
        let next = match (node, seg) {
            (Node::Map(entries), Seg::Key(k)) => entries
                .iter()
                .find(|(key, _)| &key.value == k)
                .map(|(key, value)| (key.referenced, &value.value)),
            (Node::Seq(items), Seg::Index(i)) => {
                items.get(*i).map(|item| (item.referenced, &item.value))
            }
            _ => None,
        };
        let Some((place, child)) = next else {
            break;
        };
        found = Some(place);
        node = child;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The place of `path` in `text`, `None` when the text does not parse.
    fn locate(text: &str, path: &YamlPath) -> Option<Location> {
        locate_in(&serde_saphyr::from_str(text).ok()?, path)
    }

    const DOC: &str = "\
pools:
  local:
    window: 10s
    levels:
      - name: a
        enter: {queue_depth: 3}
      - name: b
        actions:
          - shed: {tiers: [free]}
";

    fn line(path: &YamlPath) -> Option<u64> {
        locate(DOC, path).map(|l| l.line())
    }

    #[test]
    fn keys_and_list_items_have_their_lines() {
        let local = YamlPath::root().key("pools").key("local");
        assert_eq!(line(&local), Some(2));
        assert_eq!(line(&local.key("window")), Some(3));
        let levels = local.key("levels");
        assert_eq!(line(&levels.index(0)), Some(5));
        assert_eq!(line(&levels.index(0).key("enter")), Some(6));
        assert_eq!(
            line(&levels.index(0).key("enter").key("queue_depth")),
            Some(6)
        );
        assert_eq!(line(&levels.index(1).key("actions").index(0)), Some(9));
        let col = locate(DOC, &levels.index(0).key("enter")).map(|l| l.column());
        assert_eq!(col, Some(9));
    }

    #[test]
    fn a_missing_part_falls_back_to_the_deepest_one_found() {
        let local = YamlPath::root().key("pools").key("local");
        // `tick` is not written: the pool's own line.
        assert_eq!(line(&local.key("tick")), Some(2));
        assert_eq!(line(&local.key("levels").index(7)), Some(4));
        assert_eq!(line(&YamlPath::root().key("nothing")), None);
        assert_eq!(locate("{not yaml", &local), None);
    }
}
