//! Prometheus text as the tests read it: one sample picked by name and a subset of its labels.

use std::time::Duration;

use hyper::StatusCode;

use super::http::get;

/// How often the harness reads a metric it waits on.
pub const METRIC_POLL: Duration = Duration::from_millis(10);

/// Finds `selector` in Prometheus text: a metric name, optionally followed by `{k="v",...}`
/// naming a subset of the series' labels. Returns the first matching sample.
pub fn find_metric(text: &str, selector: &str) -> Option<f64> {
    let (name, want) = match selector.split_once('{') {
        Some((n, rest)) => (n, rest.trim_end_matches('}')),
        None => (selector, ""),
    };
    let wanted: Vec<&str> = want.split(',').filter(|s| !s.is_empty()).collect();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            let have: Vec<&str> = labels.split(',').collect();
            (series_name == name && wanted.iter().all(|w| have.contains(w)))
                .then(|| value.parse().ok())
                .flatten()
        })
}

/// Reads `/metrics` at `url` and returns the value of `selector` (see [`find_metric`]).
pub async fn metric(url: &str, selector: &str) -> f64 {
    let (status, text) = get(url).await;
    assert_eq!(status, StatusCode::OK, "GET {url}");
    find_metric(&text, selector).unwrap_or_else(|| panic!("no metric {selector} in:\n{text}"))
}
