//! One keep-alive HTTP/1.1 connection to a worker, driven inline by the request's own task: the
//! request is written, and its answer read, where the gateway awaits it, with no connection
//! task, channel or wake-up in between (hyper's client dispatcher cost about 14,000
//! instructions and two task hand-offs a request).
//!
//! It speaks what a proxied request needs: a request written whole, an answer framed by its
//! Content-Length, chunked coding or the connection's close (RFC 9112 §6.3), interim 1xx heads
//! skipped. Everything the worker sends is bounded before it is kept: the head, each chunk-size
//! line, the trailers. The request is written before the answer is read, so a worker that
//! answers a large body early without reading it waits on the first-byte timeout.

use std::fmt;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use hyper::body::{Body, Bytes, Frame, SizeHint};
use hyper::header::{CONNECTION, CONTENT_LENGTH, HeaderName, HeaderValue, TRANSFER_ENCODING};
use hyper::{HeaderMap, Response, StatusCode, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response head (status line and headers) a worker may send.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most headers in one response head.
const MAX_HEADERS: usize = 100;
/// Longest chunk-size line, extensions included.
const MAX_CHUNK_LINE: usize = 1024;
/// Most bytes of trailers after the last chunk (read and dropped).
const MAX_TRAILER_BYTES: usize = 64 * 1024;
/// Most interim (1xx) heads before the answer's own.
const MAX_INTERIM: usize = 8;
/// Headers the gateway may add to an answer: `x-request-id`, pool, worker, route, version,
/// degradation and the six rate-limit headers.
const GATEWAY_HEADERS: usize = 12;
/// Room made for each read.
const READ_ROOM: usize = 16 * 1024;
/// Body pieces up to this size are copied out, so the read buffer stays the connection's for
/// the next answer; larger ones are split off without a copy.
const COPY_BELOW: usize = 4 * 1024;

/// Why a worker's answer could not be read.
#[derive(Debug)]
pub enum H1Error {
    /// The socket failed (reset, broken pipe).
    Io(io::Error),
    /// The worker closed or reset the connection before any byte of an answer: on a kept
    /// connection, the worker closing it idle as the request went out.
    Unanswered,
    /// The worker closed the connection in the middle of the answer's head.
    ClosedBeforeHead,
    /// The worker closed the connection before the body's end.
    ClosedMidBody,
    /// The answer breaks HTTP/1.1.
    Malformed(&'static str),
    /// A part of the answer is larger than its bound.
    TooLarge(&'static str),
}

impl fmt::Display for H1Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            H1Error::Io(e) => write!(f, "connection error: {e}"),
            H1Error::Unanswered => f.write_str("connection closed before any response"),
            H1Error::ClosedBeforeHead => f.write_str("connection closed before the response head"),
            H1Error::ClosedMidBody => f.write_str("connection closed before the body's end"),
            H1Error::Malformed(what) => write!(f, "malformed response: {what}"),
            H1Error::TooLarge(what) => write!(f, "response {what} too large"),
        }
    }
}

impl std::error::Error for H1Error {}

/// A request head, written before its body in one system call.
#[derive(Debug)]
pub struct RequestHead {
    bytes: Vec<u8>,
}

impl RequestHead {
    /// `POST target` to `host` with a body of `body_len` bytes. `target` and `host` come from
    /// a parsed URL (no spaces, no line breaks).
    pub fn post(target: &[u8], host: &[u8], body_len: usize) -> Self {
        let mut bytes = Vec::with_capacity(256);
        bytes.extend_from_slice(b"POST ");
        bytes.extend_from_slice(target);
        bytes.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        bytes.extend_from_slice(host);
        bytes.extend_from_slice(b"\r\ncontent-length: ");
        bytes.extend_from_slice(itoa::Buffer::new().format(body_len).as_bytes());
        bytes.extend_from_slice(b"\r\n");
        Self { bytes }
    }

    /// Adds a header (`name` a constant token) unless `value` holds a byte other than visible
    /// ASCII, space and tab (as `HeaderValue::from_str` checks, without building one): a line
    /// break would end the head early. Says whether it was added.
    pub fn header(&mut self, name: &'static str, value: &[u8]) -> bool {
        if !value
            .iter()
            .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
        {
            return false;
        }
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.extend_from_slice(b": ");
        self.bytes.extend_from_slice(value);
        self.bytes.extend_from_slice(b"\r\n");
        true
    }

    /// The head as sent: the blank line that ends it included.
    fn finish(&mut self) -> &[u8] {
        if !self.bytes.ends_with(b"\r\n\r\n") {
            self.bytes.extend_from_slice(b"\r\n");
        }
        &self.bytes
    }

    /// The head's bytes so far (tests).
    #[cfg(test)]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// An open connection to a worker, idle between answers.
#[derive(Debug)]
pub struct Connection {
    tcp: TcpStream,
    /// Bytes read and not yet used; empty between answers.
    buf: BytesMut,
}

impl Connection {
    /// Wraps a freshly connected socket.
    pub fn new(tcp: TcpStream) -> Self {
        Self {
            tcp,
            buf: BytesMut::new(),
        }
    }

    /// Whether an idle connection may carry a request: the worker has neither closed it nor
    /// sent anything unasked. Costs no system call when the socket has had no event since its
    /// last read came up empty.
    pub fn is_open(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.tcp.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Writes `head` and `body`.
    pub async fn write_request(&mut self, head: &mut RequestHead, body: &[u8]) -> io::Result<()> {
        let mut slices = [IoSlice::new(head.finish()), IoSlice::new(body)];
        let mut rest = &mut slices[..];
        while rest.iter().any(|s| !s.is_empty()) {
            let n = self.tcp.write_vectored(rest).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, n);
        }
        Ok(())
    }

    /// Reads the answer's head; its body follows in the returned response.
    pub async fn read_response(mut self) -> Result<Response<WorkerBody>, H1Error> {
        let mut interim = 0;
        let head = loop {
            if let Some(head) = answer_head(&mut self.buf, &mut interim)? {
                break head;
            }
            let read = std::future::poll_fn(|cx| self.poll_fill(cx)).await;
            // Closed or reset before any byte of an answer: the worker never took the request
            // up (a kept connection it closed as the request went out).
            let untouched = self.buf.is_empty() && interim == 0;
            match read {
                Ok(0) if untouched => return Err(H1Error::Unanswered),
                Ok(0) => return Err(H1Error::ClosedBeforeHead),
                Err(e) if untouched && e.kind() == io::ErrorKind::ConnectionReset => {
                    return Err(H1Error::Unanswered);
                }
                Err(e) => return Err(H1Error::Io(e)),
                Ok(_) => {}
            }
        };
        let mut framing = Framing::of(&head)?;
        framing.settle(&mut self.buf);
        let mut res = Response::new(WorkerBody {
            conn: Some(self),
            framing,
        });
        *res.status_mut() = head.status;
        *res.version_mut() = head.version;
        *res.headers_mut() = head.headers;
        Ok(res)
    }

    /// Reads what the socket has into the buffer; `Ok(0)` is the worker's end of the connection.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ_ROOM / 4 {
            self.buf.reserve(READ_ROOM);
        }
        // Through `poll_read`, not `try_read_buf`: a read shorter than the room clears the
        // socket's readiness, so the next checkout's close probe ([`Self::is_open`]) costs no
        // system call (`try_read_buf` leaves it set until a read would block).
        let read = self.tcp.read_buf(&mut self.buf);
        tokio::pin!(read);
        read.poll(cx)
    }
}

/// A parsed response head.
struct Head {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
}

/// Parses a complete head off the front of `buf`; `None` until one has arrived.
fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, H1Error> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut slots);
    let len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(H1Error::TooLarge("header count")),
        Err(_) => return Err(H1Error::Malformed("the head does not parse")),
    };
    let status = parsed
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(H1Error::Malformed("status code"))?;
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    // One copy of the head; the header values are views of it.
    let base = buf.as_ptr() as usize;
    let head = Bytes::copy_from_slice(&buf[..len]);
    // Room for the headers the gateway adds to the answer (request id, pool, worker, version,
    // rate limits), so that the map does not grow twice on its way out.
    let mut headers = HeaderMap::with_capacity(parsed.headers.len() + GATEWAY_HEADERS);
    for h in parsed.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| H1Error::Malformed("header name"))?;
        let at = h.value.as_ptr() as usize - base;
        let value = HeaderValue::from_maybe_shared(head.slice(at..at + h.value.len()))
            .map_err(|_| H1Error::Malformed("header value"))?;
        headers.append(name, value);
    }
    buf.advance(len);
    Ok(Some(Head {
        status,
        version,
        headers,
    }))
}

/// The answer's own head off the front of `buf`, past any interim (1xx) heads (counted in
/// `interim`); `None` until it has arrived.
fn answer_head(buf: &mut BytesMut, interim: &mut usize) -> Result<Option<Head>, H1Error> {
    loop {
        let Some(head) = parse_head(buf)? else {
            if buf.len() >= MAX_HEAD_BYTES {
                return Err(H1Error::TooLarge("head"));
            }
            return Ok(None);
        };
        // 101 would switch protocols: never asked for, so not an interim answer here.
        if !head.status.is_informational() || head.status == StatusCode::SWITCHING_PROTOCOLS {
            return Ok(Some(head));
        }
        *interim += 1;
        if *interim > MAX_INTERIM {
            return Err(H1Error::Malformed("too many interim (1xx) responses"));
        }
    }
}

/// How the body of `head` is framed, and whether the connection may carry another request
/// after it (RFC 9112 §6.3 and §9.3).
fn framing(head: &Head) -> Result<(State, bool), H1Error> {
    let h = &head.headers;
    let closes = h.get_all(CONNECTION).iter().any(|v| {
        v.as_bytes()
            .split(|b| *b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
    });
    let mut keep_alive = head.version == Version::HTTP_11 && !closes;
    if head.status.is_informational()
        || head.status == StatusCode::NO_CONTENT
        || head.status == StatusCode::NOT_MODIFIED
    {
        return Ok((State::Done, keep_alive));
    }
    if h.contains_key(TRANSFER_ENCODING) {
        // A length beside a coding is a smuggling risk: the coding wins, the connection ends.
        if h.contains_key(CONTENT_LENGTH) {
            keep_alive = false;
        }
        let chunked_last = h
            .get_all(TRANSFER_ENCODING)
            .iter()
            .next_back()
            .and_then(|v| v.as_bytes().rsplit(|b| *b == b',').next())
            .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        return Ok(if chunked_last {
            (State::ChunkSize, keep_alive)
        } else {
            (State::UntilClose, false)
        });
    }
    let mut length: Option<u64> = None;
    for v in h.get_all(CONTENT_LENGTH) {
        for part in v.as_bytes().split(|b| *b == b',') {
            let n = parse_decimal(part.trim_ascii()).ok_or(H1Error::Malformed("content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(H1Error::Malformed("conflicting content-lengths"));
            }
            length = Some(n);
        }
    }
    Ok(match length {
        Some(n) => (State::Length(n), keep_alive),
        None => (State::UntilClose, false),
    })
}

fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 {
        return None;
    }
    s.iter().try_fold(0u64, |n, b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

/// Where the body's reader stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Bytes left of a Content-Length body.
    Length(u64),
    /// Before a chunk-size line.
    ChunkSize,
    /// Bytes left of the current chunk.
    ChunkData(u64),
    /// The line break after a chunk's data.
    ChunkEnd,
    /// Trailer lines after the last chunk, and how many bytes of them so far.
    Trailers(usize),
    /// Everything until the worker closes the connection.
    UntilClose,
    /// The body's end was read (or it failed).
    Done,
}

/// What the buffered bytes gave.
enum Step {
    Data(Bytes),
    End,
    NeedMore,
}

/// Where an answer's body stands in its framing: pure logic over the bytes read so far, so the
/// tests drive it piece by piece without a socket.
#[derive(Debug)]
struct Framing {
    state: State,
    keep_alive: bool,
    /// A framing error found ahead of the data ([`Framing::settle`]), for the next step.
    broken: Option<H1Error>,
}

impl Framing {
    /// The framing of `head`'s body.
    fn of(head: &Head) -> Result<Self, H1Error> {
        let (state, keep_alive) = framing(head)?;
        Ok(Self {
            state,
            keep_alive,
            broken: None,
        })
    }

    /// Moves past the framing `buf` already holds (a chunk's line break, the last chunk, the
    /// trailers), so a body whose end has arrived reports it before it is polled again. An error
    /// is kept for the next step to return.
    fn settle(&mut self, buf: &mut BytesMut) {
        loop {
            match self.step_framing(buf) {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    self.broken = Some(e);
                    return;
                }
            }
        }
    }

    /// One step through framing (no data) on `buf`; `Ok(false)` when none was made.
    fn step_framing(&mut self, buf: &mut BytesMut) -> Result<bool, H1Error> {
        match self.state {
            State::Length(0) => self.state = State::Done,
            State::ChunkData(0) => self.state = State::ChunkEnd,
            State::ChunkEnd => {
                if buf.len() < 2 {
                    return Ok(false);
                }
                if &buf[..2] != b"\r\n" {
                    return Err(H1Error::Malformed("no line break after a chunk"));
                }
                buf.advance(2);
                self.state = State::ChunkSize;
            }
            State::ChunkSize => {
                let Some((len, taken)) = line_at_front(buf, MAX_CHUNK_LINE, "chunk-size line")?
                else {
                    return Ok(false);
                };
                let size = parse_chunk_size(&buf[..len])?;
                buf.advance(taken);
                self.state = if size == 0 {
                    State::Trailers(0)
                } else {
                    State::ChunkData(size)
                };
            }
            State::Trailers(seen) => {
                let room = MAX_TRAILER_BYTES.saturating_sub(seen);
                let Some((len, taken)) = line_at_front(buf, room, "trailers")? else {
                    return Ok(false);
                };
                buf.advance(taken);
                self.state = if len == 0 {
                    State::Done
                } else {
                    State::Trailers(seen + taken)
                };
            }
            State::Length(_) | State::ChunkData(_) | State::UntilClose | State::Done => {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The next piece of body data in `buf`, the end, or the need to read more.
    fn step(&mut self, buf: &mut BytesMut) -> Result<Step, H1Error> {
        if let Some(e) = self.broken.take() {
            return Err(e);
        }
        while self.step_framing(buf)? {}
        let (left, next): (u64, fn(u64) -> State) = match self.state {
            State::Done => return Ok(Step::End),
            State::Length(n) => (n, State::Length),
            State::ChunkData(n) => (n, State::ChunkData),
            State::UntilClose => (u64::MAX, |_| State::UntilClose),
            _ => return Ok(Step::NeedMore),
        };
        if buf.is_empty() {
            return Ok(Step::NeedMore);
        }
        let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        self.state = next(left - n as u64);
        let data = if n <= COPY_BELOW {
            let data = Bytes::copy_from_slice(&buf[..n]);
            buf.advance(n);
            data
        } else {
            buf.split_to(n).freeze()
        };
        self.settle(buf);
        Ok(Step::Data(data))
    }

    /// The worker closed the connection: the end of a body framed by the close, an error for
    /// any other.
    fn closed(&mut self) -> Result<(), H1Error> {
        self.keep_alive = false;
        if self.state != State::UntilClose {
            return Err(H1Error::ClosedMidBody);
        }
        self.state = State::Done;
        Ok(())
    }

    /// Read to the end, with the connection fit for another request.
    fn reusable(&self) -> bool {
        self.state == State::Done && self.keep_alive
    }
}

/// A worker's answer body, read from its connection as the client takes it. Read to its end,
/// the connection goes back for the next request ([`WorkerBody::take_reusable`]); dropped
/// before, it closes, which cancels the request on the worker.
#[derive(Debug)]
pub struct WorkerBody {
    conn: Option<Connection>,
    framing: Framing,
}

impl WorkerBody {
    /// The connection, when the body was read to its end and the worker left it fit for
    /// another request.
    pub fn take_reusable(&mut self) -> Option<Connection> {
        if !self.framing.reusable() {
            return None;
        }
        self.conn.take().filter(|c| c.buf.is_empty())
    }

    /// Ends the body after a failure: the connection closes.
    fn fail(&mut self, e: H1Error) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        self.framing.state = State::Done;
        self.framing.keep_alive = false;
        self.conn = None;
        Poll::Ready(Some(Err(e)))
    }
}

/// Where the first line of `buf` ends, if a whole one has arrived within `max` bytes: its
/// length without the line break, and the bytes it takes with it. Nothing is copied: a
/// stream's every chunk has such a line.
fn line_at_front(
    buf: &[u8],
    max: usize,
    what: &'static str,
) -> Result<Option<(usize, usize)>, H1Error> {
    match memchr::memchr(b'\n', &buf[..buf.len().min(max)]) {
        Some(at) => {
            let len = if at > 0 && buf[at - 1] == b'\r' {
                at - 1
            } else {
                at
            };
            Ok(Some((len, at + 1)))
        }
        None if buf.len() >= max => Err(H1Error::TooLarge(what)),
        None => Ok(None),
    }
}

/// The size of a chunk-size line: hex digits, then optional whitespace and `;extensions`.
fn parse_chunk_size(line: &[u8]) -> Result<u64, H1Error> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = line[digits..].trim_ascii_start();
    if digits == 0 || digits > 15 || !(rest.is_empty() || rest[0] == b';') {
        return Err(H1Error::Malformed("chunk size"));
    }
    Ok(line[..digits].iter().fold(0u64, |n, b| {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => b - b'A' + 10,
        };
        n * 16 + u64::from(d)
    }))
}

impl Body for WorkerBody {
    type Data = Bytes;
    type Error = H1Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        let this = &mut *self;
        loop {
            // No connection: the body ended or failed.
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match this.framing.step(&mut conn.buf) {
                Err(e) => return this.fail(e),
                Ok(Step::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Step::End) => return Poll::Ready(None),
                Ok(Step::NeedMore) => {}
            }
            match ready!(conn.poll_fill(cx)) {
                Ok(0) => {
                    if let Err(e) = this.framing.closed() {
                        return this.fail(e);
                    }
                }
                Ok(_) => {}
                Err(e) => return this.fail(H1Error::Io(e)),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.framing.state == State::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing.state {
            State::Length(n) => SizeHint::with_exact(n),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The answer [`exchange`] gives by resetting the connection.
    const RESET: &[u8] = b"(reset)";

    /// A worker on loopback that reads one request head and body, then writes `answer` (or
    /// resets the connection, for [`RESET`]) and keeps the connection open until the client
    /// closes it (or closes it itself when `close` is set). Returns a connection to it and the
    /// request it saw. How a body arriving in pieces is read is [`decode`]'s to test, without a
    /// socket's timing.
    async fn exchange(
        answer: &'static [u8],
        close: bool,
    ) -> (Connection, tokio::sync::oneshot::Receiver<Vec<u8>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut chunk = [0u8; 4096];
            // The request: its head, then the body its content-length promises.
            loop {
                let n = tcp.read(&mut chunk).await.unwrap();
                seen.extend_from_slice(&chunk[..n]);
                if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                    let text = String::from_utf8_lossy(&seen[..end]).to_lowercase();
                    let len: usize = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if seen.len() >= end + 4 + len {
                        break;
                    }
                }
            }
            let _ = seen_tx.send(seen);
            if answer == RESET {
                // Closed with a zero linger: the kernel sends a reset, not a close.
                let _ = tcp.set_zero_linger();
                return;
            }
            // The client may have given up on a broken answer already.
            let _ = tcp.write_all(answer).await;
            if !close {
                let _ = tcp.read(&mut chunk).await;
            }
        });
        let tcp = TcpStream::connect(addr).await.unwrap();
        (Connection::new(tcp), seen_rx)
    }

    /// Sends a small POST on `conn` and reads the whole answer: its status, body, and
    /// whether the connection came back for reuse.
    async fn call(mut conn: Connection) -> Result<(StatusCode, HeaderMap, Vec<u8>, bool), H1Error> {
        let mut head = RequestHead::post(b"/v1/x", b"w:1", 2);
        assert!(head.header("x-request-id", b"r1"));
        assert!(!head.header("x-injected", b"r1\r\nx-evil: 1"));
        conn.write_request(&mut head, b"{}")
            .await
            .map_err(H1Error::Io)?;
        let res = conn.read_response().await?;
        let (parts, mut body) = res.into_parts();
        let mut data = Vec::new();
        while let Some(frame) = body.frame().await {
            data.extend_from_slice(&frame?.into_data().unwrap_or_default());
        }
        let reusable = body.take_reusable().is_some();
        Ok((parts.status, parts.headers, data, reusable))
    }

    #[tokio::test]
    async fn a_request_is_written_whole_with_its_host_length_and_headers() {
        let (conn, seen) = exchange(b"HTTP/1.1 204 No Content\r\n\r\n", false).await;
        let (status, _, body, reusable) = call(conn).await.unwrap();
        assert_eq!(status, StatusCode::NO_CONTENT);
        assert!(body.is_empty());
        assert!(reusable);
        let seen = String::from_utf8(seen.await.unwrap()).unwrap();
        assert_eq!(
            seen,
            "POST /v1/x HTTP/1.1\r\nhost: w:1\r\ncontent-length: 2\r\nx-request-id: r1\r\n\r\n{}"
        );
    }

    /// Reads `answer` as if it arrived in pieces of `piece` bytes, the connection closing after
    /// the last: its status, body, and whether the connection could carry another request.
    fn decode(answer: &[u8], piece: usize) -> Result<(StatusCode, Vec<u8>, bool), H1Error> {
        let mut pieces = answer.chunks(piece);
        let mut buf = BytesMut::new();
        let mut interim = 0;
        let head = loop {
            if let Some(head) = answer_head(&mut buf, &mut interim)? {
                break head;
            }
            buf.extend_from_slice(pieces.next().ok_or(H1Error::ClosedBeforeHead)?);
        };
        let mut framing = Framing::of(&head)?;
        framing.settle(&mut buf);
        let mut body = Vec::new();
        loop {
            match framing.step(&mut buf)? {
                Step::Data(data) => body.extend_from_slice(&data),
                Step::End => break,
                Step::NeedMore => match pieces.next() {
                    Some(p) => buf.extend_from_slice(p),
                    None => framing.closed()?,
                },
            }
        }
        Ok((head.status, body, framing.reusable() && buf.is_empty()))
    }

    /// Piece sizes every framing test reads its answer in: byte by byte up to whole.
    fn piece_sizes(answer: &[u8]) -> [usize; 4] {
        [1, 3, 7, answer.len()]
    }

    #[tokio::test]
    async fn a_content_length_body_arrives_whole_in_any_pieces() {
        const ANSWER: &[u8] =
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\":\"bcd\"}";
        let (conn, _) = exchange(ANSWER, false).await;
        let (status, headers, body, reusable) = call(conn).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(body, b"{\"a\":\"bcd\"}");
        assert!(reusable);
        for piece in piece_sizes(ANSWER) {
            let (status, body, reusable) = decode(ANSWER, piece).unwrap();
            assert_eq!(status, StatusCode::OK, "piece {piece}");
            assert_eq!(body, b"{\"a\":\"bcd\"}", "piece {piece}");
            assert!(reusable, "piece {piece}");
        }
    }

    #[tokio::test]
    async fn a_chunked_body_with_extensions_and_trailers_is_decoded_in_any_pieces() {
        const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
            6\r\ndata: \r\nA;name=value\r\n0123456789\r\n1\r\n\n\r\n0\r\nx-trailer: 1\r\n\r\n";
        let (conn, _) = exchange(ANSWER, false).await;
        let (status, _, body, reusable) = call(conn).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, b"data: 0123456789\n");
        assert!(reusable);
        for piece in piece_sizes(ANSWER) {
            let (status, body, reusable) = decode(ANSWER, piece).unwrap();
            assert_eq!(status, StatusCode::OK);
            assert_eq!(body, b"data: 0123456789\n", "piece {piece}");
            assert!(reusable, "piece {piece}");
        }
    }

    #[tokio::test]
    async fn interim_heads_are_skipped() {
        const ANSWER: &[u8] =
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let (conn, _) = exchange(ANSWER, false).await;
        let (status, _, body, _) = call(conn).await.unwrap();
        assert_eq!((status, body.as_slice()), (StatusCode::OK, &b"ok"[..]));
        for piece in piece_sizes(ANSWER) {
            let (status, body, _) = decode(ANSWER, piece).unwrap();
            assert_eq!((status, body.as_slice()), (StatusCode::OK, &b"ok"[..]));
        }
    }

    #[test]
    fn a_body_framed_by_the_close_or_cut_short_reads_the_same_in_any_pieces() {
        const TO_CLOSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nto the end";
        const SHORT: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc";
        const BAD_CHUNK: &[u8] =
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n";
        for piece in piece_sizes(TO_CLOSE) {
            let (_, body, reusable) = decode(TO_CLOSE, piece).unwrap();
            assert_eq!(body, b"to the end", "piece {piece}");
            assert!(!reusable);
            assert!(matches!(decode(SHORT, piece), Err(H1Error::ClosedMidBody)));
            assert!(matches!(
                decode(BAD_CHUNK, piece),
                Err(H1Error::Malformed(_))
            ));
        }
    }

    #[tokio::test]
    async fn a_body_framed_by_the_close_ends_with_it_and_the_connection_is_not_reused() {
        const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nto the end";
        let (conn, _) = exchange(ANSWER, true).await;
        let (_, _, body, reusable) = call(conn).await.unwrap();
        assert_eq!(body, b"to the end");
        assert!(!reusable);
        // Said to close, or HTTP/1.0: read whole, not reused.
        for answer in [
            &b"HTTP/1.1 200 OK\r\nconnection: keep-alive, Close\r\ncontent-length: 2\r\n\r\nok"[..],
            b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
        ] {
            let (conn, _) = exchange(answer, false).await;
            let (_, _, body, reusable) = call(conn).await.unwrap();
            assert_eq!(body, b"ok");
            assert!(!reusable);
        }
    }

    #[tokio::test]
    async fn a_worker_that_closes_early_fails_the_answer() {
        // Before any byte, in the head, in the middle of a length, in the middle of a chunk.
        let (conn, _) = exchange(b"", true).await;
        assert!(matches!(call(conn).await, Err(H1Error::Unanswered)));
        let (conn, _) = exchange(RESET, true).await;
        assert!(matches!(call(conn).await, Err(H1Error::Unanswered)));
        let (conn, _) = exchange(b"HTTP/1.1 200 OK\r\ncontent-le", true).await;
        assert!(matches!(call(conn).await, Err(H1Error::ClosedBeforeHead)));
        let (conn, _) = exchange(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", true).await;
        assert!(matches!(call(conn).await, Err(H1Error::ClosedMidBody)));
        let (conn, _) = exchange(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab",
            true,
        )
        .await;
        assert!(matches!(call(conn).await, Err(H1Error::ClosedMidBody)));
    }

    #[tokio::test]
    async fn what_breaks_http_or_its_bounds_is_an_error() {
        let malformed: [&'static [u8]; 6] = [
            b"NOT HTTP\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 1x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n",
        ];
        for answer in malformed {
            let (conn, _) = exchange(answer, false).await;
            let got = call(conn).await;
            assert!(
                matches!(got, Err(H1Error::Malformed(_))),
                "{}: {got:?}",
                String::from_utf8_lossy(answer)
            );
        }
        // A chunk-size line that never ends, and a head past its bound.
        let long_line: &'static [u8] = Box::leak(
            [
                &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1;"[..],
                &[b'x'; 2 * MAX_CHUNK_LINE][..],
            ]
            .concat()
            .into_boxed_slice(),
        );
        let (conn, _) = exchange(long_line, false).await;
        assert!(matches!(call(conn).await, Err(H1Error::TooLarge(_))));
        let huge_head: &'static [u8] = Box::leak(
            [
                &b"HTTP/1.1 200 OK\r\nx-pad: "[..],
                &[b'a'; MAX_HEAD_BYTES + 10][..],
            ]
            .concat()
            .into_boxed_slice(),
        );
        let (conn, _) = exchange(huge_head, false).await;
        assert!(matches!(call(conn).await, Err(H1Error::TooLarge(_))));
    }

    #[tokio::test]
    async fn a_length_beside_a_coding_is_read_by_the_coding_and_the_connection_dropped() {
        const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\
            transfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
        let (conn, _) = exchange(ANSWER, false).await;
        let (_, _, body, reusable) = call(conn).await.unwrap();
        assert_eq!(body, b"ok");
        assert!(!reusable);
    }

    #[tokio::test]
    async fn an_idle_connection_the_worker_closed_is_not_open() {
        let (mut conn, _) = exchange(b"", true).await;
        let mut head = RequestHead::post(b"/", b"w", 0);
        conn.write_request(&mut head, b"").await.unwrap();
        // The worker answers nothing and closes: poll until the socket sees it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while conn.is_open() {
            assert!(std::time::Instant::now() < deadline, "close never seen");
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn chunk_sizes_parse_as_hex_with_extensions() {
        assert_eq!(parse_chunk_size(b"1aF").ok(), Some(0x1af));
        assert_eq!(parse_chunk_size(b"10 ;ext=1").ok(), Some(16));
        assert!(parse_chunk_size(b"").is_err());
        assert!(parse_chunk_size(b";x").is_err());
        assert!(parse_chunk_size(b"1 2").is_err());
        assert!(parse_chunk_size(b"1000000000000000").is_err(), "16 digits");
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"-1"), None);
        assert_eq!(parse_decimal(b"99999999999999999999"), None);
    }
}
