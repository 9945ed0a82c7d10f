//! A stand-in worker on loopback for answers no real engine gives on demand (a 503 every time, a
//! usage without cached tokens): `GET /metrics` serves idle vLLM gauges and `GET /ready` 200, so
//! the gateway's poller keeps it healthy and warm, and every other request gets what `answer`
//! returns for its method and path.

use std::convert::Infallible;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};

/// Idle vLLM gauges, as the poller reads them.
const IDLE_METRICS: &str =
    "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n";

/// Starts the worker on an ephemeral port and returns its URL; it serves until the test ends.
pub async fn stand_in_worker<F>(answer: F) -> String
where
    F: Fn(&Method, &str) -> (StatusCode, String) + Send + Sync + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("local address"));
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (status, body) = match (req.method(), req.uri().path()) {
                        (&Method::GET, "/metrics") => (StatusCode::OK, IDLE_METRICS.to_string()),
                        (&Method::GET, "/ready") => (StatusCode::OK, String::new()),
                        (method, path) => answer(method, path),
                    };
                    let mut res = Response::new(Full::new(Bytes::from(body)));
                    *res.status_mut() = status;
                    async move { Ok::<_, Infallible>(res) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    url
}
