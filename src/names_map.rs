//! Maps keyed by names from the config (tenants, models, versions) on the request path: FNV-1a
//! instead of the standard library's SipHash. These keys are bounded by the config, never chosen
//! freely by a client, so SipHash's defence against crafted collisions buys nothing here, and
//! for a ten-byte name it costs several times FNV's few instructions a byte (measured by
//! callgrind: the drift book's two lookups an answer were ~760 instructions with SipHash).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

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
}
