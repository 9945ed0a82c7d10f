//! Length distributions: checking a `{dist: ...}` block into a `LengthDist`, and sampling it,
//! alone or jointly with another through a Gaussian copula (for correlated prompt/output lengths).

use super::build::Problems;
use super::model::LengthDist;
use super::rng::{Rng, normal_cdf};
use super::spec::RawDist;

/// Default clamp ceiling for a lognormal without `max`.
const DEFAULT_MAX: u32 = 1_000_000;

/// Checks one distribution block; `key` names it in messages, `at` is its line.
pub(super) fn build(
    raw: &RawDist,
    key: &str,
    at: Option<u64>,
    p: &mut Problems,
) -> Option<LengthDist> {
    let before = p.len();
    let built = build_inner(raw, key, false, &mut |m| p.push((at, m)));
    (p.len() == before).then_some(built).flatten()
}

fn build_inner(
    raw: &RawDist,
    key: &str,
    in_mixture: bool,
    fail: &mut dyn FnMut(String),
) -> Option<LengthDist> {
    let kind = raw.dist.as_str();
    let allowed: &[&str] = match kind {
        "fixed" => &["value"],
        "uniform" => &["min", "max"],
        "lognormal" => &["mean", "sigma", "min", "max"],
        "mixture" => &["parts"],
        other => {
            fail(format!(
                "{key}: unknown dist `{other}`: use fixed, uniform, lognormal or mixture"
            ));
            return None;
        }
    };
    let present = [
        ("value", raw.value.is_some()),
        ("mean", raw.mean.is_some()),
        ("sigma", raw.sigma.is_some()),
        ("min", raw.min.is_some()),
        ("max", raw.max.is_some()),
        ("parts", raw.parts.is_some()),
    ];
    for (name, _) in present
        .iter()
        .filter(|(n, set)| *set && !allowed.contains(n))
    {
        fail(format!("{key}: `{name}` does not apply to dist {kind}"));
    }
    if raw.weight.is_some() && !in_mixture {
        fail(format!(
            "{key}: `weight` belongs only inside a mixture's parts"
        ));
    }
    let mut count = |v: Option<f64>, name: &str, default: Option<u32>| match (v, default) {
        (None, Some(d)) => Some(d),
        (None, None) => {
            fail(format!("{key}: dist {kind} needs `{name}`"));
            None
        }
        (Some(x), _) if x >= 0.0 && x <= f64::from(u32::MAX) && x.fract() == 0.0 => Some(x as u32),
        (Some(x), _) => {
            fail(format!(
                "{key}: `{name}` must be a whole number ≥ 0, got {x}"
            ));
            None
        }
    };
    let built = match kind {
        "fixed" => LengthDist::Fixed(count(raw.value, "value", None)?),
        "uniform" => {
            let (min, max) = (count(raw.min, "min", None), count(raw.max, "max", None));
            LengthDist::Uniform {
                min: min?,
                max: max?,
            }
        }
        "lognormal" => {
            let (min, max) = (
                count(raw.min, "min", Some(1)),
                count(raw.max, "max", Some(DEFAULT_MAX)),
            );
            let mean = raw.mean.filter(|m| m.is_finite() && *m > 0.0);
            let sigma = raw.sigma.filter(|s| s.is_finite() && *s >= 0.0);
            if mean.is_none() {
                fail(format!("{key}: lognormal needs `mean` > 0"));
            }
            if sigma.is_none() {
                fail(format!("{key}: lognormal needs `sigma` ≥ 0"));
            }
            LengthDist::Lognormal {
                mean: mean?,
                sigma: sigma?,
                min: min?,
                max: max?,
            }
        }
        _ => {
            let parts = raw.parts.as_deref().unwrap_or_default();
            if parts.is_empty() {
                fail(format!("{key}: mixture needs a non-empty `parts` list"));
            }
            let mut out = Vec::new();
            for (i, part) in parts.iter().enumerate() {
                let name = format!("{key}.parts[{i}]");
                let weight = part.weight.filter(|w| w.is_finite() && *w > 0.0);
                if weight.is_none() {
                    fail(format!("{name}: needs `weight` > 0"));
                }
                let dist = build_inner(part, &name, true, fail);
                if let (Some(w), Some(d)) = (weight, dist) {
                    out.push((w, d));
                }
            }
            let total: f64 = out.iter().map(|(w, _)| w).sum();
            LengthDist::Mixture(out.into_iter().map(|(w, d)| (w / total, d)).collect())
        }
    };
    if let LengthDist::Uniform { min, max } | LengthDist::Lognormal { min, max, .. } = built
        && min > max
    {
        fail(format!("{key}: min ({min}) is above max ({max})"));
    }
    Some(built)
}

impl LengthDist {
    /// An independent sample.
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        let z = rng.normal();
        self.sample_at(z, rng)
    }

    /// The sample at standard-normal score `z` (its quantile Φ(z)); mixtures pick their part
    /// with `rng`, then use `z` within it, so rank order is kept inside each part.
    pub fn sample_at(&self, z: f64, rng: &mut Rng) -> u32 {
        match self {
            LengthDist::Fixed(v) => *v,
            LengthDist::Uniform { min, max } => {
                let span = f64::from(max - min) + 1.0;
                let offset = (normal_cdf(z) * span).floor() as u32;
                min.saturating_add(offset).min(*max)
            }
            LengthDist::Lognormal {
                mean,
                sigma,
                min,
                max,
            } => {
                let mu = mean.ln() - sigma * sigma / 2.0;
                let x = (mu + sigma * z).exp().round();
                x.clamp(f64::from(*min), f64::from(*max)) as u32
            }
            LengthDist::Mixture(parts) => {
                let mut target = rng.uniform();
                let chosen = parts.iter().find(|(w, _)| {
                    target -= w;
                    target < 0.0
                });
                match chosen.or(parts.last()) {
                    Some((_, dist)) => dist.sample_at(z, rng),
                    None => 0,
                }
            }
        }
    }
}

/// Draws two lengths whose Spearman rank correlation is about `rank_corr` (Gaussian copula).
pub fn sample_pair(a: &LengthDist, b: &LengthDist, rank_corr: f64, rng: &mut Rng) -> (u32, u32) {
    // Spearman ρs of a Gaussian copula is (6/π)·asin(ρ/2), so invert it for the normal's ρ.
    let rho = (2.0 * (std::f64::consts::PI * rank_corr / 6.0).sin()).clamp(-1.0, 1.0);
    let z1 = rng.normal();
    let z2 = rho * z1 + (1.0 - rho * rho).sqrt() * rng.normal();
    (a.sample_at(z1, rng), b.sample_at(z2, rng))
}
