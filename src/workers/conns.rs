//! Keep-alive HTTP/1.1 connections to one worker, kept by the worker itself. A checkout pops the
//! worker's own idle list (no pool map shared by every worker, no key to hash), the request is
//! written and its answer read by the request's own task ([`super::h1`]), and a connection goes
//! back when its answer's body has been read to the end (`ProxyBody`), not from a task spawned
//! per request to watch it.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use hyper::Response;
use hyper::Uri;

use super::h1::{Connection, H1Error, RequestHead, WorkerBody};

/// Idle connections kept per worker; one more answer finishing while the list is full closes
/// its connection.
const MAX_IDLE: usize = 256;

/// An idle connection unused this long is closed instead of reused (workers close theirs too).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Why a request got no answer from the worker.
#[derive(Debug)]
pub enum SendError {
    /// No connection could be opened: refused, unreachable, timed out, or a URL that is not
    /// plain `http://`. Says nothing of the worker's address (the client may see it).
    Connect(String),
    /// The connection failed before the answer's head, or the head broke HTTP/1.1.
    Send(H1Error),
}

impl SendError {
    /// Whether no connection could be opened (the request never left).
    pub fn is_connect(&self) -> bool {
        matches!(self, SendError::Connect(_))
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Connect(why) => write!(f, "connect failed: {why}"),
            SendError::Send(e) => write!(f, "{e}"),
        }
    }
}

/// Where and how to reach one worker, and its idle connections.
#[derive(Debug)]
pub struct Conns {
    /// `host:port` to connect to; `Err` says why the URL cannot be reached.
    addr: Result<String, &'static str>,
    /// The `Host` header of every request.
    host: String,
    /// The URL's path (a worker behind a path-routing proxy), prefixed to every request path;
    /// empty for most workers.
    base_path: String,
    /// Oldest at the front; checkouts take the newest (the one least likely closed meanwhile).
    idle: Mutex<VecDeque<(Instant, Connection)>>,
}

impl Conns {
    /// The connections of the worker at `url` (none open yet).
    pub fn new(url: &str) -> Self {
        let parsed = url.parse::<Uri>();
        let addr = match &parsed {
            Err(_) => Err("the worker URL does not parse"),
            Ok(u) if u.scheme_str() != Some("http") => Err("the worker URL is not plain http://"),
            Ok(u) => match u.authority() {
                None => Err("the worker URL has no host"),
                Some(a) => Ok(format!("{}:{}", a.host(), a.port_u16().unwrap_or(80))),
            },
        };
        // Host and port only: never the URL's user info, and no port when it is the default.
        let host = parsed
            .as_ref()
            .ok()
            .and_then(Uri::authority)
            .map(|a| match a.port_u16() {
                Some(port) if port != 80 => format!("{}:{port}", a.host()),
                _ => a.host().to_string(),
            })
            .unwrap_or_default();
        let base_path = parsed
            .as_ref()
            .map(|u| u.path().trim_end_matches('/').to_string())
            .unwrap_or_default();
        Self {
            addr,
            host,
            base_path,
            idle: Mutex::new(VecDeque::new()),
        }
    }

    /// The head of a POST of `body_len` bytes to `path` on this worker (its URL's path kept
    /// in front), with its `Host`; the caller adds its own headers.
    pub fn post_head(&self, path: &'static str, body_len: usize) -> RequestHead {
        if self.base_path.is_empty() {
            return RequestHead::post(path.as_bytes(), self.host.as_bytes(), body_len);
        }
        let target = format!("{}{path}", self.base_path);
        RequestHead::post(target.as_bytes(), self.host.as_bytes(), body_len)
    }

    /// Sends `head` and `body` on an idle connection, or on a new one opened within
    /// `connect_timeout`, and reads the answer's head. A pooled connection the worker closed
    /// meanwhile is skipped, as is one whose write fails (nothing of the request reached the
    /// worker's application). The answer's body holds the connection: read to its end, it goes
    /// back with [`Conns::put`].
    pub async fn send(
        &self,
        mut head: RequestHead,
        body: &[u8],
        connect_timeout: Duration,
    ) -> Result<Response<WorkerBody>, SendError> {
        while let Some(mut conn) = self.take() {
            if conn.write_request(&mut head, body).await.is_err() {
                continue;
            }
            match conn.read_response().await {
                // The worker closed the kept connection as the request went out (the close
                // probe at checkout sees a close only once the reactor has: a close in flight
                // can pass it): no byte of an answer came, so the next connection takes it.
                Err(H1Error::Unanswered) => continue,
                answer => return answer.map_err(SendError::Send),
            }
        }
        let mut conn = self.connect(connect_timeout).await?;
        conn.write_request(&mut head, body)
            .await
            .map_err(|e| SendError::Send(H1Error::Io(e)))?;
        conn.read_response().await.map_err(SendError::Send)
    }

    /// Gives back a connection whose last answer was read to the end `now` (the caller's
    /// clock reading, so the hot path reads the clock once).
    pub fn put(&self, conn: Connection, now: Instant) {
        let mut idle = self.lock();
        evict_older(&mut idle, now);
        if idle.len() < MAX_IDLE {
            idle.push_back((now, conn));
        }
    }

    /// Closes the connections idle longer than [`IDLE_TIMEOUT`] (the poller calls this, so
    /// a worker without traffic does not keep them open).
    pub fn evict_idle(&self, now: Instant) {
        evict_older(&mut self.lock(), now);
    }

    /// Idle connections kept now.
    pub fn idle(&self) -> usize {
        self.lock().len()
    }

    fn take(&self) -> Option<Connection> {
        let now = Instant::now();
        let mut idle = self.lock();
        while let Some((at, mut conn)) = idle.pop_back() {
            // The newest is idle too long: so are all the others.
            if now.duration_since(at) > IDLE_TIMEOUT {
                idle.clear();
                return None;
            }
            if conn.is_open() {
                return Some(conn);
            }
        }
        None
    }

    async fn connect(&self, timeout: Duration) -> Result<Connection, SendError> {
        let addr = self
            .addr
            .as_deref()
            .map_err(|why| SendError::Connect(why.to_string()))?;
        let tcp = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(e)) => return Err(SendError::Connect(e.to_string())),
            Err(_) => return Err(SendError::Connect(format!("timed out after {timeout:?}"))),
        };
        // Requests and answers are small writes each: no Nagle delay.
        let _ = tcp.set_nodelay(true);
        Ok(Connection::new(tcp))
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<(Instant, Connection)>> {
        // The list holds no invariant a panic could break.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn evict_older(idle: &mut VecDeque<(Instant, Connection)>, now: Instant) {
    while idle
        .front()
        .is_some_and(|(at, _)| now.duration_since(*at) > IDLE_TIMEOUT)
    {
        idle.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use hyper::Request;
    use hyper::body::{Bytes, Incoming};
    use hyper::header::{HOST, HeaderValue};
    use hyper_util::rt::TokioIo;

    #[test]
    fn request_targets_keep_the_worker_urls_path() {
        for (url, want) in [
            ("http://10.0.0.5:8000", "/v1/chat/completions"),
            ("http://10.0.0.5:8000/", "/v1/chat/completions"),
            ("http://[::1]:9", "/v1/chat/completions"),
            // A path prefix (a worker behind a path-routing proxy) is kept.
            ("http://h:1/engine-a", "/engine-a/v1/chat/completions"),
            ("http://h:1/engine-a/", "/engine-a/v1/chat/completions"),
        ] {
            let head = Conns::new(url).post_head("/v1/chat/completions", 2);
            let line = format!("POST {want} HTTP/1.1\r\n");
            assert!(head.as_bytes().starts_with(line.as_bytes()), "{url}");
        }
    }

    #[test]
    fn addresses_default_the_port_and_refuse_what_is_not_plain_http() {
        assert_eq!(
            Conns::new("http://10.0.0.5:8000").addr.as_deref(),
            Ok("10.0.0.5:8000")
        );
        assert_eq!(Conns::new("http://h").addr.as_deref(), Ok("h:80"));
        assert_eq!(Conns::new("http://[::1]:9").addr.as_deref(), Ok("[::1]:9"));
        assert!(Conns::new("https://h").addr.is_err());
        assert!(Conns::new("not a url").addr.is_err());
        for (url, host) in [
            ("http://h:1/x", "h:1"),
            ("http://user:secret@h:8000", "h:8000"),
            ("http://h:80", "h"),
            ("http://[::1]:9", "[::1]:9"),
        ] {
            assert_eq!(Conns::new(url).host, host, "{url}");
        }
    }

    #[tokio::test]
    async fn an_unreachable_worker_is_a_connect_error_without_its_address() {
        // A port just freed: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let conns = Conns::new(&format!("http://127.0.0.1:{port}"));
        let head = conns.post_head("/v1/chat/completions", 2);
        let err = conns
            .send(head, b"{}", Duration::from_secs(2))
            .await
            .err()
            .unwrap();
        assert!(err.is_connect(), "{err}");
        assert!(!err.to_string().contains(&port.to_string()), "{err}");
        let https = Conns::new("https://h");
        let head = https.post_head("/v1/chat/completions", 0);
        let sent = https.send(head, b"", Duration::from_secs(2)).await;
        assert!(sent.err().is_some_and(|e| e.is_connect()));
    }

    /// A worker on loopback that answers `ok`, closing the connection after each answer when
    /// `close` is set; returns its URL and its count of accepted connections.
    async fn worker(close: bool) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = std::sync::Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| async move {
                    let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
                    let host = req.headers().get(HOST).cloned();
                    if let Some(h) = host {
                        res.headers_mut().insert("x-host", h);
                    }
                    if close {
                        res.headers_mut()
                            .insert("connection", HeaderValue::from_static("close"));
                    }
                    Ok::<_, std::convert::Infallible>(res)
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc),
                );
            }
        });
        (url, accepted)
    }

    /// One request through `conns`, its body read to the end and its connection given back.
    async fn round_trip(conns: &Conns) -> Response<Bytes> {
        use http_body_util::BodyExt;
        let head = conns.post_head("/v1/chat/completions", 2);
        let res = conns
            .send(head, b"{}", Duration::from_secs(5))
            .await
            .unwrap();
        let (parts, mut body) = res.into_parts();
        let mut bytes = Vec::new();
        while let Some(frame) = body.frame().await {
            bytes.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        if let Some(conn) = body.take_reusable() {
            conns.put(conn, Instant::now());
        }
        Response::from_parts(parts, Bytes::from(bytes))
    }

    #[tokio::test]
    async fn a_connection_read_to_the_end_is_reused_and_one_the_worker_closed_is_not() {
        use std::sync::atomic::Ordering;
        let (url, accepted) = worker(false).await;
        let conns = Conns::new(&url);
        for _ in 0..5 {
            let res = round_trip(&conns).await;
            assert_eq!(res.body().as_ref(), b"ok");
            assert_eq!(
                res.headers().get("x-host").map(HeaderValue::as_bytes),
                Some(url.trim_start_matches("http://").as_bytes())
            );
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for five"
        );
        assert_eq!(conns.idle(), 1);

        // A worker that closes after each answer: every request still gets one, each on a
        // new connection, and no closed connection is kept.
        let (url, accepted) = worker(true).await;
        let conns = Conns::new(&url);
        for _ in 0..3 {
            assert_eq!(round_trip(&conns).await.body().as_ref(), b"ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn idle_connections_past_the_timeout_are_closed() {
        let (url, _) = worker(false).await;
        let conns = Conns::new(&url);
        round_trip(&conns).await;
        assert_eq!(conns.idle(), 1);
        conns.evict_idle(Instant::now() + IDLE_TIMEOUT / 2);
        assert_eq!(conns.idle(), 1);
        conns.evict_idle(Instant::now() + IDLE_TIMEOUT + Duration::from_secs(1));
        assert_eq!(conns.idle(), 0);
    }

    #[tokio::test]
    async fn a_kept_connection_closed_as_the_request_goes_out_passes_it_to_a_new_one() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = std::sync::Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        // The first connection answers one request, then reads the next and closes without a
        // byte of answer (an idle close racing the request); later ones answer every request.
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let first = count.fetch_add(1, Ordering::SeqCst) == 0;
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    for n in 0.. {
                        let mut seen = Vec::new();
                        while !seen.ends_with(b"{}") {
                            match tcp.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(k) => seen.extend_from_slice(&buf[..k]),
                            }
                        }
                        if first && n == 1 {
                            return;
                        }
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if tcp.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let conns = Conns::new(&url);
        for _ in 0..3 {
            assert_eq!(round_trip(&conns).await.body().as_ref(), b"ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
