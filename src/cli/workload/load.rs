//! Finding and reading workload files: a bare name is looked up in `config/workloads/` (then in
//! the copies shipped inside the binary), anything else is a path. Errors name file and line.

use std::path::{Path, PathBuf};

use super::build::{Problems, build};
use super::model::Workload;
use super::spec::RawWorkload;
use infergate::diagnostics::{ConfigError, ConfigErrors};

/// Where named workloads live, relative to the current directory.
pub const WORKLOAD_DIR: &str = "config/workloads";

/// The shipped workloads, embedded so a bare name works from any directory.
const SHIPPED: &[(&str, &str)] = &[
    ("chat", include_str!("../../../config/workloads/chat.yaml")),
    ("rag", include_str!("../../../config/workloads/rag.yaml")),
    (
        "mixed-long",
        include_str!("../../../config/workloads/mixed-long.yaml"),
    ),
    (
        "burst",
        include_str!("../../../config/workloads/burst.yaml"),
    ),
    (
        "tiers",
        include_str!("../../../config/workloads/tiers.yaml"),
    ),
    // Fair share (issue 45): one tenant sends ten times its neighbours' tokens.
    (
        "noisy-neighbour",
        include_str!("../../../config/workloads/noisy-neighbour.yaml"),
    ),
    // Rare shapes off the fast path (issue 43): victims and culprits.
    (
        "rare-shapes",
        include_str!("../../../config/workloads/rare-shapes.yaml"),
    ),
    (
        "rare-shapes-bursts",
        include_str!("../../../config/workloads/rare-shapes-bursts.yaml"),
    ),
    // The five symptoms' scenarios (config/scenarios/NAME).
    (
        "tpot-at-peak",
        include_str!("../../../config/workloads/tpot-at-peak.yaml"),
    ),
    (
        "host-bound",
        include_str!("../../../config/workloads/host-bound.yaml"),
    ),
    (
        "small-batches",
        include_str!("../../../config/workloads/small-batches.yaml"),
    ),
    (
        "long-context",
        include_str!("../../../config/workloads/long-context.yaml"),
    ),
    (
        "long-context-chat",
        include_str!("../../../config/workloads/long-context-chat.yaml"),
    ),
    (
        "itl-freeze",
        include_str!("../../../config/workloads/itl-freeze.yaml"),
    ),
    (
        "shared-system-prompt",
        include_str!("../../../config/workloads/shared-system-prompt.yaml"),
    ),
];

/// Names of the workloads shipped with infergate.
pub fn shipped() -> impl Iterator<Item = &'static str> {
    SHIPPED.iter().map(|(name, _)| *name)
}

/// Loads a workload: `chat` → `config/workloads/chat.yaml` (or the shipped copy), else a path.
pub fn load(name_or_path: &str) -> Result<Workload, String> {
    let looks_like_path = name_or_path.contains(['/', '\\'])
        || name_or_path.ends_with(".yaml")
        || name_or_path.ends_with(".yml");
    if looks_like_path {
        return load_file(Path::new(name_or_path));
    }
    let local = Path::new(WORKLOAD_DIR).join(format!("{name_or_path}.yaml"));
    if local.exists() {
        return load_file(&local);
    }
    match SHIPPED.iter().find(|(name, _)| *name == name_or_path) {
        Some((name, text)) => {
            let shown = PathBuf::from(WORKLOAD_DIR).join(format!("{name}.yaml"));
            parse(text, &shown, name, None)
        }
        None => {
            let known: Vec<&str> = shipped().collect();
            Err(format!(
                "no workload `{name_or_path}`: not in {WORKLOAD_DIR}/ and not shipped ({}); or give a path",
                known.join(", ")
            ))
        }
    }
}

/// Loads a workload file.
pub fn load_file(path: &Path) -> Result<Workload, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read workload: {e}", path.display()))?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("workload");
    parse(&text, path, stem, path.parent())
}

/// Parses workload YAML; `file` names it in errors, `stem` is the default name and `dir`
/// anchors relative trace paths.
pub fn parse(text: &str, file: &Path, stem: &str, dir: Option<&Path>) -> Result<Workload, String> {
    let raw: RawWorkload =
        serde_saphyr::from_str(text).map_err(|err| ConfigError::yaml(file, &err).to_string())?;
    build(raw, stem, dir).map_err(|problems| report(file, problems))
}

/// Every problem, one line each, in file order: located the way every config file's are
/// ([`infergate::diagnostics`]).
fn report(file: &Path, mut problems: Problems) -> String {
    problems.sort_by_key(|(line, _)| line.unwrap_or(0));
    let errors = problems
        .into_iter()
        .map(|(line, message)| ConfigError {
            line,
            ..ConfigError::file(file, message)
        })
        .collect();
    ConfigErrors(errors).to_string()
}
