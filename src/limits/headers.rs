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

impl RateHeaders {
    /// Header name/value pairs as OpenAI sends them; unlimited dimensions are left out.
    pub fn header_pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::with_capacity(6);
        if let Some(limit) = self.limit_requests {
            pairs.push(("x-ratelimit-limit-requests", limit.to_string()));
            let remaining = self.remaining_requests.unwrap_or(0);
            pairs.push(("x-ratelimit-remaining-requests", remaining.to_string()));
            let reset = self.reset_requests.unwrap_or_default();
            pairs.push(("x-ratelimit-reset-requests", format_reset(reset)));
        }
        if let Some(limit) = self.limit_tokens {
            pairs.push(("x-ratelimit-limit-tokens", limit.to_string()));
            let remaining = self.remaining_tokens.unwrap_or(0);
            pairs.push(("x-ratelimit-remaining-tokens", remaining.to_string()));
            let reset = self.reset_tokens.unwrap_or_default();
            pairs.push(("x-ratelimit-reset-tokens", format_reset(reset)));
        }
        pairs
    }
}

/// Formats a duration like OpenAI's reset headers (Go style): "0s", "120ms", "1s", "1.5s",
/// "6m0s", "1h2m3s". Rounded up to the millisecond, so a client waiting it is never early.
pub fn format_reset(d: Duration) -> String {
    let total_ms = d.as_nanos().div_ceil(1_000_000);
    if total_ms == 0 {
        return "0s".to_owned();
    }
    if total_ms < 1000 {
        return format!("{total_ms}ms");
    }
    let hours = total_ms / 3_600_000;
    let minutes = total_ms / 60_000 % 60;
    let seconds = total_ms / 1000 % 60;
    let millis = total_ms % 1000;
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&seconds.to_string());
    if millis > 0 {
        let frac = format!("{millis:03}");
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
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
