//! Tests of where the core's time goes: busy inside steps, host time between them (the sim
//! backend's modelled host time included), batch sizes, recomputed tokens and the caps.

use super::*;
use crate::host_time::HostCost;

/// Steps `h` until no work is left, without the harness's no-host-time check; returns the
/// steps run and the sum of their costs.
fn run_raw(h: &mut Harness, max_steps: usize) -> (u64, f64) {
    let (mut steps, mut busy) = (0, 0.0);
    for _ in 0..max_steps {
        if !h.core.has_work() {
            return (steps, busy);
        }
        if let Some(cost) = h.core.step().cost {
            steps += 1;
            busy += cost.seconds;
        }
    }
    panic!("still busy after {max_steps} steps");
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn without_host_time_a_saturated_engine_is_all_busy() {
    let mut h = Harness::new(Setup::default());
    for i in 0..16 {
        h.submit(i, prompt(i as u32, 40), fixed_length(20, i), usize::MAX);
    }
    let (steps, busy) = run_raw(&mut h, 10_000);
    let m = &h.metrics;
    assert!(close(m.busy_seconds.get(), busy));
    assert_eq!(m.host_seconds.get(), 0.0);
    // Every step is observed, and the whole run was inside steps.
    assert_eq!(m.step_gap.get_sample_count(), steps);
    assert!(close(h.clock.now(), busy));
    assert_eq!(m.batch_size.get_sample_count(), steps);
}

#[test]
fn modelled_host_time_idles_the_accelerator_and_advances_the_clock() {
    let host = HostCost::from_micros(10_000.0, 0.0, 0.0, 0.0);
    let mut h = Harness::new(Setup {
        host_cost: host,
        ..Setup::default()
    });
    for i in 0..16 {
        h.submit(i, prompt(i as u32, 40), fixed_length(20, i), usize::MAX);
    }
    let (steps, busy) = run_raw(&mut h, 10_000);
    let m = &h.metrics;
    // 10 ms before every step, the first included (the loop had the requests in hand).
    assert!(close(m.host_seconds.get(), 0.01 * steps as f64));
    assert!(close(m.busy_seconds.get(), busy));
    // The virtual clock advanced by both: the host time was waited, not only counted.
    assert!(close(h.clock.now(), busy + m.host_seconds.get()));
    let busy_fraction = busy / h.clock.now();
    assert!(
        busy_fraction < 0.5,
        "a 10 ms host overhead dwarfs short steps: busy {busy_fraction}"
    );
    assert_eq!(m.step_gap.get_sample_count(), steps);
    assert!(close(m.step_gap.get_sample_sum(), m.host_seconds.get()));
}

#[test]
fn host_time_follows_tokens_in_and_out_and_sequences() {
    // One request alone: 100 prompt tokens tokenised once, 10 tokens out, one sequence a step.
    let run = |host: HostCost| {
        let mut h = Harness::new(Setup {
            host_cost: host,
            max_num_batched_tokens: 64,
            ..Setup::default()
        });
        h.submit(1, prompt(1, 100), fixed_length(10, 1), usize::MAX);
        let (steps, _) = run_raw(&mut h, 1_000);
        (steps, h.metrics.host_seconds.get())
    };
    let (steps, per_prompt) = run(HostCost::from_micros(0.0, 0.0, 1.0, 0.0));
    // 64 + 36 prompt tokens, then 9 decode steps.
    assert_eq!(steps, 2 + 9);
    assert!(close(per_prompt, 100e-6), "{per_prompt}");
    let (_, per_output) = run(HostCost::from_micros(0.0, 0.0, 0.0, 1.0));
    assert!(close(per_output, 10e-6), "{per_output}");
    let (_, per_seq) = run(HostCost::from_micros(0.0, 1.0, 0.0, 0.0));
    assert!(close(per_seq, steps as f64 * 1e-6), "{per_seq}");
}

#[test]
fn idle_time_between_requests_is_not_host_time() {
    let mut h = Harness::new(Setup::default());
    h.submit(1, prompt(1, 20), fixed_length(5, 1), usize::MAX);
    run_raw(&mut h, 1_000);
    // Nothing to do for a minute, then another request.
    h.clock.advance_to(h.clock.now() + 60.0);
    h.submit(2, prompt(2, 20), fixed_length(5, 2), usize::MAX);
    let (_, busy) = run_raw(&mut h, 1_000);
    assert!(busy > 0.0);
    assert_eq!(h.metrics.host_seconds.get(), 0.0);
}

#[test]
fn batch_sizes_are_the_sequences_of_each_step() {
    let mut h = Harness::new(Setup {
        max_num_seqs: 4,
        ..Setup::default()
    });
    for i in 0..8 {
        h.submit(i, prompt(i as u32, 10), fixed_length(3, i), usize::MAX);
    }
    let mut scheduled = 0;
    while h.core.has_work() {
        scheduled += h.core.step().scheduled;
    }
    let m = &h.metrics;
    assert_eq!(m.batch_size.get_sample_sum(), scheduled as f64);
    // The cap shows, and no step went past it.
    assert_eq!(m.max_num_seqs.get(), 4.0);
    assert_eq!(m.max_num_batched_tokens.get(), 2_048.0);
    let text = m.render();
    let over = text
        .lines()
        .find(|l| l.starts_with("infergate_engine_batch_size_bucket{") && l.contains("le=\"4\""))
        .unwrap();
    assert!(
        over.ends_with(&format!(" {}", m.batch_size.get_sample_count())),
        "{over}"
    );
}

#[test]
fn recomputed_tokens_count_the_work_a_preemption_threw_away() {
    let run = |num_blocks: usize| {
        let mut h = Harness::new(Setup {
            num_blocks,
            max_num_batched_tokens: 64,
            ..Setup::default()
        });
        for i in 0..16 {
            h.submit(i, prompt(i as u32, 30), fixed_length(30, i), usize::MAX);
        }
        h.run(20_000);
        (
            h.metrics.preemptions.get(),
            h.metrics.recomputed_tokens.get(),
        )
    };
    let (preemptions, recomputed) = run(1_024);
    assert_eq!((preemptions, recomputed), (0.0, 0.0));
    let (preemptions, recomputed) = run(12);
    assert!(preemptions > 0.0, "the cache was meant to be too small");
    assert!(
        recomputed >= preemptions,
        "each preemption threw computed tokens away: {recomputed} for {preemptions}"
    );
}

/// A backend that runs in real time, as cpu and cuda do: each pass takes its cost off the
/// (virtual) clock while it runs, and it models no host time.
struct RealTime {
    inner: SimBackend,
    clock: Arc<VirtualClock>,
}

impl Backend for RealTime {
    fn execute(&mut self, batch: &crate::scheduler::Batch, running: &[Sequence]) -> StepCost {
        let cost = self.inner.execute(batch, running);
        self.clock.advance_to(self.clock.now() + cost.seconds);
        cost
    }

    fn sample(&mut self, seq: &mut Sequence) -> crate::backend::Sampled {
        self.inner.sample(seq)
    }

    fn prompt_logprobs(&mut self, seq: &mut Sequence) {
        self.inner.prompt_logprobs(seq);
    }

    fn eos_token(&self) -> u32 {
        self.inner.eos_token()
    }
}

#[test]
fn a_real_time_backend_counts_the_host_time_that_really_passed() {
    let clock = Arc::new(VirtualClock::new());
    let model = RooflineModel::new(
        presets::gpu("h100").unwrap(),
        presets::model("llama-3-8b").unwrap(),
        RooflineConfig::default(),
    );
    let inner = SimBackend::new(model, (1_000..1_100).collect(), EOS, 1_000.0, BS);
    let backend = RealTime {
        inner,
        clock: clock.clone(),
    };
    let sched = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: 64,
            max_num_batched_tokens: 2_048,
            chunked_prefill: true,
        },
        BlockManager::new(1_024, BS, true),
    );
    let metrics = Arc::new(EngineMetrics::new("m").unwrap());
    let pending = Arc::new(AtomicUsize::new(0));
    let core = EngineCore::new(
        sched,
        Box::new(backend),
        clock.clone(),
        metrics.clone(),
        pending.clone(),
    );
    let mut h = Harness {
        core,
        clock,
        metrics,
        pending,
        busy_s: 0.0,
        paths: Vec::new(),
    };
    for i in 0..4 {
        h.submit(i, prompt(i as u32, 20), fixed_length(10, i), usize::MAX);
    }
    let (mut steps, mut busy) = (0u32, 0.0);
    while h.core.has_work() {
        let before = h.clock.now();
        let report = h.core.step();
        let cost = report.cost.unwrap();
        // The step ended when the pass did, on the clock.
        assert!(close(report.end, before + cost.seconds));
        assert!(close(report.end, h.clock.now()));
        steps += 1;
        busy += cost.seconds;
        // 3 ms of host work before the next step: within what a modelled GPU would overlap,
        // but a real pass cannot start before it is done.
        h.clock.advance_to(h.clock.now() + 0.003);
    }
    let m = &h.metrics;
    assert!(close(m.busy_seconds.get(), busy));
    // The gap after the last step is idle (nothing was left), so it is not counted.
    assert!(
        close(m.host_seconds.get(), 0.003 * f64::from(steps - 1)),
        "{} over {steps} steps",
        m.host_seconds.get()
    );
}
