//! The gateway's one error type: where it came from, whether a retry may help, and the single
//! mapping to an HTTP response (or to an SSE error event once a stream has started).

use std::convert::Infallible;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Response, StatusCode};
use infergate_engine::openai::ApiError;

/// Boxed error of response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Response body of every gateway route.
pub type ResBody = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// Everything that can end a request early.
#[derive(Debug, Clone, PartialEq)]
pub enum GatewayError {
    /// Malformed or invalid request (400).
    BadRequest {
        /// What is wrong.
        message: String,
        /// The field at fault.
        param: Option<String>,
    },
    /// Unknown model or route (404).
    NotFound(String),
    /// Body over the limit (413).
    PayloadTooLarge(usize),
    /// The body did not arrive within the body read timeout (408).
    BodyTimeout(std::time::Duration),
    /// Wrong method for the route (405).
    MethodNotAllowed,
    /// Missing or unknown API key (401).
    Unauthorized(String),
    /// The tenant's tier does not allow this (403).
    Forbidden(String),
    /// Over a rate, concurrency or queue limit (429); a retry after `retry_after_secs` can pass.
    TooManyRequests {
        /// What limit and by how much.
        message: String,
        /// Whole seconds, rounded up.
        retry_after_secs: u64,
        /// Extra headers: `x-ratelimit-*`, or `x-infergate-degraded` for a shed request.
        headers: Vec<(&'static str, String)>,
        /// The per-tenant rejection reason label (`rate`, `queue_full`, `degraded`, ...).
        reason: &'static str,
    },
    /// The tenant reached a hard spending budget (429); it resets after `retry_after_secs`.
    BudgetExceeded {
        /// Which budget, the spend and the reset time.
        message: String,
        /// Whole seconds to the reset.
        retry_after_secs: u64,
    },
    /// Larger than the tenant's whole budget: no retry can pass (400).
    NeverFits(String),
    /// Refused while the pool is degraded (503); a retry after the level eases can pass.
    Degraded {
        /// Which level and what it refuses.
        message: String,
        /// Whole seconds.
        retry_after_secs: u64,
        /// The degradation action that refused it (the `x-infergate-degraded` header).
        action: &'static str,
    },
    /// The request bodies being read or held gateway-wide already fill `limits.max_buffered_body_bytes`
    /// (503); a retry after `retry_after_secs` can pass.
    BodyMemory {
        /// Whole seconds.
        retry_after_secs: u64,
    },
    /// No healthy worker in the pool (503).
    NoHealthyWorker(String),
    /// The gateway is draining (503).
    Draining,
    /// The worker could not be reached or failed before answering (502).
    UpstreamUnavailable(String),
    /// The worker was ejected while the request waited for its first byte (503).
    WorkerEjected(String),
    /// The worker did not answer in time (504).
    UpstreamTimeout(String),
    /// A bug or resource failure inside the gateway (500).
    Internal(String),
}

impl GatewayError {
    /// A 400 naming the field at fault.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self::BadRequest {
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }

    /// Everything this error maps to, in one place: status, OpenAI type, message, field,
    /// `Retry-After`, extra headers and the rejection reason label.
    fn row(&self) -> Row {
        use StatusCode as S;
        let row = |status, kind, reason, message: String| Row {
            status,
            kind,
            reason,
            message,
            param: None,
            retry_after_secs: None,
            headers: Vec::new(),
            retryable: false,
        };
        const INVALID: &str = "invalid_request_error";
        const UNAVAILABLE: &str = "service_unavailable";
        const SERVER: &str = "server_error";
        match self {
            Self::BadRequest { message, param } => Row {
                param: param.clone(),
                ..row(S::BAD_REQUEST, INVALID, "validation", message.clone())
            },
            Self::NotFound(m) => row(S::NOT_FOUND, "not_found_error", "validation", m.clone()),
            Self::PayloadTooLarge(limit) => row(
                S::PAYLOAD_TOO_LARGE,
                INVALID,
                "validation",
                format!("request body exceeds {limit} bytes"),
            ),
            Self::BodyTimeout(limit) => row(
                S::REQUEST_TIMEOUT,
                INVALID,
                "validation",
                format!("the request body did not arrive within {limit:?}"),
            ),
            Self::MethodNotAllowed => row(
                S::METHOD_NOT_ALLOWED,
                INVALID,
                "validation",
                "Method Not Allowed".into(),
            ),
            Self::Unauthorized(m) => row(S::UNAUTHORIZED, "authentication_error", "auth", m.clone()),
            Self::Forbidden(m) => row(S::FORBIDDEN, "permission_error", "validation", m.clone()),
            Self::TooManyRequests {
                message,
                retry_after_secs,
                headers,
                reason,
            } => Row {
                retry_after_secs: Some(*retry_after_secs),
                headers: headers.clone(),
                ..row(S::TOO_MANY_REQUESTS, "rate_limit_error", reason, message.clone())
            },
            // OpenAI's own type for a spent quota.
            Self::BudgetExceeded {
                message,
                retry_after_secs,
            } => Row {
                retry_after_secs: Some(*retry_after_secs),
                ..row(S::TOO_MANY_REQUESTS, "insufficient_quota", "budget", message.clone())
            },
            Self::NeverFits(m) => Row {
                param: Some("max_tokens".into()),
                ..row(S::BAD_REQUEST, INVALID, "validation", m.clone())
            },
            Self::Degraded {
                message,
                retry_after_secs,
                action,
            } => Row {
                retry_after_secs: Some(*retry_after_secs),
                headers: vec![("x-infergate-degraded", (*action).to_string())],
                ..row(S::SERVICE_UNAVAILABLE, UNAVAILABLE, "degraded", message.clone())
            },
            Self::BodyMemory { retry_after_secs } => Row {
                retry_after_secs: Some(*retry_after_secs),
                ..row(
                    S::SERVICE_UNAVAILABLE,
                    UNAVAILABLE,
                    "body_memory",
                    "the gateway is holding as many request bodies as it may at once; retry shortly"
                        .into(),
                )
            },
            Self::NoHealthyWorker(pool) => Row {
                retry_after_secs: Some(1),
                ..row(
                    S::SERVICE_UNAVAILABLE,
                    UNAVAILABLE,
                    "upstream",
                    format!("no healthy worker in pool `{pool}`"),
                )
            },
            // The connection is not reused: the gateway is going away (HTTP/2 strips the header).
            Self::Draining => Row {
                retry_after_secs: Some(1),
                headers: vec![("connection", "close".into())],
                ..row(
                    S::SERVICE_UNAVAILABLE,
                    UNAVAILABLE,
                    "draining",
                    "the gateway is shutting down".into(),
                )
            },
            // The worker's URL stays in the logs: clients are not told internal addresses.
            Self::WorkerEjected(_) => Row {
                retry_after_secs: Some(1),
                retryable: true,
                ..row(
                    S::SERVICE_UNAVAILABLE,
                    UNAVAILABLE,
                    "upstream",
                    "the worker serving this request stopped answering and was ejected; no other worker took it"
                        .into(),
                )
            },
            Self::UpstreamUnavailable(m) => Row {
                retryable: true,
                ..row(S::BAD_GATEWAY, SERVER, "upstream", m.clone())
            },
            // The worker may still be running it: a retry would run it twice.
            Self::UpstreamTimeout(m) => row(S::GATEWAY_TIMEOUT, SERVER, "upstream", m.clone()),
            Self::Internal(m) => row(S::INTERNAL_SERVER_ERROR, SERVER, "internal", m.clone()),
        }
    }

    /// HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        self.row().status
    }

    /// The OpenAI-shaped error this maps to.
    pub fn to_api(&self) -> ApiError {
        self.row().into_api()
    }

    /// The response for this error.
    pub fn into_response(&self) -> Response<ResBody> {
        let mut row = self.row();
        let headers = std::mem::take(&mut row.headers);
        let api = row.into_api();
        let mut res = json_response(api.status, api.to_json());
        if let Some(secs) = api.retry_after_secs {
            res.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        for (name, value) in headers {
            if let Ok(v) = HeaderValue::from_str(&value) {
                res.headers_mut().insert(name, v);
            }
        }
        res
    }

    /// Whether forwarding may try another worker after this failure (only before anything
    /// reached the client, and within the retry budget).
    pub fn retryable(&self) -> bool {
        self.row().retryable
    }

    /// The rejection reason label for per-tenant metrics (`upstream`/`internal` are not
    /// rejections).
    pub fn reason(&self) -> &'static str {
        self.row().reason
    }

    /// An SSE error event followed by `[DONE]`, for failures after a stream has started.
    pub fn sse_event(&self) -> Bytes {
        Bytes::from(self.to_api().sse_event() + infergate_engine::openai::sse::DONE)
    }
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_api().message)
    }
}

impl std::error::Error for GatewayError {}

impl From<infergate_engine::edge::BodyError> for GatewayError {
    fn from(e: infergate_engine::edge::BodyError) -> Self {
        use infergate_engine::edge::BodyError;
        match e {
            BodyError::TooLarge { limit } => Self::PayloadTooLarge(limit),
            BodyError::TimedOut { limit } => Self::BodyTimeout(limit),
            BodyError::Read(_) => Self::bad_request(e.to_string(), None),
        }
    }
}

/// One row of the error table (see [`GatewayError::row`]).
struct Row {
    status: StatusCode,
    /// OpenAI error `type`.
    kind: &'static str,
    /// Per-tenant rejection reason label.
    reason: &'static str,
    message: String,
    /// The request field at fault.
    param: Option<String>,
    /// `Retry-After`, whole seconds.
    retry_after_secs: Option<u64>,
    /// Extra response headers.
    headers: Vec<(&'static str, String)>,
    /// Another worker may take the request (the failure happened before it reached the client).
    retryable: bool,
}

impl Row {
    /// The OpenAI error body's fields.
    fn into_api(self) -> ApiError {
        let mut e = ApiError::bad_request(self.message, self.param.as_deref());
        e.status = self.status;
        e.kind = self.kind;
        e.retry_after_secs = self.retry_after_secs;
        e
    }
}

/// A complete body.
pub fn full_body(body: impl Into<Bytes>) -> ResBody {
    Full::new(body.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// A JSON response with `status`.
pub fn json_response(status: StatusCode, body: impl Into<Bytes>) -> Response<ResBody> {
    let mut res = Response::new(full_body(body));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_before_any_answer_may_go_to_another_worker() {
        let retryable = [
            GatewayError::UpstreamUnavailable("refused".into()),
            GatewayError::WorkerEjected("w".into()),
        ];
        assert!(retryable.iter().all(GatewayError::retryable));
        let not = [
            // The worker may still be running it.
            GatewayError::UpstreamTimeout("slow".into()),
            GatewayError::Draining,
            GatewayError::NoHealthyWorker("p".into()),
            GatewayError::Internal("bug".into()),
            GatewayError::bad_request("bad", None),
        ];
        assert!(!not.iter().any(GatewayError::retryable));
    }

    #[test]
    fn maps_to_status_and_openai_body() {
        let e = GatewayError::bad_request("bad temperature", Some("temperature"));
        let res = e.into_response();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
        let v: serde_json::Value = serde_json::from_str(&e.to_api().to_json()).unwrap();
        assert_eq!(v["error"]["param"], "temperature");
        let e = GatewayError::NoHealthyWorker("p".into());
        let res = e.into_response();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(res.headers().contains_key(RETRY_AFTER));
        assert_eq!(
            GatewayError::UpstreamTimeout("x".into()).status(),
            StatusCode::GATEWAY_TIMEOUT
        );
        let ev = String::from_utf8(
            GatewayError::UpstreamUnavailable("gone".into())
                .sse_event()
                .to_vec(),
        )
        .unwrap();
        assert!(
            ev.starts_with("data: {\"error\"") && ev.ends_with("data: [DONE]\n\n"),
            "{ev}"
        );
    }

    #[test]
    fn each_variant_carries_its_reason_and_headers() {
        let shed = GatewayError::TooManyRequests {
            message: "shed".into(),
            retry_after_secs: 3,
            headers: vec![("x-infergate-degraded", "shed".into())],
            reason: "degraded",
        };
        assert_eq!(shed.reason(), "degraded");
        let res = shed.into_response();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()[RETRY_AFTER], "3");
        assert_eq!(res.headers()["x-infergate-degraded"], "shed");
        let long = GatewayError::Degraded {
            message: "too long".into(),
            retry_after_secs: 5,
            action: "refuse_long_prompts",
        };
        let res = long.into_response();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.headers()["x-infergate-degraded"], "refuse_long_prompts");
        assert_eq!(long.to_api().kind, "service_unavailable");
        assert_eq!(GatewayError::Draining.reason(), "draining");
        let quota = GatewayError::BudgetExceeded {
            message: "spent".into(),
            retry_after_secs: 60,
        };
        assert_eq!(
            (quota.reason(), quota.to_api().kind),
            ("budget", "insufficient_quota")
        );
        let never = GatewayError::NeverFits("huge".into()).to_api();
        assert_eq!(
            (never.status, never.param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("max_tokens"))
        );
        assert_eq!(GatewayError::Internal("bug".into()).reason(), "internal");
    }
}
