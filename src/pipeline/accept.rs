//! Accept: requests no well-behaved client sends are refused before any work, and a client's
//! `traceparent` is forwarded only when it is well-formed. (The request id and arrival time are
//! taken in [`super::ctx::accept`].)

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

/// Whether a `traceparent` is well-formed W3C Trace Context (`00-<32 hex>-<16 hex>-<2 hex>`,
/// ids not all zero; a later version may append fields). A malformed one is not forwarded.
pub(super) fn valid_traceparent(v: &[u8]) -> bool {
    let hex = |b: &[u8]| !b.is_empty() && b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let nonzero = |b: &[u8]| b.iter().any(|&c| c != b'0');
    if v.len() < 55 || (v.len() > 55 && (v[..2] == *b"00" || v[55] != b'-')) {
        return false;
    }
    let (version, trace, parent, flags) = (&v[0..2], &v[3..35], &v[36..52], &v[53..55]);
    v[2] == b'-'
        && v[35] == b'-'
        && v[52] == b'-'
        && hex(version)
        && version != b"ff"
        && hex(trace)
        && nonzero(trace)
        && hex(parent)
        && nonzero(parent)
        && hex(flags)
}

#[cfg(test)]
mod tests {
    use super::valid_traceparent;

    #[test]
    fn traceparent_is_checked_against_the_w3c_format() {
        let ok = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(valid_traceparent(ok));
        // A later version may append fields after a dash.
        assert!(valid_traceparent(
            b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
        ));
        for bad in [
            &b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"[..],
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            b"junk",
            &[b'a'; 8192][..],
        ] {
            assert!(
                !valid_traceparent(bad),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
