//! Account: the request's metrics, tenant outcome and (for a refused or failed request) its
//! usage row, once per request. A relayed answer is accounted when its body ends (see
//! [`super::forward`]): its status is known only then.

use hyper::{Response, StatusCode};

use super::ctx::RequestCtx;
use crate::error::{GatewayError, ResBody};
use crate::gateway::Gateway;

/// Account: count the request by model, pool and status, and per tenant (once per request).
pub(super) fn account(
    gw: &Gateway,
    ctx: &RequestCtx,
    res: &Response<ResBody>,
    err: Option<&GatewayError>,
) {
    if ctx.counted_at_end && err.is_none() {
        return;
    }
    let status = res.status();
    if let Some(t) = &ctx.target {
        gw.metrics
            .requests
            .with_label_values(&[&t.model, &t.pool, status.as_str()])
            .inc();
    }
    let tenant = ctx.tenant().unwrap_or("unknown");
    // `upstream` and `internal` failures are not refusals of the caller.
    let reason = err.map(GatewayError::reason);
    let refused = reason.filter(|r| !matches!(*r, "upstream" | "internal"));
    if let Some(reason) = reason {
        if let Some(reason) = refused {
            gw.metrics
                .rejections
                .with_label_values(&[tenant, reason])
                .inc();
        }
        // A refusal of a known caller is a ledger row too (an unknown one is not: a flood of
        // bad keys must not fill the ledger).
        if let Some(ledger) = ctx.ledger.as_ref().filter(|_| ctx.caller.is_some()) {
            let mut row = ctx.ended_row(status.as_u16(), reason);
            row.price_version = gw.live().snapshot.prices.version;
            ledger.record(row);
        }
    }
    if ctx.caller.is_none() && err.is_none() {
        return;
    }
    let outcome = match refused {
        Some(_) => "rejected",
        None => outcome_of(status.as_u16()),
    };
    gw.metrics
        .tenant_requests
        .with_label_values(&[tenant, outcome])
        .inc();
}

/// The `status` label and tenant outcome of a relayed answer, from how its body ended: a body
/// the worker broke off (a reset, an error event, a stream cut before `[DONE]`, a short body) is
/// a 502 whatever status its headers had (a held whole answer: the 5xx its client got), and a
/// client that left is nginx's 499.
pub(super) fn end_outcome(end: &crate::proxy::body::EndReport) -> (StatusCode, &'static str) {
    if end.client_gone {
        (CLIENT_CLOSED, "cancelled")
    } else if !end.completed {
        let status = StatusCode::from_u16(end.status)
            .ok()
            .filter(StatusCode::is_server_error)
            .unwrap_or(StatusCode::BAD_GATEWAY);
        (status, "upstream_error")
    } else {
        // A status hyper accepted from the worker is a valid code.
        let status = StatusCode::from_u16(end.status).unwrap_or(StatusCode::BAD_GATEWAY);
        (status, outcome_of(end.status))
    }
}

/// Whether a relayed answer counts as a success of the version that served it (the canary's
/// analysis sample): read to its end, whole, with a 2xx. A stream that carried an error event
/// or stopped before `[DONE]` is a failure whatever its head said.
pub(super) fn served_well(end: &crate::proxy::body::EndReport) -> bool {
    end.completed && (200..300).contains(&end.status)
}

/// nginx's 499: the client closed the connection before the answer ended.
const CLIENT_CLOSED: StatusCode = match StatusCode::from_u16(499) {
    Ok(s) => s,
    Err(_) => StatusCode::BAD_REQUEST,
};

/// The tenant outcome of an answer with HTTP `status`.
pub(super) fn outcome_of(status: u16) -> &'static str {
    match status {
        200..=399 => "ok",
        400..=499 => "client_error",
        _ => "upstream_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::body::EndReport;

    #[test]
    fn a_body_the_worker_broke_is_an_upstream_error_whatever_its_head_said() {
        let end = |status, completed, client_gone| EndReport {
            status,
            completed,
            client_gone,
            ..EndReport::default()
        };
        assert_eq!(end_outcome(&end(200, true, false)), (StatusCode::OK, "ok"));
        let broken = (StatusCode::BAD_GATEWAY, "upstream_error");
        assert_eq!(end_outcome(&end(200, false, false)), broken);
        assert_eq!(end_outcome(&end(404, false, false)), broken);
        assert_eq!(
            end_outcome(&end(504, false, false)),
            (StatusCode::GATEWAY_TIMEOUT, "upstream_error")
        );
        assert_eq!(end_outcome(&end(200, false, true)).1, "cancelled");
        assert!(served_well(&end(200, true, false)));
        assert!(!served_well(&end(200, false, false)), "a broken stream");
        assert!(!served_well(&end(503, true, false)));
        assert_eq!(
            end_outcome(&end(429, true, false)),
            (StatusCode::TOO_MANY_REQUESTS, "client_error")
        );
    }
}
