//! Validation of `quality.regression:`: the prompts file (read at load, each bad line reported
//! at its own line of that file), the interval between rounds and the models replayed (default:
//! every model with a canary split).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::raw::RawRegression;
use super::snapshot::ModelRoute;
use super::values::parse_duration;
use crate::canary::CanarySpec;
use crate::diagnostics::{ConfigError, Sink};
use crate::quality::regression::{self, RegressionConfig};

/// Largest prompts file read, in bytes.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// What the replayed models are checked against.
pub(super) struct Known<'a> {
    /// The config's models.
    pub models: &'a [ModelRoute],
    /// routing.yaml's canary splits.
    pub canaries: &'a BTreeMap<String, CanarySpec>,
}

/// `quality.regression:` checked.
#[derive(Default)]
pub(super) struct Regression {
    /// The validated section; `None` when absent or wrong.
    pub config: Option<RegressionConfig>,
    /// The prompts file's own errors, at its lines.
    pub errors: Vec<ConfigError>,
    /// The prompts file, watched for reloads like the policy files.
    pub file: Option<PathBuf>,
}

/// Checks `quality.regression:` (the prompts path relative to `base`, the config's directory).
pub(super) fn regression(
    sink: &mut Sink<'_>,
    raw: Option<&RawRegression>,
    base: &Path,
    known: &Known<'_>,
) -> Regression {
    let Some(raw) = raw else {
        return Regression::default();
    };
    let mut ok = true;
    let interval = match &raw.interval {
        None => regression::DEFAULT_INTERVAL,
        Some(text) => match parse_duration(&text.value) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => {
                sink.at(
                    &text.referenced,
                    "quality.regression.interval must be above zero",
                );
                ok = false;
                regression::DEFAULT_INTERVAL
            }
            Err(msg) => {
                sink.at(
                    &text.referenced,
                    format!("quality.regression.interval: {msg}"),
                );
                ok = false;
                regression::DEFAULT_INTERVAL
            }
        },
    };
    let models = match &raw.models {
        None => known.canaries.keys().cloned().collect(),
        Some(list) => {
            let mut models: Vec<String> = Vec::with_capacity(list.len());
            for m in list {
                let problem = if models.contains(&m.value) {
                    Some(format!(
                        "quality.regression.models: `{}` is listed twice",
                        m.value
                    ))
                } else {
                    callable(&m.value, known)
                };
                match problem {
                    Some(p) => {
                        sink.at(&m.referenced, p);
                        ok = false;
                    }
                    None => models.push(m.value.clone()),
                }
            }
            models
        }
    };
    let joined = base.join(&raw.prompts.value);
    let path = std::path::absolute(&joined).unwrap_or(joined);
    let mut out = Regression {
        file: Some(path.clone()),
        ..Regression::default()
    };
    let text = match read(&path) {
        Ok(text) => text,
        Err(msg) => {
            sink.at(
                &raw.prompts.referenced,
                format!("quality.regression.prompts: {msg}"),
            );
            return out;
        }
    };
    match regression::parse_prompts(&text) {
        Ok(prompts) if ok => {
            out.config = Some(RegressionConfig {
                prompts: prompts.into(),
                interval,
                models,
            });
        }
        Ok(_) => {}
        Err(problems) => {
            out.errors = problems
                .into_iter()
                .map(|(line, message)| ConfigError {
                    file: path.clone(),
                    line,
                    column: None,
                    message,
                })
                .collect();
        }
    }
    out
}

/// Why `model` cannot be replayed, if it cannot: it must be a model clients call (a canary's
/// version model is reached through its canary's model).
fn callable(model: &str, known: &Known<'_>) -> Option<String> {
    let Some(route) = known.models.iter().find(|r| r.name == model) else {
        return Some(format!(
            "quality.regression.models: `{model}` is not a model of the config"
        ));
    };
    if route.direct || known.canaries.contains_key(model) {
        return None;
    }
    let owner = known.canaries.iter().find(|(_, spec)| {
        spec.versions
            .iter()
            .enumerate()
            .any(|(i, v)| i != spec.stable && v.model == model)
    });
    owner.map(|(canary, _)| {
        format!(
            "quality.regression.models: `{model}` is a version of `{canary}`; list `{canary}`, whose versions are all replayed"
        )
    })
}

/// The prompts file's text, bounded.
fn read(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!(
            "{shown} is {} bytes; at most {MAX_FILE_BYTES} are read",
            meta.len()
        ));
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {shown}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{MINIMAL, errors, load_both};
    use std::time::Duration;

    /// A prompts file under the temp directory, unique to `name`; its absolute path.
    fn prompts_file(name: &str, text: &str) -> String {
        let dir = std::env::temp_dir().join(format!(
            "infergate-regression-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("prompts.jsonl");
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    }

    const GOOD: &str = r#"{"id": "a", "prompt": "Say hi.", "max_tokens": 4}"#;

    #[test]
    fn absent_nothing_is_replayed_and_present_every_key_is_read() {
        let s = load_both(MINIMAL, None).unwrap();
        assert_eq!(s.quality.regression, None);
        let file = prompts_file("keys", &format!("{GOOD}\n"));
        let yaml = format!(
            "quality:\n  regression: {{prompts: {file}, interval: 200ms, models: [m]}}\n{MINIMAL}"
        );
        let s = load_both(&yaml, None).unwrap();
        let r = s.quality.regression.clone().unwrap();
        assert_eq!(r.interval, Duration::from_millis(200));
        assert_eq!(r.models, ["m"]);
        assert_eq!(r.prompts.len(), 1);
        assert!(
            s.files.iter().any(|f| f.ends_with("prompts.jsonl")),
            "watched"
        );
        // Without `models`: every model with a canary split, here none; the default interval.
        let yaml = format!("quality:\n  regression: {{prompts: {file}}}\n{MINIMAL}");
        let r = load_both(&yaml, None)
            .unwrap()
            .quality
            .regression
            .clone()
            .unwrap();
        assert_eq!(r.interval, Duration::from_secs(600));
        assert!(r.models.is_empty());
    }

    #[test]
    fn the_canary_models_are_the_default_and_a_version_model_is_refused() {
        let file = prompts_file("canary", GOOD);
        let pools = "pools:\n  - name: p\n    workers:\n      - url: http://127.0.0.1:9000/\n";
        let models = "models:\n  - {name: m, pool: p}\n  - {name: m2, pool: p}\n";
        let config = format!("quality:\n  regression:\n    prompts: {file}\n{models}{pools}");
        let routing = "models:\n  m:\n    versions:\n      - {name: v1, model: m, weight: 90}\n      - {name: v2, model: m2, weight: 10}\n";
        let r = load_both(&config, Some(routing))
            .unwrap()
            .quality
            .regression
            .clone()
            .unwrap();
        assert_eq!(r.models, ["m"]);
        let listed = config.replace(
            &format!("    prompts: {file}\n"),
            &format!("    prompts: {file}\n    models: [m2, m, m, nope]\n"),
        );
        let errs = errors(&listed, Some(routing));
        let messages: Vec<&str> = errs.iter().map(|e| e.2.as_str()).collect();
        assert_eq!(errs.len(), 3, "{errs:#?}");
        assert!(
            messages[0].contains("`m2` is a version of `m`"),
            "{messages:?}"
        );
        assert!(messages[1].contains("`m` is listed twice"), "{messages:?}");
        assert!(
            messages[2].contains("`nope` is not a model"),
            "{messages:?}"
        );
        assert!(errs.iter().all(|e| e.1 == Some(4)), "{errs:#?}");
    }

    #[test]
    fn a_missing_file_is_an_error_at_the_key_and_a_bad_line_at_its_own_line() {
        let yaml = "quality:\n  regression:\n    interval: 0s\n    prompts: /nonexistent/infergate/prompts.jsonl\n"
            .to_string()
            + MINIMAL;
        let errs = errors(&yaml, None);
        assert_eq!(errs.len(), 2, "{errs:#?}");
        assert_eq!((errs[0].1, errs[1].1), (Some(3), Some(4)), "{errs:#?}");
        assert!(
            errs[0].2.contains("interval must be above zero"),
            "{errs:#?}"
        );
        assert!(errs[1].2.contains("cannot read /nonexistent"), "{errs:#?}");

        let file = prompts_file("bad", &format!("{GOOD}\n\n{{\"id\": \"b\"}}\n"));
        let yaml = format!("quality:\n  regression: {{prompts: {file}}}\n{MINIMAL}");
        let errs = errors(&yaml, None);
        assert_eq!(errs.len(), 1, "{errs:#?}");
        assert_eq!(errs[0].0, "prompts.jsonl");
        assert_eq!(errs[0].1, Some(3));
        assert!(errs[0].2.contains("needs `messages`"), "{errs:#?}");
    }
}
