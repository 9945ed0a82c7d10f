//! The tenant cost dashboard at `GET /admin/dashboard` on the admin listener: one static HTML
//! page with its script and hand-drawn SVG charts, embedded in the binary (no CDN, no build
//! step). It reads `/admin/usage` and `/admin/budgets` with the admin key the user gives it.

use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};

use crate::error::{ResBody, json_response};

/// The page.
const PAGE: &str = include_str!("dashboard.html");

/// The dashboard page.
pub fn page() -> Response<ResBody> {
    let mut res = json_response(StatusCode::OK, PAGE);
    let h = res.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // Everything the page loads comes from this listener.
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
        ),
    );
    res
}
