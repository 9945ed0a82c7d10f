//! TLS termination with a certificate generated in the test (rustls client trusting only that
//! certificate, and curl over HTTP/2), a drain with a TLS stream in flight, and the admin
//! listener behind an admin key.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::gateway::{Gateway, MODEL, TempDir, chat, config_yaml, eventually, routing_yaml, send};
use common::{Engine, assert_error};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::net::TcpStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Writes a self-signed `cert.pem` / `key.pem` for localhost and 127.0.0.1 into `dir`.
async fn self_signed(dir: &Path) {
    let out = tokio::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
        ])
        .args([
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-days",
            "1",
        ])
        // An end-entity certificate: webpki refuses a CA certificate as the server's own.
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .args(["-addext", "extendedKeyUsage=serverAuth"])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .output()
        .await
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A rustls client config trusting exactly the certificates in `ca` (none when `None`).
fn client_config(ca: Option<&Path>) -> Result<rustls::ClientConfig, BoxError> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = ca {
        for cert in CertificateDer::pem_file_iter(ca)? {
            roots.add(cert?)?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// One HTTP/1.1 request over TLS to `addr` as `localhost`: status and body text.
async fn https(
    addr: std::net::SocketAddr,
    cfg: rustls::ClientConfig,
    method: Method,
    path: &str,
    body: Option<String>,
) -> Result<(StatusCode, String), BoxError> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = TcpStream::connect(addr).await?;
    let tls = connector
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, "localhost");
    if body.is_some() {
        req = req.header(CONTENT_TYPE, "application/json");
    }
    let res = sender
        .send_request(req.body(Full::new(Bytes::from(body.unwrap_or_default())))?)
        .await?;
    let status = res.status();
    let bytes = res.into_body().collect().await?.to_bytes();
    conn.abort();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

#[tokio::test]
async fn tls_terminates_with_the_configured_certificate() {
    let engine = Engine::start(&["--gpu", "h100"]).await;
    let dir = TempDir::new("tls");
    self_signed(&dir.path).await;
    dir.write_config(&config_yaml(
        &[&engine.url],
        "tls: {cert: cert.pem, key: key.pem}\n",
    ));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    assert!(gw.url.starts_with("https://"), "{}", gw.url);
    let ca = dir.path.join("cert.pem");
    let trusted = || client_config(Some(&ca)).expect("client config");

    eventually("HTTPS /readyz 200", Duration::from_secs(10), || async {
        let res = https(gw.addr, trusted(), Method::GET, "/readyz", None).await;
        matches!(res, Ok((StatusCode::OK, _))).then_some(())
    })
    .await;
    let (status, models) = https(gw.addr, trusted(), Method::GET, "/v1/models", None)
        .await
        .expect("HTTPS /v1/models");
    assert_eq!(status, StatusCode::OK);
    assert!(models.contains(MODEL), "{models}");
    let body = chat("Be brief.", "Hello over TLS.", 4, false).to_string();
    let (status, text) = https(
        gw.addr,
        trusted(),
        Method::POST,
        "/v1/chat/completions",
        Some(body),
    )
    .await
    .expect("HTTPS chat");
    assert_eq!(status, StatusCode::OK, "{text}");
    let res: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(res["usage"]["completion_tokens"], 4, "{res}");

    // A client that does not trust the certificate fails the handshake.
    let untrusted = client_config(None).expect("client config");
    let res = https(gw.addr, untrusted, Method::GET, "/readyz", None).await;
    assert!(res.is_err(), "an untrusting client got {res:?}");
    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain = send(
        Method::GET,
        &format!("http://{}/readyz", gw.addr),
        &[],
        None,
    )
    .await;
    assert!(plain.is_err(), "plain HTTP answered: {plain:?}");

    // curl with the CA negotiates HTTP/2 by ALPN and streams a completion.
    let port = gw.addr.port();
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "-N", "--http2", "--max-time", "20", "--cacert"])
        .arg(&ca)
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
        .args(["-H", "content-type: application/json", "-d"])
        .arg(chat("Be brief.", "Stream over h2.", 5, true).to_string())
        .args(["-w", "\nhttp_version=%{http_version}"])
        .arg(format!("https://localhost:{port}/v1/chat/completions"))
        .output()
        .await
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.ends_with("http_version=2"), "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
    assert_eq!(text.matches("chat.completion.chunk").count(), 7, "{text}");
}

#[tokio::test]
async fn sigterm_drains_a_tls_stream_and_exits_zero() {
    let engine = Engine::start(&["--gpu", "l4"]).await;
    let dir = TempDir::new("tls-drain");
    self_signed(&dir.path).await;
    let extra = "tls: {cert: cert.pem, key: key.pem}\ndrain: {grace: 20s}\n";
    dir.write_config(&config_yaml(&[&engine.url], extra));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let mut gw = Gateway::start(&dir.config(), &[]).await;
    let cfg = client_config(Some(&dir.path.join("cert.pem"))).expect("client config");

    // ~4 s of tokens on an L4: long enough to be seen running by a poll on a busy machine.
    let body = chat("You narrate slowly.", "A story over TLS.", 60, true).to_string();
    let addr = gw.addr;
    let streamed = tokio::spawn(async move {
        https(addr, cfg, Method::POST, "/v1/chat/completions", Some(body)).await
    });
    let running = eventually("stream running", Duration::from_secs(10), || async {
        if streamed.is_finished() {
            return Some(false);
        }
        let w = gw.worker_status(&engine.url).await;
        (w["in_flight"] == 1).then_some(true)
    })
    .await;
    if !running {
        let ended = streamed.await.expect("stream task");
        panic!(
            "the stream ended before it was seen running: {ended:?}; stderr:\n{}",
            gw.stderr()
        );
    }
    gw.signal("TERM");
    let exit = gw.wait_exit(Duration::from_secs(20)).await;
    let result = streamed.await.expect("stream task");
    let (status, text) = result.unwrap_or_else(|e| {
        panic!(
            "TLS stream broken by the drain ({e}); gateway {exit}; stderr:\n{}",
            gw.stderr()
        )
    });
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(exit.success(), "exit {exit}; stderr:\n{}", gw.stderr());
}

#[tokio::test]
async fn admin_listener_requires_the_admin_key_when_configured() {
    const KEY_ENV: &str = "INFERGATE_E2E_ADMIN_KEY";
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let key = format!("e2e-{:x}-{nanos:x}", std::process::id());
    let engine = Engine::start(&["--gpu", "h100"]).await;
    let dir = TempDir::new("admin");
    let extra = format!("admin:\n  listen: \"127.0.0.1:0\"\n  api_key_env: {KEY_ENV}\n");
    let config =
        config_yaml(&[&engine.url], "").replace("admin:\n  listen: \"127.0.0.1:0\"\n", &extra);
    assert!(config.contains(KEY_ENV), "{config}");
    dir.write_config(&config);
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[(KEY_ENV, key.as_str())]).await;
    let status_url = gw.admin_at("/admin/status");

    let (status, _, text) = send(Method::GET, &status_url, &[], None).await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
    assert_error(
        status,
        &serde_json::from_str(&text).unwrap(),
        &["admin key"],
    );
    let wrong = [("authorization", "Bearer not-the-key")];
    let (status, _, _) = send(Method::GET, &status_url, &wrong, None).await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = send(Method::POST, &gw.admin_at("/admin/reload"), &[], None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let auth = format!("Bearer {key}");
    let good = [("authorization", auth.as_str())];
    let (status, _, text) = send(Method::GET, &status_url, &good, None).await.unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
    let s: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(s["ready"], true, "{s}");
    assert_eq!(
        s["pools"][0]["workers"][0]["url"],
        engine.url.as_str(),
        "{s}"
    );
    let (status, _, text) = send(Method::POST, &gw.admin_at("/admin/reload"), &good, None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");

    // Admin routes live only on the admin listener.
    let (status, _, _) = send(Method::GET, &gw.at("/admin/status"), &good, None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Over TLS as over plain HTTP: half a header block, then silence, is answered 408 (encrypted)
/// when the header timer fires, and the connection closed; normal clients are served meanwhile.
#[tokio::test]
async fn a_half_sent_header_over_tls_gets_408_at_the_header_deadline() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let engine = Engine::start(&["--gpu", "h100"]).await;
    let dir = TempDir::new("tls-408");
    self_signed(&dir.path).await;
    dir.write_config(&config_yaml(
        &[&engine.url],
        "tls: {cert: cert.pem, key: key.pem}\nlimits: {header_read_timeout: 1s}\n",
    ));
    dir.write_routing(&routing_yaml("round_robin", &[]));
    let gw = Gateway::start(&dir.config(), &[]).await;
    let ca = dir.path.join("cert.pem");
    let cfg = client_config(Some(&ca)).expect("client config");
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = TcpStream::connect(gw.addr).await.expect("connect");
    let mut tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake");
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .expect("write half a header");
    tls.flush().await.expect("flush");
    let started = std::time::Instant::now();
    // Meanwhile a normal client is served.
    let (status, _) = https(
        gw.addr,
        client_config(Some(&ca)).unwrap(),
        Method::GET,
        "/healthz",
        None,
    )
    .await
    .expect("HTTPS /healthz");
    assert_eq!(status, StatusCode::OK);
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut got)).await;
    let after = started.elapsed();
    // rustls may report the peer's close without close_notify as an error after the data.
    assert!(read.is_ok(), "not closed within 5 s");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text:?} after {after:?}");
    assert!(text.contains("did not arrive within"), "{text}");
    assert!(
        after >= Duration::from_millis(500),
        "answered after {after:?}"
    );
}
