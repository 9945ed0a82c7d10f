//! Whether a relayed answer really ended well: a worker can answer 200 and then fail inside the
//! body (an SSE event carrying `error`, as SGLang and vLLM send, or a stream that stops before the
//! `data: [DONE]` it promised). Pure functions over what the usage tap saw and over SSE bytes
//! already split into whole events with `\n` line ends (the tap's output).

use infergate_engine::openai::sse;

use crate::error::GatewayError;

use super::json_members;

/// A failure inside a body whose head said 200.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// An SSE event with a top-level `error`.
    ErrorEvent,
    /// The worker ended an OpenAI-style stream before `data: [DONE]`.
    NoDone,
}

impl Fault {
    /// The `kind` label of `infergate_upstream_errors_total`.
    pub fn kind(self) -> &'static str {
        match self {
            Self::ErrorEvent => "error_event",
            Self::NoDone => "no_done",
        }
    }

    /// What the client is told (its SSE error event).
    pub fn error(self) -> GatewayError {
        GatewayError::UpstreamUnavailable(
            match self {
                Self::ErrorEvent => "the worker reported an error in the middle of its answer",
                Self::NoDone => "the worker ended its stream before it was complete",
            }
            .into(),
        )
    }
}

/// The fault of a stream the worker ended (its last byte read), from what the tap saw: an error
/// event, or no `[DONE]` where the endpoint's streams end with one (`expects_done`).
pub fn at_end(expects_done: bool, saw_error: bool, saw_done: bool) -> Option<Fault> {
    if saw_error {
        Some(Fault::ErrorEvent)
    } else if expects_done && !saw_done {
        Some(Fault::NoDone)
    } else {
        None
    }
}

/// Whether an SSE payload is an error: a JSON object whose top-level `error` is not `null`.
pub fn is_error_payload(payload: &[u8]) -> bool {
    // Every content chunk passes here: most are ruled out by one fast search, unparsed.
    if memchr::memmem::find(payload, b"\"error\"").is_none() {
        return false;
    }
    matches!(json_members::find(payload, ["error"]), Some([Some(e)]) if e != b"null")
}

/// Where the first error event starts in `events` (whole SSE events separated by a blank line,
/// `\n` line ends): what comes before it reached the client, it and the rest do not.
pub fn error_event_at(events: &[u8]) -> Option<usize> {
    let mut start = 0;
    while start < events.len() {
        let end = events[start..]
            .windows(2)
            .position(|w| w == b"\n\n")
            .map_or(events.len(), |i| start + i + 2);
        if payload_of(&events[start..end]).is_some_and(|p| is_error_payload(&p)) {
            return Some(start);
        }
        start = end;
    }
    None
}

/// What the bytes of an event the worker never terminated (its stream's last) are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// `data: [DONE]`.
    Done,
    /// An error event.
    Error,
    /// Anything else, or nothing.
    Other,
}

/// Reads the unterminated last event `tail`.
pub fn tail(tail: &[u8]) -> Tail {
    match payload_of(tail) {
        Some(p) if sse::is_done(&p) => Tail::Done,
        Some(p) if is_error_payload(&p) => Tail::Error,
        _ => Tail::Other,
    }
}

/// The payload of one event: its `data:` lines joined with `\n` (the SSE rule).
fn payload_of(event: &[u8]) -> Option<Vec<u8>> {
    let mut lines = event.split(|&b| b == b'\n').filter_map(sse::data_field);
    let mut payload = lines.next()?.to_vec();
    for line in lines {
        payload.push(b'\n');
        payload.extend_from_slice(line);
    }
    Some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_is_judged_by_the_error_event_then_the_done() {
        assert_eq!(at_end(true, false, true), None);
        assert_eq!(at_end(false, false, false), None, "no [DONE] promised");
        assert_eq!(at_end(true, false, false), Some(Fault::NoDone));
        assert_eq!(at_end(true, true, true), Some(Fault::ErrorEvent));
        assert_eq!(at_end(false, true, false), Some(Fault::ErrorEvent));
        assert_eq!(
            Fault::NoDone.error().status(),
            hyper::StatusCode::BAD_GATEWAY
        );
        assert_ne!(Fault::ErrorEvent.kind(), Fault::NoDone.kind());
    }

    #[test]
    fn only_a_top_level_error_is_an_error() {
        assert!(is_error_payload(
            br#"{"error":{"message":"boom","code":500}}"#
        ));
        assert!(is_error_payload(br#"{"object":"x", "error" : "boom"}"#));
        assert!(!is_error_payload(br#"{"error":null,"choices":[]}"#));
        assert!(!is_error_payload(
            br#"{"choices":[{"delta":{"content":"{\"error\":1}"}}]}"#
        ));
        assert!(!is_error_payload(
            br#"{"choices":[{"error":{"message":"x"}}]}"#
        ));
        assert!(!is_error_payload(b"[DONE]"));
        assert!(!is_error_payload(b"not json"));
    }

    #[test]
    fn the_cut_falls_before_the_first_error_event() {
        let ok = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
        let err = "data: {\"error\":{\"message\":\"boom\"}}\n\n";
        let after = "data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
        let events = format!("{ok}{ok}{err}{after}");
        assert_eq!(error_event_at(events.as_bytes()), Some(2 * ok.len()));
        assert_eq!(error_event_at(err.as_bytes()), Some(0));
        assert_eq!(error_event_at(format!("{ok}{after}").as_bytes()), None);
        // An event with a name and an error split over two data lines.
        let split = "event: x\ndata: {\"error\":\ndata: {\"message\":\"m\"}}\n\n";
        assert_eq!(
            error_event_at(format!("{ok}{split}").as_bytes()),
            Some(ok.len())
        );
    }

    #[test]
    fn an_unterminated_last_event_is_read_too() {
        assert_eq!(tail(b"data: [DONE]\n"), Tail::Done);
        assert_eq!(tail(b"data: [DONE]"), Tail::Done);
        assert_eq!(
            tail(b"data: {\"error\":{\"message\":\"m\"}}\n"),
            Tail::Error
        );
        assert_eq!(tail(b"data: {\"choices\":[]}\n"), Tail::Other);
        assert_eq!(tail(b""), Tail::Other);
    }
}
