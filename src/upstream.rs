//! The pooled HTTP client the gateway uses for side traffic to workers: metric polls, KV event
//! streams, mirrored and shadow copies. Proxied requests go on each worker's own connections
//! ([`crate::workers::conns`]).

use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Keep-alive client over plain HTTP to workers.
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// A client with the given connect timeout; idle connections are kept for reuse.
pub fn client(connect_timeout: Duration) -> UpstreamClient {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(256)
        .build(http)
}
