//! API keys: SHA-256 hashing, the `sha256:<hex>` form written in the config, key generation from
//! the OS's randomness, the `Authorization: Bearer` header, and the table that maps a presented key
//! to its tenant. Plain keys are never stored or logged; only their digests are kept.

use std::collections::HashMap;
use std::io::Read;

use sha2::{Digest, Sha256};

use super::TenantSpec;

/// Prefix of a key hash as written in the config.
const HASH_PREFIX: &str = "sha256:";

/// Prefix of every generated key, so a leaked key is recognisable in a secret scanner.
const KEY_PREFIX: &str = "ig-";

/// Random characters in a generated key (40 × 6 bits = 240 bits of entropy).
const KEY_RANDOM_CHARS: usize = 40;

/// The URL-safe alphabet of generated keys; 64 symbols, so `byte % 64` is uniform.
const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// The SHA-256 digest of a plain key, as stored in `TenantSpec::key_hashes`.
pub fn hash_key(plain: &str) -> [u8; 32] {
    Sha256::digest(plain.as_bytes()).into()
}

/// A digest in config form: `sha256:` and 64 lowercase hex digits.
pub fn format_hash(hash: &[u8; 32]) -> String {
    let mut out = String::with_capacity(HASH_PREFIX.len() + 64);
    out.push_str(HASH_PREFIX);
    for byte in hash {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

/// The short id of a key in usage records: the first 12 hex digits of its digest, the start of
/// its `sha256:` line in the config (enough to tell keys apart, useless to guess one).
pub fn key_id(hash: &[u8; 32]) -> String {
    let mut out = String::with_capacity(12);
    for byte in &hash[..6] {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

/// Lowercase hex digits.
const HEX: &[u8; 16] = b"0123456789abcdef";

/// Parses `sha256:` followed by 64 hex digits (either case). The error never repeats the input,
/// which may be a plain key pasted where its hash belongs.
pub fn parse_hash(text: &str) -> Result<[u8; 32], String> {
    let hint = "write `sha256:` and 64 hex digits (`infergate keys create` prints one)";
    let Some(hex) = text.trim().strip_prefix(HASH_PREFIX) else {
        return Err(format!(
            "a key hash must start with `sha256:` (plain keys do not belong in the config): {hint}"
        ));
    };
    let digits = hex.as_bytes();
    if digits.len() != 64 {
        return Err(format!(
            "a key hash has 64 hex digits, this one has {}: {hint}",
            digits.len()
        ));
    }
    let mut hash = [0u8; 32];
    for (byte, pair) in hash.iter_mut().zip(digits.chunks_exact(2)) {
        match (hex_value(pair[0]), hex_value(pair[1])) {
            (Some(high), Some(low)) => *byte = (high << 4) | low,
            _ => return Err(format!("a key hash holds a non-hex character: {hint}")),
        }
    }
    Ok(hash)
}

/// The value of one hex digit.
fn hex_value(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|v| u8::try_from(v).ok())
}

/// A fresh key: `ig-` and 40 URL-safe characters drawn from `/dev/urandom`.
pub fn generate_key() -> Result<String, std::io::Error> {
    let mut random = [0u8; KEY_RANDOM_CHARS];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut random)?;
    let mut key = String::with_capacity(KEY_PREFIX.len() + KEY_RANDOM_CHARS);
    key.push_str(KEY_PREFIX);
    key.extend(
        random
            .iter()
            .map(|b| char::from(ALPHABET[usize::from(b % 64)])),
    );
    Ok(key)
}

/// The key of an `Authorization: Bearer <key>` header value (scheme case-insensitive, spaces
/// around the key ignored). `None` when the header is absent, uses another scheme, or the key is
/// empty or contains whitespace.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    let (scheme, rest) = value.split_once([' ', '\t'])?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let key = rest.trim();
    (!key.is_empty() && !key.contains(char::is_whitespace)).then_some(key)
}

/// Key digests → index of the tenant in `Snapshot::tenants`; built once per snapshot.
///
/// Lookup is a hash-map probe on the SHA-256 digest of the presented key rather than a
/// constant-time scan over every stored digest. Timing can at most reveal how the digest of the
/// caller's own guess relates to a stored digest (its bucket, a shared leading byte run); turning
/// that into a key needs a SHA-256 preimage, so it reveals nothing usable, and the plain keys
/// are never compared at all. The probe stays O(1) with thousands of tenants, where a full
/// `subtle::ConstantTimeEq` scan would cost microseconds per request.
#[derive(Debug, Clone, Default)]
pub struct KeyTable {
    by_hash: HashMap<[u8; 32], usize>,
}

impl KeyTable {
    /// The table of every key of `tenants`. A digest listed twice (config validation rejects
    /// that) maps to the first tenant holding it.
    pub fn new(tenants: &[TenantSpec]) -> Self {
        let mut by_hash = HashMap::new();
        for (index, tenant) in tenants.iter().enumerate() {
            for hash in &tenant.key_hashes {
                by_hash.entry(*hash).or_insert(index);
            }
        }
        Self { by_hash }
    }

    /// The index of the tenant whose key is `presented`, if any.
    pub fn lookup(&self, presented: &str) -> Option<usize> {
        self.by_hash.get(&hash_key(presented)).copied()
    }

    /// The index of the tenant whose key has digest `hash`, if any.
    pub fn lookup_hash(&self, hash: &[u8; 32]) -> Option<usize> {
        self.by_hash.get(hash).copied()
    }

    /// Number of keys in the table.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// True when no tenant has a key.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str, keys: &[&str]) -> TenantSpec {
        TenantSpec {
            name: name.into(),
            tier: "free".into(),
            key_hashes: keys.iter().map(|k| hash_key(k)).collect(),
        }
    }

    #[test]
    fn hashes_are_sha256_in_config_form() {
        let hash = hash_key("abc");
        let text = format_hash(&hash);
        assert_eq!(
            text,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(parse_hash(&text), Ok(hash));
        assert_eq!(
            parse_hash(&text.to_uppercase().replace("SHA256", "sha256")),
            Ok(hash)
        );
        assert_eq!(parse_hash(&format!("  {text}\n")), Ok(hash));
    }

    #[test]
    fn bad_hashes_say_why_without_echoing_the_input() {
        let secret = "ig-this-is-a-plain-key";
        let err = parse_hash(secret).expect_err("plain key");
        assert!(err.contains("plain keys") && !err.contains(secret), "{err}");
        let short = parse_hash("sha256:abcd").expect_err("short");
        assert!(short.contains("this one has 4"), "{short}");
        let bad = format!("sha256:{}", "g".repeat(64));
        assert!(parse_hash(&bad).expect_err("non-hex").contains("non-hex"));
        assert!(parse_hash(&format!("sha256:{}é", "a".repeat(62))).is_err());
    }

    #[test]
    fn generated_keys_are_fresh_and_url_safe() {
        let a = generate_key().expect("urandom");
        let b = generate_key().expect("urandom");
        assert_ne!(a, b);
        assert_eq!(a.len(), 43);
        let body = a.strip_prefix("ig-").expect("prefix");
        assert!(body.bytes().all(|c| ALPHABET.contains(&c)), "{a}");
    }

    #[test]
    fn bearer_headers() {
        assert_eq!(bearer(Some("Bearer ig-abc")), Some("ig-abc"));
        assert_eq!(bearer(Some("bearer   ig-abc  ")), Some("ig-abc"));
        assert_eq!(bearer(Some("BEARER\tk")), Some("k"));
        for bad in [
            "",
            "Bearer",
            "Bearer ",
            "Basic dXNlcjpwYXNz",
            "Bearer a b",
            "ig-abc",
        ] {
            assert_eq!(bearer(Some(bad)), None, "{bad:?}");
        }
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn the_table_maps_keys_to_tenants() {
        let tenants = [tenant("a", &["ka1", "ka2"]), tenant("b", &["kb"])];
        let table = KeyTable::new(&tenants);
        assert_eq!(table.len(), 3);
        assert_eq!(table.lookup("ka1"), Some(0));
        assert_eq!(table.lookup("ka2"), Some(0));
        assert_eq!(table.lookup("kb"), Some(1));
        assert_eq!(table.lookup("kc"), None);
        assert_eq!(table.lookup(""), None);
        assert!(KeyTable::new(&[]).is_empty());
    }

    #[test]
    fn a_generated_key_round_trips_through_its_hash_line() {
        let key = generate_key().expect("urandom");
        let line = format_hash(&hash_key(&key));
        let parsed = parse_hash(&line).expect("valid");
        let table = KeyTable::new(&[TenantSpec {
            name: "demo".into(),
            tier: "default".into(),
            key_hashes: vec![parsed],
        }]);
        assert_eq!(table.lookup(&key), Some(0));
    }
}
