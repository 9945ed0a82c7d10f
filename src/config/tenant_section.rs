//! Validation of the config's `tenants:`: unique names, a known tier, and API keys from hashes
//! in the file, an environment variable or a key file. Plain keys are hashed as soon as they are
//! read and never kept, nor repeated in any message.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_saphyr::Location;

use super::raw::{RawTenant, Text};
use super::snapshot::{TenantSpec, TierSpec};
use super::tiers_file::names;
use crate::diagnostics::Sink;
use crate::tenants::keys::{hash_key, parse_hash};

/// The validated tenants, and the key files they read (for the file watcher).
pub(super) struct Tenants {
    /// Tenants in file order.
    pub tenants: Vec<TenantSpec>,
    /// Every `key_file` read, absolute.
    pub key_files: Vec<PathBuf>,
}

/// Checks every tenant. `tiers` is `None` when tenants.yaml did not parse: tier names are then
/// not checked (that file's error is reported instead). `base` anchors relative key files.
pub(super) fn tenants(
    raw: &[RawTenant],
    tiers: Option<&[TierSpec]>,
    base: &Path,
    sink: &mut Sink<'_>,
) -> Tenants {
    let mut first_line: HashMap<&str, u64> = HashMap::new();
    let mut owners: HashMap<[u8; 32], (usize, u64)> = HashMap::new();
    let mut out = Tenants {
        tenants: Vec::with_capacity(raw.len()),
        key_files: Vec::new(),
    };
    for (index, tenant) in raw.iter().enumerate() {
        let name = &tenant.name;
        if name.value.trim().is_empty() {
            sink.at(&name.referenced, "tenant name is empty");
        } else if let Some(line) = first_line.get(name.value.as_str()) {
            let msg = format!(
                "duplicate tenant name `{}` (first on line {line})",
                name.value
            );
            sink.at(&name.referenced, msg);
        } else {
            first_line.insert(&name.value, name.referenced.line());
        }
        if let Some(tiers) = tiers.filter(|t| !t.iter().any(|t| t.name == tenant.tier.value)) {
            let msg = format!(
                "tenant `{}`: tier `{}` is not defined (tiers: {})",
                name.value,
                tenant.tier.value,
                names(tiers)
            );
            sink.at(&tenant.tier.referenced, msg);
        }
        let keys = keys(tenant, base, sink, &mut out.key_files);
        let mut key_hashes = Vec::with_capacity(keys.len());
        for (hash, at) in keys {
            match owners.get(&hash) {
                Some(&(owner, _)) if owner == index => continue,
                Some(&(owner, line)) => {
                    let msg = format!(
                        "tenant `{}`: this key is also a key of tenant `{}` (line {line}); \
                         keys must be unique across tenants",
                        name.value, raw[owner].name.value
                    );
                    sink.at(&at, msg);
                }
                None => {
                    owners.insert(hash, (index, at.line()));
                }
            }
            key_hashes.push(hash);
        }
        out.tenants.push(TenantSpec {
            name: name.value.clone(),
            tier: tenant.tier.value.clone(),
            key_hashes,
        });
    }
    out
}

/// The key digests of one tenant, each with where its source is written.
fn keys(
    tenant: &RawTenant,
    base: &Path,
    sink: &mut Sink<'_>,
    key_files: &mut Vec<PathBuf>,
) -> Vec<([u8; 32], Location)> {
    let name = &tenant.name.value;
    let mut fail =
        |at: &Text, message: String| sink.at(&at.referenced, format!("tenant `{name}`: {message}"));
    let listed = tenant.keys.as_deref().unwrap_or_default();
    if listed.is_empty() && tenant.key_env.is_none() && tenant.key_file.is_none() {
        fail(
            &tenant.name,
            "no keys: give `keys` (sha256 hash lines from `infergate keys create`), `key_env` or \
             `key_file`"
                .into(),
        );
    }
    let mut out = Vec::new();
    for key in listed {
        match parse_hash(&key.value) {
            Ok(hash) => out.push((hash, key.referenced)),
            Err(message) => fail(key, message),
        }
    }
    if let Some(env) = &tenant.key_env {
        match std::env::var(&env.value) {
            Ok(plain) if !plain.trim().is_empty() => {
                out.push((hash_key(plain.trim()), env.referenced));
            }
            Ok(_) => fail(
                env,
                format!("key_env: environment variable `{}` is empty", env.value),
            ),
            Err(std::env::VarError::NotPresent) => {
                fail(
                    env,
                    format!("key_env: environment variable `{}` is not set", env.value),
                );
            }
            Err(std::env::VarError::NotUnicode(_)) => fail(
                env,
                format!("key_env: environment variable `{}` is not UTF-8", env.value),
            ),
        }
    }
    if let Some(file) = &tenant.key_file {
        let joined = base.join(&file.value);
        let path = std::path::absolute(&joined).unwrap_or(joined);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let before = out.len();
                let plain = text.lines().map(str::trim);
                let plain = plain.filter(|l| !l.is_empty() && !l.starts_with('#'));
                out.extend(plain.map(|key| (hash_key(key), file.referenced)));
                if out.len() == before {
                    fail(file, format!("key_file {} holds no keys", path.display()));
                }
            }
            Err(err) => fail(
                file,
                format!("key_file: cannot read {}: {err}", path.display()),
            ),
        }
        key_files.push(path);
    }
    out
}
