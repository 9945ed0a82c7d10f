//! The discrete-event loop: a min-heap of (time, event) holding the next planned arrival (the plan
//! is streamed, never materialized) and each busy worker's step end. Arrivals pass the fleet's
//! admission bound, are routed by the real policy and wait in the chosen worker's inbox until its
//! next step starts; token events are stamped with the worker's clock when the step ends.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use super::record::{Live, refused};
use super::sink::Note;
use super::worker::{SimWorker, WorkerStats};
use crate::report::RequestRecord;
use crate::routing::features::{
    DEFAULT_BLOCK_BYTES, DEFAULT_MAX_BLOCKS, prefix_hashes, session_hash,
};
use crate::routing::{RequestFeatures, RoutingPolicy, WorkerView};
use crate::workload::{PlannedRequest, Requests};

/// A simulated time, ordered totally so it can key the heap.
#[derive(Debug, Clone, Copy, PartialEq)]
struct At(f64);

impl Eq for At {}

impl PartialOrd for At {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for At {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Something that happens at a point in simulated time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A planned request is sent (its body waits in `Fleet::arrivals` under this key).
    Arrive(u64),
    /// A worker's step ends.
    StepEnd(usize),
}

/// How the plan's requests are sent.
pub(super) enum Clients {
    /// At their planned times.
    Open,
    /// By this many clients, each sending its next request when the previous one ends, until
    /// the given time.
    Closed(usize, f64),
}

/// What a finished run hands back.
pub(super) struct Outcome {
    /// One record per planned request, by id.
    pub records: Vec<RequestRecord>,
    /// Time of the last event (the last request's end), seconds.
    pub end: f64,
    /// Engine steps run, over all workers.
    pub steps: u64,
    /// Per-worker counters.
    pub stats: Vec<WorkerStats>,
}

/// The fleet and the state of the run.
pub(super) struct Fleet {
    workers: Vec<SimWorker>,
    policy: Box<dyn RoutingPolicy>,
    plan: Requests,
    clients: Clients,
    /// Most requests queued (submitted, never yet scheduled) over the fleet; 0 = unbounded.
    max_queue: usize,
    heap: BinaryHeap<Reverse<(At, u64, Event)>>,
    next_seq: u64,
    arrivals: HashMap<u64, PlannedRequest>,
    live: HashMap<u64, Live>,
    records: Vec<RequestRecord>,
    views: Vec<WorkerView>,
    notes: Vec<(u64, Note)>,
    now: f64,
    steps: u64,
    /// Chat template tokens around each prompt (before, after), when clients use chat.
    chat_wrap: Option<(Vec<u32>, Vec<u32>)>,
}

impl Fleet {
    /// A fleet of idle `workers` about to send `plan`.
    pub(super) fn new(
        workers: Vec<SimWorker>,
        policy: Box<dyn RoutingPolicy>,
        plan: Requests,
        clients: Clients,
        max_queue: usize,
    ) -> Self {
        Self {
            views: Vec::with_capacity(workers.len()),
            workers,
            policy,
            plan,
            clients,
            max_queue,
            heap: BinaryHeap::new(),
            next_seq: 0,
            arrivals: HashMap::new(),
            live: HashMap::new(),
            records: Vec::new(),
            notes: Vec::new(),
            now: 0.0,
            steps: 0,
            chat_wrap: None,
        }
    }

    /// Wraps every prompt in the engine's default chat template (ChatML, one user message),
    /// tokenized as the engine tokenizes it, so the simulated prefill matches a live chat call.
    pub(super) fn with_chat_template(mut self, on: bool) -> Result<Self, String> {
        if on {
            let tok = infergate_engine::tokenizer::SimTokenizer::shared()?;
            self.chat_wrap = Some((
                tok.encode("<|im_start|>user\n"),
                tok.encode("<|im_end|>\n<|im_start|>assistant\n"),
            ));
        }
        Ok(self)
    }

    /// Runs until every planned request has ended.
    pub(super) fn run(mut self) -> Outcome {
        match self.clients {
            Clients::Open => self.send_next(0.0),
            Clients::Closed(n, _) => (0..n).for_each(|_| self.send_next(0.0)),
        }
        while let Some(Reverse((At(t), _, event))) = self.heap.pop() {
            self.now = t;
            match event {
                Event::Arrive(key) => self.arrive(key, t),
                Event::StepEnd(w) => self.step_end(w, t),
            }
        }
        // Whatever the engines never finished (it cannot happen unless a request is stuck).
        let end = self.now;
        let mut stuck: Vec<(u64, Live)> = self.live.drain().collect();
        stuck.sort_by_key(|(id, _)| *id);
        for (id, live) in stuck {
            let name = &self.workers[live.worker].name;
            self.records
                .push(live.into_record(id, end, 503, name, None));
        }
        self.records.sort_by_key(|r| r.id);
        let stats = self.workers.iter_mut().map(|w| w.stats(end)).collect();
        Outcome {
            records: self.records,
            end,
            steps: self.steps,
            stats,
        }
    }

    fn push(&mut self, t: f64, event: Event) {
        self.heap.push(Reverse((At(t), self.next_seq, event)));
        self.next_seq += 1;
    }

    /// Queues the plan's next request: at its planned time (open loop) or at `now` (a client of
    /// a closed loop that just got its answer).
    fn send_next(&mut self, now: f64) {
        if let Clients::Closed(_, until) = self.clients
            && now >= until
        {
            return;
        }
        let Some(req) = self.plan.next() else { return };
        let at = match self.clients {
            Clients::Open => req.at.as_secs_f64().max(now),
            Clients::Closed(..) => now,
        };
        let key = self.next_seq;
        self.arrivals.insert(key, req);
        self.push(at, Event::Arrive(key));
    }

    fn arrive(&mut self, key: u64, t: f64) {
        let Some(req) = self.arrivals.remove(&key) else {
            return;
        };
        if matches!(self.clients, Clients::Open) {
            self.send_next(t);
        }
        let template = self
            .chat_wrap
            .as_ref()
            .map_or(0, |(before, after)| before.len() + after.len());
        let prompt_tokens = (req.prompt.len() + template) as u64;
        let queued: usize = self.workers.iter().map(SimWorker::queued).sum();
        if self.max_queue > 0 && queued >= self.max_queue {
            self.records
                .push(refused(req.id, t, 429, req.tenant, prompt_tokens));
            self.client_done(t);
            return;
        }
        let features = features(&req);
        self.views.clear();
        self.views.extend(self.workers.iter().map(SimWorker::view));
        let Some(decision) = self.policy.select(&features, &self.views) else {
            self.records
                .push(refused(req.id, t, 503, req.tenant, prompt_tokens));
            self.client_done(t);
            return;
        };
        let w = decision.index;
        self.policy.observe(&features, self.workers[w].key);
        let live = Live::new(t, w, req.tenant, prompt_tokens, req.output_tokens);
        self.live.insert(req.id, live);
        let prompt = match &self.chat_wrap {
            Some((before, after)) => {
                let mut p = Vec::with_capacity(before.len() + req.prompt.len() + after.len());
                p.extend_from_slice(before);
                p.extend_from_slice(&req.prompt);
                p.extend_from_slice(after);
                p
            }
            None => req.prompt,
        };
        self.workers[w].submit(req.id, prompt, req.output_tokens);
        if !self.workers[w].busy {
            self.start_step(w, t);
        }
    }

    fn step_end(&mut self, w: usize, t: f64) {
        self.workers[w].busy = false;
        self.handle_notes(w);
        if self.workers[w].has_work() {
            self.start_step(w, t);
        }
    }

    /// Admits the worker's inbox at `t` and starts a step; an idle engine waits for news.
    fn start_step(&mut self, w: usize, t: f64) {
        self.workers[w].admit(t);
        self.handle_notes(w);
        match self.workers[w].step() {
            Some(end) => {
                self.steps += 1;
                self.workers[w].busy = true;
                self.push(end, Event::StepEnd(w));
            }
            None => self.handle_notes(w),
        }
    }

    /// Applies the worker's notes at its clock's time (the end of the step that emitted them).
    fn handle_notes(&mut self, w: usize) {
        let mut notes = std::mem::take(&mut self.notes);
        self.workers[w].take_notes(&mut notes);
        let now = self.workers[w].now();
        for &(id, note) in &notes {
            let ended = match note {
                Note::Tokens(n) => {
                    if let Some(live) = self.live.get_mut(&id) {
                        live.tokens(now, n);
                    }
                    continue;
                }
                Note::Finished(info) => (200, Some(info)),
                // The engine's refusal of a request that can never fit: a 400 from the server.
                Note::Error => (400, None),
            };
            let Some(live) = self.live.remove(&id) else {
                continue;
            };
            let worker = &mut self.workers[live.worker];
            worker.in_flight = worker.in_flight.saturating_sub(1);
            let record = live.into_record(id, now, ended.0, &worker.name, ended.1.as_ref());
            self.records.push(record);
            self.client_done(now);
        }
        self.notes = notes;
    }

    /// A request ended at `now`: a closed-loop client sends its next one.
    fn client_done(&mut self, now: f64) {
        if matches!(self.clients, Clients::Closed(..)) {
            self.send_next(now);
        }
    }
}

/// Routing features of a planned request. The live gateway hashes the canonical prompt *text*
/// bytes; the plan has token ids, so we hash their little-endian bytes instead. The values differ
/// but the structure is the same (chained hashes of fixed-size leading blocks, 64 tokens a block
/// here), so shared prefixes share leading hashes exactly as they do in the gateway.
fn features(req: &PlannedRequest) -> RequestFeatures {
    let max_tokens = DEFAULT_BLOCK_BYTES * DEFAULT_MAX_BLOCKS / 4;
    let head = &req.prompt[..req.prompt.len().min(max_tokens)];
    let bytes: Vec<u8> = head.iter().flat_map(|t| t.to_le_bytes()).collect();
    RequestFeatures {
        prefix_hashes: prefix_hashes(&bytes, DEFAULT_BLOCK_BYTES, DEFAULT_MAX_BLOCKS),
        session_key: req.session.as_deref().map(session_hash),
    }
}
