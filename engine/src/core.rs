//! The engine core: the step loop (admit → schedule → execute → sample → stream out → free) that
//! runs on its own thread, owning the scheduler and the backend. The same core runs on the real
//! clock when serving and on a virtual clock in the offline simulator.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use crate::backend::Backend;
use crate::block_manager::CacheStats;
use crate::clock::Clock;
use crate::host_time::StepAccounting;
use crate::kv_events::KvEventHub;
use crate::metrics::{EngineMetrics, FinishedRequest};
use crate::roofline::{ExecPath, StepCost};
use crate::scheduler::{ScheduledSeq, Scheduler};
use crate::sequence::{FinishInfo, FinishReason, NewRequest, SendError, SeqEvent, Sequence};

/// A step that begins within this long of the previous one's end counts as back to back.
const BACK_TO_BACK_SECS: f64 = 0.005;

/// What one call to [`EngineCore::step`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepReport {
    /// Cost of the step; `None` when nothing could be scheduled.
    pub cost: Option<StepCost>,
    /// Sequences in the batch.
    pub scheduled: usize,
    /// Sequences that finished.
    pub finished: usize,
    /// Sequences preempted.
    pub preempted: usize,
    /// Clock time at the end of the step.
    pub end: f64,
}

/// Engine state owned by one thread.
pub struct EngineCore {
    sched: Scheduler,
    backend: Box<dyn Backend>,
    clock: Arc<dyn Clock>,
    metrics: Arc<EngineMetrics>,
    pending: Arc<AtomicUsize>,
    draining: Vec<(Sequence, FinishInfo)>,
    entries: Vec<ScheduledSeq>,
    last_stats: CacheStats,
    last_end: Option<f64>,
    /// Busy and host time of the steps, for the metrics.
    timing: StepAccounting,
    kv_events: Option<Arc<KvEventHub>>,
    /// vLLM-format KV events' publisher (`--kv-events-zmq`).
    vllm_events: Option<crate::vllm_kv_events::VllmPublisher>,
    /// Clock time of each unfinished sequence's first token, by id (prefill and decode times).
    first_token_at: HashMap<u64, f64>,
    /// Group (its first sequence's id) of each unfinished sequence submitted with siblings.
    group_of: HashMap<u64, u64>,
    /// Unfinished groups by id.
    groups: HashMap<u64, GroupState>,
}

/// The sequences of one request's prompt (`n` / `best_of` > 1) still to end.
#[derive(Debug, Clone, Copy)]
struct GroupState {
    /// Sequences in the group.
    size: usize,
    /// Sequences not yet ended.
    left: usize,
    /// Longest generation among those that finished; `None` while none has.
    max_generation: Option<usize>,
}

impl EngineCore {
    /// A core over `sched` and `backend`. `pending` counts requests submitted but not yet
    /// admitted; the core decrements it as they are admitted or dropped.
    pub fn new(
        sched: Scheduler,
        backend: Box<dyn Backend>,
        clock: Arc<dyn Clock>,
        metrics: Arc<EngineMetrics>,
        pending: Arc<AtomicUsize>,
    ) -> Self {
        let caps = sched.config();
        metrics.set_limits(caps.max_num_seqs, caps.max_num_batched_tokens);
        Self {
            sched,
            backend,
            clock,
            metrics,
            pending,
            draining: Vec::new(),
            entries: Vec::new(),
            last_stats: CacheStats::default(),
            last_end: None,
            timing: StepAccounting::default(),
            kv_events: None,
            vllm_events: None,
            first_token_at: HashMap::new(),
            group_of: HashMap::new(),
            groups: HashMap::new(),
        }
    }

    /// The KV events since the last call, for a caller that applies them itself (the simulator);
    /// empty when a hub publishes them or events are off.
    pub fn take_kv_events(&mut self) -> crate::kv_events::KvEventBatch {
        if self.kv_events.is_some() {
            return crate::kv_events::KvEventBatch::default();
        }
        self.sched.kv.take_events()
    }

    /// Publishes the scheduler's KV events (router key residency) to `hub` after every step.
    pub fn publish_kv_events(&mut self, hub: Arc<KvEventHub>) {
        self.kv_events = Some(hub);
    }

    /// Publishes the cache's blocks in vLLM's format through `publisher` after every step.
    pub fn publish_vllm_events(&mut self, publisher: crate::vllm_kv_events::VllmPublisher) {
        self.sched.kv.enable_vllm_events();
        self.vllm_events = Some(publisher);
    }

    /// The scheduler (read-only: tests, simulator reports).
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// Queues a request; one that could never fit in the whole KV cache is refused at once.
    pub fn add_request(&mut self, req: NewRequest) {
        self.add_group(vec![req]);
    }

    /// Queues sequences that share one prompt (a request's `n` or `best_of` choices). The
    /// first computes the prompt; the others wait for its full prompt blocks to be cached and
    /// then read them from the prefix cache, so the prompt is computed once. Sequences that
    /// could never fit in the whole KV cache are refused at once.
    pub fn add_group(&mut self, reqs: Vec<NewRequest>) {
        let Some(leader) = reqs.first().map(|r| r.id) else {
            return;
        };
        let bs = self.sched.kv.block_size();
        let num_blocks = self.sched.kv.num_blocks();
        let prefix_caching = self.sched.kv.prefix_caching();
        let size = reqs.len();
        let mut queued = 0;
        for mut req in reqs {
            let need = (req.prompt.len() + req.params.max_tokens).div_ceil(bs);
            if need > num_blocks || req.prompt.is_empty() {
                self.pending.fetch_sub(1, Ordering::AcqRel);
                self.metrics
                    .rejected
                    .with_label_values(&["kv_capacity"])
                    .inc();
                let msg = format!(
                    "request needs {need} KV blocks ({} prompt + {} max tokens) but the cache has {num_blocks} blocks",
                    req.prompt.len(),
                    req.params.max_tokens,
                );
                let _ = req.sink.try_send(SeqEvent::Error(msg));
                continue;
            }
            let mut seq = Sequence::new(req, bs, self.clock.now());
            // Waiting only pays when there is a full block to share, and a sequence that
            // computes its whole prompt (prompt logprobs) shares nothing.
            let shareable = prefix_caching && seq.prompt_len > bs;
            if seq.id != leader && shareable && !seq.needs_prompt_logprobs() {
                seq.share_prefix_of = Some(leader);
            }
            if size > 1 {
                self.group_of.insert(seq.id, leader);
            }
            self.sched.add(seq);
            queued += 1;
        }
        if size > 1 && queued > 0 {
            let state = GroupState {
                size,
                left: queued,
                max_generation: None,
            };
            self.groups.insert(leader, state);
        }
        self.metrics.waiting.set(self.sched.waiting.len() as f64);
    }

    /// True while any request waits, runs, or has undelivered output.
    pub fn has_work(&self) -> bool {
        !self.sched.is_idle() || !self.draining.is_empty()
    }

    /// Runs one engine step; waits on the clock for the step's cost (and, for a backend that
    /// models it, the host time before it).
    pub fn step(&mut self) -> StepReport {
        let pending = self.pending.clone();
        let gone = self.sched.remove_where(|s| s.sink.is_closed());
        for s in &gone {
            if s.first_scheduled.is_none() {
                pending.fetch_sub(1, Ordering::AcqRel);
            }
            self.first_token_at.remove(&s.id);
            self.end_in_group(s.id, None);
            self.metrics
                .request_success
                .with_label_values(&["abort"])
                .inc();
        }

        // Back to back with the previous step, a modelled GPU overlaps this thread's bookkeeping:
        // the next step is ready when the previous one ended (plus any host time the backend
        // models). A real backend's step starts when it actually does.
        let now = self.clock.now();
        let ready = match self.last_end {
            Some(end) if now - end < BACK_TO_BACK_SECS => end,
            _ => now,
        };
        let stopped = self.sched.remove_where(|s| s.sink.stop_requested());
        for mut seq in stopped {
            if seq.first_scheduled.is_none() {
                pending.fetch_sub(1, Ordering::AcqRel);
            }
            seq.finish = Some(FinishReason::Stop);
            self.retire(seq, ready);
        }
        let batch = self.sched.schedule(ready);
        let preempted = batch.preempted;
        self.entries.clear();
        self.entries.extend_from_slice(&batch.seqs);
        if self.entries.is_empty() {
            self.last_end = None;
            self.timing.skipped(!self.sched.is_idle());
            self.update_gauges();
            self.flush_outputs();
            return StepReport {
                end: ready,
                ..StepReport::default()
            };
        }
        let host = self
            .backend
            .host_seconds(self.sched.batch(), &self.sched.running);
        let recomputed: usize = self
            .entries
            .iter()
            .map(|e| {
                let seq = &self.sched.running[e.index];
                let from = seq.num_computed;
                (from + e.num_tokens)
                    .min(seq.recompute_until)
                    .saturating_sub(from)
            })
            .sum();
        let cost = self
            .backend
            .execute(self.sched.batch(), &self.sched.running);
        let (start, end) = match host {
            // Modelled host work holds the accelerator back: on the real clock it is waited for.
            Some(h) => (ready + h, ready + h + cost.seconds),
            // A real pass has just run for the time it measured; the host time is what passed.
            None => {
                let end = self.clock.now().max(ready + cost.seconds);
                (end - cost.seconds, end)
            }
        };
        self.clock.sleep_until(end);
        self.last_end = Some(end);
        self.sched.commit_step();
        self.metrics.recomputed_tokens.inc_by(recomputed as f64);
        self.metrics
            .steps
            .with_label_values(&[cost.path.as_str()])
            .inc();
        self.metrics.preemptions.inc_by(preempted as f64);

        let mut generated = 0u64;
        let batch_size = self.entries.len();
        let decode_only = self.sched.batch().shape.is_decode_only();
        // An eager step past the captured budget (in sequences, or in tokens with someone's
        // prefill chunk) left the fast path for everyone who only decoded in it.
        let step_tokens = self.sched.batch().shape.new_tokens;
        let off_path = cost.path == ExecPath::Eager
            && self
                .backend
                .capture_budget()
                .is_none_or(|max| batch_size > max || step_tokens > max);
        for e in &self.entries {
            let seq = &mut self.sched.running[e.index];
            seq.record_path(cost.path);
            seq.record_shared(off_path, e.num_tokens);
            seq.record_batch(batch_size, decode_only);
            if seq.graph_steps + seq.eager_steps == 1 && seq.preemptions == 0 {
                pending.fetch_sub(1, Ordering::AcqRel);
                self.metrics.prompt_tokens.inc_by(seq.prompt_len as f64);
            }
            if seq.needs_prompt_logprobs() {
                self.backend.prompt_logprobs(seq);
            }
            if seq.remaining() != 0 {
                continue;
            }
            if seq.params.max_tokens == 0 {
                // Prompt only (echo with `max_tokens: 0`): its logprobs are all it wanted.
                seq.finish = Some(FinishReason::Length);
                continue;
            }
            let mut sampled = self.backend.sample(seq);
            let stop_ok = !seq.params.ignore_eos && seq.num_output() >= seq.params.min_tokens;
            if let Some(script) = &seq.params.script {
                // A quality fault: the script's token instead (its logprob stays the sampled
                // one's); where the script ends but may not stop yet, sampling goes on.
                match script.token_at(seq.num_output()) {
                    Some(t) => sampled.token = t,
                    None if stop_ok => sampled.token = self.backend.eos_token(),
                    None => {}
                }
            }
            let token = sampled.token;
            if self.backend.is_eos(token) && stop_ok {
                seq.finish = Some(FinishReason::Stop);
                continue;
            }
            seq.push_token(token, self.sched.kv.block_size());
            if let Some(lp) = sampled.logprob {
                seq.push_logprob(lp);
            }
            generated += 1;
            match seq.last_token_at {
                None => {
                    self.metrics.ttft.observe(end - seq.arrival);
                    self.first_token_at.insert(seq.id, end);
                }
                Some(prev) => {
                    self.metrics.itl.observe(end - prev);
                    self.metrics.tpot.observe(end - prev);
                }
            }
            seq.last_token_at = Some(end);
            if seq.num_output() >= seq.params.max_tokens {
                seq.finish = Some(FinishReason::Length);
            }
        }

        self.metrics.generation_tokens.inc_by(generated as f64);
        let step_tokens: usize = self.entries.iter().map(|e| e.num_tokens).sum();
        self.metrics.iteration_tokens.observe(step_tokens as f64);
        let finished = self.sched.take_finished();
        let n_finished = finished.len();
        for seq in finished {
            self.retire(seq, end);
        }
        let times = self.timing.ran(now, start, end, !self.sched.is_idle());
        self.metrics.observe_step(&times, self.entries.len());
        // Gauges first: a client that hears its request finished must not read stale ones.
        self.update_gauges();
        self.flush_outputs();
        if self.sched.is_idle() {
            // Nothing left to run: the next step waits for a request, it is not back to back.
            self.last_end = None;
        }
        StepReport {
            cost: Some(cost),
            scheduled: self.entries.len(),
            finished: n_finished,
            preempted,
            end,
        }
    }

    /// Records a finished sequence (blocks already freed) and queues its final report.
    fn retire(&mut self, seq: Sequence, now: f64) {
        let Some(reason) = seq.finish else { return };
        let mut info = seq.finish_info(reason);
        // vLLM's intervals: a sequence that ended without a token (EOS first) had its first
        // and last token events when it finished; one never scheduled was scheduled then.
        let scheduled = seq.first_scheduled.unwrap_or(now);
        let last = seq.last_token_at.unwrap_or(now);
        let first = self.first_token_at.remove(&seq.id).unwrap_or(last);
        info.queue_s = (scheduled - seq.arrival).max(0.0);
        info.prefill_s = (first - scheduled).max(0.0);
        info.decode_s = (last - first).max(0.0);
        self.metrics.observe_finished(&FinishedRequest {
            e2e: (now - seq.arrival).max(0.0),
            queued: (scheduled - seq.arrival).max(0.0),
            prefill: (first - scheduled).max(0.0),
            decode: (last - first).max(0.0),
            inference: (last - scheduled).max(0.0),
            prompt_tokens: seq.prompt_len,
            generation_tokens: info.completion_tokens,
            max_tokens: seq.params.max_tokens,
        });
        self.end_in_group(seq.id, Some(info.completion_tokens));
        let label = match reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        };
        self.metrics
            .request_success
            .with_label_values(&[label])
            .inc();
        self.draining.push((seq, info));
    }

    /// Counts a sequence of a group as ended (`generated` is `None` when it was aborted) and
    /// observes the group's request-level metrics when it was the last; a sequence submitted
    /// alone is its own group of one.
    fn end_in_group(&mut self, id: u64, generated: Option<usize>) {
        let Some(group) = self.group_of.remove(&id) else {
            if let Some(g) = generated {
                self.metrics.observe_group(1, g);
            }
            return;
        };
        let Some(state) = self.groups.get_mut(&group) else {
            return;
        };
        state.left = state.left.saturating_sub(1);
        if let Some(g) = generated {
            state.max_generation = Some(state.max_generation.map_or(g, |m| m.max(g)));
        }
        if state.left == 0 {
            let done = *state;
            self.groups.remove(&group);
            if let Some(max) = done.max_generation {
                self.metrics.observe_group(done.size, max);
            }
        }
    }

    /// Hands buffered tokens to clients; finished sequences leave once their last event is taken.
    fn flush_outputs(&mut self) {
        for seq in &mut self.sched.running {
            // A closed sink is noticed and aborted at the start of the next step.
            seq.flush();
        }
        self.draining.retain_mut(|(seq, info)| {
            if !seq.flush() {
                return false;
            }
            if seq.has_pending() {
                return true;
            }
            match seq.sink.try_send(SeqEvent::Finished(Box::new(*info))) {
                Ok(()) | Err(SendError::Closed) => false,
                Err(SendError::Full(_)) => true,
            }
        });
    }

    fn update_gauges(&mut self) {
        let m = &self.metrics;
        m.running.set(self.sched.running.len() as f64);
        m.waiting.set(self.sched.waiting.len() as f64);
        m.kv_usage.set(self.sched.kv.usage());
        let stats = self.sched.kv.stats();
        m.prefix_queries
            .inc_by((stats.queried_tokens - self.last_stats.queried_tokens) as f64);
        m.prefix_hits
            .inc_by((stats.hit_tokens - self.last_stats.hit_tokens) as f64);
        self.last_stats = stats;
        if let Some(hub) = &self.kv_events {
            hub.publish(self.sched.kv.take_events());
        }
        if let Some(publisher) = &mut self.vllm_events {
            publisher.publish(self.sched.kv.take_vllm_events());
        }
    }
}

/// Runs warm-up on the core's own backend and clock (before the loop, on the core thread, so
/// nothing else touches the backend meanwhile), then the loop.
pub fn warm_up_then_run(
    mut core: EngineCore,
    plan: &crate::warmup::WarmupPlan,
    state: &crate::warmup::WarmupState,
    requests: Receiver<Vec<NewRequest>>,
) {
    crate::warmup::run(&mut *core.backend, &*core.clock, plan, state);
    run_engine_loop(core, requests);
}

/// Runs `core` until every sender of `requests` is gone and all work is done. Each message is
/// one prompt's sequences (see [`EngineCore::add_group`]).
pub fn run_engine_loop(mut core: EngineCore, requests: Receiver<Vec<NewRequest>>) {
    loop {
        if !core.has_work() {
            match requests.recv() {
                Ok(r) => core.add_group(r),
                Err(_) => return,
            }
        }
        while let Ok(r) = requests.try_recv() {
            core.add_group(r);
        }
        let report = core.step();
        if report.cost.is_none() {
            // Nothing could run (output buffers full, or waiting on blocks): wait for news briefly.
            match requests.recv_timeout(Duration::from_millis(2)) {
                Ok(r) => core.add_group(r),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    if !core.has_work() {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
