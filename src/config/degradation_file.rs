//! `policies/degradation.yaml` in the snapshot: the degradation module validates the levels; this
//! pass checks what only the whole config knows (pool, tier and fallback model names).

use std::collections::BTreeMap;
use std::path::Path;

use super::error::ConfigError;
use super::snapshot::{ModelRoute, PoolSpec, TierSpec};
use crate::degrade::{Action, DegradationPolicy};

/// The validated policies per pool, and every error found (tied to `file`).
pub(super) fn compile(
    text: &str,
    file: &Path,
    pools: &[PoolSpec],
    tiers: &[TierSpec],
    models: &[ModelRoute],
) -> (BTreeMap<String, DegradationPolicy>, Vec<ConfigError>) {
    let policies = match crate::degrade::parse(text) {
        Ok(p) => p,
        Err(messages) => {
            let errors = messages
                .into_iter()
                .map(|m| ConfigError::file(file, m))
                .collect();
            return (BTreeMap::new(), errors);
        }
    };
    let mut errors = Vec::new();
    for (pool, policy) in &policies {
        if !pools.iter().any(|p| &p.name == pool) {
            errors.push(ConfigError::file(
                file,
                format!("pool `{pool}` is not defined in the config"),
            ));
        }
        for (i, level) in policy.levels.iter().enumerate() {
            for action in &level.actions {
                for tier in action.tiers() {
                    if !tiers.iter().any(|t| &t.name == tier) {
                        errors.push(ConfigError::file(
                            file,
                            format!(
                                "pool `{pool}` level {} `{}`: unknown tier `{tier}`",
                                i + 1,
                                level.name
                            ),
                        ));
                    }
                }
                if let Action::Fallback { model, .. } = action
                    && !models.iter().any(|m| &m.name == model)
                {
                    errors.push(ConfigError::file(
                        file,
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
    (policies, errors)
}
