//! Parsers for the scalar values the YAML schema keeps as strings: durations (`250ms`, `2s`,
//! `10m`, `1h`), socket addresses and worker URLs. Each returns a message fit for a config error.

use std::net::SocketAddr;
use std::time::Duration;

/// Durations in config files (see [`crate::duration::parse`]).
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    crate::duration::parse(text)
}

/// Parses `IP:port` (IPv6 as `[::1]:8080`).
pub(super) fn parse_socket_addr(text: &str) -> Result<SocketAddr, String> {
    text.trim().parse().map_err(|_| {
        format!("`{text}` is not a socket address: write IP:port, e.g. 127.0.0.1:8080 or [::]:8080")
    })
}

/// Checks an `http`/`https` base URL with a host, and returns it without trailing slash.
pub(super) fn parse_worker_url(text: &str) -> Result<String, String> {
    let uri: hyper::Uri = text
        .trim()
        .parse()
        .map_err(|e| format!("`{text}` is not a URL ({e}): write e.g. http://10.0.0.5:8000"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => {
            return Err(format!(
                "`{text}`: scheme must be http or https, not `{other}`"
            ));
        }
        None => return Err(format!("`{text}` has no scheme: write e.g. http://{text}")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{text}` has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("`{text}`: a worker URL takes no query string"));
    }
    Ok(text.trim().trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn junk_durations_say_why() {
        for bad in ["", "ms", "10", "3d", "-1s", "s10", "1 h"] {
            let err = parse_duration(bad).expect_err(bad);
            assert!(err.contains("e.g. 250ms"), "{bad}: {err}");
        }
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(
            parse_duration("10")
                .expect_err("no unit")
                .contains("no unit")
        );
    }

    #[test]
    fn socket_addresses() {
        assert!(parse_socket_addr("127.0.0.1:8080").is_ok());
        assert!(parse_socket_addr("[::1]:80").is_ok());
        assert!(parse_socket_addr("localhost:8080").is_err());
        assert!(parse_socket_addr("127.0.0.1").is_err());
    }

    #[test]
    fn worker_urls() {
        assert_eq!(
            parse_worker_url("http://10.0.0.5:8000/"),
            Ok("http://10.0.0.5:8000".into())
        );
        assert_eq!(
            parse_worker_url("https://w.example/api"),
            Ok("https://w.example/api".into())
        );
        for bad in [
            "10.0.0.5:8000",
            "ftp://x",
            "http://x/?a=1",
            "http//x",
            "not a url",
        ] {
            assert!(parse_worker_url(bad).is_err(), "{bad}");
        }
    }
}
