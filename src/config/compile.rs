//! The one conversion path from file text to `Snapshot`: parse the config, routing.yaml and
//! tenants.yaml, validate every section, collect every error, and only then build the snapshot.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use super::raw::RawConfig;
use super::snapshot::Snapshot;
use super::{
    degradation_file, pools, prices_file, routing_doc, routing_file, sections, shape_classes,
    tenant_section, tiers_file,
};
use crate::diagnostics::{ConfigError, ConfigErrors, Sink};

/// Where a policy file (routing.yaml, tenants.yaml) comes from.
#[derive(Clone, Copy)]
pub(super) enum PolicySource<'a> {
    /// Given as text, with the path it stands for.
    Text(&'a str, &'a Path),
    /// None: defaults (every pool gets the default policy; one built-in tier).
    Absent,
    /// Read from the `policies` directory next to the config file.
    Policies,
}

/// Where each policy file comes from.
#[derive(Clone, Copy)]
pub(super) struct PolicySources<'a> {
    pub routing: PolicySource<'a>,
    pub tenants: PolicySource<'a>,
    pub degradation: PolicySource<'a>,
    pub prices: PolicySource<'a>,
}

impl PolicySources<'_> {
    /// Every policy file from the `policies` directory.
    pub const FROM_DISK: PolicySources<'static> = PolicySources {
        routing: PolicySource::Policies,
        tenants: PolicySource::Policies,
        degradation: PolicySource::Policies,
        prices: PolicySource::Policies,
    };
}

/// Parses and validates the config text and its policy files into a snapshot, or every error.
pub(super) fn compile(
    text: &str,
    path: &Path,
    sources: PolicySources<'_>,
) -> Result<Snapshot, ConfigErrors> {
    let PolicySources {
        routing,
        tenants,
        degradation,
        prices,
    } = sources;
    let mut sink = Sink::new(path);
    let raw: RawConfig = match serde_saphyr::from_str(text) {
        Ok(raw) => raw,
        Err(err) => {
            sink.yaml(&err);
            return Err(ConfigErrors(sink.into_sorted()));
        }
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let routing = policy_text(routing, &raw, base, "routing.yaml", &mut sink);
    let tenants = policy_text(tenants, &raw, base, "tenants.yaml", &mut sink);
    let degradation = policy_text(degradation, &raw, base, "degradation.yaml", &mut sink);
    let prices_src = policy_text(prices, &raw, base, "prices.yaml", &mut sink);

    let mut pool_specs = pools::pools(&raw.pools, base, &mut sink);
    let models = pools::models(&raw.models, &pool_specs, &mut sink);
    // routing.yaml is parsed once; its sections go to their checkers below.
    let routing_doc = routing
        .as_ref()
        .map(|(text, file)| routing_doc::parse(text, file));
    let (routing_pools, routing_models, routing_shadows, routing_classes) = match routing_doc {
        Some(doc) => (doc.pools, doc.models, doc.shadows, doc.shape_classes),
        None => (
            Ok(Vec::new()),
            Ok(Default::default()),
            Ok(Default::default()),
            Ok(Vec::new()),
        ),
    };
    let mut routing_errors = Vec::new();
    if let Some((_, routing_path)) = &routing {
        let mut routing_sink = Sink::new(routing_path);
        let entries = match routing_pools {
            Ok(section) => routing_file::check(section, &mut routing_sink),
            Err(err) => {
                routing_errors.push(err);
                Vec::new()
            }
        };
        for entry in entries {
            match pool_specs.iter_mut().find(|p| p.name == entry.pool.value) {
                Some(pool) => pool.policy = entry.policy,
                None => routing_sink.at(
                    &entry.pool.referenced,
                    format!(
                        "pool `{}` is not defined in {}",
                        entry.pool.value,
                        path.display()
                    ),
                ),
            }
        }
        routing_errors.extend(routing_sink.into_sorted());
    }
    let (tiers, tier_errors) = match &tenants {
        Some((tenants_text, tenants_path)) => {
            let mut tier_sink = Sink::new(tenants_path);
            let tiers = tiers_file::parse(tenants_text, &models, &mut tier_sink);
            (tiers, tier_sink.into_sorted())
        }
        None => (Some(tiers_file::builtin()), Vec::new()),
    };
    let tier_list = tiers.as_ref().map(|t| t.tiers.as_slice());
    let raw_tenants = raw.tenants.as_deref().unwrap_or_default();
    let tenant_list = tenant_section::tenants(raw_tenants, tier_list, base, &mut sink);
    let (tiers, default_tier, raw_budgets) = tiers.map_or((Vec::new(), None, Vec::new()), |t| {
        (t.tiers, t.default_tier, t.tenant_budgets)
    });
    // A budget for a tenant the config does not declare is a typo (unless the config declares
    // none: `infergate up` then serves its demo tenant).
    let mut budget_errors = Vec::new();
    let mut tenant_budgets = std::collections::BTreeMap::new();
    if let Some((_, tenants_path)) = &tenants {
        let mut budget_sink = Sink::new(tenants_path);
        for (name, specs) in raw_budgets {
            let known = tenant_list.tenants.is_empty()
                || tenant_list.tenants.iter().any(|t| t.name == name.value);
            if known {
                tenant_budgets.insert(name.value, specs);
            } else {
                let msg = format!(
                    "budgets: tenant `{}` is not one of the config's tenants",
                    name.value
                );
                budget_sink.at(&name.referenced, msg);
            }
        }
        budget_errors = budget_sink.into_sorted();
    }
    let (prices, price_errors) = match &prices_src {
        Some((text, file)) => {
            let mut price_sink = Sink::new(file);
            let prices = prices_file::parse(text, &models, &tiers, &mut price_sink);
            (prices, price_sink.into_sorted())
        }
        None => (Default::default(), Vec::new()),
    };
    // Errors in routing.yaml's `pools:` section do not hide those of its `models:` (canary) and
    // `shadows:` sections; a routing.yaml that is not YAML at all is reported once, above.
    let (canaries, canary_errors) = match (&routing, routing_models) {
        (Some((text, file)), Ok(section)) => canaries(&section, text, file, &models),
        (_, Err(err)) => (Default::default(), vec![err]),
        (None, Ok(_)) => (Default::default(), Vec::new()),
    };
    let (shadows, shadow_errors) = match (&routing, routing_shadows) {
        (Some((text, file)), Ok(section)) => shadows(section, text, file, &models),
        (_, Err(err)) => (Default::default(), vec![err]),
        (None, Ok(_)) => (Default::default(), Vec::new()),
    };
    let (shape_classes, class_errors) = match (&routing, routing_classes) {
        (Some((_, file)), Ok(section)) => {
            let mut class_sink = Sink::new(file);
            let pools: Vec<&str> = pool_specs.iter().map(|p| p.name.as_str()).collect();
            let tiers: Vec<&str> = tiers.iter().map(|t| t.name.as_str()).collect();
            let model_names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
            let known = shape_classes::Known {
                pools: &pools,
                tiers: &tiers,
                models: &model_names,
            };
            let classes = shape_classes::check(section, &known, &mut class_sink);
            (classes, class_sink.into_sorted())
        }
        (_, Err(err)) => (Vec::new(), vec![err]),
        (None, Ok(_)) => (Vec::new(), Vec::new()),
    };
    let (degradation_policies, degradation_errors) = match &degradation {
        Some((text, file)) => degradation_file::compile(text, file, &pool_specs, &tiers, &models),
        None => (Default::default(), Vec::new()),
    };

    let default_listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 8080));
    let max_body_bytes = sections::max_body_bytes(&mut sink, raw.limits.as_ref());
    let (trace, otlp) = sections::trace(&mut sink, raw.trace.as_ref(), base);
    let mut quality = super::quality_section::quality(&mut sink, raw.quality.as_ref(), &pool_specs);
    let regression = super::regression_section::regression(
        &mut sink,
        raw.quality.as_ref().and_then(|q| q.regression.as_ref()),
        base,
        &super::regression_section::Known {
            models: &models,
            canaries: &canaries,
        },
    );
    quality.regression = regression.config;
    let quality = std::sync::Arc::new(quality);
    let snapshot = Snapshot {
        listen: sections::address(&mut sink, raw.listen.as_ref(), "listen", default_listen),
        admin: sections::admin(&mut sink, raw.admin.as_ref()),
        tls: raw
            .tls
            .as_ref()
            .and_then(|tls| sections::tls(&mut sink, tls, base)),
        log: sections::log(&mut sink, raw.log.as_ref()),
        health: sections::health(&mut sink, raw.health.as_ref()),
        forward: sections::forward(&mut sink, raw.forward.as_ref()),
        usage_check: sections::usage_check(&mut sink, raw.usage_check.as_ref()),
        outlier: sections::outlier(&mut sink, raw.outlier.as_ref()),
        drain_grace: sections::drain_grace(&mut sink, raw.drain.as_ref()),
        max_body_bytes,
        max_buffered_body_bytes: sections::max_buffered_body_bytes(
            &mut sink,
            raw.limits.as_ref(),
            max_body_bytes,
        ),
        connections: sections::connections(&mut sink, raw.limits.as_ref()),
        metrics_public: raw.metrics.as_ref().and_then(|m| m.public).unwrap_or(false),
        debug_headers: raw.debug_headers.unwrap_or(false),
        models,
        pools: pool_specs,
        tenants: tenant_list.tenants,
        tiers,
        default_tier,
        degradation: degradation_policies,
        canaries,
        shadows,
        shape_classes,
        tenant_budgets,
        prices: std::sync::Arc::new(prices),
        ledger: sections::ledger(&mut sink, raw.ledger.as_ref(), base),
        trace,
        otlp,
        quality,
        redis: raw
            .state
            .as_ref()
            .and_then(|s| s.redis.as_ref())
            .and_then(|r| sections::redis(&mut sink, r)),
        files: std::iter::once(path.to_path_buf())
            .chain(routing.map(|(_, p)| p))
            .chain(tenants.map(|(_, p)| p))
            .chain(degradation.map(|(_, p)| p))
            .chain(prices_src.map(|(_, p)| p))
            .chain(tenant_list.key_files)
            .chain(regression.file)
            .map(|p| std::path::absolute(&p).unwrap_or(p))
            .collect(),
    };

    let mut errors = sink.into_sorted();
    errors.extend(routing_errors);
    errors.extend(tier_errors);
    errors.extend(degradation_errors);
    errors.extend(budget_errors);
    errors.extend(price_errors);
    errors.extend(canary_errors);
    errors.extend(shadow_errors);
    errors.extend(class_errors);
    errors.extend(regression.errors);
    if errors.is_empty() {
        Ok(snapshot)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// The canary splits of routing.yaml's parsed `models:`, each version's model checked against
/// the config; every problem at its line (the text is read again only to place problems).
fn canaries(
    section: &std::collections::BTreeMap<String, crate::canary::spec::RawCanary>,
    text: &str,
    file: &Path,
    models: &[super::snapshot::ModelRoute],
) -> (
    std::collections::BTreeMap<String, crate::canary::CanarySpec>,
    Vec<ConfigError>,
) {
    let known = |m: &str| models.iter().any(|r| r.name == m);
    let (specs, problems) = crate::canary::check_models(section, &known);
    if problems.is_empty() {
        return (specs, Vec::new());
    }
    (specs, crate::diagnostics::placed(text, file, problems))
}

/// The shadows of routing.yaml's parsed `shadows:`, each model checked against the config;
/// every problem at its line (the text is read again only to place problems).
fn shadows(
    section: std::collections::BTreeMap<String, crate::shadow::ShadowSpec>,
    text: &str,
    file: &Path,
    models: &[super::snapshot::ModelRoute],
) -> (
    std::collections::BTreeMap<String, crate::shadow::ShadowSpec>,
    Vec<ConfigError>,
) {
    let known = |m: &str| models.iter().any(|r| r.name == m);
    let (specs, problems) = crate::shadow::check_shadows(section, &known);
    if !problems.is_empty() {
        return (
            Default::default(),
            crate::diagnostics::placed(text, file, problems),
        );
    }
    (specs, Vec::new())
}

/// The text of one policy file and the path it stands for, `None` when absent.
fn policy_text(
    source: PolicySource<'_>,
    raw: &RawConfig,
    base: &Path,
    file: &str,
    sink: &mut Sink<'_>,
) -> Option<(String, PathBuf)> {
    match source {
        PolicySource::Text(text, path) => Some((text.to_string(), path.to_path_buf())),
        PolicySource::Absent => None,
        PolicySource::Policies => read_policy(raw, base, file, sink),
    }
}

/// Reads `<policies>/<file>` (`policies` defaults to `../policies`, relative to the config file).
/// A missing file is an error only for routing.yaml when `policies` was set explicitly;
/// tenants.yaml is always optional.
fn read_policy(
    raw: &RawConfig,
    base: &Path,
    file: &str,
    sink: &mut Sink<'_>,
) -> Option<(String, PathBuf)> {
    let dir = raw
        .policies
        .as_ref()
        .map_or("../policies", |p| p.value.as_str());
    let path = base.join(dir).join(file);
    match std::fs::read_to_string(&path) {
        Ok(text) => Some((text, path)),
        Err(err) => {
            let message = format!("cannot read {}: {err}", path.display());
            let missing = err.kind() == std::io::ErrorKind::NotFound;
            match &raw.policies {
                _ if missing && file != "routing.yaml" => {}
                Some(policies) => sink.at(&policies.referenced, message),
                None if missing => {}
                None => sink.whole(message),
            }
            None
        }
    }
}

/// The error for a config file that cannot be read at all.
pub(super) fn unreadable(path: &Path, err: &std::io::Error) -> ConfigErrors {
    ConfigErrors(vec![ConfigError::file(path, format!("cannot read: {err}"))])
}
