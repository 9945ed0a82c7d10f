//! The OpenAI-style rate-limit headers (`x-ratelimit-*`) and their duration format.

use std::time::Duration;

use hyper::header::{HeaderName, HeaderValue};

/// The `x-ratelimit-*` names, in OpenAI's order.
const NAMES: [&str; 6] = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
];

/// [`NAMES`] as header names, built at compile time.
static HEADER_NAMES: [HeaderName; 6] = [
    HeaderName::from_static(NAMES[0]),
    HeaderName::from_static(NAMES[1]),
    HeaderName::from_static(NAMES[2]),
    HeaderName::from_static(NAMES[3]),
    HeaderName::from_static(NAMES[4]),
    HeaderName::from_static(NAMES[5]),
];

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
    /// The headers OpenAI sends, in its order, as indexes into [`NAMES`]; unlimited dimensions
    /// are left out.
    fn each(&self, mut f: impl FnMut(usize, RateValue)) {
        if let Some(limit) = self.limit_requests {
            f(0, RateValue::Count(limit));
            f(1, RateValue::Count(self.remaining_requests.unwrap_or(0)));
            f(2, RateValue::Reset(self.reset_requests.unwrap_or_default()));
        }
        if let Some(limit) = self.limit_tokens {
            f(3, RateValue::Count(limit));
            f(4, RateValue::Count(self.remaining_tokens.unwrap_or(0)));
            f(5, RateValue::Reset(self.reset_tokens.unwrap_or_default()));
        }
    }

    /// Header name/value pairs as OpenAI sends them; unlimited dimensions are left out.
    pub fn header_pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::with_capacity(6);
        self.each(|i, value| {
            pairs.push((
                NAMES[i],
                match value {
                    RateValue::Count(n) => n.to_string(),
                    RateValue::Reset(d) => format_reset(d),
                },
            ));
        });
        pairs
    }

    /// The same headers set on `headers` (every answer carries them: prebuilt names, no string
    /// formatting for the counts; the caller makes room).
    pub fn insert_into(&self, headers: &mut hyper::HeaderMap) {
        // Room for all six at once: one growth of the answer's map, not one per header.
        if self.limit_requests.is_some() || self.limit_tokens.is_some() {
            headers.reserve(6);
        }
        self.each(|i, value| {
            let value = match value {
                RateValue::Count(n) => HeaderValue::from(n),
                RateValue::Reset(d) => match HeaderValue::try_from(format_reset(d)) {
                    Ok(v) => v,
                    Err(_) => return,
                },
            };
            headers.insert(HEADER_NAMES[i].clone(), value);
        });
    }
}

/// Formats a duration like OpenAI's reset headers (Go style): "0s", "120ms", "1s", "1.5s",
/// "6m0s", "1h2m3s". Rounded up to the millisecond, so a client waiting it is never early.
pub fn format_reset(d: Duration) -> String {
    // Digits by itoa: `write!` goes through core::fmt's machinery for each number.
    let total_ms = d.as_nanos().div_ceil(1_000_000);
    let mut out = String::with_capacity(16);
    let mut digits = itoa::Buffer::new();
    if total_ms == 0 {
        out.push_str("0s");
        return out;
    }
    if total_ms < 1000 {
        out.push_str(digits.format(total_ms));
        out.push_str("ms");
        return out;
    }
    let hours = total_ms / 3_600_000;
    let minutes = total_ms / 60_000 % 60;
    let seconds = total_ms / 1000 % 60;
    let millis = total_ms % 1000;
    if hours > 0 {
        out.push_str(digits.format(hours));
        out.push('h');
    }
    if hours > 0 || minutes > 0 {
        out.push_str(digits.format(minutes));
        out.push('m');
    }
    out.push_str(digits.format(seconds));
    if millis > 0 {
        // Three decimals, trailing zeros dropped.
        out.push('.');
        let mut frac = millis;
        let mut width = 3;
        while frac.is_multiple_of(10) {
            frac /= 10;
            width -= 1;
        }
        let text = digits.format(frac);
        for _ in text.len()..width {
            out.push('0');
        }
        out.push_str(text);
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
