//! Tests of the engine core on a virtual clock with the sim backend and recording clients.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::*;
use crate::backend::sim::SimBackend;
use crate::block_manager::BlockManager;
use crate::clock::VirtualClock;
use crate::presets;
use crate::request::SamplingParams;
use crate::roofline::{ExecPath, RooflineConfig, RooflineModel};
use crate::scheduler::SchedulerConfig;
use crate::sequence::EventSink;

/// Tokens per KV block.
const BS: usize = 16;
/// End-of-sequence token of the fake vocabulary.
const EOS: u32 = 999;

/// What a client has been sent, shared between its sink (inside the engine) and the test.
#[derive(Default)]
struct Inbox {
    /// Events accepted but not yet read by the client.
    buffered: VecDeque<SeqEvent>,
    /// Events the client has read, in order.
    read: Vec<SeqEvent>,
    /// Most events `buffered` holds before the sink reports `Full`.
    capacity: usize,
    /// The client went away.
    closed: bool,
}

/// The engine's end of a client: a bounded buffer that may be full or closed.
struct TestSink(Arc<Mutex<Inbox>>);

impl EventSink for TestSink {
    fn try_send(&mut self, event: SeqEvent) -> Result<(), SendError> {
        let mut inbox = self.0.lock().unwrap();
        if inbox.closed {
            return Err(SendError::Closed);
        }
        if inbox.buffered.len() >= inbox.capacity {
            return Err(SendError::Full(event));
        }
        inbox.buffered.push_back(event);
        Ok(())
    }

    fn is_closed(&self) -> bool {
        self.0.lock().unwrap().closed
    }
}

/// The test's end of a client.
#[derive(Clone)]
struct Client(Arc<Mutex<Inbox>>);

impl Client {
    fn new(capacity: usize) -> (Self, Box<dyn EventSink>) {
        let inbox = Arc::new(Mutex::new(Inbox {
            capacity,
            ..Inbox::default()
        }));
        (Self(inbox.clone()), Box::new(TestSink(inbox)))
    }

    /// Reads at most one buffered event; true if there was one.
    fn read_one(&self) -> bool {
        let mut inbox = self.0.lock().unwrap();
        match inbox.buffered.pop_front() {
            Some(e) => {
                inbox.read.push(e);
                true
            }
            None => false,
        }
    }

    /// Reads everything buffered and returns every event read so far.
    fn events(&self) -> Vec<SeqEvent> {
        let mut inbox = self.0.lock().unwrap();
        let buffered: Vec<SeqEvent> = inbox.buffered.drain(..).collect();
        inbox.read.extend(buffered);
        inbox.read.clone()
    }

    fn close(&self) {
        self.0.lock().unwrap().closed = true;
    }

    /// All tokens received, in order.
    fn tokens(&self) -> Vec<u32> {
        self.events()
            .iter()
            .flat_map(|e| match e {
                SeqEvent::Tokens(t) => t.ids.clone(),
                _ => Vec::new(),
            })
            .collect()
    }

    /// The final event, if the stream ended.
    fn finished(&self) -> Option<FinishInfo> {
        match self.events().last() {
            Some(SeqEvent::Finished(info)) => Some(**info),
            _ => None,
        }
    }

    /// Checks the stream's shape: token events, then exactly one `Finished` (or `Error`) last.
    fn assert_well_formed(&self) {
        let events = self.events();
        let ends = events
            .iter()
            .filter(|e| !matches!(e, SeqEvent::Tokens(_)))
            .count();
        assert_eq!(ends, 1, "exactly one final event: {events:?}");
        assert!(!matches!(events.last(), Some(SeqEvent::Tokens(_))));
        for e in &events {
            if let SeqEvent::Tokens(t) = e {
                assert!(!t.is_empty(), "empty token event");
            }
        }
    }
}

/// Engine settings for one test.
struct Setup {
    num_blocks: usize,
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    mean_output_tokens: f64,
    /// The sim backend's modelled host time (none by default).
    host_cost: crate::host_time::HostCost,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            num_blocks: 1_024,
            max_num_seqs: 64,
            max_num_batched_tokens: 2_048,
            mean_output_tokens: 1_000.0,
            host_cost: crate::host_time::HostCost::default(),
        }
    }
}

/// An engine core on a virtual clock, and the handles a test inspects.
struct Harness {
    core: EngineCore,
    clock: Arc<VirtualClock>,
    metrics: Arc<EngineMetrics>,
    pending: Arc<AtomicUsize>,
    /// Sum of the costs of every step taken.
    busy_s: f64,
    paths: Vec<ExecPath>,
}

impl Harness {
    fn new(setup: Setup) -> Self {
        let model = RooflineModel::new(
            presets::gpu("h100").unwrap(),
            presets::model("llama-3-8b").unwrap(),
            RooflineConfig::default(),
        );
        let backend = SimBackend::new(
            model,
            (1_000..1_100).collect(),
            EOS,
            setup.mean_output_tokens,
            BS,
        )
        .with_host_cost(setup.host_cost);
        let sched = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: setup.max_num_seqs,
                max_num_batched_tokens: setup.max_num_batched_tokens,
                chunked_prefill: true,
            },
            BlockManager::new(setup.num_blocks, BS, true),
        );
        let clock = Arc::new(VirtualClock::new());
        let metrics = Arc::new(EngineMetrics::new("m").unwrap());
        let pending = Arc::new(AtomicUsize::new(0));
        let core = EngineCore::new(
            sched,
            Box::new(backend),
            clock.clone(),
            metrics.clone(),
            pending.clone(),
        );
        Self {
            core,
            clock,
            metrics,
            pending,
            busy_s: 0.0,
            paths: Vec::new(),
        }
    }

    /// Submits a request the way the server does (counting it as pending first).
    fn submit(
        &mut self,
        id: u64,
        prompt: Vec<u32>,
        params: SamplingParams,
        sink_capacity: usize,
    ) -> Client {
        let (client, sink) = Client::new(sink_capacity);
        self.pending.fetch_add(1, Ordering::AcqRel);
        self.core.add_request(NewRequest {
            id,
            prompt,
            params,
            sink,
            prefix_keys: None,
        });
        client
    }

    fn step(&mut self) -> StepReport {
        let before = self.clock.now();
        let report = self.core.step();
        if let Some(cost) = report.cost {
            self.busy_s += cost.seconds;
            self.paths.push(cost.path);
            assert_eq!(report.end, before + cost.seconds);
        }
        assert_eq!(self.clock.now(), report.end);
        report
    }

    /// Steps until no work is left; returns the steps taken.
    fn run(&mut self, max_steps: usize) -> usize {
        for n in 0..max_steps {
            if !self.core.has_work() {
                return n;
            }
            self.step();
        }
        panic!("still busy after {max_steps} steps");
    }

    fn kv_free(&self) -> usize {
        self.core.scheduler().kv.num_free_blocks()
    }

    fn kv_blocks(&self) -> usize {
        self.core.scheduler().kv.num_blocks()
    }

    fn steps_on(&self, path: &str) -> u64 {
        self.metrics.steps.with_label_values(&[path]).get()
    }
}

/// `n` prompt tokens from the fake vocabulary, varied by `salt`.
fn prompt(salt: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 1_000 + (salt * 31 + i * 7) % 100)
        .collect()
}

/// Sampling with a seed that runs to exactly `max_tokens`.
fn fixed_length(max_tokens: usize, seed: u64) -> SamplingParams {
    SamplingParams {
        max_tokens,
        seed: Some(seed),
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

/// Runs one request alone on a fresh engine; returns its tokens.
fn solo(prompt: Vec<u32>, params: SamplingParams, mean_output_tokens: f64) -> Vec<u32> {
    let mut h = Harness::new(Setup {
        mean_output_tokens,
        ..Setup::default()
    });
    let c = h.submit(1, prompt, params, usize::MAX);
    h.run(10_000);
    c.assert_well_formed();
    c.tokens()
}

#[test]
fn ignore_eos_yields_exactly_max_tokens_then_length() {
    let mut h = Harness::new(Setup::default());
    let c = h.submit(7, prompt(1, 20), fixed_length(10, 42), usize::MAX);
    assert_eq!(h.pending.load(Ordering::Acquire), 1);
    let steps = h.run(100);
    assert_eq!(steps, 10, "one prefill step, then nine decodes");

    c.assert_well_formed();
    let tokens = c.tokens();
    assert_eq!(tokens.len(), 10);
    assert!(tokens.iter().all(|t| (1_000..1_100).contains(t)));
    let info = c.finished().expect("finished");
    assert_eq!(info.reason, FinishReason::Length);
    assert_eq!(info.prompt_tokens, 20);
    assert_eq!(info.completion_tokens, 10);
    assert_eq!(info.cached_tokens, 0);
    assert_eq!(info.preemptions, 0);
    assert_eq!(info.eager_steps + info.graph_steps, 10);

    assert!(h.busy_s > 0.0);
    assert!((h.clock.now() - h.busy_s).abs() < 1e-12);
    assert_eq!(h.pending.load(Ordering::Acquire), 0);
    let m = &h.metrics;
    assert_eq!(m.generation_tokens.get(), 10.0);
    assert_eq!(m.prompt_tokens.get(), 20.0);
    assert_eq!(m.ttft.get_sample_count(), 1);
    assert_eq!(m.itl.get_sample_count(), 9);
    assert_eq!(m.e2e.get_sample_count(), 1);
    assert_eq!(m.queue_time.get_sample_count(), 1);
    assert_eq!(m.request_success.with_label_values(&["length"]).get(), 1);
    assert_phases_add_up(m, 1);
    assert_eq!(m.request_prompt_tokens.get_sample_sum(), 20.0);
    assert_eq!(m.request_generation_tokens.get_sample_sum(), 10.0);
    assert_eq!(m.request_max_tokens.get_sample_sum(), 10.0);
    assert_eq!(m.iteration_tokens.get_sample_count(), 10);
    assert_eq!(m.iteration_tokens.get_sample_sum(), (20 + 9) as f64);
    assert_eq!(m.running.get(), 0.0);
    assert_eq!(m.kv_usage.get(), 0.0);
    assert_eq!(h.kv_free(), h.kv_blocks());
}

#[test]
fn prefill_runs_eager_and_small_decode_batches_replay_graphs() {
    let mut h = Harness::new(Setup::default());
    let clients: Vec<Client> = (0..3)
        .map(|i| h.submit(i, prompt(i as u32, 30), fixed_length(5, i), usize::MAX))
        .collect();
    let first = h.step();
    assert_eq!(first.scheduled, 3);
    assert_eq!(first.cost.unwrap().path, ExecPath::Eager);
    let second = h.step();
    assert_eq!(second.scheduled, 3);
    let cost = second.cost.unwrap();
    assert_eq!(cost.path, ExecPath::Graph);
    assert_eq!(
        cost.padded_batch, 4,
        "three decodes padded to the next capture size"
    );
    h.run(100);
    assert_eq!(
        h.paths,
        [
            ExecPath::Eager,
            ExecPath::Graph,
            ExecPath::Graph,
            ExecPath::Graph,
            ExecPath::Graph
        ]
    );
    assert_eq!(h.steps_on("eager"), 1);
    assert_eq!(h.steps_on("graph"), 4);
    for c in &clients {
        let info = c.finished().unwrap();
        assert_eq!((info.eager_steps, info.graph_steps), (1, 4));
        assert_eq!(
            info.eager_shared_steps, 0,
            "its one eager step was its own prefill"
        );
    }
}

#[test]
fn a_mixed_step_runs_eager() {
    let mut h = Harness::new(Setup::default());
    let a = h.submit(1, prompt(1, 30), fixed_length(4, 1), usize::MAX);
    h.step();
    let b = h.submit(2, prompt(2, 30), fixed_length(4, 2), usize::MAX);
    let r = h.step();
    assert_eq!(r.scheduled, 2);
    assert_eq!(r.cost.unwrap().path, ExecPath::Eager);
    h.run(100);
    let (ia, ib) = (a.finished().unwrap(), b.finished().unwrap());
    assert_eq!((ia.eager_steps, ia.graph_steps), (2, 2));
    assert_eq!((ib.eager_steps, ib.graph_steps), (1, 3));
    assert_eq!(ia.eager_steps + ib.eager_steps, 3);
    // `a` decoded in `b`'s prefill step, eager but within the captured budget (31 tokens of
    // at most 256): not off the fast path for it.
    assert_eq!((ia.eager_shared_steps, ib.eager_shared_steps), (0, 0));
    assert_eq!((ia.off_path_steps, ib.off_path_steps), (0, 0));
}

#[test]
fn a_chunked_prefill_makes_each_of_its_steps_shared_for_the_decoders() {
    // Captures up to 256 (the model's default), a step budget of 512 tokens.
    let mut h = Harness::new(Setup {
        max_num_batched_tokens: 512,
        ..Setup::default()
    });
    let a = h.submit(1, prompt(1, 30), fixed_length(8, 1), usize::MAX);
    h.step();
    // 800 prompt tokens in chunks of 511 and 289 beside `a`'s decode: two mixed steps past 256.
    let b = h.submit(2, prompt(2, 800), fixed_length(2, 2), usize::MAX);
    h.run(100);
    let (ia, ib) = (a.finished().unwrap(), b.finished().unwrap());
    assert_eq!(ia.eager_shared_steps, 2);
    assert_eq!(ia.eager_steps, 3, "its prefill and the two mixed steps");
    assert_eq!(
        ib.eager_shared_steps, 0,
        "its own prefill chunks are not shared"
    );
    // Both left the fast path in those two steps: `a` as a victim, `b` by its own shape.
    assert_eq!((ia.off_path_steps, ib.off_path_steps), (2, 2));
}

#[test]
fn eos_ends_sequences_before_max_tokens() {
    let mut h = Harness::new(Setup {
        mean_output_tokens: 2.0,
        ..Setup::default()
    });
    let clients: Vec<Client> = (0..16)
        .map(|i| {
            let params = SamplingParams {
                max_tokens: 64,
                seed: Some(i),
                ..SamplingParams::default()
            };
            h.submit(i, prompt(i as u32, 12), params, usize::MAX)
        })
        .collect();
    h.run(1_000);
    let mut generated = 0;
    for c in &clients {
        c.assert_well_formed();
        let info = c.finished().unwrap();
        assert_eq!(info.reason, FinishReason::Stop);
        assert!(info.completion_tokens < 64);
        let tokens = c.tokens();
        assert_eq!(tokens.len(), info.completion_tokens);
        assert!(!tokens.contains(&EOS), "EOS is not streamed");
        generated += tokens.len();
    }
    assert_eq!(h.metrics.generation_tokens.get(), generated as f64);
    assert_eq!(
        h.metrics.request_success.with_label_values(&["stop"]).get(),
        16
    );
    // EOS is not a generated token, here as in the answers' usage.
    let m = &h.metrics;
    assert_eq!(m.request_generation_tokens.get_sample_count(), 16);
    assert_eq!(
        m.request_generation_tokens.get_sample_sum(),
        generated as f64
    );
    assert_phases_add_up(m, 16);
}

/// Per-request histograms: each holds `n` samples, and the phases add up (inference = prefill +
/// decode, time to first token = queue + prefill).
fn assert_phases_add_up(m: &EngineMetrics, n: u64) {
    for h in [
        &m.e2e,
        &m.queue_time,
        &m.prefill_time,
        &m.decode_time,
        &m.inference_time,
        &m.request_tpot,
        &m.request_prompt_tokens,
        &m.request_generation_tokens,
        &m.request_max_generation_tokens,
        &m.request_max_tokens,
        &m.request_n,
    ] {
        assert_eq!(h.get_sample_count(), n);
    }
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
    let (prefill, decode) = (
        m.prefill_time.get_sample_sum(),
        m.decode_time.get_sample_sum(),
    );
    let inference = m.inference_time.get_sample_sum();
    assert!(
        close(inference, prefill + decode),
        "{inference} vs {prefill} + {decode}"
    );
    assert!(inference <= m.e2e.get_sample_sum() + 1e-9);
    assert_eq!(m.request_n.get_sample_sum(), n as f64);
    assert_eq!(
        m.request_max_generation_tokens.get_sample_sum(),
        m.request_generation_tokens.get_sample_sum()
    );
    // The deprecated per-token histogram carries the inter-token latencies.
    assert_eq!(m.tpot.get_sample_count(), m.itl.get_sample_count());
    assert!(close(m.tpot.get_sample_sum(), m.itl.get_sample_sum()));
}

#[test]
fn per_request_histograms_follow_vllms_intervals() {
    // One sequence at a time: b waits in the queue while a runs.
    let mut h = Harness::new(Setup {
        max_num_seqs: 1,
        ..Setup::default()
    });
    let a = h.submit(1, prompt(1, 20), fixed_length(10, 1), usize::MAX);
    let b = h.submit(2, prompt(2, 24), fixed_length(6, 2), usize::MAX);
    let mut ends = Vec::new();
    while h.core.has_work() {
        ends.push(h.step().end);
    }
    assert_eq!(ends.len(), 16, "a: 1 prefill + 9 decodes, then b: 1 + 5");
    assert_eq!(a.finished().unwrap().completion_tokens, 10);
    assert_eq!(b.finished().unwrap().completion_tokens, 6);

    // Both arrived at 0; steps run back to back, so b was scheduled when a's last step ended.
    let (a_first, a_last) = (ends[0], ends[9]);
    let (b_sched, b_first, b_last) = (ends[9], ends[10], ends[15]);
    let m = &h.metrics;
    let close = |got: f64, want: f64| {
        assert!((got - want).abs() < 1e-12, "got {got}, want {want}");
    };
    close(m.queue_time.get_sample_sum(), b_sched);
    close(
        m.prefill_time.get_sample_sum(),
        a_first + (b_first - b_sched),
    );
    close(
        m.decode_time.get_sample_sum(),
        (a_last - a_first) + (b_last - b_first),
    );
    close(
        m.inference_time.get_sample_sum(),
        a_last + (b_last - b_sched),
    );
    close(m.e2e.get_sample_sum(), a_last + b_last);
    close(m.ttft.get_sample_sum(), a_first + b_first);
    close(
        m.request_tpot.get_sample_sum(),
        (a_last - a_first) / 9.0 + (b_last - b_first) / 5.0,
    );
    close(m.itl.get_sample_sum(), m.decode_time.get_sample_sum());
    assert_eq!(m.tpot.get_sample_count(), 9 + 5);
    assert_eq!(m.request_prompt_tokens.get_sample_sum(), 44.0);
    assert_eq!(m.request_generation_tokens.get_sample_sum(), 16.0);
    assert_eq!(m.request_max_tokens.get_sample_sum(), 16.0);
    assert_phases_add_up(m, 2);

    // A step computes the prompt (no cached prefix here) or one token per decode; the last
    // sampled token of each request is never computed.
    assert_eq!(m.iteration_tokens.get_sample_count(), 16);
    assert_eq!(m.iteration_tokens.get_sample_sum(), (44 + 9 + 5) as f64);
    assert!(h.core.first_token_at.is_empty());
}

#[test]
fn iteration_tokens_sum_the_tokens_of_each_batch() {
    let mut h = Harness::new(Setup {
        max_num_batched_tokens: 32,
        ..Setup::default()
    });
    // A 50-token prompt is chunked 32 + 18; b's 10 decode alongside nothing, then together.
    h.submit(1, prompt(1, 50), fixed_length(3, 1), usize::MAX);
    let first = h.step();
    assert_eq!(first.scheduled, 1);
    assert_eq!(h.metrics.iteration_tokens.get_sample_sum(), 32.0);
    h.submit(2, prompt(2, 10), fixed_length(3, 2), usize::MAX);
    h.step();
    // The 18 remaining prompt tokens of a, then b's 10 fit the budget of 32.
    assert_eq!(h.metrics.iteration_tokens.get_sample_sum(), 32.0 + 28.0);
    h.run(100);
    let m = &h.metrics;
    // Every prompt token once, plus every generated token but the last of each request.
    assert_eq!(m.iteration_tokens.get_sample_sum(), (60 + 2 + 2) as f64);
    assert_eq!(m.iteration_tokens.get_sample_count(), 4);
}

#[test]
fn aborted_requests_count_only_as_aborts() {
    let mut h = Harness::new(Setup::default());
    let gone = h.submit(1, prompt(1, 20), fixed_length(50, 1), usize::MAX);
    let kept = h.submit(2, prompt(2, 20), fixed_length(4, 2), usize::MAX);
    h.step();
    h.step();
    assert_eq!(h.core.first_token_at.len(), 2);
    gone.close();
    h.run(100);
    assert_eq!(kept.finished().unwrap().completion_tokens, 4);
    let m = &h.metrics;
    assert_eq!(m.request_success.with_label_values(&["abort"]).get(), 1);
    assert_phases_add_up(m, 1);
    assert_eq!(m.request_generation_tokens.get_sample_sum(), 4.0);
    assert!(
        h.core.first_token_at.is_empty(),
        "nothing kept for the aborted one"
    );
}

#[test]
fn min_tokens_holds_off_eos() {
    // A mean of one token makes EOS certain whenever it is allowed.
    for min_tokens in [0, 1, 5] {
        let mut h = Harness::new(Setup {
            mean_output_tokens: 1.0,
            ..Setup::default()
        });
        let params = SamplingParams {
            max_tokens: 20,
            min_tokens,
            seed: Some(3),
            ..SamplingParams::default()
        };
        let c = h.submit(1, prompt(1, 8), params, usize::MAX);
        h.run(100);
        c.assert_well_formed();
        let info = c.finished().unwrap();
        assert_eq!(info.reason, FinishReason::Stop);
        assert_eq!(info.completion_tokens, min_tokens);
        assert_eq!(c.tokens().len(), min_tokens);
        assert_eq!(h.pending.load(Ordering::Acquire), 0);
        assert_eq!(h.kv_free(), h.kv_blocks());
    }
}

#[test]
fn same_seed_same_tokens_and_other_seeds_differ() {
    let p = prompt(5, 24);
    let a = solo(p.clone(), fixed_length(32, 11), 1_000.0);
    let b = solo(p.clone(), fixed_length(32, 11), 1_000.0);
    let c = solo(p, fixed_length(32, 12), 1_000.0);
    assert_eq!(a.len(), 32);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn greedy_output_depends_on_the_prompt_not_the_seed() {
    let greedy = |seed| SamplingParams {
        temperature: 0.0,
        ..fixed_length(32, seed)
    };
    let a = solo(prompt(5, 24), greedy(1), 1_000.0);
    let b = solo(prompt(5, 24), greedy(2), 1_000.0);
    let c = solo(prompt(6, 24), greedy(1), 1_000.0);
    assert_eq!(a.len(), 32);
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Two greedy requests in one batch agree too.
    let mut h = Harness::new(Setup::default());
    let x = h.submit(1, prompt(5, 24), greedy(7), usize::MAX);
    let y = h.submit(2, prompt(5, 24), greedy(8), usize::MAX);
    h.run(100);
    assert_eq!(x.tokens(), a);
    assert_eq!(y.tokens(), a);
}

#[test]
fn a_closed_client_is_aborted_at_the_next_step() {
    let mut h = Harness::new(Setup::default());
    let a = h.submit(1, prompt(1, 40), fixed_length(50, 1), usize::MAX);
    let b = h.submit(2, prompt(2, 40), fixed_length(5, 2), usize::MAX);
    let late = h.submit(3, prompt(3, 40), fixed_length(5, 3), usize::MAX);
    assert_eq!(h.pending.load(Ordering::Acquire), 3);
    // The third is closed before it was ever scheduled.
    late.close();
    for _ in 0..3 {
        h.step();
    }
    assert_eq!(h.pending.load(Ordering::Acquire), 0);
    assert_eq!(h.core.scheduler().running.len(), 2);
    let got = a.tokens().len();
    assert_eq!(got, 3);

    a.close();
    let r = h.step();
    assert_eq!(r.scheduled, 1, "only b runs");
    let ids: Vec<u64> = h.core.scheduler().running.iter().map(|s| s.id).collect();
    assert_eq!(ids, vec![2]);
    h.run(100);
    assert_eq!(a.tokens().len(), got, "nothing after the client left");
    assert!(a.finished().is_none());
    assert!(late.events().is_empty());
    assert_eq!(b.finished().unwrap().completion_tokens, 5);
    assert_eq!(h.pending.load(Ordering::Acquire), 0);
    assert_eq!(
        h.metrics
            .request_success
            .with_label_values(&["abort"])
            .get(),
        2
    );
    assert_eq!(h.metrics.kv_usage.get(), 0.0);
    assert_eq!(h.kv_free(), h.kv_blocks());
    assert!(!h.core.has_work());
}

#[test]
fn a_client_closed_while_its_tail_drains_is_dropped() {
    let mut h = Harness::new(Setup::default());
    let c = h.submit(1, prompt(1, 8), fixed_length(3, 1), 1);
    for _ in 0..10 {
        h.step();
    }
    // Finished, but its buffer is full: the engine still holds its tail.
    assert!(h.core.scheduler().is_idle());
    assert!(h.core.has_work());
    c.close();
    let r = h.step();
    assert!(r.cost.is_none());
    assert!(!h.core.has_work());
}

#[test]
fn a_full_client_delays_but_never_loses_tokens() {
    let reference = solo(prompt(9, 20), fixed_length(12, 5), 1_000.0);
    let mut h = Harness::new(Setup::default());
    let c = h.submit(1, prompt(9, 20), fixed_length(12, 5), 1);
    let mut steps = 0;
    while h.core.has_work() {
        h.step();
        steps += 1;
        assert!(steps < 1_000, "stuck");
        // A slow reader: one event every third step.
        if steps % 3 == 0 {
            c.read_one();
        }
    }
    assert!(steps > 12, "the full buffer held the stream up");
    c.assert_well_formed();
    assert_eq!(c.tokens(), reference);
    let info = c.finished().unwrap();
    assert_eq!(info.reason, FinishReason::Length);
    assert_eq!(info.completion_tokens, 12);
    assert_eq!(h.kv_free(), h.kv_blocks());
}

#[test]
fn a_request_larger_than_the_cache_is_refused_at_once() {
    let mut h = Harness::new(Setup {
        num_blocks: 4,
        ..Setup::default()
    });
    // 40 + 30 tokens need 5 blocks of 16.
    let c = h.submit(1, prompt(1, 40), fixed_length(30, 1), usize::MAX);
    let events = c.events();
    assert_eq!(events.len(), 1);
    assert!(matches!(&events[0], SeqEvent::Error(m) if m.contains("5 KV blocks")));
    assert_eq!(h.pending.load(Ordering::Acquire), 0);
    assert!(!h.core.has_work());
    assert_eq!(
        h.metrics.rejected.with_label_values(&["kv_capacity"]).get(),
        1
    );
    // 40 + 24 fit exactly.
    let ok = h.submit(2, prompt(1, 40), fixed_length(24, 1), usize::MAX);
    h.run(100);
    assert_eq!(ok.finished().unwrap().completion_tokens, 24);
}

#[test]
fn an_empty_prompt_is_refused() {
    let mut h = Harness::new(Setup::default());
    let c = h.submit(1, Vec::new(), fixed_length(4, 1), usize::MAX);
    assert!(matches!(c.events().as_slice(), [SeqEvent::Error(_)]));
    assert_eq!(h.pending.load(Ordering::Acquire), 0);
    assert!(!h.core.has_work());
}

#[test]
fn preemption_by_recompute_does_not_change_any_output() {
    const N: u64 = 32;
    let params = |i: u64| {
        let mut p = fixed_length(20 + (i as usize * 7) % 30, 1_000 + i);
        match i % 4 {
            // Sampled requests that may stop on EOS.
            0 => p.ignore_eos = false,
            // Greedy ones.
            1 => p.temperature = 0.0,
            _ => {}
        }
        p
    };
    let prompts: Vec<Vec<u32>> = (0..N)
        .map(|i| prompt((i % 5) as u32, 10 + (i as usize * 13) % 40))
        .collect();
    let mut h = Harness::new(Setup {
        num_blocks: 12,
        max_num_batched_tokens: 64,
        mean_output_tokens: 40.0,
        ..Setup::default()
    });
    let clients: Vec<Client> = (0..N)
        .map(|i| h.submit(i, prompts[i as usize].clone(), params(i), usize::MAX))
        .collect();
    assert_eq!(h.pending.load(Ordering::Acquire), N as usize);
    h.run(20_000);

    assert!(
        h.metrics.preemptions.get() > 0.0,
        "the cache was meant to be too small"
    );
    let mut preemptions = 0;
    let mut started = 0;
    for i in 0..N {
        let c = &clients[i as usize];
        c.assert_well_formed();
        let info = c.finished().unwrap();
        let p = params(i);
        assert_eq!(info.prompt_tokens, prompts[i as usize].len());
        assert_eq!(info.completion_tokens, c.tokens().len());
        if p.ignore_eos {
            assert_eq!(info.reason, FinishReason::Length);
            assert_eq!(info.completion_tokens, p.max_tokens);
        }
        preemptions += info.preemptions;
        started += u64::from(info.completion_tokens > 0);
        let alone = solo(prompts[i as usize].clone(), p, 40.0);
        assert_eq!(c.tokens(), alone, "request {i} changed under preemption");
    }
    assert_eq!(f64::from(preemptions), h.metrics.preemptions.get());
    assert_eq!(h.pending.load(Ordering::Acquire), 0);
    assert_eq!(h.metrics.ttft.get_sample_count(), started);
    // Preemptions stretch the phases but never break them apart.
    assert_phases_add_up(&h.metrics, N);
    let completion: usize = clients.iter().map(|c| c.tokens().len()).sum();
    assert_eq!(
        h.metrics.request_generation_tokens.get_sample_sum(),
        completion as f64
    );
    assert_eq!(h.kv_free(), h.kv_blocks());
    assert_eq!(h.metrics.kv_usage.get(), 0.0);
}

#[test]
fn a_step_with_nothing_to_run_costs_nothing() {
    let mut h = Harness::new(Setup::default());
    let r = h.step();
    assert_eq!(r.cost, None);
    assert_eq!(r.end, 0.0);
    assert_eq!(h.clock.now(), 0.0);
}

#[test]
fn cached_prefix_tokens_are_reported() {
    let mut h = Harness::new(Setup::default());
    let shared = prompt(4, 3 * BS + 5);
    let first = h.submit(1, shared.clone(), fixed_length(2, 1), usize::MAX);
    h.run(100);
    assert_eq!(first.finished().unwrap().cached_tokens, 0);
    let mut p = shared[..2 * BS].to_vec();
    p.extend(prompt(8, 10));
    let second = h.submit(2, p, fixed_length(2, 2), usize::MAX);
    h.run(100);
    assert_eq!(second.finished().unwrap().cached_tokens, 2 * BS);
    let queried = (3 * BS + 5 + 2 * BS + 10) as f64;
    assert_eq!(h.metrics.prefix_queries.get(), queried);
    assert_eq!(h.metrics.prefix_hits.get(), (2 * BS) as f64);
}

#[test]
fn the_engine_loop_serves_until_every_sender_is_gone() {
    let h = Harness::new(Setup {
        num_blocks: 16,
        ..Setup::default()
    });
    let (submit, requests) = std::sync::mpsc::channel();
    let pending = h.pending.clone();
    let clients: Vec<Client> = (0..8u64)
        .map(|i| {
            let (client, sink) = Client::new(usize::MAX);
            pending.fetch_add(1, Ordering::AcqRel);
            let req = NewRequest {
                id: i,
                prompt: prompt(i as u32, 20),
                params: fixed_length(10, i),
                sink,
                prefix_keys: None,
            };
            submit.send(vec![req]).unwrap();
            client
        })
        .collect();
    drop(submit);
    let core = h.core;
    std::thread::spawn(move || run_engine_loop(core, requests))
        .join()
        .unwrap();
    for c in &clients {
        c.assert_well_formed();
        assert_eq!(c.finished().unwrap().completion_tokens, 10);
    }
    assert_eq!(pending.load(Ordering::Acquire), 0);
    assert!(h.clock.now() > 0.0);
}

#[path = "core_group_tests.rs"]
mod group;

#[path = "core_time_tests.rs"]
mod time;

#[test]
fn finish_info_carries_batch_sizes_and_phase_times_for_the_flight_record() {
    let mut h = Harness::new(Setup::default());
    // Three requests start together; a fourth joins after two steps.
    let first: Vec<Client> = (0..3)
        .map(|i| h.submit(i, prompt(i as u32, 30), fixed_length(5, i), usize::MAX))
        .collect();
    h.step();
    h.step();
    let late = h.submit(9, prompt(9, 30), fixed_length(3, 9), usize::MAX);
    h.run(100);
    let info = first[0].finished().unwrap();
    assert_eq!(
        info.batch_max, 4,
        "the late request's prefill shared a step"
    );
    assert_eq!(info.batch_min, 3);
    let steps = u64::from(info.eager_steps + info.graph_steps);
    assert!(info.batch_sum >= 3 * steps && info.batch_sum <= 4 * steps);
    assert!(info.decode_s > 0.0 && info.prefill_s > 0.0 && info.queue_s >= 0.0);
    // The histogram counts the same steps: the late prefill's step of 4 apart from decode.
    let hist = &info.batch_hist;
    assert_eq!(hist.steps(), steps);
    assert!(
        hist.mixed.bins().iter().any(|&(size, _)| size == 4),
        "{hist:?}"
    );
    assert!(
        hist.decode.bins().iter().all(|&(size, _)| size >= 3),
        "{hist:?}"
    );
    assert!(hist.decode.steps() >= u64::from(info.graph_steps));
    let info = late.finished().unwrap();
    assert!(info.batch_min >= 1 && info.batch_max == 4, "{info:?}");
    assert_eq!(
        info.batch_hist.steps(),
        u64::from(info.eager_steps + info.graph_steps)
    );
}

#[test]
fn a_scripted_answer_emits_its_tokens_and_counts_them() {
    use crate::misbehave::Script;
    // A loop runs to max_tokens whatever EOS the sampler draws (mean output of 1 token).
    let looping = SamplingParams {
        max_tokens: 7,
        seed: Some(3),
        script: Some(Arc::new(Script::Cycle(vec![1_001, 1_002]))),
        ..SamplingParams::default()
    };
    let mut h = Harness::new(Setup {
        mean_output_tokens: 1.0,
        ..Setup::default()
    });
    let c = h.submit(1, prompt(1, 20), looping, usize::MAX);
    h.run(100);
    c.assert_well_formed();
    assert_eq!(
        c.tokens(),
        [1_001, 1_002, 1_001, 1_002, 1_001, 1_002, 1_001]
    );
    let info = c.finished().unwrap();
    assert_eq!(
        (info.reason, info.completion_tokens),
        (FinishReason::Length, 7)
    );

    // A one-off script ends with EOS after its tokens; an empty one at once.
    for (script, want) in [(vec![1_005, 1_006], 2), (vec![], 0)] {
        let once = SamplingParams {
            max_tokens: 50,
            seed: Some(3),
            script: Some(Arc::new(Script::Once(script.clone()))),
            ..SamplingParams::default()
        };
        let mut h = Harness::new(Setup {
            mean_output_tokens: 1_000.0,
            ..Setup::default()
        });
        let c = h.submit(2, prompt(2, 20), once, usize::MAX);
        h.run(100);
        c.assert_well_formed();
        assert_eq!(c.tokens(), script);
        let info = c.finished().unwrap();
        assert_eq!(
            (info.reason, info.completion_tokens),
            (FinishReason::Stop, want)
        );
    }
}
