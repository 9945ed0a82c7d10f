//! HTTP/1.1 over loopback, as clients see the servers under test: kept-alive connections (with
//! an optional `Authorization: Bearer` key), one-shot exchanges on fresh connections, whole
//! answers as text or JSON, and the OpenAI error shape. Every exchange runs under a deadline.

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// Boxed error of the raw HTTP helpers.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long any single HTTP exchange may take before the test fails.
pub const HTTP_DEADLINE: Duration = Duration::from_secs(30);

/// The task driving one client connection; dropping this closes the socket, so a request
/// future cancelled mid-flight disconnects like a client that went away.
struct ConnTask(JoinHandle<()>);

impl Drop for ConnTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One kept-alive HTTP/1.1 client connection; dropping it closes the socket.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    authority: String,
    _task: ConnTask,
}

impl Conn {
    /// Connects (with `TCP_NODELAY`) to the host of `url` (`http://HOST:PORT`, a path allowed).
    pub async fn open(url: &str) -> Result<Conn, BoxError> {
        let uri: Uri = url.parse()?;
        let authority = uri.authority().ok_or("URL without authority")?.to_string();
        let tcp = TcpStream::connect(authority.as_str()).await?;
        tcp.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        let task = ConnTask(tokio::spawn(async move {
            let _ = conn.await;
        }));
        Ok(Conn {
            sender,
            authority,
            _task: task,
        })
    }

    /// True when the server closed the connection (or it failed).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Sends one request (a JSON body when given) and returns once the response head arrived.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Response<Incoming>, BoxError> {
        self.send_with(method, path, &[], body).await
    }

    /// [`send`](Self::send) with `Authorization: Bearer KEY` when `key` is given.
    pub async fn send_as(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        key: Option<&str>,
    ) -> Result<Response<Incoming>, BoxError> {
        let auth = key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> = auth
            .iter()
            .map(|a| (AUTHORIZATION.as_str(), a.as_str()))
            .collect();
        self.send_with(method, path, &headers, body).await
    }

    /// [`send`](Self::send) with extra request headers.
    pub async fn send_with(
        &mut self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<Response<Incoming>, BoxError> {
        self.sender.ready().await?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.authority.as_str());
        if body.is_some() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req.body(Full::new(body.unwrap_or_default()))?;
        Ok(self.sender.send_request(req).await?)
    }

    /// One whole exchange with `key` (if any): an empty `body` is sent without a content type.
    pub async fn exchange(
        &mut self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Bytes,
    ) -> Result<Reply, BoxError> {
        let t0 = Instant::now();
        let body = (!body.is_empty()).then_some(body);
        let (parts, body) = self.send_as(method, path, body, key).await?.into_parts();
        let bytes = body.collect().await?.to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            text: String::from_utf8_lossy(&bytes).into_owned(),
            elapsed: t0.elapsed(),
            at: Instant::now(),
        })
    }
}

/// A whole answer, timed.
#[derive(Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: StatusCode,
    /// Response headers.
    pub headers: HeaderMap,
    /// The body as text.
    pub text: String,
    /// From sending the request to the end of the body.
    pub elapsed: Duration,
    /// When the end of the body arrived.
    pub at: Instant,
}

impl Reply {
    /// The body parsed as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("{} answer is not JSON ({e}): {:?}", self.status, self.text))
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A header as a whole number (panics when absent or not a number).
    pub fn header_u64(&self, name: &str) -> u64 {
        let v = self
            .header(name)
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers));
        v.parse()
            .unwrap_or_else(|_| panic!("{name}: {v:?} is not a number"))
    }
}

/// The path (and query) of `url`, `/` when it has none.
fn path_of(url: &str) -> Result<String, BoxError> {
    let uri: Uri = url.parse()?;
    Ok(uri.path_and_query().map_or("/", |p| p.as_str()).to_owned())
}

/// `POST url` with `key` and a raw body on a fresh connection, failing the test on any error.
pub async fn post_raw_as(url: &str, key: Option<&str>, body: impl Into<Bytes>) -> Reply {
    let body = body.into();
    let exchange = async {
        let path = path_of(url)?;
        let mut conn = Conn::open(url).await?;
        conn.exchange(Method::POST, &path, key, body).await
    };
    tokio::time::timeout(HTTP_DEADLINE, exchange)
        .await
        .unwrap_or_else(|_| panic!("POST {url} timed out"))
        .unwrap_or_else(|e| panic!("POST {url}: {e}"))
}

/// `POST url` with `key` and a JSON body on a fresh connection.
pub async fn post_as(url: &str, key: Option<&str>, body: &Value) -> Reply {
    post_raw_as(url, key, body.to_string()).await
}

/// An open HTTP/1.1 exchange on its own connection; dropping it closes the socket.
pub struct Exchange {
    /// Response status.
    pub status: StatusCode,
    /// Response headers.
    pub headers: HeaderMap,
    /// The response body, read as it arrives.
    pub body: Incoming,
    _conn: Conn,
}

/// Sends one request on a fresh connection and returns once the response head arrived.
pub async fn open(method: Method, url: &str, body: Option<Bytes>) -> Result<Exchange, BoxError> {
    open_with(method, url, &[], body).await
}

/// [`open`] with extra request headers.
pub async fn open_with(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Bytes>,
) -> Result<Exchange, BoxError> {
    let path = path_of(url)?;
    let mut conn = Conn::open(url).await?;
    let (parts, body) = conn
        .send_with(method, &path, headers, body)
        .await?
        .into_parts();
    Ok(Exchange {
        status: parts.status,
        headers: parts.headers,
        body,
        _conn: conn,
    })
}

/// Reads the rest of `ex`: status, headers and the whole body.
async fn collect(mut ex: Exchange) -> Result<(StatusCode, HeaderMap, Bytes), BoxError> {
    let bytes = (&mut ex.body).collect().await?.to_bytes();
    Ok((ex.status, ex.headers, bytes))
}

/// One whole request/response on a fresh connection.
pub async fn request(
    method: Method,
    url: &str,
    body: Option<Bytes>,
) -> Result<(StatusCode, HeaderMap, Bytes), BoxError> {
    collect(open(method, url, body).await?).await
}

/// One request on a fresh connection with extra `headers`, under [`HTTP_DEADLINE`]: status,
/// headers and body text.
pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> Result<(StatusCode, HeaderMap, String), BoxError> {
    let exchange =
        async { collect(open_with(method, url, headers, body.map(Bytes::from)).await?).await };
    let (status, headers, body) = tokio::time::timeout(HTTP_DEADLINE, exchange)
        .await
        .map_err(|_| format!("{url}: no answer within {HTTP_DEADLINE:?}"))??;
    Ok((status, headers, String::from_utf8_lossy(&body).into_owned()))
}

/// `GET url` → status and body text.
pub async fn get(url: &str) -> (StatusCode, String) {
    let (status, _, body) = send(Method::GET, url, &[], None)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (status, body)
}

/// `POST url` with a raw body → status, headers and body text.
pub async fn post_raw(url: &str, body: impl Into<String>) -> (StatusCode, HeaderMap, String) {
    send(Method::POST, url, &[], Some(body.into()))
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"))
}

/// `POST url` with a JSON body → status, headers and the parsed JSON answer.
pub async fn post_json(url: &str, body: &Value) -> (StatusCode, HeaderMap, Value) {
    let (status, headers, text) = post_raw(url, body.to_string()).await;
    let json = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{status} answer is not JSON ({e}): {text:?}"));
    (status, headers, json)
}

/// Polls `GET url` until it answers 200, giving up after `within`; each attempt may take 2 s.
pub async fn wait_ok(url: &str, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        let attempt =
            tokio::time::timeout(Duration::from_secs(2), request(Method::GET, url, None)).await;
        let other = match attempt {
            Ok(Ok((StatusCode::OK, _, _))) => return Ok(()),
            Ok(Ok((status, _, body))) => format!("{status} {}", String::from_utf8_lossy(&body)),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 2s".to_owned(),
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "{url} never answered 200 within {within:?}: {other}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts the OpenAI error shape `{"error":{"message","type","param","code"}}` with `code ==
/// status`, and that the message contains every one of `needles`; returns the inner object.
pub fn assert_error(status: StatusCode, body: &Value, needles: &[&str]) -> Value {
    let err = body
        .get("error")
        .unwrap_or_else(|| panic!("no `error` in {body}"));
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");
    let message = err["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error.message in {body}"));
    assert!(err["type"].is_string(), "no error.type in {body}");
    assert!(
        err.as_object().unwrap().contains_key("param"),
        "no error.param in {body}"
    );
    assert_eq!(err["code"], status.as_u16(), "{body}");
    for needle in needles {
        assert!(
            message.contains(needle),
            "error message {message:?} lacks {needle:?}"
        );
    }
    err.clone()
}
