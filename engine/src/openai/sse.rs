//! Server-sent events as OpenAI streams use them: the frames the engine writes, and the field
//! rules every reader parses them by (the gateway's usage tap, the bench's client, the tests).
//! One module, so writer and readers cannot drift apart.

use std::fmt::Display;

/// The stream's last event.
pub const DONE: &str = "data: [DONE]\n\n";

/// The payload of [`DONE`].
const DONE_PAYLOAD: &[u8] = b"[DONE]";

/// One unnamed event carrying `payload` (one line of JSON), written straight into the event:
/// a JSON value is not serialized to a string of its own first.
pub fn data_event(payload: impl Display) -> String {
    format!("data: {payload}\n\n")
}

/// One named event, as the Responses API sends them (`event: <type>`, then its data).
pub fn named_event(kind: &str, payload: impl Display) -> String {
    format!("event: {kind}\ndata: {payload}\n\n")
}

/// The value of a `data` line: what follows `data:`, less one leading space (the SSE rule);
/// `None` for any other line. The line comes without its line ending.
pub fn data_field(line: &[u8]) -> Option<&[u8]> {
    let value = line.strip_prefix(b"data:")?;
    Some(value.strip_prefix(b" ").unwrap_or(value))
}

/// The text of a comment line (one that starts with `:`), `None` for any other line.
pub fn comment(line: &[u8]) -> Option<&[u8]> {
    line.strip_prefix(b":")
}

/// Whether a data payload is the end-of-stream marker.
pub fn is_done(payload: &[u8]) -> bool {
    payload.trim_ascii_end() == DONE_PAYLOAD
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_by_the_field_rules() {
        let event = data_event(r#"{"a":1}"#);
        assert_eq!(event, "data: {\"a\":1}\n\n");
        let line = event.as_bytes().split(|&b| b == b'\n').next().unwrap();
        assert_eq!(data_field(line), Some(&br#"{"a":1}"#[..]));
        let named = named_event("response.created", "{}");
        let lines: Vec<&[u8]> = named.as_bytes().split(|&b| b == b'\n').collect();
        assert_eq!(lines[0], b"event: response.created");
        assert_eq!(data_field(lines[1]), Some(&b"{}"[..]));
        let done = DONE.as_bytes().split(|&b| b == b'\n').next().unwrap();
        assert!(is_done(data_field(done).unwrap()));
    }

    #[test]
    fn one_space_is_stripped_and_other_lines_are_not_data() {
        assert_eq!(data_field(b"data:x"), Some(&b"x"[..]));
        assert_eq!(data_field(b"data:  x"), Some(&b" x"[..]));
        assert_eq!(data_field(b"data:"), Some(&b""[..]));
        assert_eq!(data_field(b"event: x"), None);
        assert_eq!(data_field(b" data: x"), None);
        assert_eq!(comment(b": ping"), Some(&b" ping"[..]));
        assert_eq!(comment(b"data: x"), None);
        assert!(is_done(b"[DONE]\r"));
        assert!(!is_done(b"[DONE]x"));
        assert!(!is_done(b"{}"));
    }
}
