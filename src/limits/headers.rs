//! The OpenAI-style rate-limit headers (`x-ratelimit-*`) and their duration format.

use std::time::Duration;

/// What a tenant's limits look like at the moment of a decision; `None` where unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateHeaders {
    /// Requests per minute allowed.
    pub limit_requests: Option<u64>,
    /// Requests that would pass now.
    pub remaining_requests: Option<u64>,
    /// Time until the request budget is full again.
    pub reset_requests: Option<Duration>,
    /// Tokens per minute allowed.
    pub limit_tokens: Option<u64>,
    /// Tokens that would pass now.
    pub remaining_tokens: Option<u64>,
    /// Time until the token budget is full again.
    pub reset_tokens: Option<Duration>,
}

/// One `x-ratelimit-*` value.
enum RateValue {
    Count(u64),
    Reset(Duration),
}

impl RateHeaders {
    /// The headers OpenAI sends, in its order; unlimited dimensions are left out.
    fn each(&self, mut f: impl FnMut(&'static str, RateValue)) {
        if let Some(limit) = self.limit_requests {
            f("x-ratelimit-limit-requests", RateValue::Count(limit));
            let remaining = self.remaining_requests.unwrap_or(0);
            f(
                "x-ratelimit-remaining-requests",
                RateValue::Count(remaining),
            );
            let reset = self.reset_requests.unwrap_or_default();
            f("x-ratelimit-reset-requests", RateValue::Reset(reset));
        }
        if let Some(limit) = self.limit_tokens {
            f("x-ratelimit-limit-tokens", RateValue::Count(limit));
            let remaining = self.remaining_tokens.unwrap_or(0);
            f("x-ratelimit-remaining-tokens", RateValue::Count(remaining));
            let reset = self.reset_tokens.unwrap_or_default();
            f("x-ratelimit-reset-tokens", RateValue::Reset(reset));
        }
    }

    /// Header name/value pairs as OpenAI sends them; unlimited dimensions are left out.
    pub fn header_pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::with_capacity(6);
        self.each(|name, value| {
            pairs.push((
                name,
                match value {
                    RateValue::Count(n) => n.to_string(),
                    RateValue::Reset(d) => format_reset(d),
                },
            ));
        });
        pairs
    }

    /// The same headers set on `headers` (every answer carries them: no string formatting for
    /// the counts).
    pub fn insert_into(&self, headers: &mut hyper::HeaderMap) {
        self.each(|name, value| {
            let value = match value {
                RateValue::Count(n) => hyper::header::HeaderValue::from(n),
                RateValue::Reset(d) => {
                    match hyper::header::HeaderValue::try_from(format_reset(d)) {
                        Ok(v) => v,
                        Err(_) => return,
                    }
                }
            };
            headers.insert(hyper::header::HeaderName::from_static(name), value);
        });
    }
}

/// Formats a duration like OpenAI's reset headers (Go style): "0s", "120ms", "1s", "1.5s",
/// "6m0s", "1h2m3s". Rounded up to the millisecond, so a client waiting it is never early.
pub fn format_reset(d: Duration) -> String {
    use std::fmt::Write;
    let total_ms = d.as_nanos().div_ceil(1_000_000);
    let mut out = String::with_capacity(12);
    if total_ms == 0 {
        out.push_str("0s");
        return out;
    }
    if total_ms < 1000 {
        let _ = write!(out, "{total_ms}ms");
        return out;
    }
    let hours = total_ms / 3_600_000;
    let minutes = total_ms / 60_000 % 60;
    let seconds = total_ms / 1000 % 60;
    let millis = total_ms % 1000;
    if hours > 0 {
        let _ = write!(out, "{hours}h");
    }
    if hours > 0 || minutes > 0 {
        let _ = write!(out, "{minutes}m");
    }
    let _ = write!(out, "{seconds}");
    if millis > 0 {
        // Three digits, trailing zeros dropped: 1.5s, 12.34s, 1.005s.
        let (mut frac, mut digits) = (millis, 3);
        while frac % 10 == 0 {
            frac /= 10;
            digits -= 1;
        }
        let _ = write!(out, ".{frac:0digits$}");
    }
    out.push('s');
    out
}

/// A `Retry-After` value: whole seconds, rounded up, at least 1.
pub fn retry_after_secs(d: Duration) -> u64 {
    let nanos = d.as_nanos().div_ceil(1_000_000_000).max(1);
    u64::try_from(nanos).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_openai() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ms"),
            (Duration::from_millis(120), "120ms"),
            (Duration::from_millis(999), "999ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(12_340), "12.34s"),
            (Duration::from_millis(1_005), "1.005s"),
            (Duration::from_millis(61_050), "1m1.05s"),
            (Duration::from_secs(360), "6m0s"),
            (Duration::from_secs(3723), "1h2m3s"),
            (Duration::from_secs(3600), "1h0m0s"),
        ];
        for (d, want) in cases {
            assert_eq!(format_reset(d), want, "{d:?}");
        }
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(6)), 6);
        assert_eq!(retry_after_secs(Duration::from_nanos(8_571_428_572)), 9);
    }

    #[test]
    fn pairs_skip_unlimited_dimensions() {
        let h = RateHeaders {
            limit_tokens: Some(40_000),
            remaining_tokens: Some(39_000),
            reset_tokens: Some(Duration::from_millis(1500)),
            ..RateHeaders::default()
        };
        assert_eq!(
            h.header_pairs(),
            vec![
                ("x-ratelimit-limit-tokens", "40000".to_owned()),
                ("x-ratelimit-remaining-tokens", "39000".to_owned()),
                ("x-ratelimit-reset-tokens", "1.5s".to_owned()),
            ]
        );
        assert!(RateHeaders::default().header_pairs().is_empty());
    }
}
