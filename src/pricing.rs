//! What a request cost, in integer nano-USD: the price table of `policies/prices.yaml` (USD per
//! 1M input, cached input and output tokens per model, optional per-tier multipliers, a version
//! recorded with every cost) and the one cost rule. Pure: no I/O, no floats after loading.

use std::collections::BTreeMap;

/// Nano-USD in one USD.
pub const NANO_PER_USD: u64 = 1_000_000_000;

/// A multiplier of 1 in parts per million.
const PPM_ONE: u64 = 1_000_000;

/// Prices of one model, in nano-USD per 1M tokens (so $0.15 per 1M is 150,000,000).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelPrice {
    /// Uncached prompt tokens.
    pub input: u64,
    /// Prompt tokens served from the worker's prefix cache.
    pub cached_input: u64,
    /// Completion tokens.
    pub output: u64,
}

/// The price table in force: one version of `prices.yaml`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prices {
    /// The file's `version`, recorded with every cost priced by this table (0: no prices file).
    pub version: u32,
    /// Per model name (the client's model, or a canary version's model).
    pub models: BTreeMap<String, ModelPrice>,
    /// Per-tier multiplier in parts per million (800,000 = ×0.8); a tier not listed pays ×1.
    pub tier_multipliers: BTreeMap<String, u64>,
}

/// Token counts of one request as the worker reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenCounts {
    /// Prompt tokens, cached ones included (OpenAI's `prompt_tokens`).
    pub prompt: u64,
    /// Of which served from the prefix cache (`prompt_tokens_details.cached_tokens`).
    pub cached: u64,
    /// Completion tokens.
    pub completion: u64,
}

/// A priced request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    /// Nano-USD, rounded half up once, after the multiplier.
    pub nano_usd: u64,
    /// The price version it was priced at.
    pub price_version: u32,
    /// False when no price is listed for the model (the cost is then 0).
    pub priced: bool,
}

impl Prices {
    /// A stable hash of the prices (not the version), to tell two tables apart.
    pub fn fingerprint(&self) -> String {
        let text = format!("{:?}|{:?}", self.models, self.tier_multipliers);
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
    }

    /// The price of `model`, else of `fallback` (the model the client asked for, when a canary
    /// version served it).
    pub fn price_of(&self, model: &str, fallback: &str) -> Option<&ModelPrice> {
        self.models.get(model).or_else(|| self.models.get(fallback))
    }

    /// `cost = (prompt − cached)·input + cached·cached_input + completion·output`, times the
    /// tier's multiplier. Cached tokens above the prompt (a confused worker) count as prompt.
    pub fn cost(&self, model: &str, fallback: &str, tier: &str, tokens: TokenCounts) -> Cost {
        let Some(price) = self.price_of(model, fallback) else {
            return Cost {
                nano_usd: 0,
                price_version: self.version,
                priced: false,
            };
        };
        let multiplier = self.tier_multipliers.get(tier).copied().unwrap_or(PPM_ONE);
        Cost {
            nano_usd: price.cost(tokens, multiplier),
            price_version: self.version,
            priced: true,
        }
    }
}

impl ModelPrice {
    /// Nano-USD for `tokens` at `multiplier_ppm`, rounded half up.
    pub fn cost(&self, tokens: TokenCounts, multiplier_ppm: u64) -> u64 {
        let cached = tokens.cached.min(tokens.prompt);
        let uncached = tokens.prompt - cached;
        // Units: nano-USD × 1M (prices are per 1M tokens), then × 1M for the ppm multiplier.
        // Saturating: token counts come from the worker and may be absurd.
        let part = |n: u64, price: u64| u128::from(n).saturating_mul(u128::from(price));
        let scaled = part(uncached, self.input)
            .saturating_add(part(cached, self.cached_input))
            .saturating_add(part(tokens.completion, self.output));
        let scale = u128::from(PPM_ONE) * u128::from(PPM_ONE);
        let total = scaled
            .saturating_mul(u128::from(multiplier_ppm))
            .saturating_add(scale / 2)
            / scale;
        u64::try_from(total).unwrap_or(u64::MAX)
    }

    /// What caching saved on `cached` tokens against the uncached price, in nano-USD.
    pub fn cache_saving(&self, cached: u64) -> u64 {
        let per_m = self.input.saturating_sub(self.cached_input);
        let total = (u128::from(cached) * u128::from(per_m) + 500_000) / 1_000_000;
        u64::try_from(total).unwrap_or(u64::MAX)
    }
}

/// USD per 1M tokens as written in prices.yaml → nano-USD per 1M tokens. `None` when negative,
/// not finite or absurd (above $1M per 1M tokens).
pub fn usd_per_million(usd: f64) -> Option<u64> {
    if !usd.is_finite() || !(0.0..=1_000_000.0).contains(&usd) {
        return None;
    }
    // f64 holds 15 significant digits: exact for any price written with up to 9 decimals.
    Some((usd * NANO_PER_USD as f64).round() as u64)
}

/// USD (a budget) → nano-USD; `None` when negative, not finite or above $1 billion.
pub fn usd_to_nano(usd: f64) -> Option<u64> {
    if !usd.is_finite() || !(0.0..=1e9).contains(&usd) {
        return None;
    }
    Some((usd * NANO_PER_USD as f64).round() as u64)
}

/// A multiplier as written (e.g. 0.8) → parts per million; `None` unless in (0, 100].
pub fn multiplier_ppm(m: f64) -> Option<u64> {
    if !m.is_finite() || m <= 0.0 || m > 100.0 {
        return None;
    }
    Some((m * PPM_ONE as f64).round() as u64)
}

/// Nano-USD as a USD decimal string with 9 places, for JSON, CSV and messages.
pub fn format_usd(nano: u64) -> String {
    format!("{}.{:09}", nano / NANO_PER_USD, nano % NANO_PER_USD)
}

/// Nano-USD for people: rounded to cents (`$12.35`), or to millionths below a cent
/// (`$0.000128`), so small budgets do not read as `$0.00`.
pub fn format_usd_cents(nano: u64) -> String {
    if nano < 10_000_000 {
        let micro = (nano + 500) / 1_000;
        return format!("$0.{micro:06}");
    }
    let cents = (nano + 5_000_000) / 10_000_000;
    format!("${}.{:02}", cents / 100, cents % 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Prices {
        let mut models = BTreeMap::new();
        models.insert(
            "m".to_string(),
            ModelPrice {
                input: usd_per_million(3.0).unwrap_or_default(),
                cached_input: usd_per_million(0.3).unwrap_or_default(),
                output: usd_per_million(15.0).unwrap_or_default(),
            },
        );
        let mut tier_multipliers = BTreeMap::new();
        tier_multipliers.insert("ent".to_string(), 800_000);
        Prices {
            version: 7,
            models,
            tier_multipliers,
        }
    }

    #[test]
    fn each_token_class_has_its_price() {
        let p = table();
        let only = |prompt, cached, completion| {
            p.cost(
                "m",
                "m",
                "free",
                TokenCounts {
                    prompt,
                    cached,
                    completion,
                },
            )
            .nano_usd
        };
        // $3 per 1M input: 3,000 nano-USD a token.
        assert_eq!(only(1, 0, 0), 3_000);
        // Cached prompt tokens at $0.30 per 1M: 300 nano-USD each, and they are part of prompt.
        assert_eq!(only(1, 1, 0), 300);
        assert_eq!(only(0, 0, 1), 15_000);
        // 1,000 prompt of which 400 cached, 100 completion.
        assert_eq!(
            only(1_000, 400, 100),
            600 * 3_000 + 400 * 300 + 100 * 15_000
        );
    }

    #[test]
    fn rounding_is_half_up_once_after_the_multiplier() {
        let mut p = table();
        p.models.insert(
            "cheap".into(),
            ModelPrice {
                input: 1_500, // 1.5 nano-USD per 1M tokens
                cached_input: 0,
                output: 1,
            },
        );
        let t = |prompt, completion| TokenCounts {
            prompt,
            cached: 0,
            completion,
        };
        // 1M tokens at 1,500 nano-USD per 1M = 1,500; 1 token = 0.0015 → 0.
        assert_eq!(
            p.cost("cheap", "cheap", "x", t(1_000_000, 0)).nano_usd,
            1_500
        );
        assert_eq!(p.cost("cheap", "cheap", "x", t(1, 0)).nano_usd, 0);
        // 333,000 tokens × 1,500 / 1M = 499.5 → 500 (half up).
        assert_eq!(p.cost("cheap", "cheap", "x", t(333_000, 0)).nano_usd, 500);
        // The sum is rounded, not each class: 0.4995 + 0.5 = 0.9995 → 1 (each alone → 0 or 1).
        assert_eq!(p.cost("cheap", "cheap", "x", t(333, 500_000)).nano_usd, 1);
        // ×0.8 applies before rounding: 1,000 prompt × 3,000 × 0.8 = 2,400,000.
        let ent = p.cost("m", "m", "ent", t(1_000, 0));
        assert_eq!(ent.nano_usd, 2_400_000);
    }

    #[test]
    fn the_version_and_a_missing_price_are_reported() {
        let p = table();
        let t = TokenCounts {
            prompt: 10,
            cached: 0,
            completion: 1,
        };
        let c = p.cost("m", "m", "free", t);
        assert_eq!((c.price_version, c.priced), (7, true));
        let none = p.cost("other", "other", "free", t);
        assert_eq!(
            (none.nano_usd, none.priced, none.price_version),
            (0, false, 7)
        );
        // A canary version without its own price is priced as the model the client asked for.
        assert_eq!(p.cost("m-canary", "m", "free", t).nano_usd, c.nano_usd);
    }

    #[test]
    fn a_missing_or_impossible_cached_field_counts_as_uncached() {
        let p = table();
        let no_cached = TokenCounts {
            prompt: 100,
            cached: 0,
            completion: 0,
        };
        assert_eq!(p.cost("m", "m", "", no_cached).nano_usd, 300_000);
        let too_many = TokenCounts {
            prompt: 100,
            cached: 500,
            completion: 0,
        };
        assert_eq!(p.cost("m", "m", "", too_many).nano_usd, 30_000);
    }

    #[test]
    fn prices_convert_exactly_and_format_back() {
        assert_eq!(usd_per_million(0.15), Some(150_000_000));
        assert_eq!(usd_per_million(0.000_000_001), Some(1));
        assert_eq!(usd_per_million(2.5), Some(2_500_000_000));
        assert_eq!(usd_per_million(-1.0), None);
        assert_eq!(usd_per_million(f64::NAN), None);
        assert_eq!(multiplier_ppm(0.8), Some(800_000));
        assert_eq!(multiplier_ppm(0.0), None);
        assert_eq!(format_usd(1_234_567_890), "1.234567890");
        assert_eq!(format_usd(5), "0.000000005");
        assert_eq!(format_usd_cents(12_345_000_000), "$12.35");
        assert_eq!(format_usd_cents(128_400), "$0.000128");
        assert_eq!(format_usd_cents(0), "$0.000000");
        assert_eq!(usd_to_nano(2_000_000.0), Some(2_000_000_000_000_000));
        // Absurd token counts saturate instead of wrapping.
        let huge = TokenCounts {
            prompt: u64::MAX,
            cached: 0,
            completion: u64::MAX,
        };
        let mut p = table();
        p.tier_multipliers.insert("x".into(), 100_000_000);
        assert_eq!(p.cost("m", "m", "x", huge).nano_usd, u64::MAX);
        let saving = table().models["m"].cache_saving(1_000_000);
        assert_eq!(saving, 2_700_000_000);
    }
}
