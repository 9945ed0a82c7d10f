//! The tenant-cost admin API on the admin listener: `GET /admin/usage` (JSON, grouped, bounded
//! and paginated), `GET /admin/usage.csv` (the same groups, or raw rows without `group_by`),
//! `GET /admin/usage/daily` (the daily rollup) and `GET /admin/budgets`. Ledger reads run off the
//! reactor.

use std::sync::Arc;

use hyper::header::{CONTENT_DISPOSITION, CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::json;

use crate::error::{GatewayError, ResBody, json_response};
use crate::gateway::Gateway;
use crate::ledger::{Dimension, LedgerReader, UsagePage, UsageQuery};

/// What a usage route answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageRoute {
    /// `/admin/usage`: grouped JSON.
    Json,
    /// `/admin/usage.csv`: grouped CSV, or raw rows without `group_by`.
    Csv,
    /// `/admin/usage/daily`: the daily rollup as JSON.
    Daily,
}

/// Serves a usage route for the query string `query`.
pub async fn usage(gw: &Arc<Gateway>, route: UsageRoute, query: Option<&str>) -> Response<ResBody> {
    let Some(ledger) = gw.ledger.clone() else {
        return GatewayError::NotFound(
            "no usage ledger is kept: add `ledger: {path: usage.sqlite}` to the config".into(),
        )
        .into_response();
    };
    let params = query_pairs(query.unwrap_or(""));
    let grouped = params.iter().any(|(k, _)| k == "group_by" || k == "by");
    let raw_rows = route == UsageRoute::Csv && !grouped;
    if route == UsageRoute::Daily && params.iter().any(|(k, v)| k == "outcome" && v == "refused") {
        return GatewayError::bad_request(
            "the daily rollup counts refusals but keeps no per-refusal tokens: use /admin/usage?outcome=refused",
            Some("outcome"),
        )
        .into_response();
    }
    let default_group: &[Dimension] = if raw_rows { &[] } else { &[Dimension::Day] };
    let mut q = match UsageQuery::from_params(&params, crate::utc::now_ms(), default_group) {
        Ok(q) => q,
        Err(msg) => return GatewayError::bad_request(msg, None).into_response(),
    };
    if raw_rows && !params.iter().any(|(k, _)| k == "limit") {
        q.limit = crate::ledger::MAX_LIMIT;
    }
    let prices = gw.live().snapshot.prices.clone();
    let reader = ledger.reader().clone();
    let answer = tokio::task::spawn_blocking(move || -> Result<Response<ResBody>, String> {
        let reader: &dyn LedgerReader = reader.as_ref();
        if raw_rows {
            let rows = reader.rows(&q).map_err(|e| e.to_string())?;
            // A full page may have more behind it.
            let next = (rows.len() == q.limit).then_some(q.offset + rows.len());
            return Ok(csv_response(crate::ledger::render_rows_csv(&rows), next));
        }
        let mut page: UsagePage = match route {
            UsageRoute::Daily => reader.daily(&q),
            _ => reader.usage(&q),
        }
        .map_err(|e| e.to_string())?;
        page.price_savings(&prices);
        Ok(match route {
            UsageRoute::Csv => csv_response(crate::ledger::render_csv(&page), page.next_offset),
            _ => json_response(
                StatusCode::OK,
                serde_json::to_string(&page).map_err(|e| e.to_string())?,
            ),
        })
    })
    .await;
    match answer {
        Ok(Ok(res)) => res,
        Ok(Err(e)) => GatewayError::Internal(format!("usage ledger: {e}")).into_response(),
        Err(e) => GatewayError::Internal(format!("usage query failed: {e}")).into_response(),
    }
}

/// CSV with `x-next-offset` when the page was cut (ask again with `offset=` that value).
fn csv_response(body: String, next: Option<usize>) -> Response<ResBody> {
    let mut res = json_response(StatusCode::OK, body);
    let h = res.headers_mut();
    if let Some(n) = next {
        h.insert("x-next-offset", HeaderValue::from(n));
    }
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    h.insert(
        CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"usage.csv\""),
    );
    res
}

/// `GET /admin/budgets`: every tenant's budgets (its own, else its tier's) with spend, remaining,
/// reset and projected exhaustion; `?tenant=` narrows to one.
pub fn budgets(gw: &Gateway, query: Option<&str>) -> Response<ResBody> {
    let live = gw.live();
    let snapshot = &live.snapshot;
    let only = query_pairs(query.unwrap_or(""))
        .into_iter()
        .find(|(k, _)| k == "tenant")
        .map(|(_, v)| v);
    let now = crate::utc::now_ms();
    let mut out = Vec::new();
    // Without declared tenants every caller is the anonymous tenant of the default tier.
    let anonymous = crate::config::TenantSpec {
        name: "anonymous".into(),
        tier: snapshot.default_tier.clone().unwrap_or_default(),
        key_hashes: Vec::new(),
    };
    let tenants = if snapshot.tenants.is_empty() {
        std::slice::from_ref(&anonymous)
    } else {
        snapshot.tenants.as_slice()
    };
    for tenant in tenants {
        if only.as_ref().is_some_and(|t| *t != tenant.name) {
            continue;
        }
        let Some(tier) = snapshot.tier(&tenant.tier) else {
            continue;
        };
        let specs = snapshot.budgets_of(&tenant.name, tier);
        out.extend(gw.budgets.status(&tenant.name, specs, now));
    }
    json_response(
        StatusCode::OK,
        json!({"now": crate::utc::iso_time(now), "budgets": out}).to_string(),
    )
}

/// `a=1&b=x%20y` → pairs, percent- and plus-decoded.
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let hex = |b: u8| {
        char::from(b)
            .to_digit(16)
            .and_then(|v| u8::try_from(v).ok())
    };
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    out.push((high << 4) | low);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_decode() {
        let pairs = query_pairs("tenant=acme%20co&group_by=day,tenant&x=a+b&bad=%zz&end=%4");
        assert_eq!(
            pairs,
            vec![
                ("tenant".to_string(), "acme co".to_string()),
                ("group_by".to_string(), "day,tenant".to_string()),
                ("x".to_string(), "a b".to_string()),
                ("bad".to_string(), "%zz".to_string()),
                ("end".to_string(), "%4".to_string()),
            ]
        );
    }
}
