//! Tenants: who is calling (API keys → tenant) and what their tier allows. Tenants and tiers are
//! declared in the config snapshot (`Snapshot::tenants`, `Snapshot::tiers`); this module turns them
//! into the structures the request path consults.

pub mod keys;

pub use keys::{KeyTable, bearer, format_hash, generate_key, hash_key, key_id, parse_hash};
