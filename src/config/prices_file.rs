//! `policies/prices.yaml`: USD per 1M input, cached input and output tokens per model, optional
//! per-tier multipliers, and the version recorded with every cost. Model and tier names are
//! checked against the config and tenants.yaml.

use std::collections::BTreeMap;

use super::raw::{RawPricesFile, Text};
use super::snapshot::{ModelRoute, TierSpec};
use crate::diagnostics::Sink;
use crate::pricing::{ModelPrice, Prices, multiplier_ppm, usd_per_million};

/// Parses and checks prices.yaml; every bad value is reported with its line.
pub(super) fn parse(
    text: &str,
    models: &[ModelRoute],
    tiers: &[TierSpec],
    sink: &mut Sink<'_>,
) -> Prices {
    let raw: RawPricesFile = match serde_saphyr::from_str(text) {
        Ok(raw) => raw,
        Err(err) => {
            sink.yaml(&err);
            return Prices::default();
        }
    };
    let version = match &raw.version {
        Some(v) if v.value >= 1 => v.value,
        Some(v) => {
            sink.at(
                &v.referenced,
                "version must be ≥ 1 (raise it with every price change)",
            );
            0
        }
        None => {
            sink.whole("no `version`: add `version: 1` and raise it with every price change");
            0
        }
    };
    if let Some(c) = raw.currency.as_ref().filter(|c| c.value != "USD") {
        sink.at(
            &c.referenced,
            format!("currency `{}`: only USD is supported", c.value),
        );
    }
    let mut entries: Vec<(Text, super::raw::RawPrice)> =
        raw.models.unwrap_or_default().into_iter().collect();
    entries.sort_by_key(|(name, _)| (name.referenced.line(), name.referenced.column()));
    let mut table = BTreeMap::new();
    for (name, price) in entries {
        if !models.iter().any(|m| m.name == name.value) {
            let all: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
            sink.at(
                &name.referenced,
                format!(
                    "model `{}` is not in the config's models ({})",
                    name.value,
                    all.join(", ")
                ),
            );
            continue;
        }
        let mut usd = |field: &serde_saphyr::Spanned<f64>, key: &str| {
            usd_per_million(field.value).unwrap_or_else(|| {
                sink.at(
                    &field.referenced,
                    format!(
                        "model `{}`: {key} must be USD per 1M tokens, 0 to 1,000,000",
                        name.value
                    ),
                );
                0
            })
        };
        let input = usd(&price.input, "input");
        let output = usd(&price.output, "output");
        // Without a cached price, cached tokens cost what uncached ones do.
        let cached_input = price
            .cached_input
            .as_ref()
            .map_or(input, |c| usd(c, "cached_input"));
        table.insert(
            name.value,
            ModelPrice {
                input,
                cached_input,
                output,
            },
        );
    }
    let mut tier_multipliers = BTreeMap::new();
    for (name, m) in raw.tiers.unwrap_or_default() {
        if !tiers.iter().any(|t| t.name == name.value) {
            let all: Vec<&str> = tiers.iter().map(|t| t.name.as_str()).collect();
            sink.at(
                &name.referenced,
                format!(
                    "tier `{}` is not in tenants.yaml ({})",
                    name.value,
                    all.join(", ")
                ),
            );
            continue;
        }
        match multiplier_ppm(m.value) {
            Some(ppm) => {
                tier_multipliers.insert(name.value, ppm);
            }
            None => sink.at(
                &m.referenced,
                format!(
                    "tier `{}`: the multiplier must be above 0 and at most 100",
                    name.value
                ),
            ),
        }
    }
    Prices {
        version,
        models: table,
        tier_multipliers,
    }
}
