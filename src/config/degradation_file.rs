//! `policies/degradation.yaml` in the snapshot: the degradation module validates the levels; this
//! pass checks what only the whole config knows (pool, tier and fallback model names), and
//! places every problem on its line.

use std::collections::BTreeMap;
use std::path::Path;

use super::snapshot::{ModelRoute, PoolSpec, TierSpec};
use crate::degrade::policy::RawDegradationFile;
use crate::degrade::{Action, DegradationPolicy};
use crate::diagnostics::ConfigError;
use crate::diagnostics::{self as place, Problem, YamlPath};

/// The validated policies per pool, and every error found (tied to `file`, each at its line).
pub(super) fn compile(
    text: &str,
    file: &Path,
    pools: &[PoolSpec],
    tiers: &[TierSpec],
    models: &[ModelRoute],
) -> (BTreeMap<String, DegradationPolicy>, Vec<ConfigError>) {
    let raw: RawDegradationFile = match serde_saphyr::from_str(text) {
        Ok(raw) => raw,
        Err(err) => return (BTreeMap::new(), vec![ConfigError::yaml(file, &err)]),
    };
    // Every check runs, whatever the others found, so that one error never hides the next.
    let (policies, mut problems) = crate::degrade::check(&raw);
    problems.extend(cross_check(&policies, pools, tiers, models));
    (policies, place::placed(text, file, problems))
}

/// Pool, tier and fallback model names the policies use that the config lacks.
fn cross_check(
    policies: &BTreeMap<String, DegradationPolicy>,
    pools: &[PoolSpec],
    tiers: &[TierSpec],
    models: &[ModelRoute],
) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (pool, policy) in policies {
        let at = YamlPath::root().key("pools").key(pool);
        if !pools.iter().any(|p| &p.name == pool) {
            problems.push(Problem::at(
                &at,
                format!("pool `{pool}` is not defined in the config"),
            ));
        }
        for (i, level) in policy.levels.iter().enumerate() {
            for (j, action) in level.actions.iter().enumerate() {
                let action_at = at
                    .key("levels")
                    .index(i)
                    .key("actions")
                    .index(j)
                    .key(action.label());
                for tier in action.tiers() {
                    if !tier.trim().is_empty() && !tiers.iter().any(|t| &t.name == tier) {
                        problems.push(Problem::at(
                            &action_at.key("tiers"),
                            format!(
                                "pool `{pool}` level {} `{}`: unknown tier `{tier}`",
                                i + 1,
                                level.name
                            ),
                        ));
                    }
                }
                if let Action::Fallback { model, .. } = action
                    && !model.trim().is_empty()
                    && !models.iter().any(|m| &m.name == model)
                {
                    problems.push(Problem::at(
                        &action_at.key("model"),
                        format!(
                            "pool `{pool}` level {} `{}`: fallback model `{model}` is not a model of the config",
                            i + 1,
                            level.name
                        ),
                    ));
                }
            }
        }
    }
    problems
}
