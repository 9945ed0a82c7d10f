//! Tests of the cpu backend's logprobs on the default model: prompt logprobs from a chunked,
//! batched step agree with a whole-prompt pass, and a generated token's logprob is the raw
//! log-softmax of its logits (before temperature).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::block_manager::BlockManager;
use crate::clock::VirtualClock;
use crate::core::EngineCore;
use crate::logprobs;
use crate::metrics::EngineMetrics;
use crate::model::forward::SeqChunk;
use crate::model::{self, default_model};
use crate::request::SamplingParams;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::sequence::{EventSink, NewRequest, SendError, SeqEvent};

const BS: usize = 4;
const BLOCKS: usize = 64;

/// The default model, built once into a shared temp directory (reused by later runs; `ensure`
/// is safe against concurrent callers and rebuilds an incomplete copy).
fn tiny() -> Model {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let root = std::env::temp_dir().join("infergate-cpu-backend-tests");
        default_model::ensure(&root).unwrap()
    });
    let loaded = model::load(dir).unwrap_or_else(|e| panic!("{e}"));
    Model::new(loaded.config, loaded.weights)
}

struct Inbox(Arc<std::sync::Mutex<Vec<SeqEvent>>>);

impl EventSink for Inbox {
    fn try_send(&mut self, event: SeqEvent) -> Result<(), SendError> {
        self.0.lock().unwrap().push(event);
        Ok(())
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// Serves `prompt` with `params` on a core whose token budget (5) chunks the prompt, beside a
/// second, unrelated request; returns the first request's events.
fn serve(prompt: &[u32], params: SamplingParams) -> Vec<SeqEvent> {
    let sched = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 5,
            chunked_prefill: true,
        },
        BlockManager::new(BLOCKS, BS, true),
    );
    let pending = Arc::new(AtomicUsize::new(2));
    let mut core = EngineCore::new(
        sched,
        Box::new(CpuBackend::new(Arc::new(tiny()), BLOCKS, BS)),
        Arc::new(VirtualClock::new()),
        Arc::new(EngineMetrics::new("m").unwrap()),
        pending.clone(),
    );
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let other = SamplingParams {
        max_tokens: 3,
        ..SamplingParams::default()
    };
    for (id, prompt, params, sink) in [
        (1, prompt.to_vec(), params, Inbox(events.clone())),
        (2, vec![7, 8, 9], other, Inbox(Arc::default())),
    ] {
        core.add_request(NewRequest {
            id,
            prompt,
            params,
            sink: Box::new(sink),
            prefix_keys: None,
        });
    }
    for _ in 0..200 {
        if !core.has_work() {
            break;
        }
        core.step();
    }
    assert_eq!(pending.load(Ordering::Acquire), 0);
    events.lock().unwrap().clone()
}

#[test]
fn prompt_and_token_logprobs_are_the_raw_log_softmax() {
    let model = tiny();
    let prompt: Vec<u32> = (0..13u32).map(|i| 40 + i * 17).collect();
    // Reference: the whole prompt in one pass, logits of every position.
    let mut cache = model.new_cache(BLOCKS, BS);
    let table: Vec<u32> = (0..prompt.len().div_ceil(BS) as u32).collect();
    let chunk = SeqChunk {
        tokens: &prompt,
        start: 0,
        block_table: &table,
        want_logits: true,
        prompt_len: prompt.len(),
    };
    let rows: Vec<(usize, usize)> = (0..prompt.len()).map(|p| (0, p)).collect();
    let mut all = Vec::new();
    let last = model
        .forward_with_rows(&mut cache, &[chunk], &rows, &mut |_, l| {
            all.push(l.to_vec())
        })
        .unwrap();
    assert_eq!(all.len(), prompt.len());
    assert_eq!(
        all[prompt.len() - 1],
        last[0],
        "the extra rows are the same head"
    );

    // Temperature 2 changes what is sampled from, not the reported (raw) logprobs.
    let params = SamplingParams {
        max_tokens: 1,
        temperature: 2.0,
        seed: Some(5),
        logprobs: Some(4),
        prompt_logprobs: Some(4),
        ..SamplingParams::default()
    };
    let events = serve(&prompt, params);
    let SeqEvent::Tokens(chunk) = &events[0] else {
        panic!("{events:?}");
    };
    let got = chunk.prompt_logprobs.as_ref().unwrap();
    assert_eq!(got.len(), prompt.len());
    assert!(got[0].is_none());
    for p in 1..prompt.len() {
        let want = logprobs::from_logits(&all[p - 1], prompt[p], 4);
        let e = got[p].as_ref().unwrap();
        assert_eq!(e.token, want.token);
        assert!((e.logprob - want.logprob).abs() < 1e-5, "position {p}");
        for (a, b) in e.top.iter().zip(&want.top) {
            assert_eq!(a.0, b.0);
            assert!((a.1 - b.1).abs() < 1e-5);
        }
    }
    let lp = &chunk.logprobs[0];
    let want = logprobs::from_logits(&all[prompt.len() - 1], chunk.ids[0], 4);
    assert_eq!(lp.token, chunk.ids[0]);
    assert!((lp.logprob - want.logprob).abs() < 1e-5);
    assert_eq!(
        lp.top.iter().map(|t| t.0).collect::<Vec<_>>(),
        want.top.iter().map(|t| t.0).collect::<Vec<_>>()
    );
}

#[test]
fn greedy_tokens_are_their_top_alternative() {
    let prompt: Vec<u32> = (0..9u32).map(|i| 100 + i * 3).collect();
    let params = SamplingParams {
        max_tokens: 6,
        temperature: 0.0,
        ignore_eos: true,
        logprobs: Some(3),
        ..SamplingParams::default()
    };
    let events = serve(&prompt, params);
    let mut n = 0;
    for e in &events {
        if let SeqEvent::Tokens(c) = e {
            for (id, lp) in c.ids.iter().zip(&c.logprobs) {
                assert_eq!(lp.top[0].0, *id, "greedy takes the argmax");
                assert_eq!(lp.top[0].1, lp.logprob);
                n += 1;
            }
        }
    }
    assert_eq!(n, 6);
}

#[test]
fn embeddings_are_unit_norm_deterministic_and_input_dependent() {
    let m = tiny();
    let a = m.embed(&[1, 2, 3, 4, 5]).unwrap();
    assert_eq!(a.len(), m.config.hidden_size);
    let norm: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    assert_eq!(a, m.embed(&[1, 2, 3, 4, 5]).unwrap());
    assert_ne!(a, m.embed(&[5, 4, 3, 2, 1]).unwrap());
    // Longer than one scratch block, and out-of-vocabulary ids are refused.
    assert_eq!(m.embed(&[7; 40]).unwrap().len(), m.config.hidden_size);
    assert!(m.embed(&[u32::MAX]).is_err());
    assert!(m.embed(&[]).is_err());
}

#[test]
fn warm_up_runs_a_real_pass_per_capture_size_even_past_the_cache() {
    let mut backend = CpuBackend::new(Arc::new(tiny()), 2, BS);
    for size in [1, 4] {
        let cost = crate::capture_cost::SizeCost {
            size,
            bytes: 0,
            seconds: 0.0,
        };
        let warmed = backend.warm_up(&cost).unwrap();
        assert_eq!(warmed, crate::warmup::Warmed::default());
    }
}
