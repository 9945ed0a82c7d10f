//! Reading an OpenAI streaming answer as it arrives: SSE lines split across network frames, the
//! content chunks timed (TTFT, every gap), the usage chunk, a mid-stream error event, the
//! `: x-infergate-exec-path graph=N,eager=M` comment and the engine's `: flight {json}` record
//! (which a gateway relays only with `debug_headers: true`). State is a few numbers, the gap
//! list and one reused line buffer.

use std::borrow::Cow;
use std::time::Instant;

use infergate_engine::openai::sse;
use serde::Deserialize;

/// One `data:` JSON chunk, borrowing from the frame where it can.
#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    choices: Vec<Choice<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<ErrorBody>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    code: Option<serde_json::Value>,
}

/// What one stream has shown so far.
#[derive(Debug, Default)]
pub struct StreamStats {
    /// Arrival of the first content chunk.
    pub first: Option<Instant>,
    /// Arrival of the latest content chunk.
    pub last: Option<Instant>,
    /// Gaps between consecutive content chunks, seconds.
    pub gaps: Vec<f64>,
    /// Content chunks seen.
    pub chunks: u64,
    /// `(prompt, completion)` tokens from the usage chunk.
    pub usage: Option<(u64, u64)>,
    /// Cached prompt tokens from the usage chunk (`prompt_tokens_details.cached_tokens`).
    pub cached: Option<u64>,
    /// `(graph, eager)` step counts from the exec-path comment (or header).
    pub paths: Option<(u64, u64)>,
    /// Whether the request shared a step with an off-path step, from the engine's flight record
    /// (comment or header) when one came and counts it (format 3 or later).
    pub shared: Option<bool>,
    /// The request's path class by its flight record (which counts the steps past the captured
    /// budget, unlike the exec-path counts).
    pub flight_path: Option<&'static str>,
    /// Status carried by a mid-stream error event (502 when it names none).
    pub error: Option<u16>,
    /// `data: [DONE]` arrived.
    pub done: bool,
}

/// Incremental SSE reader: feed it frames, it keeps only an unfinished line between them.
#[derive(Debug, Default)]
pub struct SseReader {
    partial: Vec<u8>,
    /// What has been read.
    pub stats: StreamStats,
}

impl SseReader {
    /// Consumes one body frame that arrived at `at`.
    pub fn feed(&mut self, frame: &[u8], at: Instant) {
        if self.partial.is_empty() {
            let used = self.lines(frame, at);
            self.partial.extend_from_slice(&frame[used..]);
        } else {
            let mut buf = std::mem::take(&mut self.partial);
            buf.extend_from_slice(frame);
            let used = self.lines(&buf, at);
            buf.drain(..used);
            self.partial = buf;
        }
    }

    /// Handles every complete line of `bytes`; returns how many bytes they took.
    fn lines(&mut self, bytes: &[u8], at: Instant) -> usize {
        let mut used = 0;
        while let Some(n) = bytes[used..].iter().position(|&b| b == b'\n') {
            let line = &bytes[used..used + n];
            self.line(line.strip_suffix(b"\r").unwrap_or(line), at);
            used += n + 1;
        }
        used
    }

    fn line(&mut self, line: &[u8], at: Instant) {
        if let Some(data) = sse::data_field(line) {
            if sse::is_done(data) {
                self.stats.done = true;
            } else if let Ok(chunk) = serde_json::from_slice::<Chunk<'_>>(data) {
                self.chunk(&chunk, at);
            }
        } else if let Some(comment) = sse::comment(line) {
            let text = std::str::from_utf8(comment).unwrap_or("").trim();
            if let Some(value) = text.strip_prefix("x-infergate-exec-path") {
                self.stats.paths = parse_exec_path(value.trim()).or(self.stats.paths);
            } else if let Some(raw) = text.strip_prefix(FLIGHT_COMMENT)
                && let Some((shared, path)) = flight_facts(raw.trim().as_bytes())
            {
                self.stats.shared = shared.or(self.stats.shared);
                self.stats.flight_path = Some(path);
            }
        }
    }

    fn chunk(&mut self, chunk: &Chunk<'_>, at: Instant) {
        let s = &mut self.stats;
        if let Some(u) = &chunk.usage {
            s.usage = Some((u.prompt_tokens, u.completion_tokens));
            s.cached = u
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens);
        }
        if let Some(e) = &chunk.error {
            let code = e.code.as_ref().and_then(serde_json::Value::as_u64);
            s.error = Some(match code {
                Some(c @ 400..=599) => c as u16,
                _ => 502,
            });
        }
        let content = chunk.choices.iter().any(|c| {
            let delta = c.delta.as_ref().and_then(|d| d.content.as_deref());
            !delta.or(c.text.as_deref()).unwrap_or("").is_empty()
        });
        if !content {
            return;
        }
        s.chunks += 1;
        match s.last {
            Some(last) => s.gaps.push(at.duration_since(last).as_secs_f64()),
            None => s.first = Some(at),
        }
        s.last = Some(at);
    }
}

/// The flight-record comment's name (`infergate_engine::flight::SSE_PREFIX` without its `: `).
const FLIGHT_COMMENT: &str = "flight ";

/// What a raw flight record (header value or comment payload) says of its request: whether it
/// shared a step with an off-path step (`None` before format 3 counted it), and its path
/// class. `None` for a record that fails the gateway's checks.
pub fn flight_facts(raw: &[u8]) -> Option<(Option<bool>, &'static str)> {
    let record = infergate::trace::record::parse(raw);
    let r = record.record()?;
    Some(((r.v >= 3).then_some(r.eager_shared > 0), r.path()))
}

/// Parses `graph=N,eager=M`.
pub fn parse_exec_path(value: &str) -> Option<(u64, u64)> {
    let (mut graph, mut eager) = (None, None);
    for part in value.split(',') {
        match part.trim().split_once('=') {
            Some(("graph", n)) => graph = n.trim().parse().ok(),
            Some(("eager", n)) => eager = n.trim().parse().ok(),
            _ => {}
        }
    }
    Some((graph?, eager?))
}

/// The path class of a request's steps by their counts alone (the exec-path header, without a
/// flight record): `eager` when no step ran as a graph, `graph` when at most one did not (the
/// prefill), else `mixed`. See `infergate_engine::exec_path::request_path`.
pub fn path_class(graph: u64, eager: u64) -> &'static str {
    infergate_engine::exec_path::request_path(graph, eager, None)
}
