//! `policies/tenants.yaml`: the tiers tenants belong to (priority, rate limits, token ceilings,
//! allowed models) and the tier of a generated demo tenant. Model names are checked against the
//! main config's `models:`.

use serde_saphyr::{Location, Spanned};

use super::raw::{RawBudget, RawTier, RawTiersFile, Text};
use super::snapshot::{ModelRoute, TierSpec};
use crate::budgets::{BudgetSpec, Period};
use crate::diagnostics::Sink;

/// Name of the built-in tier used when there is no tenants.yaml.
pub(super) const BUILTIN_TIER: &str = "default";

/// `max_tokens` of a tier that gives none (and of the built-in tier).
const DEFAULT_MAX_TOKENS: u32 = 4096;

/// `default_max_tokens` of a tier that gives none, capped at its `max_tokens`.
const DEFAULT_RESERVED_TOKENS: u32 = 256;

/// The tiers of one tenants.yaml (or the built-in one).
pub(super) struct Tiers {
    /// Tiers in file order.
    pub tiers: Vec<TierSpec>,
    /// The `default_tier`, known to name one of `tiers`.
    pub default_tier: Option<String>,
    /// `budgets:` per tenant name (checked against the config's tenants by the caller).
    pub tenant_budgets: Vec<(Text, Vec<BudgetSpec>)>,
}

/// The built-in tier set: one unlimited tier called `default`, which is also the default tier.
pub(super) fn builtin() -> Tiers {
    Tiers {
        tiers: vec![TierSpec {
            name: BUILTIN_TIER.to_string(),
            priority: 0,
            requests_per_minute: None,
            tokens_per_minute: None,
            max_concurrent: None,
            max_tokens: DEFAULT_MAX_TOKENS,
            default_max_tokens: DEFAULT_RESERVED_TOKENS,
            models: vec!["*".to_string()],
            budgets: Vec::new(),
            min_deadline: None,
        }],
        default_tier: Some(BUILTIN_TIER.to_string()),
        tenant_budgets: Vec::new(),
    }
}

/// Parses and checks tenants.yaml. `None` when the file does not parse (the error is in `sink`);
/// a tier with bad values is reported and kept, so tenants naming it are not reported twice.
pub(super) fn parse(text: &str, models: &[ModelRoute], sink: &mut Sink<'_>) -> Option<Tiers> {
    let raw: RawTiersFile = if is_blank(text) {
        RawTiersFile {
            tiers: None,
            default_tier: None,
            budgets: None,
        }
    } else {
        match serde_saphyr::from_str(text) {
            Ok(raw) => raw,
            Err(err) => {
                sink.yaml(&err);
                return None;
            }
        }
    };
    let mut entries: Vec<(Text, RawTier)> = raw.tiers.unwrap_or_default().into_iter().collect();
    entries.sort_by_key(|(name, _)| (name.referenced.line(), name.referenced.column()));
    if entries.is_empty() {
        sink.whole("no tiers declared: add `tiers: {NAME: {priority: 0}}`, or delete the file");
    }
    let tiers: Vec<TierSpec> = entries
        .iter()
        .map(|(name, tier)| check(name, tier, models, sink))
        .collect();
    let default_tier = raw.default_tier.and_then(|name| {
        if tiers.iter().any(|t| t.name == name.value) {
            return Some(name.value);
        }
        let msg = format!(
            "default_tier `{}` is not a tier here (tiers: {})",
            name.value,
            names(&tiers)
        );
        sink.at(&name.referenced, msg);
        None
    });
    let mut tenant_budgets: Vec<(Text, Vec<BudgetSpec>)> = raw
        .budgets
        .unwrap_or_default()
        .into_iter()
        .map(|(tenant, list)| {
            let what = format!("budgets of tenant `{}`", tenant.value);
            let specs = budgets(&list, &what, sink);
            (tenant, specs)
        })
        .collect();
    tenant_budgets.sort_by_key(|(name, _)| (name.referenced.line(), name.referenced.column()));
    Some(Tiers {
        tiers,
        default_tier,
        tenant_budgets,
    })
}

/// A list of budgets: `{period: day|month, usd: N, kind: hard|soft}` (kind defaults to hard).
fn budgets(list: &[RawBudget], what: &str, sink: &mut Sink<'_>) -> Vec<BudgetSpec> {
    let mut out: Vec<BudgetSpec> = Vec::new();
    for b in list {
        let period = match b.period.value.as_str() {
            "day" => Period::Day,
            "month" => Period::Month,
            other => {
                let msg = format!("{what}: period `{other}`: use `day` or `month`");
                sink.at(&b.period.referenced, msg);
                continue;
            }
        };
        let hard = match b.kind.as_ref().map(|k| k.value.as_str()) {
            None | Some("hard") => true,
            Some("soft") => false,
            Some(other) => {
                let msg = format!("{what}: kind `{other}`: use `hard` or `soft`");
                if let Some(k) = &b.kind {
                    sink.at(&k.referenced, msg);
                }
                continue;
            }
        };
        let Some(limit_nano) = crate::pricing::usd_to_nano(b.usd.value).filter(|n| *n > 0) else {
            let msg = format!("{what}: usd must be above 0 (and at most 1,000,000,000)");
            sink.at(&b.usd.referenced, msg);
            continue;
        };
        if out.iter().any(|o| o.period == period && o.hard == hard) {
            let msg = format!(
                "{what}: two {} budgets per {}",
                if hard { "hard" } else { "soft" },
                period.as_str()
            );
            sink.at(&b.period.referenced, msg);
            continue;
        }
        out.push(BudgetSpec {
            period,
            limit_nano,
            hard,
        });
    }
    out
}

/// One tier with its defaults filled in; every value out of range is reported.
fn check(name: &Text, raw: &RawTier, models: &[ModelRoute], sink: &mut Sink<'_>) -> TierSpec {
    let tier = &name.value;
    if tier.trim().is_empty() {
        sink.at(&name.referenced, "tier name is empty");
    }
    let mut fail = |at: &Location, message: String| {
        sink.at(at, format!("tier `{tier}`: {message}"));
    };
    let mut positive = |field: Option<&Spanned<u64>>, key: &str| {
        let value = field.map(|f| f.value);
        if let Some(f) = field.filter(|f| f.value == 0) {
            fail(
                &f.referenced,
                format!("{key} must be ≥ 1, or null for no limit"),
            );
        }
        value
    };
    let requests_per_minute = positive(raw.requests_per_minute.as_ref(), "requests_per_minute");
    let tokens_per_minute = positive(raw.tokens_per_minute.as_ref(), "tokens_per_minute");
    let max_concurrent = raw.max_concurrent.as_ref().map(|f| f.value);
    if let Some(f) = raw.max_concurrent.as_ref().filter(|f| f.value == 0) {
        fail(
            &f.referenced,
            "max_concurrent must be ≥ 1, or null for no limit".into(),
        );
    }
    let max_tokens = raw
        .max_tokens
        .as_ref()
        .map_or(DEFAULT_MAX_TOKENS, |f| f.value);
    if let Some(f) = raw.max_tokens.as_ref().filter(|f| f.value == 0) {
        fail(&f.referenced, "max_tokens must be ≥ 1".into());
    }
    let default_max_tokens = match &raw.default_max_tokens {
        None => DEFAULT_RESERVED_TOKENS.min(max_tokens),
        Some(f) if f.value == 0 => {
            fail(&f.referenced, "default_max_tokens must be ≥ 1".into());
            f.value
        }
        Some(f) if f.value > max_tokens => {
            let msg = format!(
                "default_max_tokens {} is above max_tokens {max_tokens}",
                f.value
            );
            fail(&f.referenced, msg);
            f.value
        }
        Some(f) => f.value,
    };
    let allowed = match &raw.models {
        None => vec!["*".to_string()],
        Some(list) => {
            if list.is_empty() {
                sink.at(
                    &name.referenced,
                    format!("tier `{tier}`: models is empty: list model names, or \"*\" for all"),
                );
            }
            for model in list {
                let known = model.value == "*" || models.iter().any(|m| m.name == model.value);
                if !known {
                    let all: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
                    let msg = format!(
                        "tier `{tier}`: model `{}` is not in the config's models ({}), nor \"*\"",
                        model.value,
                        all.join(", ")
                    );
                    sink.at(&model.referenced, msg);
                }
            }
            list.iter().map(|m| m.value.clone()).collect()
        }
    };
    let budgets = budgets(
        raw.budgets.as_deref().unwrap_or_default(),
        &format!("tier `{tier}`"),
        sink,
    );
    let min_deadline =
        raw.min_deadline.as_ref().and_then(|text| {
            match super::values::parse_duration(&text.value) {
                Ok(d) if !d.is_zero() => Some(d),
                Ok(_) => {
                    let msg = format!("tier `{tier}`: min_deadline must be above 0");
                    sink.at(&text.referenced, msg);
                    None
                }
                Err(message) => {
                    sink.at(
                        &text.referenced,
                        format!("tier `{tier}`: min_deadline: {message}"),
                    );
                    None
                }
            }
        });
    TierSpec {
        budgets,
        min_deadline,
        name: tier.clone(),
        priority: raw.priority.unwrap_or(0),
        requests_per_minute,
        tokens_per_minute,
        max_concurrent,
        max_tokens,
        default_max_tokens,
        models: allowed,
    }
}

/// The tier names, comma-separated, for messages.
pub(super) fn names(tiers: &[TierSpec]) -> String {
    let names: Vec<&str> = tiers.iter().map(|t| t.name.as_str()).collect();
    names.join(", ")
}

/// True when the text holds nothing but blank lines and comments.
fn is_blank(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .all(|l| l.is_empty() || l.starts_with('#') || l == "---")
}
