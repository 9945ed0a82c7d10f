//! The one error type answered to OpenAI clients, as a JSON body or as an SSE event mid-stream.

use hyper::StatusCode;
use serde::Serialize;

/// An error answered to the client in OpenAI's shape: `{"error":{"message","type","param","code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status of the answer; also sent as the numeric `code`, as vLLM does.
    pub status: StatusCode,
    /// Human-readable explanation, sent as `message`.
    pub message: String,
    /// OpenAI error `type`, e.g. `invalid_request_error`, `not_found_error`, `server_error`.
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// Seconds the client should wait before retrying (`Retry-After`), for 503s.
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            retry_after_secs: None,
        }
    }

    /// 400: the request is malformed or asks for something unsupported; `param` names the field.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        let mut err = Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message);
        err.param = param.map(str::to_owned);
        err
    }

    /// 404: no such route or model.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    /// 503: the engine cannot take the request now; the client may retry after `retry_after_secs`.
    pub fn unavailable(message: impl Into<String>, retry_after_secs: u64) -> Self {
        let mut err = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            message,
        );
        err.retry_after_secs = Some(retry_after_secs);
        err
    }

    /// 500: something failed inside the engine.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// 413: the request body exceeds the size limit.
    pub fn payload_too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            message,
        )
    }

    /// 408: the request body did not arrive in time.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            message,
        )
    }

    /// 405: the route exists but not for this HTTP method.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "Method Not Allowed",
        )
    }

    /// The JSON response body.
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct Inner<'a> {
            message: &'a str,
            #[serde(rename = "type")]
            kind: &'a str,
            param: Option<&'a str>,
            code: u16,
        }
        #[derive(Serialize)]
        struct Outer<'a> {
            error: Inner<'a>,
        }
        let body = Outer {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.status.as_u16(),
            },
        };
        // Serializing plain strings and integers cannot fail; the fallback keeps this total.
        serde_json::to_string(&body).unwrap_or_else(|_| String::from("{\"error\":{}}"))
    }

    /// The same body as one SSE event, `data: {...}\n\n`, for errors after streaming began.
    pub fn sse_event(&self) -> String {
        super::sse::data_event(self.to_json())
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.status.as_u16(),
            self.kind,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn body(err: &ApiError) -> Value {
        serde_json::from_str(&err.to_json()).unwrap()
    }

    #[test]
    fn bad_request_shape() {
        let err = ApiError::bad_request("`temperature` must be in [0, 2]", Some("temperature"));
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        let v = body(&err);
        assert_eq!(v["error"]["message"], "`temperature` must be in [0, 2]");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "temperature");
        assert_eq!(v["error"]["code"], 400);
        assert_eq!(v.as_object().unwrap().len(), 1);
    }

    #[test]
    fn param_is_null_when_absent() {
        let v = body(&ApiError::not_found("The model `x` does not exist."));
        assert!(v["error"]["param"].is_null());
        assert_eq!(v["error"]["code"], 404);
        assert_eq!(v["error"]["type"], "not_found_error");
    }

    #[test]
    fn statuses_and_kinds() {
        let un = ApiError::unavailable("queue full", 2);
        assert_eq!(un.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(un.retry_after_secs, Some(2));
        assert_eq!(body(&un)["error"]["code"], 503);
        assert_eq!(
            ApiError::internal("boom").status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            body(&ApiError::internal("boom"))["error"]["type"],
            "server_error"
        );
        assert_eq!(
            ApiError::payload_too_large("big").status,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(
            ApiError::method_not_allowed().status,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[test]
    fn escapes_message() {
        let err = ApiError::bad_request("bad \"quote\"\nline", None);
        assert_eq!(body(&err)["error"]["message"], "bad \"quote\"\nline");
    }

    #[test]
    fn sse_event_wraps_json() {
        let err = ApiError::internal("engine died");
        let ev = err.sse_event();
        assert!(ev.starts_with("data: {"));
        assert!(ev.ends_with("}\n\n"));
        let v: Value = serde_json::from_str(ev.trim_start_matches("data: ").trim_end()).unwrap();
        assert_eq!(v["error"]["message"], "engine died");
    }
}
