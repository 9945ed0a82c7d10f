//! Accept, past the edge layers (which set the request id, drop malformed trace context and bound
//! the body): requests no well-behaved client sends are refused before any work. (The arrival
//! time is taken in [`super::ctx::accept`].)

use hyper::Request;

use crate::error::GatewayError;

/// Requests no well-behaved client sends, refused before any work: HTTP/1.1 without `Host`
/// (RFC 9112 §3.2) and more than one `Authorization` header (which one would count?).
pub(super) fn hygiene<B>(req: &Request<B>) -> Result<(), GatewayError> {
    if req.version() == hyper::Version::HTTP_11 && !req.headers().contains_key(hyper::header::HOST)
    {
        return Err(GatewayError::bad_request(
            "an HTTP/1.1 request must carry a Host header",
            None,
        ));
    }
    if req
        .headers()
        .get_all(hyper::header::AUTHORIZATION)
        .iter()
        .nth(1)
        .is_some()
    {
        return Err(GatewayError::bad_request(
            "more than one Authorization header",
            None,
        ));
    }
    Ok(())
}
