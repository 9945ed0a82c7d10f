//! Tests of the seeded generator and the length distributions, alone and correlated.

use super::dist::sample_pair;
use super::rng::normal_cdf;
use super::*;

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

fn draws(dist: &LengthDist, n: usize) -> Vec<f64> {
    let mut rng = Rng::new(5);
    (0..n).map(|_| f64::from(dist.sample(&mut rng))).collect()
}

#[test]
fn generator_moments() {
    let mut rng = Rng::new(0);
    let n = 50_000;
    let u: Vec<f64> = (0..n).map(|_| rng.uniform()).collect();
    assert!((mean(&u) - 0.5).abs() < 0.01);
    let e: Vec<f64> = (0..n).map(|_| rng.exponential(4.0)).collect();
    assert!((mean(&e) - 0.25).abs() < 0.01);
    let z: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    let var = z.iter().map(|x| x * x).sum::<f64>() / n as f64;
    assert!(
        mean(&z).abs() < 0.02 && (var - 1.0).abs() < 0.03,
        "var {var}"
    );
    let l: Vec<f64> = (0..n).map(|_| rng.lognormal(0.0, 0.5)).collect();
    assert!((mean(&l) - (0.125f64).exp()).abs() < 0.02);
    assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7);
    assert!((normal_cdf(1.96) - 0.975).abs() < 1e-4);
    assert!((normal_cdf(-1.0) - 0.158_655).abs() < 1e-5);
    assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    assert_ne!(Rng::derive(1, 1).next_u64(), Rng::derive(1, 2).next_u64());
}

#[test]
fn zipf_favours_low_ranks() {
    let zipf = Zipf::new(8, 1.1);
    let mut rng = Rng::new(3);
    let mut counts = [0usize; 8];
    for _ in 0..20_000 {
        counts[zipf.sample(&mut rng)] += 1;
    }
    assert!(counts.windows(2).all(|w| w[0] > w[1]), "{counts:?}");
    // P(rank 0) = 1 / H(8, 1.1).
    let h: f64 = (1..=8).map(|k| (k as f64).powf(-1.1)).sum();
    let share = counts[0] as f64 / 20_000.0;
    assert!((share - 1.0 / h).abs() < 0.015, "{share}");
}

#[test]
fn distribution_means_within_tolerance() {
    let lognormal = LengthDist::Lognormal {
        mean: 300.0,
        sigma: 0.6,
        min: 1,
        max: 1_000_000,
    };
    let m = mean(&draws(&lognormal, 40_000));
    assert!((m - 300.0).abs() < 6.0, "lognormal mean {m}");
    let uniform = LengthDist::Uniform { min: 10, max: 20 };
    let xs = draws(&uniform, 40_000);
    assert!((mean(&xs) - 15.0).abs() < 0.1);
    assert!(xs.iter().all(|x| (10.0..=20.0).contains(x)));
    assert_eq!(draws(&LengthDist::Fixed(7), 10), vec![7.0; 10]);
    let mixture = LengthDist::Mixture(vec![
        (0.9, LengthDist::Fixed(100)),
        (0.1, LengthDist::Fixed(1000)),
    ]);
    let m = mean(&draws(&mixture, 40_000));
    assert!((m - 190.0).abs() < 5.0, "mixture mean {m}");
    let clamped = LengthDist::Lognormal {
        mean: 50.0,
        sigma: 2.0,
        min: 10,
        max: 60,
    };
    assert!(
        draws(&clamped, 5_000)
            .iter()
            .all(|x| (10.0..=60.0).contains(x))
    );
}

/// Spearman's rank correlation (ties broken by order, fine for large samples).
fn spearman(pairs: &[(u32, u32)]) -> f64 {
    let ranks = |key: &dyn Fn(&(u32, u32)) -> u32| {
        let mut idx: Vec<usize> = (0..pairs.len()).collect();
        idx.sort_by_key(|&i| key(&pairs[i]));
        let mut r = vec![0.0; pairs.len()];
        for (rank, i) in idx.into_iter().enumerate() {
            r[i] = rank as f64;
        }
        r
    };
    let (a, b) = (ranks(&|p| p.0), ranks(&|p| p.1));
    let (ma, mb) = (mean(&a), mean(&b));
    let cov: f64 = a.iter().zip(&b).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = a.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|y| (y - mb).powi(2)).sum();
    cov / (va * vb).sqrt()
}

#[test]
fn correlation_sign_and_size() {
    let prompt = LengthDist::Lognormal {
        mean: 300.0,
        sigma: 0.8,
        min: 1,
        max: 1_000_000,
    };
    let output = LengthDist::Uniform {
        min: 1,
        max: 100_000,
    };
    for target in [-0.7, 0.0, 0.5] {
        let mut rng = Rng::new(11);
        let pairs: Vec<(u32, u32)> = (0..20_000)
            .map(|_| sample_pair(&prompt, &output, target, &mut rng))
            .collect();
        let rho = spearman(&pairs);
        assert!((rho - target).abs() < 0.05, "target {target}, got {rho}");
    }
}
