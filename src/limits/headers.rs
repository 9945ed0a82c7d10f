//! The OpenAI-style rate-limit headers (`x-ratelimit-*`) and their duration format.

use std::time::Duration;

use hyper::body::Bytes;
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

    /// The same headers set on `headers` (every answer carries them: prebuilt names, and the
    /// values written into one buffer that each value is a slice of, so the six cost one
    /// allocation, not one or two apiece).
    pub fn insert_into(&self, headers: &mut hyper::HeaderMap) {
        if self.limit_requests.is_none() && self.limit_tokens.is_none() {
            return;
        }
        // Room for all six at once: one growth of the answer's map, not one per header.
        headers.reserve(6);
        let mut text = Vec::with_capacity(96);
        let mut digits = itoa::Buffer::new();
        // Each value's header and where its text ends.
        let mut ends = [(0, 0); NAMES.len()];
        let mut count = 0;
        self.each(|i, value| {
            match value {
                RateValue::Count(n) => text.extend_from_slice(digits.format(n).as_bytes()),
                RateValue::Reset(d) => write_reset(&mut text, d),
            }
            ends[count] = (i, text.len());
            count += 1;
        });
        let text = Bytes::from(text);
        let mut start = 0;
        for &(i, end) in &ends[..count] {
            // Digits and the reset format are visible ASCII: the check always passes.
            if let Ok(value) = HeaderValue::from_maybe_shared(text.slice(start..end)) {
                headers.insert(HEADER_NAMES[i].clone(), value);
            }
            start = end;
        }
    }
}

/// Formats a duration like OpenAI's reset headers (Go style): "0s", "120ms", "1s", "1.5s",
/// "6m0s", "1h2m3s". Rounded up to the millisecond, so a client waiting it is never early.
pub fn format_reset(d: Duration) -> String {
    let mut out = Vec::with_capacity(16);
    write_reset(&mut out, d);
    // Only ASCII digits and unit letters were written.
    String::from_utf8(out).unwrap_or_default()
}

/// [`format_reset`] appended to `out`.
fn write_reset(out: &mut Vec<u8>, d: Duration) {
    // Digits by itoa: `write!` goes through core::fmt's machinery for each number.
    let total_ms = d.as_nanos().div_ceil(1_000_000);
    let mut digits = itoa::Buffer::new();
    if total_ms == 0 {
        out.extend_from_slice(b"0s");
        return;
    }
    if total_ms < 1000 {
        out.extend_from_slice(digits.format(total_ms).as_bytes());
        out.extend_from_slice(b"ms");
        return;
    }
    let hours = total_ms / 3_600_000;
    let minutes = total_ms / 60_000 % 60;
    let seconds = total_ms / 1000 % 60;
    let millis = total_ms % 1000;
    if hours > 0 {
        out.extend_from_slice(digits.format(hours).as_bytes());
        out.push(b'h');
    }
    if hours > 0 || minutes > 0 {
        out.extend_from_slice(digits.format(minutes).as_bytes());
        out.push(b'm');
    }
    out.extend_from_slice(digits.format(seconds).as_bytes());
    if millis > 0 {
        // Three decimals, trailing zeros dropped.
        out.push(b'.');
        let mut frac = millis;
        let mut width = 3;
        while frac.is_multiple_of(10) {
            frac /= 10;
            width -= 1;
        }
        let text = digits.format(frac);
        for _ in text.len()..width {
            out.push(b'0');
        }
        out.extend_from_slice(text.as_bytes());
    }
    out.push(b's');
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
    fn headers_set_on_an_answer_match_the_pairs() {
        let h = RateHeaders {
            limit_requests: Some(600),
            remaining_requests: Some(599),
            reset_requests: Some(Duration::from_millis(100)),
            limit_tokens: Some(1_000_000),
            remaining_tokens: Some(12),
            reset_tokens: Some(Duration::from_secs(3723)),
        };
        let mut map = hyper::HeaderMap::new();
        h.insert_into(&mut map);
        let set: Vec<(&str, String)> = map
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap().to_owned()))
            .collect();
        let mut want = h.header_pairs();
        want.sort();
        let mut got = set;
        got.sort();
        assert_eq!(got, want);
        assert_eq!(map["x-ratelimit-reset-tokens"], "1h2m3s");
        assert_eq!(map["x-ratelimit-remaining-tokens"], "12");
        assert_eq!(map["x-ratelimit-reset-requests"], "100ms");
        let mut none = hyper::HeaderMap::new();
        RateHeaders::default().insert_into(&mut none);
        assert!(none.is_empty());
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
