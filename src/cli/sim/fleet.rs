//! The discrete-event loop: a min-heap of (time, event) holding the next planned arrival (the plan
//! is streamed, never materialized) and each busy worker's step end. Arrivals pass degradation
//! (when a policy is given), the fleet's admission (a bound on engine queues, or slots and a
//! priority queue), are routed by the real policy and wait in the chosen worker's inbox until its
//! next step starts; token events are stamped with the worker's clock when the step ends.
//! Degradation ticks and queue expiries are events too, but never extend the run's end. Before all
//! that, each arrival meets the gateway's checks, and each routed request the engine's context
//! check (see [`Gate`]).

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use super::admit::{Admission, QueueKey, Waiting};
use super::degradation::SimDegradation;
use super::features::EngineParser;
use super::gate::{Gate, Refusal};
use super::rate_limits::SimLimits;
use super::record::{Live, refused, trace_line};
use super::sink::Note;
use super::worker::{SimWorker, WorkerStats};
use crate::report::{CachedTokens, RequestRecord};
use crate::workload::{PlannedRequest, Requests};
use infergate::routing::features::{
    DEFAULT_BLOCK_BYTES, DEFAULT_MAX_BLOCKS, prefix_hashes, session_hash,
};
use infergate::routing::{Feedback, RequestFeatures, Residency, RoutingPolicy, WorkerView};
use infergate_engine::flight::EngineInfo;
use infergate_engine::kv_events::PrefixKeys;

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
    /// A queued request's longest wait is over (a no-op if it has left the queue).
    Expire(QueueKey),
    /// Degradation signals are sampled and the level reconsidered.
    Tick,
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
    /// Trace lines of the finished requests (see `SimResult::trace`); empty unless recorded.
    pub trace: Vec<String>,
    /// Numbers of the admission stage and degradation for the report's `extra` (none when off).
    pub extra: Vec<(&'static str, f64)>,
}

/// The fleet and the state of the run.
pub(super) struct Fleet {
    workers: Vec<SimWorker>,
    policy: Box<dyn RoutingPolicy>,
    plan: Requests,
    clients: Clients,
    /// Most requests queued (submitted, never yet scheduled) over the fleet; 0 = unbounded.
    /// Unused when the admission stage is on (its own queue is bounded instead).
    max_queue: usize,
    admission: Admission,
    degradation: Option<SimDegradation>,
    /// The gateway's and the engines' refusals before any queue; `None` = none modelled.
    gate: Option<Gate>,
    /// The tiers' rate limits (`--rate-limits`); `None` = not modelled.
    rate: Option<SimLimits>,
    /// Admission refusals: queue full (or evicted), waited too long.
    queue_full: u64,
    queue_timeouts: u64,
    heap: BinaryHeap<Reverse<(At, u64, Event)>>,
    next_seq: u64,
    arrivals: HashMap<u64, PlannedRequest>,
    /// Requests routed and not ended: their record so far, and what routing needs back.
    live: HashMap<u64, (Live, Routed)>,
    records: Vec<RequestRecord>,
    views: Vec<WorkerView>,
    notes: Vec<(u64, Note)>,
    now: f64,
    /// Time of the last arrival, step end or expiry that refused a request: the run's end.
    end: f64,
    steps: u64,
    /// Chat template tokens around each prompt (before, after), when clients use chat.
    chat_wrap: Option<(Vec<u32>, Vec<u32>)>,
    /// The engine's parser of replayed requests' features (chat when `chat_wrap` is).
    engine_parser: EngineParser,
    /// Prompt tokens the engines served from their prefix caches (the usage's cached tokens).
    cached_tokens: u64,
    /// The admission queue's length integrated over time, and when it was last integrated.
    admission_area: f64,
    admission_since: f64,
    /// The engines' part of every flight record, when recording them; and the lines so far.
    flights: Option<EngineInfo>,
    trace: Vec<String>,
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
        // Workers with KV events are precise from the start (an empty snapshot each).
        for w in workers.iter().filter(|w| w.kv_events()) {
            policy.residency(w.key, Residency::Snapshot(&[]));
        }
        Self {
            views: Vec::with_capacity(workers.len()),
            workers,
            policy,
            plan,
            clients,
            max_queue,
            admission: Admission::off(),
            degradation: None,
            gate: None,
            rate: None,
            queue_full: 0,
            queue_timeouts: 0,
            heap: BinaryHeap::new(),
            next_seq: 0,
            arrivals: HashMap::new(),
            live: HashMap::new(),
            records: Vec::new(),
            notes: Vec::new(),
            now: 0.0,
            end: 0.0,
            steps: 0,
            chat_wrap: None,
            engine_parser: EngineParser::new(false),
            cached_tokens: 0,
            admission_area: 0.0,
            admission_since: 0.0,
            flights: None,
            trace: Vec::new(),
        }
    }

    /// Wraps every prompt in the engine's default chat template (ChatML, one user message),
    /// tokenized as the engine tokenizes it, so the simulated prefill matches a live chat call.
    pub(super) fn with_chat_template(mut self, on: bool) -> Result<Self, String> {
        self.engine_parser = EngineParser::new(on);
        if on {
            let tok = infergate_engine::tokenizer::SimTokenizer::shared()?;
            self.chat_wrap = Some((
                tok.encode("<|im_start|>user\n"),
                tok.encode("<|im_end|>\n<|im_start|>assistant\n"),
            ));
        }
        Ok(self)
    }

    /// Puts requests through `admission` (slots and a priority queue) before routing.
    pub(super) fn with_admission(mut self, admission: Admission) -> Self {
        self.admission = admission;
        self
    }

    /// Degrades requests by tier under `degradation`, ticking on virtual time.
    pub(super) fn with_degradation(mut self, degradation: Option<SimDegradation>) -> Self {
        self.degradation = degradation;
        self
    }

    /// Applies the gate's tiers' per-tenant rate limits when `on` (needs a gate).
    pub(super) fn with_rate_limits(mut self, on: bool) -> Self {
        self.rate = on.then(SimLimits::new);
        self
    }

    /// Refuses what `gate` refuses: the gateway's checks on arrival, the engine's when routed.
    pub(super) fn with_gate(mut self, gate: Option<Gate>) -> Self {
        self.gate = gate;
        self
    }

    /// Keeps a trace line of every finished request's flight record, with `engine` its
    /// engine-wide part (`None`: none kept).
    pub(super) fn with_flights(mut self, engine: Option<EngineInfo>) -> Self {
        self.flights = engine;
        self
    }

    /// Runs until every planned request has ended.
    pub(super) fn run(mut self) -> Outcome {
        match self.clients {
            Clients::Open => self.send_next(0.0),
            Clients::Closed(n, _) => (0..n).for_each(|_| self.send_next(0.0)),
        }
        if let Some(d) = &self.degradation {
            let first = d.tick_interval();
            self.push(first, Event::Tick);
        }
        while let Some(Reverse((At(t), _, event))) = self.heap.pop() {
            self.now = t;
            if t > self.admission_since {
                self.admission_area += self.admission.len() as f64 * (t - self.admission_since);
                self.admission_since = t;
            }
            match event {
                Event::Arrive(key) => {
                    self.end = t;
                    self.arrive(key, t);
                }
                Event::StepEnd(w) => {
                    self.end = t;
                    self.step_end(w, t);
                }
                Event::Expire(key) => self.expire(key, t),
                Event::Tick => self.tick(t),
            }
            self.fill_slots(t);
        }
        // Whatever the engines never finished (it cannot happen unless a request is stuck).
        let end = self.end;
        let mut stuck: Vec<(u64, Live)> = self.live.drain().map(|(id, (l, _))| (id, l)).collect();
        stuck.sort_by_key(|(id, _)| *id);
        for (id, live) in stuck {
            let name = &self.workers[live.worker].name;
            self.records
                .push(live.into_record(id, end, 503, name, None));
        }
        self.records.sort_by_key(|r| r.id);
        let stats = self.workers.iter_mut().map(|w| w.stats(end)).collect();
        let mut extra = vec![("cached_tokens", self.cached_tokens as f64)];
        if self.admission.is_on() {
            extra.push(("admission_queue_full", self.queue_full as f64));
            extra.push(("admission_queue_timeouts", self.queue_timeouts as f64));
            let mean = if end > 0.0 {
                self.admission_area / end
            } else {
                0.0
            };
            extra.push(("admission_queue_mean", mean));
            // Jain's index over the tenants the queue kept waiting whole windows (the gateway's
            // `infergate_fair_share_jain_index`): mean and least over windows that had two.
            let jain = self.admission.jain();
            extra.push(("jain_backlogged_windows", jain.windows as f64));
            if jain.windows > 0 {
                extra.push(("jain_backlogged_mean", jain.mean));
                extra.push(("jain_backlogged_min", jain.min));
            }
        }
        if let Some(d) = &self.degradation {
            extra.extend(d.extra());
        }
        if let Some(g) = &self.gate {
            extra.extend(g.extra());
        }
        if let Some(r) = &self.rate {
            extra.extend(r.extra());
        }
        Outcome {
            records: self.records,
            end,
            steps: self.steps,
            stats,
            extra,
            trace: self.trace,
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

    /// A planned request is sent at `t`: degrade → admit (or queue) → route.
    fn arrive(&mut self, key: u64, t: f64) {
        let Some(mut req) = self.arrivals.remove(&key) else {
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
        // A shape class sends it to another pool: not this fleet's traffic.
        if let Some(g) = &mut self.gate
            && g.elsewhere(&req, prompt_tokens)
        {
            self.client_done(t);
            return;
        }
        // The gateway answers these before metering, degradation or admission.
        if let Some(g) = &mut self.gate
            && let Some(refused) = g.check(&req)
        {
            g.count(refused.why);
            self.refuse(req, t, refused.status, prompt_tokens, t);
            return;
        }
        // Metered next: the tier's rate limits reserve prompt plus `max_tokens`.
        if let (Some(rate), Some(g)) = (&mut self.rate, &self.gate) {
            let tenant = req.tenant.as_deref();
            let tokens = prompt_tokens + u64::from(req.output_tokens);
            let limits = g.limits_of(tenant);
            if let Some(status) = rate.admit(req.id, tenant.unwrap_or(""), &limits, tokens, t) {
                self.refuse(req, t, status, prompt_tokens, t);
                return;
            }
        }
        if !self.admission.is_on() && self.max_queue > 0 {
            let queued: usize = self.workers.iter().map(SimWorker::queued).sum();
            if queued >= self.max_queue {
                self.refuse(req, t, 429, prompt_tokens, t);
                return;
            }
        }
        if let Some(d) = &mut self.degradation
            && let Some(status) =
                d.apply(req.tenant.as_deref(), prompt_tokens, &mut req.output_tokens)
        {
            self.refuse(req, t, status, prompt_tokens, t);
            return;
        }
        let waiting = Waiting {
            req,
            prompt_tokens,
            arrival: t,
        };
        let tenant = waiting.req.tenant.as_deref();
        let lent = self.admission.may_borrow(self.live.len(), tenant);
        if self.admission.has_slot(self.live.len()) || lent {
            if self.admission.is_on() {
                self.admission.served_at_once(&waiting);
                if let Some(d) = &mut self.degradation {
                    d.record_queue_wait(0.0, t);
                }
            }
            if let Some(w) = self.route(waiting, t)
                && !self.workers[w].busy
            {
                self.start_step(w, t);
            }
            return;
        }
        let queued = self.admission.enqueue(waiting);
        if let Some(key) = queued.queued {
            let deadline = t + self.admission.max_wait();
            self.push(deadline, Event::Expire(key));
        }
        if let Some(out) = queued.refused {
            self.queue_full += 1;
            self.refuse(out.req, out.arrival, 429, out.prompt_tokens, t);
        }
    }

    /// Records `req`, sent at `arrival`, as refused with `status` at `now` before reaching a worker.
    fn refuse(&mut self, req: PlannedRequest, arrival: f64, status: u16, prompt: u64, now: f64) {
        if let Some(rate) = &mut self.rate {
            rate.settle(req.id, 0, now);
        }
        let asked = u64::from(req.output_tokens);
        let who = (req.tenant, req.class);
        let mut record = refused(req.id, arrival, status, who, (prompt, asked));
        record.e2e = now - arrival;
        self.records.push(record);
        self.client_done(now);
    }

    /// Routes a request by the policy and hands it to the chosen worker (whose step is not
    /// started here); `None` when the engines refuse it (400) or no worker can take it (503).
    fn route(&mut self, waiting: Waiting, t: f64) -> Option<usize> {
        let Waiting {
            req,
            prompt_tokens,
            arrival,
        } = waiting;
        // A replayed request's features, as the engine's parser reads them (it refuses before
        // its context check and its queue, whichever engine is chosen).
        let (sequences, flight_features) = if req.features.is_some() {
            match self.engine_parser.sequences(&req) {
                Ok((params, features)) => (Some(params), Some(features)),
                Err(status) => {
                    if let Some(g) = &mut self.gate {
                        g.count(Refusal::EngineInvalid);
                    }
                    self.refuse(req, arrival, status, prompt_tokens, t);
                    return None;
                }
            }
        } else {
            (None, None)
        };
        // Every engine has the same context: it refuses before its queue, whichever is chosen.
        if let Some(g) = &mut self.gate
            && let Some(refused) = g.check_engine(prompt_tokens, req.output_tokens)
        {
            g.count(refused.why);
            self.refuse(req, arrival, refused.status, prompt_tokens, t);
            return None;
        }
        let features = features(&req, prompt_tokens);
        self.views.clear();
        self.views.extend(self.workers.iter().map(SimWorker::view));
        let Some(decision) = self.policy.select(&features, &self.views) else {
            self.refuse(req, arrival, 503, prompt_tokens, t);
            return None;
        };
        let w = decision.index;
        self.policy.observe(&features, &self.views[w]);
        self.workers[w].pending_prefill += decision.prefill;
        let who = (req.tenant, req.class);
        let live = Live::new(arrival, w, who, prompt_tokens, req.output_tokens);
        // Our engines take the router's keys with the request (KV events).
        let keys = self.workers[w].kv_events().then(|| PrefixKeys {
            block_bytes: DEFAULT_BLOCK_BYTES,
            canonical_bytes: features.prompt_bytes,
            keys: features.prefix_hashes.clone(),
        });
        let routed = Routed {
            features,
            predicted_cached: decision.predicted_cached,
            available_cached: decision.available_cached,
            prefill: decision.prefill,
            flight_features,
        };
        self.live.insert(req.id, (live, routed));
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
        match sequences {
            Some(params) => self.workers[w].submit_sequences(req.id, prompt, params, keys),
            None => self.workers[w].submit(req.id, prompt, req.output_tokens, keys),
        }
        Some(w)
    }

    /// Hands free slots to the best waiters, then starts the idle workers that got work. Runs
    /// after every event, never inside a worker's step start, so a worker never steps twice.
    fn fill_slots(&mut self, t: f64) {
        if !self.admission.is_on() {
            return;
        }
        let per_worker = self.admission.per_worker(self.workers.len());
        while self.admission.len() > 0 {
            let mut moved = false;
            // Within the capacity, the gateway's order; past it, the slots fair share lends.
            loop {
                let in_flight = self.live.len();
                let next = if self.admission.has_slot(in_flight) {
                    self.pop_next(per_worker)
                } else {
                    self.admission.pop_borrower(in_flight)
                };
                let Some(waiting) = next else {
                    break;
                };
                moved = true;
                self.admission.took_slot(&waiting);
                if let Some(d) = &mut self.degradation {
                    d.record_queue_wait(t - waiting.arrival, t);
                }
                self.route(waiting, t);
            }
            for w in 0..self.workers.len() {
                if !self.workers[w].busy && self.workers[w].has_work() {
                    self.start_step(w, t);
                }
            }
            if !moved {
                break;
            }
        }
    }

    /// The next waiter by the gateway's order; with fair share, locality among the tenants
    /// within its window is judged by the routing policy's own view of the workers with a free
    /// slot (fewer than `per_worker` in flight).
    fn pop_next(&mut self, per_worker: usize) -> Option<Waiting> {
        self.views.clear();
        self.views.extend(
            self.workers
                .iter()
                .map(SimWorker::view)
                .filter(|v| (v.in_flight as usize) < per_worker),
        );
        let (policy, views) = (&self.policy, &self.views);
        self.admission.pop_next(|w| {
            !views.is_empty()
                && policy.holds_prefix(&features(&w.req, w.prompt_tokens).prefix_hashes, views)
        })
    }

    /// A queued request's wait is over: if it still waits, it gets a 429.
    fn expire(&mut self, key: QueueKey, t: f64) {
        if let Some(out) = self.admission.remove(key) {
            self.end = t;
            self.queue_timeouts += 1;
            self.refuse(out.req, out.arrival, 429, out.prompt_tokens, t);
        }
    }

    /// Feeds degradation the queue depth and the workers' mean KV usage, reconsiders the level,
    /// and schedules the next tick while anything else is still to happen.
    fn tick(&mut self, t: f64) {
        let depth = self.admission.len();
        let kv = self.workers.iter().map(|w| w.view().kv_usage).sum::<f64>()
            / self.workers.len().max(1) as f64;
        let Some(d) = &mut self.degradation else {
            return;
        };
        d.tick(t, depth, kv);
        let next = t + d.tick_interval();
        if !self.heap.is_empty() {
            self.push(next, Event::Tick);
        }
    }

    fn step_end(&mut self, w: usize, t: f64) {
        self.workers[w].busy = false;
        self.handle_notes(w);
        // Events reach the policy as the step ends: the simulator has no stream lag.
        let batch = self.workers[w].take_kv_events();
        let key = self.workers[w].key;
        if !batch.stored.is_empty() {
            self.policy.residency(key, Residency::Stored(&batch.stored));
        }
        if !batch.removed.is_empty() {
            self.policy
                .residency(key, Residency::Removed(&batch.removed));
        }
        // Slots freed by this step go to waiters first, so they join the worker's next step.
        self.fill_slots(t);
        if !self.workers[w].busy && self.workers[w].has_work() {
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
        for (id, note) in notes.drain(..) {
            let ended = match note {
                Note::Tokens(n) => {
                    let ttft = self.live.get_mut(&id).and_then(|(l, _)| l.tokens(now, n));
                    if ttft.is_some() {
                        self.prefill_done(id);
                    }
                    if let (Some(ttft), Some(d)) = (ttft, &mut self.degradation) {
                        d.record_ttft(ttft, now);
                    }
                    continue;
                }
                Note::Finished(info) => (200, Some(*info)),
                // The engine's refusal of a request that can never fit: a 400 from the server.
                Note::Error => (400, None),
            };
            self.prefill_done(id);
            let Some((live, routed)) = self.live.remove(&id) else {
                continue;
            };
            self.admission.gave_slot(live.tenant());
            if let Some(rate) = &mut self.rate {
                let used = ended
                    .1
                    .as_ref()
                    .map_or(0, |i| (i.prompt_tokens + i.completion_tokens) as u64);
                rate.settle(id, used, now);
            }
            if let Some(info) = ended.1.as_ref() {
                self.cached_tokens += info.cached_tokens as u64;
                self.policy.feedback(
                    &routed.features,
                    self.workers[live.worker].key,
                    Feedback {
                        predicted_cached: routed.predicted_cached,
                        prompt_tokens: info.prompt_tokens as u64,
                        cached_tokens: Some(info.cached_tokens as u64),
                    },
                );
            }
            if let (Some(engine), Some(info)) = (&self.flights, ended.1.as_ref()) {
                let features = routed.flight_features;
                self.trace.push(trace_line(
                    engine,
                    (id, live.class()),
                    live.arrival,
                    info,
                    features,
                ));
            }
            let worker = &mut self.workers[live.worker];
            worker.in_flight = worker.in_flight.saturating_sub(1);
            let mut record = live.into_record(id, now, ended.0, &worker.name, ended.1.as_ref());
            record.cached = ended.1.as_ref().map(|i| CachedTokens {
                predicted: routed.predicted_cached,
                delivered: i.cached_tokens as u64,
                available: routed.available_cached,
            });
            self.records.push(record);
            self.client_done(now);
        }
        self.notes = notes;
    }

    /// The request's first token came out (or it ended): its prefill is no longer pending.
    fn prefill_done(&mut self, id: u64) {
        if let Some((live, routed)) = self.live.get_mut(&id) {
            let w = &mut self.workers[live.worker];
            w.pending_prefill = w.pending_prefill.saturating_sub(routed.prefill);
            routed.prefill = 0;
        }
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
fn features(req: &PlannedRequest, prompt_tokens: u64) -> RequestFeatures {
    let max_tokens = DEFAULT_BLOCK_BYTES * DEFAULT_MAX_BLOCKS / 4;
    let head = &req.prompt[..req.prompt.len().min(max_tokens)];
    let bytes: Vec<u8> = head.iter().flat_map(|t| t.to_le_bytes()).collect();
    RequestFeatures {
        prefix_hashes: prefix_hashes(&bytes, DEFAULT_BLOCK_BYTES, DEFAULT_MAX_BLOCKS),
        session_key: req.session.as_deref().map(session_hash),
        // Four bytes a token, chat template included, as the engine will count the prompt.
        prompt_bytes: usize::try_from(prompt_tokens * 4).unwrap_or(usize::MAX),
        max_output_tokens: req.output_tokens,
        home: None,
    }
}

/// What routing needs back from a live request: its features, the cached tokens it predicted,
/// and the prefill still counted as pending on its worker.
struct Routed {
    features: RequestFeatures,
    predicted_cached: u64,
    /// The most routing knew cached on any worker at the pick (the explained hit rate's).
    available_cached: u64,
    prefill: u64,
    /// What its flight record names of its features (`None`: a plain request).
    flight_features: Option<infergate_engine::flight::Features>,
}
