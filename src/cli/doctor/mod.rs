//! `infergate doctor`: names the on-call symptom (3.1–3.5) the live metrics show, with its
//! mechanism, lever, confirming measurement and falsifier.
//!
//! It reads the gateway's admin `/metrics` twice, a window apart (the gateway carries what it
//! polls from its workers, see `workers::triage_export`), or asks a Prometheus for the same
//! window; turns the window into a [`snapshot::Snapshot`] of plain numbers; and runs the pure
//! rules of [`rules`] over it. I/O lives here, everything else is pure and tested.

pub mod expo;
pub mod prom;
pub mod report;
pub mod rules;
pub mod snapshot;
pub mod window;

use std::time::{Duration, Instant};

use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;

use expo::parse_exposition;
use snapshot::Snapshot;
use window::WindowData;

/// Largest answer doctor reads from the gateway or Prometheus.
const MAX_BODY_BYTES: usize = 64 << 20;
/// Time allowed for one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `infergate doctor` arguments.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["admin", "prometheus"])))]
pub struct DoctorArgs {
    /// The gateway's admin URL (e.g. http://127.0.0.1:9091): its `/metrics` is read twice, a
    /// window apart.
    #[arg(long)]
    pub admin: Option<String>,
    /// A Prometheus URL (e.g. http://127.0.0.1:9090) scraping the gateway: the window is read
    /// with PromQL instead.
    #[arg(long)]
    pub prometheus: Option<String>,
    /// The window measured (e.g. 30s, 2m).
    #[arg(long, default_value = "30s", value_parser = infergate::duration::parse)]
    pub window: Duration,
    /// Only this pool's workers (default: all pools together).
    #[arg(long)]
    pub pool: Option<String>,
    /// The admin key, when the gateway's admin port requires one.
    #[arg(long)]
    pub admin_key: Option<String>,
    /// Print JSON: `{"findings": [...], "missing": [...], "snapshot": {...}}`.
    #[arg(long)]
    pub json: bool,
}

/// `GET url`, its body as text; `bearer` sent as the admin key.
async fn get(url: &str, bearer: Option<&str>) -> Result<String, String> {
    let client = infergate::upstream::client(REQUEST_TIMEOUT);
    let uri: hyper::Uri = url.parse().map_err(|e| format!("bad URL {url}: {e}"))?;
    let mut req = hyper::Request::get(uri);
    if let Some(key) = bearer {
        req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let req = req
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let fetch = async {
        let res = client
            .request(req)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let status = res.status();
        let body = http_body_util::Limited::new(res.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| format!("{url}: {e}"))?
            .to_bytes();
        let text = String::from_utf8_lossy(&body).into_owned();
        if status.is_success() {
            Ok(text)
        } else {
            Err(format!("{url} answered {status}: {}", text.trim()))
        }
    };
    tokio::time::timeout(REQUEST_TIMEOUT, fetch)
        .await
        .map_err(|_| format!("{url}: no answer within {REQUEST_TIMEOUT:?}"))?
}

/// Two scrapes of the gateway's `/metrics`, a window apart.
async fn admin_window(args: &DoctorArgs, admin: &str) -> Result<WindowData, String> {
    let url = format!("{}/metrics", admin.trim_end_matches('/'));
    let key = args.admin_key.as_deref();
    let before = parse_exposition(&get(&url, key).await?);
    let started = Instant::now();
    tokio::time::sleep(args.window).await;
    let after = parse_exposition(&get(&url, key).await?);
    let window_s = started.elapsed().as_secs_f64();
    Ok(WindowData::from_scrapes(
        &before,
        &after,
        window_s,
        args.pool.as_deref(),
    ))
}

/// The window through Prometheus' instant-query API.
async fn prometheus_window(args: &DoctorArgs, base: &str) -> Result<WindowData, String> {
    let base = base.trim_end_matches('/');
    prom::window(args.window, args.pool.as_deref(), |q| async move {
        get(
            &format!("{base}/api/v1/query?query={}", prom::encode(&q)),
            None,
        )
        .await
    })
    .await
}

/// Runs doctor: the report as text (or JSON).
pub async fn run(args: &DoctorArgs) -> Result<String, String> {
    let data = match (&args.admin, &args.prometheus) {
        (Some(admin), _) => admin_window(args, admin).await?,
        (None, Some(prom)) => prometheus_window(args, prom).await?,
        (None, None) => return Err("give --admin URL or --prometheus URL".into()),
    };
    let snapshot = Snapshot::of(&data);
    let diagnosis = rules::diagnose(&snapshot);
    Ok(if args.json {
        report::json(&diagnosis, &snapshot)
    } else {
        report::text(&diagnosis, &snapshot)
    })
}
