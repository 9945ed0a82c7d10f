//! Each rule's positive case, its falsifier (the measurement that would show it wrong moves it
//! off, or onto the symptom it names), the healthy case and missing data.

use super::*;

/// A healthy, lightly loaded pool with every measurement present.
fn healthy() -> Snapshot {
    Snapshot {
        window_s: 30.0,
        workers: 2,
        busy_workers: 2,
        busy_fraction: Some(0.35),
        host_share: Some(0.05),
        step_gap_mean_s: Some(0.0005),
        batch_size_mean: Some(4.0),
        max_num_seqs: Some(256.0),
        tokens_per_step_mean: Some(300.0),
        max_num_batched_tokens: Some(8192.0),
        kv_usage_max: Some(0.2),
        running_per_worker: Some(4.0),
        queue_per_worker: Some(0.0),
        preemptions: Some(0.0),
        recomputed_tokens_per_s: Some(0.0),
        requests: Some(120.0),
        long_prompt_share: Some(0.0),
        prompt_p99_tokens: Some(900.0),
        prompt_mean_tokens: Some(400.0),
        itl_p99_s: Some(0.02),
        itl_max_s: Some(0.05),
        tpot_mean_s: Some(0.009),
        tpot_p95_s: Some(0.012),
        ttft_p95_s: Some(0.3),
        cost_usd_per_1k_tokens: Some(0.0005),
        cached_share: Some(0.5),
        prompt_per_completion: Some(2.0),
    }
}

fn names(s: &Snapshot) -> Vec<&'static str> {
    diagnose(s).findings.iter().map(|f| f.name).collect()
}

#[test]
fn healthy_names_nothing_and_lacks_nothing() {
    let d = diagnose(&healthy());
    assert!(d.findings.is_empty(), "{:?}", d.findings);
    assert!(d.missing.is_empty(), "{:?}", d.missing);
}

fn tpot_at_peak_case() -> Snapshot {
    Snapshot {
        busy_fraction: Some(0.92),
        tpot_p95_s: Some(0.035),
        tpot_mean_s: Some(0.030),
        itl_p99_s: Some(0.045),
        running_per_worker: Some(96.0),
        batch_size_mean: Some(96.0),
        ..healthy()
    }
}

#[test]
fn tpot_at_peak_is_3_1_with_its_values() {
    let d = diagnose(&tpot_at_peak_case());
    assert_eq!(names(&tpot_at_peak_case()), ["tpot-at-peak"]);
    let f = &d.findings[0];
    assert_eq!(f.symptom, "3.1");
    assert_eq!(f.confirming["tpot_p95_s"], Some(0.035));
    assert_eq!(f.confirming["running_per_worker"], Some(96.0));
    assert!(f.falsifier.contains("3.2") && f.falsifier.contains("3.4"));
}

#[test]
fn a_p95_inside_the_10_to_25_ms_bucket_is_not_slow() {
    // The live `tpot-at-peak` lever (--max-num-batched-tokens 512): requests at 15-18 ms, which
    // vLLM's 10-25 ms bucket interpolates to a p95 of 24 ms, at a large busy batch.
    let lever = Snapshot {
        tpot_p95_s: Some(0.024),
        tpot_mean_s: Some(0.015),
        ..tpot_at_peak_case()
    };
    assert!(tpot_at_peak(&lever).is_none());
    assert_eq!(names(&lever), Vec::<&str>::new());
    // Past the bucket bound (more than 5% of requests slower than 25 ms) it is 3.1.
    let symptom = Snapshot {
        tpot_p95_s: Some(0.048),
        ..lever
    };
    assert_eq!(names(&symptom), ["tpot-at-peak"]);
}

#[test]
fn tpot_at_peak_falsified_by_idle_accelerator_small_batch_or_slow_start() {
    let idle = Snapshot {
        busy_fraction: Some(0.3),
        ..tpot_at_peak_case()
    };
    assert!(tpot_at_peak(&idle).is_none());
    let small = Snapshot {
        running_per_worker: Some(2.0),
        ..tpot_at_peak_case()
    };
    assert!(tpot_at_peak(&small).is_none());
    let slow_start = Snapshot {
        ttft_p95_s: Some(20.0),
        ..tpot_at_peak_case()
    };
    assert!(tpot_at_peak(&slow_start).is_none());
}

fn small_batches_case() -> Snapshot {
    Snapshot {
        busy_fraction: Some(0.3),
        batch_size_mean: Some(2.0),
        running_per_worker: Some(2.0),
        max_num_seqs: Some(2.0),
        queue_per_worker: Some(40.0),
        ttft_p95_s: Some(25.0),
        ..healthy()
    }
}

fn host_bound_case() -> Snapshot {
    Snapshot {
        busy_fraction: Some(0.3),
        host_share: Some(0.65),
        step_gap_mean_s: Some(0.02),
        batch_size_mean: Some(24.0),
        running_per_worker: Some(24.0),
        queue_per_worker: Some(40.0),
        ttft_p95_s: Some(25.0),
        ..healthy()
    }
}

#[test]
fn the_two_3_2_mechanisms_are_told_apart() {
    let d = diagnose(&small_batches_case());
    assert_eq!(names(&small_batches_case()), ["small-batches"]);
    assert_eq!(d.findings[0].symptom, "3.2");
    assert!(d.findings[0].mechanism.starts_with("small batches"));
    assert_eq!(d.findings[0].confirming["max_num_seqs"], Some(2.0));
    let d = diagnose(&host_bound_case());
    assert_eq!(names(&host_bound_case()), ["host-bound"]);
    assert!(d.findings[0].mechanism.starts_with("host-bound"));
    assert_eq!(d.findings[0].confirming["host_share"], Some(0.65));
}

#[test]
fn small_batches_also_by_tokens_or_kv() {
    let tokens = Snapshot {
        max_num_seqs: Some(256.0),
        tokens_per_step_mean: Some(500.0),
        max_num_batched_tokens: Some(512.0),
        ..small_batches_case()
    };
    assert_eq!(names(&tokens), ["small-batches"]);
    let kv = Snapshot {
        max_num_seqs: Some(256.0),
        kv_usage_max: Some(0.97),
        ..small_batches_case()
    };
    assert_eq!(names(&kv), ["small-batches"]);
}

#[test]
fn small_batches_falsified_by_a_batch_below_its_caps() {
    // Below every cap with short step gaps: neither mechanism.
    let below = Snapshot {
        max_num_seqs: Some(256.0),
        ..small_batches_case()
    };
    assert!(idle_with_queue(&below).is_none());
    // Below every cap with long gaps: the falsifier's other symptom, 3.2 (a).
    let gaps = Snapshot {
        host_share: Some(0.6),
        ..below
    };
    assert_eq!(names(&gaps), ["host-bound"]);
    // A saturated accelerator at a large batch pinned at its cap: not small batches.
    let large = Snapshot {
        busy_fraction: Some(0.95),
        batch_size_mean: Some(64.0),
        running_per_worker: Some(64.0),
        max_num_seqs: Some(64.0),
        ..small_batches_case()
    };
    assert!(idle_with_queue(&large).is_none());
    // A batch of two stepping back to back is "busy" by the step clock, and still small.
    let stepping = Snapshot {
        busy_fraction: Some(0.98),
        ..small_batches_case()
    };
    assert_eq!(names(&stepping), ["small-batches"]);
}

#[test]
fn host_bound_falsified_by_short_gaps_or_a_pinned_batch() {
    let short = Snapshot {
        host_share: Some(0.05),
        ..host_bound_case()
    };
    assert!(idle_with_queue(&short).is_none());
    // A batch of 24 pinned at its cap: the host's share decides: (a); with short gaps the cap
    // binds: (b).
    let pinned = Snapshot {
        max_num_seqs: Some(24.0),
        ..host_bound_case()
    };
    assert_eq!(names(&pinned), ["host-bound"]);
    let pinned_short = Snapshot {
        host_share: Some(0.05),
        ..pinned.clone()
    };
    assert_eq!(names(&pinned_short), ["small-batches"]);
    // A batch of 4 pinned at its cap: its host share is the small batch's doing: (b).
    let small = Snapshot {
        batch_size_mean: Some(4.0),
        running_per_worker: Some(4.0),
        max_num_seqs: Some(4.0),
        ..pinned
    };
    assert_eq!(names(&small), ["small-batches"]);
    let no_queue = Snapshot {
        queue_per_worker: Some(0.5),
        ..host_bound_case()
    };
    assert!(idle_with_queue(&no_queue).is_none());
    let busy = Snapshot {
        busy_fraction: Some(0.8),
        ..host_bound_case()
    };
    assert!(idle_with_queue(&busy).is_none());
}

fn long_context_case() -> Snapshot {
    Snapshot {
        preemptions: Some(14.0),
        recomputed_tokens_per_s: Some(9000.0),
        kv_usage_max: Some(0.99),
        long_prompt_share: Some(0.02),
        prompt_p99_tokens: Some(31_000.0),
        prompt_mean_tokens: Some(1200.0),
        ..healthy()
    }
}

#[test]
fn preemptions_with_long_prompts_are_3_3() {
    assert_eq!(names(&long_context_case()), ["long-context"]);
    let f = long_context(&long_context_case()).unwrap();
    assert_eq!(f.symptom, "3.3");
    assert_eq!(f.confirming["preemptions"], Some(14.0));
    assert_eq!(f.evidence, 1.0);
}

#[test]
fn long_context_falsified_without_long_prompts_or_without_pressure() {
    let short = Snapshot {
        long_prompt_share: Some(0.0),
        prompt_p99_tokens: Some(2000.0),
        ..long_context_case()
    };
    assert!(long_context(&short).is_none());
    let roomy = Snapshot {
        preemptions: Some(0.0),
        recomputed_tokens_per_s: Some(0.0),
        kv_usage_max: Some(0.4),
        ..long_context_case()
    };
    assert!(long_context(&roomy).is_none());
    // A full cache alone (no preemption yet) still matches, with less weight.
    let full = Snapshot {
        preemptions: Some(0.0),
        recomputed_tokens_per_s: Some(0.0),
        ..long_context_case()
    };
    assert_eq!(long_context(&full).unwrap().evidence, PARTIAL_EVIDENCE);
}

fn itl_freeze_case() -> Snapshot {
    Snapshot {
        itl_p99_s: Some(0.28),
        itl_max_s: Some(1.0),
        tpot_mean_s: Some(0.009),
        ..healthy()
    }
}

#[test]
fn an_itl_tail_over_a_healthy_mean_is_3_4() {
    assert_eq!(names(&itl_freeze_case()), ["itl-freeze"]);
    let f = itl_freeze(&itl_freeze_case()).unwrap();
    assert_eq!(f.confirming["itl_p99_s"], Some(0.28));
    assert!((f.confirming["itl_p99_over_tpot_mean"].unwrap() - 31.11).abs() < 0.01);
}

#[test]
fn a_rare_long_freeze_is_3_4_from_the_largest_gap() {
    // A few 30k-token prefills: p99 untouched, the largest gap seconds long.
    let rare = Snapshot {
        itl_p99_s: Some(0.0126),
        itl_max_s: Some(2.5),
        tpot_mean_s: Some(0.0078),
        ..healthy()
    };
    assert_eq!(names(&rare), ["itl-freeze"]);
    let f = itl_freeze(&rare).unwrap();
    assert!(f.confirming["itl_max_over_tpot_mean"].unwrap() > 300.0);
    // A largest gap of 150 ms is not a freeze.
    let blip = Snapshot {
        itl_max_s: Some(0.15),
        ..rare
    };
    assert!(itl_freeze(&blip).is_none());
}

#[test]
fn itl_freeze_falsified_by_a_slow_mean_or_a_short_tail() {
    let slow_mean = Snapshot {
        tpot_mean_s: Some(0.05),
        ..itl_freeze_case()
    };
    assert!(itl_freeze(&slow_mean).is_none());
    let jitter = Snapshot {
        itl_p99_s: Some(0.06),
        itl_max_s: Some(0.08),
        tpot_mean_s: Some(0.002),
        ..itl_freeze_case()
    };
    assert!(itl_freeze(&jitter).is_none(), "60 ms is not a freeze");
    // A saturated accelerator at a large batch with a tail: 3.1, not 3.4.
    let peak = Snapshot {
        itl_p99_s: Some(0.114),
        tpot_mean_s: Some(0.0204),
        tpot_p95_s: Some(0.031),
        busy_fraction: Some(0.99),
        running_per_worker: Some(89.0),
        batch_size_mean: Some(88.0),
        ..itl_freeze_case()
    };
    assert_eq!(names(&peak), ["tpot-at-peak"]);
    // The same gaps with preemptions of 30k-token prompts: recomputation, 3.3.
    let recompute = Snapshot {
        preemptions: Some(16.0),
        long_prompt_share: Some(0.02),
        ..itl_freeze_case()
    };
    assert_eq!(names(&recompute), ["long-context"]);
    // The same tail where every prompt is one uncached 1,800-token system prompt (the live
    // `shared-system-prompt` scenario: ITL p99 105 ms over a 15 ms mean): 3.5's repeated
    // prefill, which prefix caching removes, not a long prompt among short ones.
    let repeated = Snapshot {
        itl_p99_s: Some(0.105),
        itl_max_s: Some(0.2),
        tpot_mean_s: Some(0.015),
        ..shared_prompt_case()
    };
    assert!(itl_freeze(&repeated).is_none());
    assert_eq!(names(&repeated), ["shared-system-prompt"]);
    // With the cache working the same tail is 3.4 again.
    let cached = Snapshot {
        cached_share: Some(0.9),
        ..repeated
    };
    assert_eq!(names(&cached), ["itl-freeze"]);
}

fn shared_prompt_case() -> Snapshot {
    Snapshot {
        prompt_per_completion: Some(31.0),
        prompt_mean_tokens: Some(1860.0),
        cached_share: Some(0.02),
        cost_usd_per_1k_tokens: Some(0.0031),
        ..healthy()
    }
}

#[test]
fn long_uncached_prompts_with_short_answers_are_3_5() {
    assert_eq!(names(&shared_prompt_case()), ["shared-system-prompt"]);
    let f = shared_system_prompt(&shared_prompt_case()).unwrap();
    assert_eq!(f.confirming["cost_usd_per_1k_tokens"], Some(0.0031));
    assert_eq!(f.confirming["cached_share"], Some(0.02));
}

#[test]
fn shared_prompt_falsified_by_a_working_cache_or_balanced_tokens() {
    let cached = Snapshot {
        cached_share: Some(0.9),
        ..shared_prompt_case()
    };
    assert!(shared_system_prompt(&cached).is_none());
    let chatty = Snapshot {
        prompt_per_completion: Some(3.0),
        ..shared_prompt_case()
    };
    assert!(shared_system_prompt(&chatty).is_none());
    let short = Snapshot {
        prompt_mean_tokens: Some(200.0),
        ..shared_prompt_case()
    };
    assert!(shared_system_prompt(&short).is_none());
    // A tail of 20k-token documents among chat: not a shared prompt, whatever the ratio.
    let documents = Snapshot {
        prompt_mean_tokens: Some(1792.0),
        prompt_p99_tokens: Some(20_000.0),
        ..shared_prompt_case()
    };
    assert!(shared_system_prompt(&documents).is_none());
}

#[test]
fn findings_are_ranked_by_expected_value() {
    // Small batches (3 / 1), then 3.4 (2 / 1), then long context on a full cache (2 / 2 × 0.6).
    let both = Snapshot {
        itl_p99_s: Some(0.5),
        tpot_mean_s: Some(0.01),
        kv_usage_max: Some(0.95),
        long_prompt_share: Some(0.05),
        ..small_batches_case()
    };
    assert_eq!(
        names(&both),
        ["small-batches", "itl-freeze", "long-context"]
    );
    let scores: Vec<f64> = diagnose(&both).findings.iter().map(|f| f.score).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
}

#[test]
fn missing_data_is_named_and_ranks_lower() {
    // A vLLM worker: no busy or host time, no batch histogram, no caps.
    let vllm = Snapshot {
        busy_fraction: None,
        host_share: None,
        batch_size_mean: None,
        max_num_seqs: None,
        max_num_batched_tokens: None,
        ..healthy()
    };
    let d = diagnose(&vllm);
    assert!(d.findings.is_empty());
    assert!(
        d.missing.iter().any(|m| m.starts_with("busy fraction")),
        "{:?}",
        d.missing
    );
    assert!(d.missing.iter().any(|m| m.starts_with("host time")));
    assert!(d.missing.iter().any(|m| m.starts_with("configured caps")));
    // 3.1 needs the busy fraction; 3.2 (b) is still found from KV, ranked lower.
    assert!(
        tpot_at_peak(&Snapshot {
            busy_fraction: None,
            ..tpot_at_peak_case()
        })
        .is_none()
    );
    let kv_bound = Snapshot {
        kv_usage_max: Some(0.98),
        queue_per_worker: Some(30.0),
        running_per_worker: Some(12.0),
        ..vllm
    };
    let d = diagnose(&kv_bound);
    assert_eq!(d.findings.len(), 1);
    assert_eq!(d.findings[0].name, "small-batches");
    assert_eq!(d.findings[0].evidence, PARTIAL_EVIDENCE);
    assert_eq!(d.findings[0].confirming["busy_fraction"], None);
    // A pool mixing ours and vLLM: the busy fraction of those that report it, said so.
    let mixed = Snapshot {
        busy_workers: 1,
        ..healthy()
    };
    let d = diagnose(&mixed);
    assert_eq!(d.missing.len(), 1, "{:?}", d.missing);
    assert!(d.missing[0].starts_with("busy fraction from 1 of 2 workers"));
    // Nothing at all: nothing found, everything missing.
    let d = diagnose(&Snapshot::default());
    assert!(d.findings.is_empty());
    assert!(d.missing.len() >= 10, "{:?}", d.missing);
}
