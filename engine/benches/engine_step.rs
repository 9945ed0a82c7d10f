//! CPU cost of the engine's hot paths: one full engine step with 256 decoding sequences (schedule,
//! cost model, sample, stream out) and a prefix-cache lookup for a 4k-token prompt.
#![expect(
    clippy::expect_used,
    reason = "tests and benches stop at the first thing that is not as it should be"
)]

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use criterion::{Criterion, criterion_group, criterion_main};
use infergate_engine::backend::sim::SimBackend;
use infergate_engine::block_manager::{BlockManager, block_hashes};
use infergate_engine::clock::VirtualClock;
use infergate_engine::core::EngineCore;
use infergate_engine::metrics::EngineMetrics;
use infergate_engine::presets;
use infergate_engine::request::SamplingParams;
use infergate_engine::roofline::{RooflineConfig, RooflineModel};
use infergate_engine::scheduler::{Scheduler, SchedulerConfig};
use infergate_engine::sequence::{EventSink, NewRequest, SendError, SeqEvent};

/// A client that takes every event and keeps none.
struct NullSink;

impl EventSink for NullSink {
    fn try_send(&mut self, _event: SeqEvent) -> Result<(), SendError> {
        Ok(())
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// A request with a 512-token prompt and an answer length that staggers completions.
fn add(core: &mut EngineCore, i: u64) {
    let prompt = (0..512u32)
        .map(|t| 1000 + ((t * 7 + i as u32 * 13) % 20_000))
        .collect();
    core.add_request(NewRequest {
        id: i,
        prompt,
        params: SamplingParams {
            max_tokens: 256 + (i as usize * 37) % 768,
            ignore_eos: true,
            seed: Some(i),
            ..SamplingParams::default()
        },
        sink: Box::new(NullSink),
        prefix_keys: None,
    });
}

fn core_with_running(n: usize) -> EngineCore {
    let (Some(gpu), Some(model)) = (presets::gpu("h100"), presets::model("llama-3-8b")) else {
        panic!("presets missing");
    };
    let roofline = RooflineModel::new(gpu, model, RooflineConfig::default());
    let vocab: Vec<u32> = (1000..30_000).collect();
    let backend = SimBackend::new(roofline, vocab, 999, 1e9, 16);
    let sched = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: n,
            max_num_batched_tokens: 8192,
            chunked_prefill: true,
        },
        BlockManager::new(200_000, 16, true),
    );
    let pending = Arc::new(AtomicUsize::new(n));
    let metrics = Arc::new(EngineMetrics::new("bench").expect("metrics"));
    let mut core = EngineCore::new(
        sched,
        Box::new(backend),
        Arc::new(VirtualClock::new()),
        metrics,
        pending,
    );
    for i in 0..n as u64 {
        add(&mut core, i);
    }
    // Prefill everything so the measured steps are pure decode steps of n sequences.
    while core.scheduler().running.len() < n
        || core.scheduler().running.iter().any(|s| s.remaining() > 1)
    {
        core.step();
    }
    core
}

fn bench_step(c: &mut Criterion) {
    let mut core = core_with_running(256);
    let mut next_id = 256;
    // Steady state: every finished request is replaced, so about 256 sequences keep decoding
    // (a replacement's 512-token prefill joins the batch, as in real serving).
    c.bench_function("engine_step_256_running", |b| {
        b.iter(|| {
            let report = core.step();
            for _ in 0..report.finished {
                add(&mut core, next_id);
                next_id += 1;
            }
            black_box(report)
        });
    });
}

fn bench_prefix_lookup(c: &mut Criterion) {
    let prompt: Vec<u32> = (0..4096).map(|t| 1000 + (t * 31) % 50_000).collect();
    let mut kv = BlockManager::new(10_000, 16, true);
    let hashes = block_hashes(&prompt, 16);
    let mut table = Vec::new();
    assert!(kv.allocate_slots(&mut table, prompt.len()));
    kv.cache_full_blocks(&table, &hashes, 0, hashes.len());
    kv.free(&mut table);
    c.bench_function("prefix_lookup_4k_tokens", |b| {
        b.iter(|| {
            let h = block_hashes(black_box(&prompt), 16);
            black_box(kv.find_cached_prefix(&h))
        });
    });
}

criterion_group!(benches, bench_step, bench_prefix_lookup);
criterion_main!(benches);
