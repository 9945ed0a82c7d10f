//! Reads the real token usage out of a proxied response as it passes, for accounting and
//! rate-limit reconciliation: the `usage` object of a JSON body, or of the final SSE chunk
//! (which the gateway asks for upstream and hides from clients that did not ask for it).

use hyper::body::Bytes;
use serde_json::Value;

/// Token counts reported by the worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub prompt: u64,
    /// Completion tokens.
    pub completion: u64,
    /// Prompt tokens served from the prefix cache; `None` when the worker does not say.
    pub cached: Option<u64>,
}

/// Largest non-streamed body scanned for `usage` (bigger ones pass through unscanned).
const MAX_SCAN_BYTES: usize = 4 * 1024 * 1024;

/// Watches a response body for its usage.
#[derive(Debug, Default)]
pub struct UsageTap {
    is_stream: bool,
    hide_usage_chunk: bool,
    pending: Vec<u8>,
    /// Usage once seen.
    pub usage: Option<TokenUsage>,
    /// SSE data events with content seen so far (a fallback count when no usage arrives).
    pub content_events: u64,
}

fn usage_of(v: &Value) -> Option<TokenUsage> {
    let u = v.get("usage")?;
    if u.is_null() {
        return None;
    }
    Some(TokenUsage {
        prompt: u.get("prompt_tokens")?.as_u64()?,
        completion: u
            .get("completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        cached: u
            .get("prompt_tokens_details")
            .and_then(|d| d.get("cached_tokens"))
            .and_then(Value::as_u64),
    })
}

impl UsageTap {
    /// A tap for an SSE stream (`is_stream`) or a JSON body. With `hide_usage_chunk`, the
    /// usage-only SSE event is removed from what the client sees.
    pub fn new(is_stream: bool, hide_usage_chunk: bool) -> Self {
        Self {
            is_stream,
            hide_usage_chunk,
            ..Self::default()
        }
    }

    /// Feeds one upstream frame; returns what to send to the client now. Streams are forwarded
    /// event by event (a partial event waits for its end); JSON bodies pass through unchanged.
    pub fn feed(&mut self, data: Bytes) -> Bytes {
        if !self.is_stream {
            if self.pending.len() + data.len() <= MAX_SCAN_BYTES {
                self.pending.extend_from_slice(&data);
            }
            return data;
        }
        if !self.hide_usage_chunk && self.pending.is_empty() && data.ends_with(b"\n\n") {
            // Fast path: whole events, nothing to remove.
            self.scan_events(&data);
            return data;
        }
        self.pending.extend_from_slice(&data);
        let Some(end) = self.pending.windows(2).rposition(|w| w == b"\n\n") else {
            return Bytes::new();
        };
        let complete: Vec<u8> = self.pending.drain(..end + 2).collect();
        let mut out = Vec::with_capacity(complete.len());
        for event in complete
            .split_inclusive(|&b| b == b'\n')
            .collect::<Vec<_>>()
            .split(|l| *l == b"\n")
        {
            if event.is_empty() {
                continue;
            }
            let text: Vec<u8> = event.concat();
            let hide = self.scan_event(&text) && self.hide_usage_chunk;
            if !hide {
                out.extend_from_slice(&text);
                out.extend_from_slice(b"\n");
            }
        }
        Bytes::from(out)
    }

    /// Bytes held back at the end of the body (an unterminated last event).
    pub fn flush(&mut self) -> Bytes {
        if !self.is_stream {
            if let Ok(v) = serde_json::from_slice::<Value>(&self.pending) {
                self.usage = usage_of(&v).or(self.usage);
            }
            self.pending.clear();
            return Bytes::new();
        }
        Bytes::from(std::mem::take(&mut self.pending))
    }

    fn scan_events(&mut self, data: &[u8]) {
        for event in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            self.scan_event(event);
        }
    }

    /// Looks at one event; returns true when it is a usage-only chunk (empty `choices`).
    fn scan_event(&mut self, event: &[u8]) -> bool {
        let Some(payload) = event.split(|&b| b == b'\n').find_map(|l| {
            l.strip_prefix(b"data: ")
                .or_else(|| l.strip_prefix(b"data:"))
        }) else {
            return false;
        };
        if payload.starts_with(b"[DONE]") {
            return false;
        }
        let Ok(v) = serde_json::from_slice::<Value>(payload) else {
            return false;
        };
        let usage = usage_of(&v);
        let empty_choices = v
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(|c| c.is_empty());
        if let Some(u) = usage {
            self.usage = Some(u);
        }
        if !empty_choices {
            self.content_events += 1;
        }
        usage.is_some() && empty_choices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n";

    fn chunk(t: &str) -> String {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}}}}]}}\n\n")
    }

    #[test]
    fn json_body_usage_is_read_at_the_end() {
        let mut tap = UsageTap::new(false, false);
        let body = "{\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}";
        let (a, b) = body.split_at(10);
        assert_eq!(tap.feed(Bytes::from(a.to_string())), a.as_bytes());
        assert_eq!(tap.feed(Bytes::from(b.to_string())), b.as_bytes());
        tap.flush();
        assert_eq!(
            tap.usage,
            Some(TokenUsage {
                prompt: 5,
                completion: 2,
                cached: None
            })
        );
    }

    #[test]
    fn stream_usage_chunk_is_read_and_hidden_when_not_asked_for() {
        let mut tap = UsageTap::new(true, true);
        let mut seen = Vec::new();
        seen.extend_from_slice(&tap.feed(Bytes::from(chunk("a"))));
        // An event split across frames waits for its end.
        let c = chunk("b");
        let (x, y) = c.split_at(9);
        assert!(tap.feed(Bytes::from(x.to_string())).is_empty());
        seen.extend_from_slice(&tap.feed(Bytes::from(y.to_string())));
        seen.extend_from_slice(&tap.feed(Bytes::from(USAGE)));
        seen.extend_from_slice(&tap.feed(Bytes::from_static(b"data: [DONE]\n\n")));
        seen.extend_from_slice(&tap.flush());
        let text = String::from_utf8(seen).unwrap();
        assert_eq!(
            text,
            format!("{}{}data: [DONE]\n\n", chunk("a"), chunk("b"))
        );
        assert_eq!(
            tap.usage,
            Some(TokenUsage {
                prompt: 7,
                completion: 3,
                cached: Some(4)
            })
        );
        assert_eq!(tap.content_events, 2);
    }

    #[test]
    fn stream_usage_chunk_passes_when_the_client_asked() {
        let mut tap = UsageTap::new(true, false);
        let out = tap.feed(Bytes::from(format!("{}{USAGE}", chunk("a"))));
        assert_eq!(out, Bytes::from(format!("{}{USAGE}", chunk("a"))));
        assert_eq!(tap.usage.unwrap().completion, 3);
    }

    #[test]
    fn comments_and_unparseable_events_pass_through() {
        let mut tap = UsageTap::new(true, true);
        let input = ": keepalive\n\ndata: not json\n\n";
        assert_eq!(tap.feed(Bytes::from(input)), Bytes::from(input));
        assert_eq!(tap.usage, None);
    }
}
