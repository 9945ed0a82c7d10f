//! What the simulator measures of one request while it runs, as a client would: its planned send
//! time, the time of every token chunk, and at the end the report's [`RequestRecord`].

use infergate_engine::sequence::FinishInfo;

use crate::report::RequestRecord;
use infergate_engine::exec_path::request_path;
use infergate_engine::flight::{EngineInfo, Features, FlightRecord};

/// A request routed to a worker and not yet finished.
#[derive(Debug, Clone)]
pub(super) struct Live {
    /// Planned send time (the latency origin, whatever the worker was doing then).
    pub arrival: f64,
    /// Index of the worker it was routed to.
    pub worker: usize,
    tenant: Option<String>,
    class: Option<String>,
    prompt_tokens: u64,
    first: Option<f64>,
    last: f64,
    itl: Vec<f64>,
    output_tokens: u64,
    asked_output_tokens: u64,
}

impl Live {
    /// A request sent at `arrival` to `worker`, as its tenant and of its class.
    pub(super) fn new(
        arrival: f64,
        worker: usize,
        (tenant, class): (Option<String>, Option<String>),
        prompt_tokens: u64,
        output_tokens: u32,
    ) -> Self {
        Self {
            arrival,
            worker,
            tenant,
            class,
            prompt_tokens,
            first: None,
            last: arrival,
            itl: Vec::with_capacity(output_tokens as usize),
            output_tokens: 0,
            asked_output_tokens: u64::from(output_tokens),
        }
    }

    /// A chunk of `n` tokens arrived at `now`; each chunk is one gap, as a streaming client sees it.
    /// The request's tenant.
    pub(super) fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The workload class it was drawn from (a replay's: the trace line's).
    pub(super) fn class(&self) -> Option<&str> {
        self.class.as_deref()
    }

    /// Returns the time to first token when this chunk is the first.
    pub(super) fn tokens(&mut self, now: f64, n: usize) -> Option<f64> {
        let first = self.first.is_none();
        if first {
            self.first = Some(now);
        } else {
            self.itl.push(now - self.last);
        }
        self.last = now;
        self.output_tokens += n as u64;
        first.then_some(now - self.arrival)
    }

    /// The record of a request that ended at `now` with `status`; `info` when the engine finished it.
    pub(super) fn into_record(
        self,
        id: u64,
        now: f64,
        status: u16,
        worker: &str,
        info: Option<&FinishInfo>,
    ) -> RequestRecord {
        let path = info.map(|i| {
            let off_path = Some(u64::from(i.off_path_steps));
            request_path(i.graph_steps.into(), i.eager_steps.into(), off_path).to_owned()
        });
        RequestRecord {
            id,
            tenant: self.tenant,
            class: self.class,
            worker: Some(worker.to_owned()),
            path,
            shared: info.map(|i| i.eager_shared_steps > 0),
            status,
            start: self.arrival,
            ttft: self.first.map(|f| f - self.arrival),
            itl: self.itl,
            e2e: now - self.arrival,
            prompt_tokens: info.map_or(self.prompt_tokens, |i| i.prompt_tokens as u64),
            output_tokens: info.map_or(self.output_tokens, |i| i.completion_tokens as u64),
            asked_output_tokens: self.asked_output_tokens,
            cached: None,
        }
    }
}

/// The record of a request refused before it reached a worker (a full or timed-out admission
/// queue or shed by degradation: 429; a prompt too long for the degradation level: 503).
pub(super) fn refused(
    id: u64,
    at: f64,
    status: u16,
    (tenant, class): (Option<String>, Option<String>),
    (prompt_tokens, asked_output_tokens): (u64, u64),
) -> RequestRecord {
    RequestRecord {
        id,
        tenant,
        class,
        worker: None,
        path: None,
        shared: None,
        status,
        start: at,
        ttft: None,
        itl: Vec::new(),
        e2e: 0.0,
        prompt_tokens,
        output_tokens: 0,
        asked_output_tokens,
        cached: None,
    }
}

/// The trace line of a request that arrived at `arrival` (virtual seconds) and that the engine
/// finished with `info` (its sequences' totals): its flight record as the engine would send it,
/// in the gateway trace file's members that `infergate shapes` reads (`start_ms`, `flight`).
/// `features` are a replayed request's as the engine read them; `None` for a plain one. The
/// `request_id` (`sim-ID`) and `class` (its workload class) make the file a gateway trace that
/// `bench --replay` reads, so a simulated window can be replayed live and checked by class.
pub(super) fn trace_line(
    engine: &EngineInfo,
    (id, class): (u64, Option<&str>),
    arrival: f64,
    info: &FinishInfo,
    features: Option<Features>,
) -> String {
    // The simulated clients send one streamed prompt with one choice, as `bench` does.
    let features = features.unwrap_or(Features {
        prompts: 1,
        n: 1,
        best_of: 1,
        stream: true,
        ..Features::default()
    });
    let record = FlightRecord::build(
        engine,
        features,
        info.prompt_tokens as u64,
        info.cached_tokens as u64,
        std::iter::once(info),
    );
    let mut line = serde_json::json!({
        "request_id": format!("sim-{id}"),
        "start_ms": (arrival * 1000.0).round() as i64,
        "flight": record,
    });
    if let (Some(class), Some(members)) = (class, line.as_object_mut()) {
        members.insert("class".into(), class.into());
    }
    line.to_string()
}
