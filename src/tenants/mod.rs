//! Tenants: who is calling (API keys → tenant) and what their tier allows. Tenants and tiers are
//! declared in the config snapshot (`Snapshot::tenants`, `Snapshot::tiers`); this module turns them
//! into the structures the request path consults.

pub mod keys;

pub use keys::{KeyTable, bearer, format_hash, generate_key, hash_key, key_id, parse_hash};

/// A tenant: who may call, and under which tier.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantSpec {
    /// Unique tenant name (metric label, logs).
    pub name: String,
    /// Name of its tier in `Snapshot::tiers`.
    pub tier: String,
    /// SHA-256 digests of its API keys, never empty, unique across tenants.
    pub key_hashes: Vec<[u8; 32]>,
}
