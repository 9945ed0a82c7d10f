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
        /// `x-ratelimit-*` headers.
        headers: Vec<(&'static str, String)>,
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

    /// HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::TooManyRequests { .. } | Self::BudgetExceeded { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Self::NeverFits(_) => StatusCode::BAD_REQUEST,
            Self::Degraded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::NoHealthyWorker(_)
            | Self::Draining
            | Self::WorkerEjected(_)
            | Self::BodyMemory { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::UpstreamUnavailable(_) => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The OpenAI-shaped error this maps to.
    pub fn to_api(&self) -> ApiError {
        match self {
            Self::BadRequest { message, param } => ApiError::bad_request(message, param.as_deref()),
            Self::NotFound(m) => ApiError::not_found(m),
            Self::Unauthorized(m) => {
                with_kind(m, StatusCode::UNAUTHORIZED, "authentication_error", None)
            }
            Self::Forbidden(m) => with_kind(m, StatusCode::FORBIDDEN, "permission_error", None),
            Self::TooManyRequests {
                message,
                retry_after_secs,
                ..
            } => with_kind(
                message,
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                Some(*retry_after_secs),
            ),
            // OpenAI's own type for a spent quota.
            Self::BudgetExceeded {
                message,
                retry_after_secs,
            } => with_kind(
                message,
                StatusCode::TOO_MANY_REQUESTS,
                "insufficient_quota",
                Some(*retry_after_secs),
            ),
            Self::NeverFits(m) => ApiError::bad_request(m, Some("max_tokens")),
            Self::Degraded {
                message,
                retry_after_secs,
            } => ApiError::unavailable(message, *retry_after_secs),
            Self::PayloadTooLarge(limit) => {
                ApiError::payload_too_large(format!("request body exceeds {limit} bytes"))
            }
            Self::BodyTimeout(limit) => with_kind(
                &format!("the request body did not arrive within {limit:?}"),
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                None,
            ),
            Self::MethodNotAllowed => ApiError::method_not_allowed(),
            Self::NoHealthyWorker(pool) => {
                ApiError::unavailable(format!("no healthy worker in pool `{pool}`"), 1)
            }
            Self::Draining => ApiError::unavailable("the gateway is shutting down", 1),
            Self::BodyMemory { retry_after_secs } => ApiError::unavailable(
                "the gateway is holding as many request bodies as it may at once; retry shortly",
                *retry_after_secs,
            ),
            // The worker's URL stays in the logs: clients are not told internal addresses.
            Self::WorkerEjected(_) => ApiError::unavailable(
                "the worker serving this request stopped answering and was ejected; no other worker took it",
                1,
            ),
            Self::UpstreamUnavailable(m) | Self::UpstreamTimeout(m) | Self::Internal(m) => {
                let mut e = ApiError::internal(m);
                e.status = self.status();
                e
            }
        }
    }

    /// The response for this error.
    pub fn into_response(&self) -> Response<ResBody> {
        let api = self.to_api();
        let mut res = json_response(self.status(), api.to_json());
        if let Some(secs) = api.retry_after_secs {
            res.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Self::Degraded { .. } = self {
            res.headers_mut().insert(
                "x-infergate-degraded",
                HeaderValue::from_static("refuse_long_prompts"),
            );
        }
        if let Self::TooManyRequests { headers, .. } = self {
            for (name, value) in headers {
                if let Ok(v) = HeaderValue::from_str(value) {
                    res.headers_mut().insert(*name, v);
                }
            }
        }
        res
    }

    /// The rejection reason label for per-tenant metrics (`upstream`/`internal` are not
    /// rejections).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unauthorized(_) => "auth",
            Self::TooManyRequests { .. } => "rate",
            Self::BudgetExceeded { .. } => "budget",
            Self::BadRequest { .. }
            | Self::NotFound(_)
            | Self::PayloadTooLarge(_)
            | Self::BodyTimeout(_)
            | Self::Forbidden(_)
            | Self::NeverFits(_)
            | Self::MethodNotAllowed => "validation",
            Self::Draining => "draining",
            Self::BodyMemory { .. } => "body_memory",
            Self::Degraded { .. } => "degraded",
            Self::NoHealthyWorker(_)
            | Self::WorkerEjected(_)
            | Self::UpstreamUnavailable(_)
            | Self::UpstreamTimeout(_) => "upstream",
            Self::Internal(_) => "internal",
        }
    }

    /// An SSE error event followed by `[DONE]`, for failures after a stream has started.
    pub fn sse_event(&self) -> Bytes {
        Bytes::from(format!("{}data: [DONE]\n\n", self.to_api().sse_event()))
    }
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_api().message)
    }
}

impl std::error::Error for GatewayError {}

fn with_kind(
    message: &str,
    status: StatusCode,
    kind: &'static str,
    retry: Option<u64>,
) -> ApiError {
    let mut e = ApiError::bad_request(message, None);
    e.status = status;
    e.kind = kind;
    e.retry_after_secs = retry;
    e
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
}
