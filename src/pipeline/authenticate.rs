//! Authenticate: the bearer key names the tenant (keys are stored hashed); without any tenant in
//! the config every caller is the anonymous tenant of the default tier.

use crate::config::TenantSpec;
use crate::error::GatewayError;
use crate::gateway::Live;
use crate::tenants::bearer;

/// The caller's tenant and the short id of its key: the owner of the bearer key, or the
/// anonymous tenant (default tier, no key id) when the config declares no tenants at all.
pub(super) fn authenticate<'a>(
    live: &'a Live,
    headers: &hyper::HeaderMap,
) -> Result<(&'a TenantSpec, String), GatewayError> {
    let snapshot = &live.snapshot;
    if snapshot.tenants.is_empty() {
        return Ok((&live.anonymous, String::new()));
    }
    let presented = bearer(
        headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
    .ok_or_else(|| {
        GatewayError::Unauthorized(
            "You didn't provide an API key: send `Authorization: Bearer YOUR_KEY`.".into(),
        )
    })?;
    let hash = crate::tenants::hash_key(presented);
    let index = live
        .keys
        .lookup_hash(&hash)
        .ok_or_else(|| GatewayError::Unauthorized("Incorrect API key provided.".into()))?;
    let tenant = snapshot
        .tenants
        .get(index)
        .ok_or_else(|| GatewayError::Internal("key table out of date".into()))?;
    Ok((tenant, crate::tenants::key_id(&hash)))
}
