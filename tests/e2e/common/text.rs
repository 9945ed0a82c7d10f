//! Deterministic request content: prompt words, token ids and prose from seeds, and the seeded
//! generator behind them (so a failing run repeats exactly).

/// Text of `n` prompt words, deterministic in `salt`.
pub fn words(n: usize, salt: usize) -> String {
    const POOL: [&str; 16] = [
        "river", "stone", "light", "garden", "window", "paper", "silver", "market", "forest",
        "engine", "harbor", "winter", "yellow", "bridge", "camera", "planet",
    ];
    (0..n)
        .map(|i| POOL[(i * 7 + salt * 3 + i / 16) % POOL.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// `n` prompt token ids (plain-vocabulary ids), distinct across `salt`s.
pub fn token_ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 1_000 + (salt * 7_919 + i * 37) % 60_000)
        .collect()
}

/// Pseudo-random prose of about `bytes` bytes, distinct for each `seed` from its first word on.
pub fn random_text(bytes: usize, seed: u64) -> String {
    const WORDS: [&str; 32] = [
        "amber", "basil", "cedar", "delta", "ember", "fjord", "gravel", "hazel", "iris", "juniper",
        "kelp", "lumen", "maple", "nectar", "onyx", "pepper", "quartz", "raven", "saffron",
        "thistle", "umber", "violet", "willow", "xenon", "yarrow", "zephyr", "copper", "meadow",
        "lantern", "orchid", "pebble", "tundra",
    ];
    let mut rng = Rng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03);
    let mut s = format!("Context {seed}:");
    while s.len() < bytes {
        s.push(' ');
        s.push_str(WORDS[rng.below(WORDS.len())]);
    }
    s
}

/// A deterministic pseudo-random generator (splitmix64) for seeded workloads.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
