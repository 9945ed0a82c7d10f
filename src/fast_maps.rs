//! Hash maps on the request path cheaper than the standard library's SipHash, which costs
//! ~100-150 instructions a lookup (callgrind: the drift book's two lookups an answer were ~760
//! instructions; the prefix index's two a prompt block, most of its routing cost).
//!
//! - [`NamesMap`]: keys are names from the config (tenants, models, versions), bounded by the
//!   config and never chosen freely by a client, so FNV-1a (a few instructions a byte) is enough.
//! - [`HashKeyMap`]: keys are 64-bit hashes of what clients send (prompt blocks), so a client
//!   can choose them: each map mixes its keys with a random per-map seed through a 128-bit
//!   multiply (both halves folded), so which keys collide is not known outside the process.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

/// FNV-1a, 64-bit.
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// A `HashMap` over config names, hashed with [`Fnv`].
pub type NamesMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// A `HashMap` over 64-bit hashes of client content, hashed with a per-map [`Seeded`] mix.
pub type HashKeyMap<V> = HashMap<u64, V, Seeded>;

/// Builds [`SeededHasher`]s with a random seed drawn when the map is made.
#[derive(Debug, Clone, Copy)]
pub struct Seeded(u64);

impl Default for Seeded {
    fn default() -> Self {
        // The standard library's per-map random keys, as one word.
        Self(std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64))
    }
}

impl BuildHasher for Seeded {
    type Hasher = SeededHasher;

    fn build_hasher(&self) -> SeededHasher {
        SeededHasher(self.0)
    }
}

/// Folds each 64-bit word into the state: `x ^ state` times an odd constant, the 128-bit
/// product's halves XORed (every input bit reaches every output bit).
#[derive(Debug, Clone, Copy)]
pub struct SeededHasher(u64);

impl SeededHasher {
    fn fold(&mut self, word: u64) {
        let product = u128::from(word ^ self.0) * 0x9e37_79b9_7f4a_7c15_u128;
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

impl Hasher for SeededHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, word: u64) {
        self.fold(word);
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.fold(u64::from_le_bytes(word));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_its_reference_values_and_the_map_works() {
        let hash = |s: &[u8]| {
            let mut h = Fnv::default();
            h.write(s);
            h.finish()
        };
        // The published FNV-1a 64 test vectors.
        assert_eq!(hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash(b"foobar"), 0x8594_4171_f739_67e8);
        let mut m: NamesMap<String, u32> = NamesMap::default();
        m.insert("acme".into(), 1);
        m.insert("globex".into(), 2);
        assert_eq!(m.get("acme"), Some(&1));
        assert_eq!(m.get("globex"), Some(&2));
        assert_eq!(m.get("initech"), None);
        let b = BuildHasherDefault::<Fnv>::default();
        assert_eq!(b.hash_one("x"), b.hash_one("x"));
    }

    #[test]
    fn seeded_maps_mix_keys_by_their_own_seed() {
        let (a, b) = (Seeded::default(), Seeded::default());
        assert_ne!(a.0, b.0, "each map draws its own seed");
        assert_eq!(a.hash_one(42u64), a.hash_one(42u64));
        assert_ne!(a.hash_one(42u64), b.hash_one(42u64));
        // Keys equal in their low bits (what a client could arrange) differ in the low bits
        // hashbrown buckets by, and in the top seven it tags by.
        let hashes: Vec<u64> = (0..64u64).map(|i| a.hash_one(i << 32)).collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 0xfff).collect();
        let top: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(
            low.len() > 60 && top.len() > 30,
            "{} {}",
            low.len(),
            top.len()
        );
        let mut m: HashKeyMap<u32> = HashKeyMap::default();
        m.insert(7, 1);
        assert_eq!(m.get(&7), Some(&1));
        assert_eq!(m.get(&8), None);
    }
}
