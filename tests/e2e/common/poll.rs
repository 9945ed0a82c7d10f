//! Waiting without sleeping blindly: poll a probe against a deadline.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `probe` every 20 ms until it yields a value, failing the test after `within`.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads a value every `every` until `pred` holds of it or `within` passes; returns the last value
/// read, so the caller's assertion shows it.
pub async fn settle<T, F, Fut>(
    within: Duration,
    every: Duration,
    mut read: F,
    pred: impl Fn(&T) -> bool,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let deadline = Instant::now() + within;
    loop {
        let v = read().await;
        if pred(&v) || Instant::now() >= deadline {
            return v;
        }
        tokio::time::sleep(every).await;
    }
}
