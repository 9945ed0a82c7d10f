//! Releasing the plan: open loop (each request spawned at its planned time, whatever earlier ones
//! are doing, bounded only by the connection limit) or closed loop (`concurrency` clients, each
//! sending its next request when the previous one ends). Returns every record, in plan order.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::client::Target;
use super::progress::Progress;
use crate::report::RequestRecord;
use crate::workload::PlannedRequest;

/// The records of a run and how long it took, first send to last answer.
#[derive(Debug)]
pub struct Outcome {
    /// One record per request sent, ordered by plan id.
    pub records: Vec<RequestRecord>,
    /// Wall time of the run.
    pub elapsed: Duration,
}

fn finish(mut records: Vec<RequestRecord>, started: Instant) -> Outcome {
    records.sort_by_key(|r| r.id);
    Outcome {
        records,
        elapsed: started.elapsed(),
    }
}

/// Sends every request of `plan` at its `at` (plans are in time order) with at most
/// `max_in_flight` at once. Latency counts from the planned time, so waiting for a free
/// connection shows in TTFT instead of silently delaying the schedule.
pub async fn open_loop(
    target: Arc<Target>,
    plan: impl IntoIterator<Item = PlannedRequest>,
    max_in_flight: usize,
    progress: Arc<Progress>,
) -> Outcome {
    let started = Instant::now();
    let slots = Arc::new(Semaphore::new(max_in_flight.max(1)));
    let mut tasks = JoinSet::new();
    let mut records = Vec::new();
    for req in plan {
        if progress.stopped_on_auth() {
            break;
        }
        let t0 = started + req.at;
        if t0 > Instant::now() {
            tokio::time::sleep_until(t0.into()).await;
        }
        let (target, slots, progress) = (target.clone(), slots.clone(), progress.clone());
        tasks.spawn(async move {
            let _slot = slots.acquire_owned().await.ok();
            progress.sent();
            let record = target.exchange(&req, t0, req.at.as_secs_f64()).await;
            progress.done(record.status, record.ok());
            record
        });
        while let Some(done) = tasks.try_join_next() {
            records.extend(done.ok());
        }
    }
    while let Some(done) = tasks.join_next().await {
        records.extend(done.ok());
    }
    finish(records, started)
}

/// Runs `concurrency` clients over `plan` (in order, drawn as they go) until it is used up or
/// `until` has passed.
pub async fn closed_loop(
    target: Arc<Target>,
    plan: impl IntoIterator<Item = PlannedRequest, IntoIter: Send + 'static>,
    concurrency: usize,
    until: Duration,
    progress: Arc<Progress>,
) -> Outcome {
    let started = Instant::now();
    let queue = Arc::new(Mutex::new(plan.into_iter()));
    let mut clients = JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (target, queue, progress) = (target.clone(), queue.clone(), progress.clone());
        clients.spawn(async move {
            let mut mine = Vec::new();
            while started.elapsed() < until && !progress.stopped_on_auth() {
                let next = queue.lock().ok().and_then(|mut q| q.next());
                let Some(req) = next else { break };
                let t0 = Instant::now();
                progress.sent();
                let start = t0.duration_since(started).as_secs_f64();
                let record = target.exchange(&req, t0, start).await;
                progress.done(record.status, record.ok());
                mine.push(record);
            }
            mine
        });
    }
    let mut records = Vec::new();
    while let Some(done) = clients.join_next().await {
        records.extend(done.unwrap_or_default());
    }
    finish(records, started)
}
