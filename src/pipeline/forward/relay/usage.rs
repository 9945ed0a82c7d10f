//! Reads the real token usage out of a proxied response as it passes, for accounting and
//! rate-limit reconciliation: the `usage` object of a JSON body, or of the final SSE chunk
//! (which the gateway asks for upstream and hides from clients that did not ask for it).

use hyper::body::Bytes;
use infergate_engine::openai::sse;
use serde::de::IgnoredAny;

use super::json_members;
use crate::trace::{Flight, record};
use crate::usage_check::TokenUsage;

/// Largest non-streamed body scanned for `usage` (bigger ones pass through unscanned).
const MAX_SCAN_BYTES: usize = 4 * 1024 * 1024;
/// Longest unterminated SSE event held back; past it the bytes pass through unscanned, so a
/// worker that never ends an event cannot make the gateway buffer without bound.
const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// Watches a response body for its usage.
#[derive(Debug, Default)]
pub struct UsageTap {
    is_stream: bool,
    hide_usage_chunk: bool,
    /// A JSON body's first frame, kept by reference (most bodies are one frame: no copy).
    first: Option<Bytes>,
    pending: Vec<u8>,
    /// The JSON body outgrew [`MAX_SCAN_BYTES`]: it passes through unscanned.
    too_big: bool,
    /// The last stream byte seen was a `\r` (already turned into `\n`): a `\n` right after it
    /// is the same line end.
    after_cr: bool,
    /// Usage once seen.
    pub usage: Option<TokenUsage>,
    /// SSE data events with content seen so far (a fallback count when no usage arrives).
    pub content_events: u64,
    /// The stream carried an error event: it, and anything after it, is no content.
    pub saw_error: bool,
    /// The stream carried `data: [DONE]`.
    pub saw_done: bool,
    /// Remove the engine's flight-record comment from what the client sees.
    hide_flight: bool,
    /// The engine's flight record: from the `x-infergate-flight` header of a whole answer, or
    /// the first `: flight {json}` comment of a stream (later ones are ignored).
    pub flight: Flight,
    /// The answer's text, collected when the request is in the quality sample.
    pub capture: Option<Box<crate::quality::capture::Capture>>,
}

/// What a body or SSE payload says about usage: `usage` of chat, completions and embeddings
/// (`prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens`), or of the
/// Responses API (`input_tokens`, `output_tokens`, `input_tokens_details.cached_tokens`), at the
/// top level (a body) or inside `response` (its `response.completed` event); and whether its
/// `choices` are empty (a usage-only chunk).
struct Payload {
    usage: Option<TokenUsage>,
    empty_choices: bool,
}

impl Payload {
    /// Reads `text`: only the members named above are parsed, the rest (the completion text) is
    /// skipped by [`json_members::find`]. `None` when `text` is not an object of that shape.
    fn read(text: &[u8]) -> Option<Self> {
        let [usage, response, choices] =
            json_members::find(text, ["usage", "response", "choices"])?;
        let mut usage = parse_usage(usage)?;
        if let Some(response) = response.filter(|r| *r != b"null") {
            let [inner] = json_members::find(response, ["usage"])?;
            let inner = parse_usage(inner)?;
            usage = usage.or(inner);
        }
        let empty_choices = match choices {
            None | Some(b"null") => false,
            Some(c) => c
                .strip_prefix(b"[")
                .and_then(|c| c.strip_suffix(b"]"))?
                .trim_ascii()
                .is_empty(),
        };
        Some(Payload {
            usage,
            empty_choices,
        })
    }
}

/// The token counts in a raw `usage` value (absent or `null`: none); `None` when it is not a
/// usage object (a count that is not a whole number, a key given twice).
fn parse_usage(raw: Option<&[u8]>) -> Option<Option<TokenUsage>> {
    let Some(raw) = raw.filter(|r| *r != b"null") else {
        return Some(None);
    };
    let [
        prompt,
        completion,
        prompt_details,
        input,
        output,
        input_details,
    ] = json_members::find(
        raw,
        [
            "prompt_tokens",
            "completion_tokens",
            "prompt_tokens_details",
            "input_tokens",
            "output_tokens",
            "input_tokens_details",
        ],
    )?;
    let (prompt, completion, details) = match count(prompt)? {
        Some(p) => (p, count(completion)?, prompt_details),
        None => match count(input)? {
            Some(p) => (p, count(output)?, input_details),
            None => return Some(None),
        },
    };
    let cached = match details.filter(|d| *d != b"null") {
        None => None,
        Some(d) => count(json_members::find(d, ["cached_tokens"])?[0])?,
    };
    Some(Some(TokenUsage {
        prompt,
        completion: completion.unwrap_or(0),
        cached,
    }))
}

/// A token count: absent or `null` is none; `None` when it is not a JSON whole number that fits.
fn count(raw: Option<&[u8]>) -> Option<Option<u64>> {
    match raw {
        None | Some(b"null") => Some(None),
        // JSON has no `+` and no leading zeros, which `parse` would take.
        Some(&[d @ b'0'..=b'9']) => Some(Some(u64::from(d - b'0'))),
        Some(digits @ [b'1'..=b'9', ..]) => {
            std::str::from_utf8(digits).ok()?.parse().ok().map(Some)
        }
        Some(_) => None,
    }
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

    /// Reads the flight record of a whole answer from its header value; with `hide`, flight
    /// comments of a stream are removed from what the client sees.
    pub fn with_flight(mut self, header: Option<&[u8]>, hide: bool) -> Self {
        if let Some(raw) = header {
            self.flight = record::parse(raw);
        }
        self.hide_flight = hide;
        self
    }

    /// Collects the answer's text for the quality signals (a sampled request).
    pub fn with_capture(mut self, capture: bool) -> Self {
        self.capture = capture.then(Box::default);
        self
    }

    /// Feeds one upstream frame; returns what to send to the client now. Streams are forwarded
    /// event by event (a partial event waits for its end); JSON bodies pass through unchanged.
    pub fn feed(&mut self, data: Bytes) -> Bytes {
        if !self.is_stream {
            if self.too_big {
                return data;
            }
            let held = self.first.as_ref().map_or(self.pending.len(), Bytes::len);
            if held + data.len() > MAX_SCAN_BYTES {
                self.too_big = true;
                self.first = None;
                self.pending = Vec::new();
            } else if held == 0 {
                self.first = Some(data.clone());
            } else {
                if let Some(first) = self.first.take() {
                    self.pending.extend_from_slice(&first);
                }
                self.pending.extend_from_slice(&data);
            }
            return data;
        }
        // SSE lines may end in `\r\n` or `\r` as well as `\n`: clients see `\n` either way.
        let data = if self.after_cr || data.contains(&b'\r') {
            self.normalize_line_ends(&data)
        } else {
            data
        };
        // A flight comment to remove takes the slow path too.
        let removes = self.hide_usage_chunk || (self.hide_flight && has_flight_comment(&data));
        if !removes && self.pending.is_empty() && data.ends_with(b"\n\n") {
            // Fast path: whole events, nothing to remove.
            self.scan_events(&data);
            return data;
        }
        self.pending.extend_from_slice(&data);
        let Some(end) = self.pending.windows(2).rposition(|w| w == b"\n\n") else {
            if self.pending.len() > MAX_EVENT_BYTES {
                return Bytes::from(std::mem::take(&mut self.pending));
            }
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
            let hide = self.scan_event(&text);
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
            let body = match self.first.take() {
                _ if self.too_big => Bytes::new(),
                Some(first) => first,
                None => Bytes::from(std::mem::take(&mut self.pending)),
            };
            if let Some(p) = Payload::read(&body) {
                self.usage = p.usage.or(self.usage);
            }
            match self.capture.as_deref_mut() {
                // An answer too big to scan is not scored (it would read as empty).
                Some(_) if self.too_big => self.capture = None,
                Some(c) => c.json_body(&body),
                None => {}
            }
            return Bytes::new();
        }
        Bytes::from(std::mem::take(&mut self.pending))
    }

    /// `data` with every `\r\n` and lone `\r` turned into `\n`, across frame boundaries.
    fn normalize_line_ends(&mut self, data: &[u8]) -> Bytes {
        let mut out = Vec::with_capacity(data.len());
        for &b in data {
            match b {
                b'\n' if self.after_cr => {}
                b'\r' => out.push(b'\n'),
                other => out.push(other),
            }
            self.after_cr = b == b'\r';
        }
        Bytes::from(out)
    }

    /// Scans whole events (separated by a blank line), as the slow path does.
    fn scan_events(&mut self, data: &[u8]) {
        let mut rest = data;
        while let Some(end) = rest.windows(2).position(|w| w == b"\n\n") {
            let event = &rest[..end + 1];
            rest = &rest[end + 2..];
            if !event.iter().all(|&b| b == b'\n') {
                self.scan_event(event);
            }
        }
    }

    /// Looks at one event; returns true when it is to be hidden: a usage-only chunk (empty
    /// `choices`) with `hide_usage_chunk`, a flight comment with `hide_flight`.
    /// Several `data:` lines make one payload, joined with `\n` (the SSE rule).
    fn scan_event(&mut self, event: &[u8]) -> bool {
        if let Some(rest) = event.strip_prefix(FLIGHT_PREFIX) {
            // The engine sends the record as an event of one comment line; an event with more
            // in it is read as any other (its comment lines ignored).
            let (raw, after) = match rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, &rest[rest.len()..]),
            };
            if after.iter().all(|&b| b == b'\n') {
                if self.flight == Flight::Absent {
                    self.flight = record::parse(raw);
                }
                return self.hide_flight;
            }
        }
        let mut lines = event.split(|&b| b == b'\n').filter_map(sse::data_field);
        let Some(first) = lines.next() else {
            return false;
        };
        let joined;
        let payload: &[u8] = match lines.next() {
            None => first,
            Some(second) => {
                let mut all = first.to_vec();
                for l in std::iter::once(second).chain(lines) {
                    all.push(b'\n');
                    all.extend_from_slice(l);
                }
                joined = all;
                &joined
            }
        };
        if self.saw_error {
            return false;
        }
        if sse::is_done(payload) {
            self.saw_done = true;
            return false;
        }
        if super::stream_end::is_error_payload(payload) {
            self.saw_error = true;
            return false;
        }
        if let Some(c) = self.capture.as_deref_mut() {
            c.sse_payload(payload);
        }
        let Some(p) = Payload::read(payload) else {
            // JSON of another shape (not an object, or a usage of odd types) still carries
            // content; only what is not JSON at all is skipped.
            if serde_json::from_slice::<IgnoredAny>(payload).is_ok() {
                self.content_events += 1;
            }
            return false;
        };
        let Payload {
            usage,
            empty_choices,
        } = p;
        if let Some(u) = usage {
            self.usage = Some(u);
        }
        if !empty_choices {
            self.content_events += 1;
        }
        usage.is_some() && empty_choices && self.hide_usage_chunk
    }
}

/// Start of the engine's flight-record comment line (`infergate_engine::flight::SSE_PREFIX`).
const FLIGHT_PREFIX: &[u8] = infergate_engine::flight::SSE_PREFIX.as_bytes();

/// True when `data` (whole events) holds an event that starts with a flight comment.
fn has_flight_comment(data: &[u8]) -> bool {
    data.starts_with(FLIGHT_PREFIX)
        || data
            .windows(FLIGHT_PREFIX.len() + 2)
            .any(|w| w.starts_with(b"\n\n") && w.ends_with(FLIGHT_PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_and_embeddings_usage_is_read() {
        let body = br#"{"object":"list","data":[],"usage":{"prompt_tokens":9,"total_tokens":9}}"#;
        let mut tap = UsageTap::new(false, false);
        tap.feed(Bytes::from_static(body));
        tap.flush();
        let want = TokenUsage {
            prompt: 9,
            completion: 0,
            cached: None,
        };
        assert_eq!(tap.usage, Some(want));
        let body = br#"{"object":"response","usage":{"input_tokens":12,"output_tokens":5,"input_tokens_details":{"cached_tokens":8}}}"#;
        let mut tap = UsageTap::new(false, false);
        tap.feed(Bytes::from_static(body));
        tap.flush();
        let want = TokenUsage {
            prompt: 12,
            completion: 5,
            cached: Some(8),
        };
        assert_eq!(tap.usage, Some(want));
        // Streamed: the usage is in the `response.completed` event, which stays visible.
        let events = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n\
                      event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n";
        let mut tap = UsageTap::new(true, true);
        let out = tap.feed(Bytes::from(events));
        assert_eq!(out, Bytes::from(events));
        let want = TokenUsage {
            prompt: 3,
            completion: 1,
            cached: None,
        };
        assert_eq!(tap.usage, Some(want));
    }

    #[test]
    fn a_sampled_answer_is_captured_streamed_or_whole() {
        let events = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi \"}}]}\n\n\
                      data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"there\"},\"finish_reason\":\"stop\"}]}\n\n\
                      data: [DONE]\n\n";
        let mut tap = UsageTap::new(true, false).with_capture(true);
        let (a, b) = events.split_at(30);
        let _ = tap.feed(Bytes::from(a.to_string()));
        let _ = tap.feed(Bytes::from(b.to_string()));
        let c = tap.capture.as_deref().expect("captured");
        assert_eq!(
            (c.answer().text, c.finish_reason()),
            ("Hi there", Some("stop"))
        );
        let body =
            br#"{"choices":[{"index":0,"message":{"content":"whole"},"finish_reason":"length"}]}"#;
        let mut tap = UsageTap::new(false, false).with_capture(true);
        tap.feed(Bytes::from_static(body));
        tap.flush();
        let c = tap.capture.as_deref().expect("captured");
        assert_eq!(
            (c.answer().text, c.finish_reason()),
            ("whole", Some("length"))
        );
        let mut off = UsageTap::new(false, false);
        off.feed(Bytes::from_static(body));
        off.flush();
        assert!(off.capture.is_none(), "not sampled: nothing kept");
    }

    #[test]
    fn an_event_of_several_data_lines_is_one_payload_on_both_paths() {
        let event = "data: {\"choices\":[],\n\
                     data: \"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n\
                     data: [DONE]\n\n";
        // Fast path: whole events in one frame.
        let mut fast = UsageTap::new(true, false);
        let _ = fast.feed(Bytes::from(event));
        // Slow path: split mid-event.
        let mut slow = UsageTap::new(true, false);
        let (a, b) = event.split_at(20);
        let _ = slow.feed(Bytes::from(a.to_string()));
        let _ = slow.feed(Bytes::from(b.to_string()));
        for tap in [&fast, &slow] {
            assert_eq!(tap.usage.map(|u| (u.prompt, u.completion)), Some((5, 2)));
            assert_eq!(tap.content_events, 0, "a usage-only event is not content");
        }
    }

    const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n";

    fn chunk(t: &str) -> String {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}}}}]}}\n\n")
    }

    #[test]
    fn a_json_body_over_the_scan_limit_passes_unscanned() {
        let head = "{\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2},\"pad\":\"";
        let pad = "a".repeat(MAX_SCAN_BYTES);
        let whole = format!("{head}{pad}\"}}");
        // In one frame, and cut in three (the limit passed at the second).
        for cuts in [vec![], vec![head.len(), MAX_SCAN_BYTES]] {
            let mut tap = UsageTap::new(false, false);
            let mut out = Vec::new();
            let mut at = 0;
            for end in cuts.into_iter().chain([whole.len()]) {
                out.extend_from_slice(&tap.feed(Bytes::from(whole[at..end].to_string())));
                at = end;
            }
            assert!(tap.flush().is_empty());
            assert_eq!(out, whole.as_bytes());
            assert_eq!(tap.usage, None);
        }
    }

    /// The usage the tap reads from a whole answer.
    fn usage_of(body: &str) -> Option<TokenUsage> {
        let mut tap = UsageTap::new(false, false);
        tap.feed(Bytes::from(body.to_string()));
        tap.flush();
        tap.usage
    }

    fn tokens(prompt: u64, completion: u64, cached: Option<u64>) -> Option<TokenUsage> {
        Some(TokenUsage {
            prompt,
            completion,
            cached,
        })
    }

    #[test]
    fn a_whole_answer_reads_only_its_top_level_usage_whatever_follows_or_hides_it() {
        // vLLM puts members after `usage`; OpenAI puts `system_fingerprint` there.
        let vllm = r#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}},"prompt_logprobs":null,"kv_transfer_params":{"a":["}",{"b":"\"}"}]}}"#;
        assert_eq!(usage_of(vllm), tokens(7, 2, Some(4)));
        assert_eq!(
            usage_of("{\"usage\" :\n {\"prompt_tokens\":1,\"completion_tokens\":1}}\n"),
            tokens(1, 1, None)
        );
        // The last `"usage":` is nested: the top-level one is still the one read.
        let nested_last = r#"{"usage":{"prompt_tokens":3,"completion_tokens":1},"extra":{"usage":{"prompt_tokens":99}}}"#;
        assert_eq!(usage_of(nested_last), tokens(3, 1, None));
        // Only a nested one: no usage.
        assert_eq!(
            usage_of(r#"{"choices":[{"usage":{"prompt_tokens":99,"completion_tokens":1}}]}"#),
            None
        );
        // Quoted inside the completion text, it is text.
        let quoted =
            r#"{"choices":[{"message":{"content":"\"usage\": {\"prompt_tokens\": 99}}"}}]}"#;
        assert_eq!(usage_of(quoted), None);
        let quoted_after = r#"{"usage":{"prompt_tokens":2,"completion_tokens":2},"note":"\"usage\":{\"prompt_tokens\":99}}"}"#;
        assert_eq!(usage_of(quoted_after), tokens(2, 2, None));
        // `null` usage, and the Responses API's event shape.
        assert_eq!(usage_of(r#"{"choices":[],"usage":null}"#), None);
        assert_eq!(
            usage_of(r#"{"response":{"usage":{"input_tokens":6,"output_tokens":3}}}"#),
            tokens(6, 3, None)
        );
        // Not JSON after all: nothing is made up.
        assert_eq!(
            usage_of(r#"{"usage":{"prompt_tokens":2,"completion_tokens":2}"#),
            None
        );
        // A truncated body whose nested `usage` ends it, and a `usage` given twice: not billed.
        assert_eq!(
            usage_of(r#"{"a":{"usage":{"prompt_tokens":2,"completion_tokens":2}}"#),
            None
        );
        assert_eq!(
            usage_of(r#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}"#),
            None
        );
    }

    #[test]
    fn counts_must_be_json_whole_numbers() {
        let with = |p: &str| {
            usage_of(&format!(
                r#"{{"usage":{{"prompt_tokens":{p},"completion_tokens":2}}}}"#
            ))
        };
        assert_eq!(with("0"), tokens(0, 2, None));
        assert_eq!(with("18446744073709551615"), tokens(u64::MAX, 2, None));
        for bad in [
            "3.0",
            "1e3",
            "-1",
            "+3",
            "03",
            "\"3\"",
            "18446744073709551616",
            "true",
            "[]",
        ] {
            assert_eq!(with(bad), None, "{bad}");
        }
        // `null` counts are absent: the Responses names are read instead, or nothing.
        assert_eq!(with("null"), None);
        assert_eq!(
            usage_of(
                r#"{"usage":{"prompt_tokens":null,"input_tokens":4,"output_tokens":null,"input_tokens_details":{"cached_tokens":2}}}"#
            ),
            tokens(4, 0, Some(2))
        );
        assert_eq!(
            usage_of(r#"{"usage":{"prompt_tokens":4,"prompt_tokens_details":null}}"#),
            tokens(4, 0, None)
        );
        assert_eq!(
            usage_of(
                r#"{"usage":{"prompt_tokens":4,"prompt_tokens_details":{"cached_tokens":1.5}}}"#
            ),
            None
        );
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

    const FLIGHT: &str = ": flight {\"v\":1,\"steps\":{\"graph\":2,\"eager\":1},\"batch\":{\"min\":1,\"max\":2,\"mean\":1.5}}\n\n";

    #[test]
    fn a_flight_comment_is_read_and_hidden_unless_debugging() {
        let input = format!("{}{FLIGHT}data: [DONE]\n\n", chunk("a"));
        let mut tap = UsageTap::new(true, false).with_flight(None, true);
        let out = tap.feed(Bytes::from(input.clone()));
        assert_eq!(out, Bytes::from(format!("{}data: [DONE]\n\n", chunk("a"))));
        assert_eq!(tap.flight.label(), "ok");
        assert_eq!(tap.flight.record().unwrap().steps.graph, 2);
        assert_eq!(tap.content_events, 1);
        assert!(tap.saw_done);
        // Debug headers on: the comment goes through, and is still read.
        let mut tap = UsageTap::new(true, false).with_flight(None, false);
        assert_eq!(
            tap.feed(Bytes::from(input.clone())),
            Bytes::from(input.clone())
        );
        assert_eq!(tap.flight.label(), "ok");
        // Split anywhere, byte by byte: the same.
        let mut tap = UsageTap::new(true, true).with_flight(None, true);
        let mut out = Vec::new();
        for b in input.bytes() {
            out.extend_from_slice(&tap.feed(Bytes::from(vec![b])));
        }
        out.extend_from_slice(&tap.flush());
        assert_eq!(out, format!("{}data: [DONE]\n\n", chunk("a")).into_bytes());
        assert_eq!(tap.flight.label(), "ok");
    }

    #[test]
    fn a_broken_flight_record_is_ignored_and_a_mixed_event_is_not_one() {
        let mut tap = UsageTap::new(true, false).with_flight(None, true);
        let out = tap.feed(Bytes::from(": flight {oops\n\ndata: [DONE]\n\n"));
        assert_eq!(out, Bytes::from("data: [DONE]\n\n"));
        assert_eq!(tap.flight.label(), "invalid");
        // A comment line followed by data in one event is an ordinary event: it passes.
        let mixed = format!(": flight {{\"v\":1}}\n{}", chunk("b"));
        let mut tap = UsageTap::new(true, false).with_flight(None, true);
        assert_eq!(tap.feed(Bytes::from(mixed.clone())), Bytes::from(mixed));
        assert_eq!(tap.flight.label(), "absent");
        assert_eq!(tap.content_events, 1);
        // A whole answer's record comes from its header.
        let tap = UsageTap::new(false, false).with_flight(Some(b"{\"v\":1}"), true);
        assert_eq!(tap.flight.label(), "ok");
        let tap = UsageTap::new(false, false).with_flight(Some(b"[]"), true);
        assert_eq!(tap.flight.label(), "invalid");
    }

    #[test]
    fn comments_and_unparseable_events_pass_through() {
        let mut tap = UsageTap::new(true, true);
        let input = ": keepalive\n\ndata: not json\n\n";
        assert_eq!(tap.feed(Bytes::from(input)), Bytes::from(input));
        assert_eq!(tap.usage, None);
    }

    use std::ops::Range;

    use proptest::prelude::*;
    use proptest::sample::Index;
    use proptest::test_runner::RngSeed;
    use serde_json::json;

    fn config(cases: u32) -> ProptestConfig {
        ProptestConfig {
            cases,
            rng_seed: RngSeed::Fixed(0x05e5_7a9e),
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// Feeds `chunks` through a fresh tap, then flushes; returns the tap and what the client got.
    fn run<'a>(
        is_stream: bool,
        hide: bool,
        chunks: impl IntoIterator<Item = &'a [u8]>,
    ) -> (UsageTap, Vec<u8>) {
        let mut tap = UsageTap::new(is_stream, hide);
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&tap.feed(Bytes::copy_from_slice(c)));
        }
        out.extend_from_slice(&tap.flush());
        (tap, out)
    }

    /// `text` cut at `cuts` (any order, repeats and out-of-range ones allowed).
    fn split_at<'a>(text: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
        let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(text.len())).collect();
        cuts.push(0);
        cuts.push(text.len());
        cuts.sort_unstable();
        cuts.dedup();
        cuts.windows(2).map(|w| &text[w[0]..w[1]]).collect()
    }

    /// Lines as SSE reads them: runs of blank lines are one event end, leading ones are nothing.
    fn sse_normal(bytes: &[u8]) -> Vec<u8> {
        // `\r\n` and lone `\r` end lines as `\n` does.
        let mut lf = Vec::with_capacity(bytes.len());
        let mut after_cr = false;
        for &b in bytes {
            match b {
                b'\n' if after_cr => {}
                b'\r' => lf.push(b'\n'),
                other => lf.push(other),
            }
            after_cr = b == b'\r';
        }
        let mut out = Vec::with_capacity(lf.len());
        let mut run = 0usize;
        for &b in &lf {
            if b == b'\n' {
                run += 1;
                if run <= 2 && !out.is_empty() {
                    out.push(b);
                }
            } else {
                run = 0;
                out.push(b);
            }
        }
        out
    }

    /// Content text, heavy on what could trip a byte-wise scanner: multi-byte UTF-8, quotes,
    /// backslashes, newlines (escaped in JSON) and SSE keywords.
    fn content() -> impl Strategy<Value = String> {
        prop_oneof![
            "\\PC{0,12}",
            prop::collection::vec(
                prop::sample::select(vec![
                    "a",
                    "é",
                    "日本",
                    "🦀",
                    "\u{2028}",
                    "\"",
                    "\\",
                    "\n",
                    "\r\n",
                    "\n\n",
                    "data: ",
                    "[DONE]",
                    "usage",
                    "{\"usage\":{}}",
                    " ",
                ]),
                0..8,
            )
            .prop_map(|parts| parts.concat()),
        ]
    }

    fn count() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..100_000, any::<u64>()]
    }

    /// A well-formed stream and what reading it must give.
    #[derive(Debug, Clone)]
    struct Stream {
        text: Vec<u8>,
        usage: TokenUsage,
        /// Byte range of the usage event.
        usage_event: Range<usize>,
        /// The usage event has no `choices` (it is removed when hiding).
        usage_only: bool,
        content_events: u64,
    }

    /// Content chunk events (some with an `id:` line, a keep-alive comment before, or `data:`
    /// without the space), the usage chunk, then `data: [DONE]`.
    fn stream() -> impl Strategy<Value = Stream> {
        let event = (content(), any::<bool>(), any::<bool>(), any::<bool>());
        let usage = (count(), count(), prop::option::of(count()));
        (prop::collection::vec(event, 0..6), usage, any::<bool>()).prop_map(
            |(events, (prompt, completion, cached), usage_only)| {
                let mut text = Vec::new();
                for (i, (c, id, comment, space)) in events.iter().enumerate() {
                    if *comment {
                        text.extend_from_slice(b": keepalive\n\n");
                    }
                    if *id {
                        text.extend_from_slice(format!("id: {i}\n").as_bytes());
                    }
                    let chunk = json!({
                        "id": "chatcmpl-1",
                        "object": "chat.completion.chunk",
                        "choices": [{"index": 0, "delta": {"content": c}, "finish_reason": null}],
                    });
                    text.extend_from_slice(if *space { b"data: " } else { b"data:" });
                    text.extend_from_slice(chunk.to_string().as_bytes());
                    text.extend_from_slice(b"\n\n");
                }
                let mut u = json!({
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt.saturating_add(completion),
                });
                if let Some(k) = cached {
                    u["prompt_tokens_details"] = json!({"cached_tokens": k});
                }
                let choices = if usage_only {
                    json!([])
                } else {
                    json!([{"index": 0, "delta": {}, "finish_reason": "stop"}])
                };
                let start = text.len();
                let last = json!({"id": "chatcmpl-1", "choices": choices, "usage": u});
                text.extend_from_slice(format!("data: {last}\n\n").as_bytes());
                let usage_event = start..text.len();
                text.extend_from_slice(b"data: [DONE]\n\n");
                Stream {
                    text,
                    usage: TokenUsage {
                        prompt,
                        completion,
                        cached,
                    },
                    usage_event,
                    usage_only,
                    content_events: events.len() as u64 + u64::from(!usage_only),
                }
            },
        )
    }

    /// Cut points: anywhere, inside the usage event, and inside multi-byte characters.
    fn cuts(s: &Stream, anywhere: &[Index], usage: &[Index], in_char: &[Index]) -> Vec<usize> {
        let continuation: Vec<usize> = (0..s.text.len())
            .filter(|&i| s.text[i] & 0xc0 == 0x80)
            .collect();
        let mut cuts: Vec<usize> = anywhere.iter().map(|i| i.index(s.text.len() + 1)).collect();
        let span = s.usage_event.len();
        cuts.extend(usage.iter().map(|i| s.usage_event.start + i.index(span)));
        if !continuation.is_empty() {
            cuts.extend(
                in_char
                    .iter()
                    .map(|i| continuation[i.index(continuation.len())]),
            );
        }
        cuts
    }

    /// What the client must see of `s`: all of it, less the usage-only event when hiding.
    fn client_view(s: &Stream, hide: bool) -> Vec<u8> {
        if hide && s.usage_only {
            [&s.text[..s.usage_event.start], &s.text[s.usage_event.end..]].concat()
        } else {
            s.text.clone()
        }
    }

    fn chunk_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..48),
            prop::sample::select(vec![
                &b"\n"[..],
                b"\n\n",
                b"\r\n",
                b"\r\n\r\n",
                b"data: ",
                b"data:",
                b"[DONE]",
                b"{\"choices\":[],",
                b"\"usage\":{\"prompt_tokens\":",
                b"18446744073709551616",
                b"7",
                b",\"completion_tokens\":3}",
                b"}",
                b"\xe6\x97",
                b": keepalive",
            ])
            .prop_map(<[u8]>::to_vec),
        ]
    }

    proptest! {
        #![proptest_config(config(256))]

        /// Arbitrary byte chunks never panic in any mode; JSON bodies pass through byte for
        /// byte, and a stream shown in full reaches the client SSE-equivalent (blank-line runs
        /// aside).
        #[test]
        fn arbitrary_chunks_never_panic(chunks in prop::collection::vec(chunk_bytes(), 0..24)) {
            let input = chunks.concat();
            let parts = chunks.iter().map(Vec::as_slice);
            let (_, out) = run(false, false, parts.clone());
            prop_assert_eq!(out, input.clone());
            let (_, out) = run(true, false, parts.clone());
            prop_assert_eq!(sse_normal(&out), sse_normal(&input));
            let (tap, out) = run(true, true, parts);
            prop_assert!(out.len() <= input.len() + tap.content_events as usize + 1);
        }

        /// A valid stream cut into arbitrary chunks (inside `\n\n`, inside multi-byte UTF-8,
        /// inside the usage JSON) gives the same usage, event count and client bytes as whole.
        #[test]
        fn split_streams_read_the_same_usage(
            s in stream(),
            anywhere in prop::collection::vec(any::<Index>(), 0..24),
            usage in prop::collection::vec(any::<Index>(), 0..4),
            in_char in prop::collection::vec(any::<Index>(), 0..4),
            hide in any::<bool>(),
        ) {
            let (whole, whole_out) = run(true, hide, [s.text.as_slice()]);
            prop_assert_eq!(whole.usage, Some(s.usage));
            prop_assert_eq!(whole.content_events, s.content_events);
            prop_assert_eq!(&whole_out, &client_view(&s, hide));
            let cut = cuts(&s, &anywhere, &usage, &in_char);
            let (tap, out) = run(true, hide, split_at(&s.text, &cut));
            prop_assert_eq!(tap.usage, whole.usage);
            prop_assert_eq!(tap.content_events, whole.content_events);
            prop_assert_eq!(out, whole_out);
        }

        /// The same stream with `\r\n` (or lone `\r`) line ends, cut anywhere (between a `\r`
        /// and its `\n` too), reads the same usage and reaches the client with `\n` ends.
        #[test]
        fn crlf_and_cr_streams_read_the_same_usage(
            s in stream(),
            anywhere in prop::collection::vec(any::<Index>(), 0..24),
            lone_cr in any::<bool>(),
            hide in any::<bool>(),
        ) {
            let (lf, lf_out) = run(true, hide, [s.text.as_slice()]);
            let ending: &[u8] = if lone_cr { b"\r" } else { b"\r\n" };
            let mut text = Vec::with_capacity(s.text.len() * 2);
            for &b in &s.text {
                if b == b'\n' {
                    text.extend_from_slice(ending);
                } else {
                    text.push(b);
                }
            }
            let cut: Vec<usize> = anywhere.iter().map(|i| i.index(text.len() + 1)).collect();
            let (tap, out) = run(true, hide, split_at(&text, &cut));
            prop_assert_eq!(tap.usage, lf.usage);
            prop_assert_eq!(tap.content_events, lf.content_events);
            prop_assert_eq!(out, lf_out);
        }

        /// A JSON (non-streamed) body cut into arbitrary chunks passes through unchanged and
        /// gives the same usage as whole.
        #[test]
        fn split_json_bodies_read_the_same_usage(
            c in content(),
            (prompt, completion, cached) in (count(), count(), prop::option::of(count())),
            anywhere in prop::collection::vec(any::<Index>(), 0..16),
        ) {
            let mut u = json!({"prompt_tokens": prompt, "completion_tokens": completion});
            if let Some(k) = cached {
                u["prompt_tokens_details"] = json!({"cached_tokens": k});
            }
            let body = json!({
                "choices": [{"index": 0, "message": {"role": "assistant", "content": c}}],
                "usage": u,
            })
            .to_string()
            .into_bytes();
            let cut: Vec<usize> = anywhere.iter().map(|i| i.index(body.len() + 1)).collect();
            let (tap, out) = run(false, false, split_at(&body, &cut));
            prop_assert_eq!(out, body);
            prop_assert_eq!(tap.usage, Some(TokenUsage { prompt, completion, cached }));
        }
    }

    proptest! {
        #![proptest_config(config(48))]

        /// A valid stream fed one byte at a time reads the same as whole.
        #[test]
        fn byte_at_a_time_streams_read_the_same_usage(s in stream(), hide in any::<bool>()) {
            let (tap, out) = run(true, hide, s.text.chunks(1));
            prop_assert_eq!(tap.usage, Some(s.usage));
            prop_assert_eq!(tap.content_events, s.content_events);
            prop_assert_eq!(out, client_view(&s, hide));
        }
    }
}
