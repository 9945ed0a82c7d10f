//! Doctor's rules: for each of the five on-call symptoms (3.1–3.5), a pure function of a
//! [`Snapshot`] that matches its signature and names mechanism, lever, the confirming
//! measurement with its values, and the falsifier. [`diagnose`] runs them all, ranks what
//! matched by expected value (impact over risk, times how complete the evidence was) and lists
//! the data it lacked.

use std::collections::BTreeMap;

use serde::Serialize;

use super::snapshot::{LONG_PROMPT_TOKENS, Snapshot};

/// Busy fraction at or above which the accelerator counts as saturated (3.1: "GPU is busy").
pub const BUSY_HIGH: f64 = 0.7;
/// Requests waiting per worker (engine plus gateway queue) that make a queue "full": more than
/// a handful waiting means admission, not arrivals, sets the pace.
pub const QUEUE_LONG_PER_WORKER: f64 = 4.0;
/// p95 time per output token past which decoding is slow (3.1's 8 → 35 ms): 25 ms is 40
/// tokens a second, where streamed text stops running ahead of a fast reader. It is a bound of
/// vLLM's TPOT buckets (10, 25, 50 ms): "p95 past it" is then exactly "more than 5% of requests
/// slower", where a bound inside the 10-25 ms bucket would read an interpolation (a fleet at
/// 17 ms, the 3.1 lever, read 24 ms and was called slow against 20 ms).
pub const TPOT_SLOW_S: f64 = 0.025;
/// Running sequences per worker that make a decode batch "large" (the step turns memory-bound);
/// below it a batch pinned at its cap is "small" (3.2 b).
pub const BATCH_LARGE: f64 = 16.0;
/// p95 TTFT still "fine" for 3.1 (the symptom is slow typing, not a slow start).
pub const TTFT_FINE_S: f64 = 2.0;
/// Share of the step loop spent on host work (host over host plus busy) that makes an engine
/// host-bound (3.2 a): about a third of the loop with the accelerator idle (3.2's "~30% busy"
/// is the far end of it).
pub const HOST_SHARE_HIGH: f64 = 0.3;
/// A batch at this share of its cap (sequences or tokens) is pinned there (3.2 b).
pub const CAP_PINNED: f64 = 0.9;
/// KV usage from which the cache counts as full (pins batches in 3.2 b, preempts in 3.3).
pub const KV_FULL: f64 = 0.9;
/// Share of requests with prompts of 30k+ tokens that makes long context present (3.3): one
/// in 200; the bursts that break memory are rarer than the traffic around them.
pub const LONG_PROMPT_SHARE_MIN: f64 = 0.005;
/// p99 ITL at least this many times the mean TPOT is a tail, not slowness (3.4: 280 vs 9 ms).
pub const ITL_TAIL_RATIO: f64 = 5.0;
/// A tail shorter than this is not a freeze anyone notices (3.4), whatever the ratio.
pub const ITL_TAIL_MIN_S: f64 = 0.1;
/// The largest inter-token gap at least this many times the mean TPOT is a freeze even when
/// too rare to reach p99 (3.4: a few 30k-token prefills among thousands of tokens).
pub const ITL_MAX_RATIO: f64 = 20.0;
/// A largest gap from which a stream visibly freezes (3.4's "freezes for a moment").
pub const ITL_FREEZE_S: f64 = 0.5;
/// p99 prompt length over mean below which prompts are uniform (3.5: one shared system prompt
/// plus a conversation); a long tail of documents is 3.3 or 3.4's traffic, not this.
pub const PROMPT_UNIFORM_RATIO: f64 = 4.0;
/// Prompt tokens per completion token above which prompts dominate cost (3.5: 1,800 vs 60).
pub const PROMPT_HEAVY_RATIO: f64 = 10.0;
/// Mean prompt length from which a shared prefix is worth caching (3.5), tokens.
pub const PROMPT_LONG_MEAN: f64 = 1000.0;
/// Cached share of prompt tokens below which prefix caching is not working (3.5).
pub const CACHED_LOW: f64 = 0.3;
/// Evidence weight when a deciding measurement is missing (the finding stays, ranked lower).
pub const PARTIAL_EVIDENCE: f64 = 0.6;

/// One matched symptom.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// 3.1 … 3.5.
    pub symptom: &'static str,
    /// Short name (the scenario's): `tpot-at-peak`, `host-bound`, `small-batches`,
    /// `long-context`, `itl-freeze`, `shared-system-prompt`.
    pub name: &'static str,
    /// What is physically happening.
    pub mechanism: &'static str,
    /// The change that fixes it.
    pub lever: &'static str,
    /// The measurement that confirms it.
    pub measurement: &'static str,
    /// That measurement's current values (null where missing).
    pub confirming: BTreeMap<&'static str, Option<f64>>,
    /// What would show the diagnosis wrong, and which symptom it would then be.
    pub falsifier: &'static str,
    /// Expected gain of the lever, relative (3 = about 3× cost or throughput).
    pub impact: f64,
    /// Implementation and operational risk of the lever, relative.
    pub risk: f64,
    /// 1, or [`PARTIAL_EVIDENCE`] when a deciding measurement was missing.
    pub evidence: f64,
    /// `impact / risk × evidence`: the ranking.
    pub score: f64,
}

/// What doctor concluded from one snapshot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnosis {
    /// Matched symptoms, highest score first; empty when nothing is wrong.
    pub findings: Vec<Finding>,
    /// Data the rules needed and did not have, and what it kept them from deciding.
    pub missing: Vec<String>,
}

struct Spec {
    symptom: &'static str,
    name: &'static str,
    mechanism: &'static str,
    lever: &'static str,
    measurement: &'static str,
    falsifier: &'static str,
    impact: f64,
    risk: f64,
}

fn finding(spec: Spec, confirming: &[(&'static str, Option<f64>)], evidence: f64) -> Finding {
    Finding {
        symptom: spec.symptom,
        name: spec.name,
        mechanism: spec.mechanism,
        lever: spec.lever,
        measurement: spec.measurement,
        confirming: confirming.iter().copied().collect(),
        falsifier: spec.falsifier,
        impact: spec.impact,
        risk: spec.risk,
        evidence,
        score: spec.impact / spec.risk * evidence,
    }
}

/// 3.1: decode batches grown at peak make each step memory-bound and slower: TPOT high at a
/// large running batch, accelerator busy, TTFT fine.
pub fn tpot_at_peak(s: &Snapshot) -> Option<Finding> {
    let busy = s.busy_fraction?;
    let tpot = s.tpot_p95_s?;
    let running = s.running_per_worker.or(s.batch_size_mean)?;
    let ttft_fine = s.ttft_p95_s.is_none_or(|t| t <= TTFT_FINE_S);
    if !(busy >= BUSY_HIGH && tpot >= TPOT_SLOW_S && running >= BATCH_LARGE && ttft_fine) {
        return None;
    }
    let spec = Spec {
        symptom: "3.1",
        name: "tpot-at-peak",
        mechanism: "decode batches grow at peak; each step reads more KV and turns memory-bound, so every sequence waits longer per token",
        lever: "cap the decode batch (max_num_seqs) or the tokens per step at the size that holds the TPOT SLO; add replicas for the throughput it gives up",
        measurement: "p95 TPOT against running batch size, with busy fraction high and TTFT fine",
        falsifier: "TPOT that stays high when the running batch is small, or a low busy fraction, is not batch growth: a long ITL tail over a healthy mean is 3.4, a low busy fraction with a queue is 3.2",
        impact: 1.5,
        risk: 1.5,
    };
    Some(finding(
        spec,
        &[
            ("tpot_p95_s", Some(tpot)),
            ("running_per_worker", Some(running)),
            ("busy_fraction", Some(busy)),
            ("ttft_p95_s", s.ttft_p95_s),
        ],
        if s.ttft_p95_s.is_some() {
            1.0
        } else {
            PARTIAL_EVIDENCE
        },
    ))
}

/// How close the batch is to a cap (1 = at it): sequences, tokens or KV blocks.
fn cap_pressure(s: &Snapshot) -> Option<f64> {
    let batch = s.batch_size_mean.or(s.running_per_worker);
    let seqs = match (batch, s.max_num_seqs) {
        (Some(b), Some(cap)) if cap > 0.0 => Some(b / cap),
        _ => None,
    };
    let tokens = match (s.tokens_per_step_mean, s.max_num_batched_tokens) {
        (Some(t), Some(cap)) if cap > 0.0 => Some(t / cap),
        _ => None,
    };
    let kv = s.kv_usage_max.map(|k| k / KV_FULL * CAP_PINNED);
    [seqs, tokens, kv].into_iter().flatten().reduce(f64::max)
}

/// 3.2: a long queue while the accelerator is wasted, by one of two mechanisms that exclude
/// each other. (b) small batches: the batch is pinned at a cap (sequences, tokens or KV) and is
/// small (under [`BATCH_LARGE`]); a small batch leaves each step's fixed host cost unamortised,
/// so a high host share then is the cap's consequence. (a) host-bound: host time between steps
/// is a large share of the loop (while work is pending busy and host add up to about 1) with a
/// batch that is not small. A larger batch pinned at a cap with short gaps, on an accelerator
/// not yet saturated, is (b) again.
///
/// The busy fraction (time inside steps) does not decide (b): an engine stepping back to back
/// on a batch of two is "busy" by that clock while the accelerator's capacity idles, so (b)
/// rests on the batch against its cap, and busy is reported beside it.
pub fn idle_with_queue(s: &Snapshot) -> Option<Finding> {
    let queue = s.queue_per_worker?;
    if queue < QUEUE_LONG_PER_WORKER {
        return None;
    }
    let batch = s.batch_size_mean.or(s.running_per_worker);
    let saturated_large =
        s.busy_fraction.is_some_and(|b| b >= BUSY_HIGH) && batch.is_some_and(|b| b >= BATCH_LARGE);
    let host_bound = match (s.busy_fraction, s.host_share) {
        (Some(busy), Some(host)) => busy < BUSY_HIGH && host >= HOST_SHARE_HIGH,
        _ => false,
    };
    let pinned = cap_pressure(s).is_some_and(|p| p >= CAP_PINNED);
    // A small batch at its cap leaves each step's fixed host cost unamortised too: the cap is
    // the cause and the host share its consequence.
    let small = batch.is_some_and(|b| b < BATCH_LARGE);
    if pinned && (small || (!saturated_large && !host_bound)) {
        let spec = Spec {
            symptom: "3.2",
            name: "small-batches",
            mechanism: "small batches: a sequence, token or KV cap keeps each step's batch small while requests queue, so the accelerator runs far below what it could batch",
            lever: "raise the cap that binds (max_num_seqs, max_num_batched_tokens, or KV blocks via memory share or a smaller KV dtype); expect throughput to grow about with the batch until busy nears 1",
            measurement: "busy fraction vs queue length vs batch size against its cap vs KV usage",
            falsifier: "a batch below every cap while the queue is long means the cap is not what binds: long step gaps make it 3.2 (a) host-bound; raising the cap without throughput growing, TPOT climbing instead, makes it 3.1",
            impact: 3.0,
            risk: 1.0,
        };
        return Some(finding(
            spec,
            &[
                ("busy_fraction", s.busy_fraction),
                ("queue_per_worker", Some(queue)),
                ("batch_size_mean", batch),
                ("max_num_seqs", s.max_num_seqs),
                ("tokens_per_step_mean", s.tokens_per_step_mean),
                ("max_num_batched_tokens", s.max_num_batched_tokens),
                ("kv_usage_max", s.kv_usage_max),
            ],
            if s.busy_fraction.is_some() {
                1.0
            } else {
                PARTIAL_EVIDENCE
            },
        ));
    }
    let busy = s.busy_fraction?;
    let host = s.host_share?;
    if busy >= BUSY_HIGH || host < HOST_SHARE_HIGH {
        return None;
    }
    let spec = Spec {
        symptom: "3.2",
        name: "host-bound",
        mechanism: "host-bound: scheduling, tokenisation and detokenisation between steps keep the accelerator idle; each step waits on the CPU",
        lever: "take host work off the step loop (tokenise and detokenise on other threads, async scheduling) or make steps larger so the host cost is amortised",
        measurement: "host share of the step loop and step gap vs busy fraction vs queue length vs batch size",
        falsifier: "short step gaps (host share low) with the queue still long mean the host is not the bottleneck: a batch pinned at a cap then makes it 3.2 (b) small batches",
        impact: 3.0,
        risk: 3.0,
    };
    Some(finding(
        spec,
        &[
            ("busy_fraction", Some(busy)),
            ("host_share", Some(host)),
            ("step_gap_mean_s", s.step_gap_mean_s),
            ("queue_per_worker", Some(queue)),
            ("batch_size_mean", s.batch_size_mean),
            ("max_num_seqs", s.max_num_seqs),
        ],
        1.0,
    ))
}

/// Whether the window saw a preemption or recomputed tokens.
fn preempted(s: &Snapshot) -> bool {
    s.preemptions.is_some_and(|p| p >= 1.0) || s.recomputed_tokens_per_s.is_some_and(|r| r > 0.0)
}

/// Whether the window saw 30k+ token prompts.
fn long_prompts(s: &Snapshot) -> bool {
    s.long_prompt_share
        .is_some_and(|l| l >= LONG_PROMPT_SHARE_MIN)
        || s.prompt_p99_tokens.is_some_and(|p| p >= LONG_PROMPT_TOKENS)
}

/// 3.3: preemptions (or recomputation, or a full KV cache) together with 30k+ token prompts.
pub fn long_context(s: &Snapshot) -> Option<Finding> {
    let preempted = preempted(s);
    let kv_full = s.kv_usage_max.is_some_and(|k| k >= KV_FULL);
    if !((preempted || kv_full) && long_prompts(s)) {
        return None;
    }
    let spec = Spec {
        symptom: "3.3",
        name: "long-context",
        mechanism: "a burst of 30k+ token prompts takes the KV blocks of many short requests at once; the engine runs out and preempts (recomputes), or an engine that cannot preempt runs out of memory",
        lever: "admit by KV tokens, not request count, and route long prompts to their own pool, instead of halving the admission cap for everyone",
        measurement: "preemptions, recomputed tokens and KV usage against the prompt-length tail",
        falsifier: "preemptions with no long prompts in the window mean KV is short for the ordinary load (3.2 b, KV-bound, or 3.1 at peak); long prompts without preemptions or a full cache mean memory holds, and stalls they cause are 3.4",
        impact: 2.0,
        risk: 2.0,
    };
    Some(finding(
        spec,
        &[
            ("preemptions", s.preemptions),
            ("recomputed_tokens_per_s", s.recomputed_tokens_per_s),
            ("kv_usage_max", s.kv_usage_max),
            ("long_prompt_share", s.long_prompt_share),
            ("prompt_p99_tokens", s.prompt_p99_tokens),
        ],
        if preempted { 1.0 } else { PARTIAL_EVIDENCE },
    ))
}

/// 3.4: p99 (or the largest) inter-token latency far above a healthy mean TPOT (prefills
/// stalling decodes), on an accelerator that is not saturated at a large batch, with neither
/// 3.3's recomputation nor 3.5's uncached shared prompt behind the gaps.
pub fn itl_freeze(s: &Snapshot) -> Option<Finding> {
    let tpot = s.tpot_mean_s.filter(|t| *t > 0.0)?;
    let p99_tail = s
        .itl_p99_s
        .is_some_and(|p| p >= ITL_TAIL_RATIO * tpot && p >= ITL_TAIL_MIN_S);
    let max_tail = s
        .itl_max_s
        .is_some_and(|m| m >= ITL_MAX_RATIO * tpot && m >= ITL_FREEZE_S);
    // A saturated accelerator at a large batch slows every token: that is 3.1, not a freeze;
    // gaps that come with preemptions of long prompts are recomputation: 3.3.
    let saturated_large = s.busy_fraction.is_some_and(|b| b >= BUSY_HIGH)
        && s.running_per_worker.is_some_and(|r| r >= BATCH_LARGE);
    let recomputing = preempted(s) && long_prompts(s);
    // Every request's uncached shared prompt prefilled into the running batch stalls decodes
    // too: there the lever is 3.5's prefix cache, which removes those prefills, not chunking.
    let repeated_prefill = shared_system_prompt(s).is_some();
    let explained = saturated_large || recomputing || repeated_prefill;
    if !((p99_tail || max_tail) && tpot < TPOT_SLOW_S) || explained {
        return None;
    }
    let p99 = s.itl_p99_s;
    let spec = Spec {
        symptom: "3.4",
        name: "itl-freeze",
        mechanism: "a long prefill scheduled into the running batch makes one step long; every decoding sequence in it freezes for that step, which mean TPOT averages away",
        lever: "chunked prefill: cap the prefill tokens per step (max_num_batched_tokens) so decodes keep their cadence",
        measurement: "ITL p99 and max beside mean TPOT",
        falsifier: "an ITL tail that stays with chunked prefill on, or one that comes with preemptions, is not prefill interference: with preemptions and long prompts it is 3.3; with mean TPOT high as well it is 3.1; with uniform long prompts hardly cached it is 3.5's repeated prefill",
        impact: 2.0,
        risk: 1.0,
    };
    Some(finding(
        spec,
        &[
            ("itl_p99_s", p99),
            ("itl_max_s", s.itl_max_s),
            ("tpot_mean_s", Some(tpot)),
            ("itl_p99_over_tpot_mean", p99.map(|p| p / tpot)),
            ("itl_max_over_tpot_mean", s.itl_max_s.map(|m| m / tpot)),
        ],
        1.0,
    ))
}

/// 3.5: long prompts, short answers and a low cached share: the same system prompt is
/// computed (and paid for) again on every request.
pub fn shared_system_prompt(s: &Snapshot) -> Option<Finding> {
    let ratio = s.prompt_per_completion?;
    let cached = s.cached_share?;
    let long = s.prompt_mean_tokens.is_none_or(|m| m >= PROMPT_LONG_MEAN);
    let uniform = match (s.prompt_p99_tokens, s.prompt_mean_tokens) {
        (Some(p99), Some(mean)) if mean > 0.0 => p99 <= PROMPT_UNIFORM_RATIO * mean,
        _ => true,
    };
    if !(ratio >= PROMPT_HEAVY_RATIO && cached < CACHED_LOW && long && uniform) {
        return None;
    }
    let spec = Spec {
        symptom: "3.5",
        name: "shared-system-prompt",
        mechanism: "prompts dominate the tokens and nearly none are served from cache: the same system prompt is prefilled, and billed, again on every request",
        lever: "prefix caching in the engines and prefix-aware routing in the gateway, so the shared prompt is computed once per worker",
        measurement: "cost per 1k tokens against cached share, with prompt tokens per completion token",
        falsifier: "a cached share that stays low with prefix caching and prefix-aware routing on means the prompts share no prefix (the price or the model is the cost, not this); latency SLOs missed point to 3.1 or 3.2 instead",
        impact: 3.0,
        risk: 1.0,
    };
    Some(finding(
        spec,
        &[
            ("cost_usd_per_1k_tokens", s.cost_usd_per_1k_tokens),
            ("cached_share", Some(cached)),
            ("prompt_per_completion", Some(ratio)),
            ("prompt_mean_tokens", s.prompt_mean_tokens),
        ],
        if s.prompt_mean_tokens.is_some() {
            1.0
        } else {
            PARTIAL_EVIDENCE
        },
    ))
}

/// What the snapshot lacked, each with what it kept doctor from deciding.
pub fn missing(s: &Snapshot) -> Vec<String> {
    let mut out = Vec::new();
    if s.busy_fraction.is_some() && s.busy_workers < s.workers {
        out.push(format!(
            "busy fraction from {} of {} workers: the others export no infergate_engine_busy_seconds_total (vLLM, SGLang, TGI); it is their mean",
            s.busy_workers, s.workers
        ));
    }
    let mut lack = |absent: bool, what: &str| {
        if absent {
            out.push(what.to_string());
        }
    };
    lack(
        s.workers == 0,
        "worker load (infergate_worker_running): no worker polled in the window",
    );
    lack(
        s.busy_fraction.is_none(),
        "busy fraction (infergate_worker_busy_seconds_total): the workers do not export infergate_engine_busy_seconds_total (vLLM, SGLang and TGI have none); 3.1 and 3.2 (a) need it, 3.2 (b) is ranked lower without it",
    );
    lack(
        s.host_share.is_none(),
        "host time between steps (infergate_worker_host_seconds_total): 3.2 (a) host-bound cannot be told",
    );
    lack(
        s.batch_size_mean.is_none(),
        "batch size per step (infergate_worker_batch_size): the running count stands in for 3.2 (b)",
    );
    lack(
        s.max_num_seqs.is_none() && s.max_num_batched_tokens.is_none(),
        "configured caps (infergate_worker_max_num_seqs, infergate_worker_max_num_batched_tokens): 3.2 (b) sees only KV usage",
    );
    lack(
        s.tpot_mean_s.is_none(),
        "TPOT (infergate_worker_time_per_output_token_seconds): no finished request in the window; 3.1 and 3.4 need it",
    );
    lack(
        s.itl_p99_s.is_none(),
        "inter-token latency (infergate_worker_inter_token_latency_seconds, infergate_inter_chunk_seconds): 3.4 needs it",
    );
    lack(
        s.requests.is_none(),
        "prompt lengths (infergate_worker_request_prompt_tokens): 3.3 and 3.5 need them",
    );
    lack(
        s.preemptions.is_none(),
        "preemptions (infergate_worker_preemptions_total): 3.3 sees only KV usage",
    );
    lack(
        s.prompt_per_completion.is_none() || s.cached_share.is_none(),
        "tokens and cached share (infergate_tenant_*_tokens_total or the workers' prefix cache counters): 3.5 needs them",
    );
    lack(
        s.cost_usd_per_1k_tokens.is_none(),
        "cost per 1k tokens (infergate_tenant_cost_nanousd_total): no priced tokens in the window",
    );
    out
}

/// Runs every rule: findings ranked by score (ties: the order 3.1 … 3.5), and what was missing.
pub fn diagnose(s: &Snapshot) -> Diagnosis {
    let mut findings: Vec<Finding> = [
        tpot_at_peak(s),
        idle_with_queue(s),
        long_context(s),
        itl_freeze(s),
        shared_system_prompt(s),
    ]
    .into_iter()
    .flatten()
    .collect();
    // Stable: equal scores keep the symptoms' order.
    findings.sort_by(|a, b| b.score.total_cmp(&a.score));
    Diagnosis {
        findings,
        missing: missing(s),
    }
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
