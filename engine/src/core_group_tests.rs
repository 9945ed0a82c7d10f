//! Tests of a request's parallel sequences (`n`, `best_of`) and of logprobs in the core: the
//! prompt computed once and shared through the prefix cache, prompt logprobs, `max_tokens` 0.

use super::*;
use crate::request::choice_seed;
use crate::sequence::TokenChunk;

impl Harness {
    /// Submits `n` sequences of one prompt as the server does for `n` choices.
    fn submit_group(
        &mut self,
        first_id: u64,
        n: usize,
        prompt: &[u32],
        params: &SamplingParams,
    ) -> Vec<Client> {
        let mut clients = Vec::new();
        let mut group = Vec::new();
        for j in 0..n {
            let (client, sink) = Client::new(usize::MAX);
            self.pending.fetch_add(1, Ordering::AcqRel);
            let mut params = params.clone();
            params.seed = params.seed.map(|s| choice_seed(s, j));
            group.push(NewRequest {
                id: first_id + j as u64,
                prompt: prompt.to_vec(),
                params,
                sink,
                prefix_keys: None,
            });
            clients.push(client);
        }
        self.core.add_group(group);
        clients
    }
}

/// Every token chunk a client received.
fn chunks(c: &Client) -> Vec<TokenChunk> {
    c.events()
        .into_iter()
        .filter_map(|e| match e {
            SeqEvent::Tokens(t) => Some(t),
            _ => None,
        })
        .collect()
}

#[test]
fn n_sequences_compute_the_prompt_once_and_share_its_blocks() {
    let mut h = Harness::new(Setup::default());
    let p = prompt(3, 2 * BS + 5);
    let clients = h.submit_group(10, 3, &p, &fixed_length(4, 9));

    // Step 1: only the first sequence prefills; its siblings wait for its blocks.
    h.step();
    assert_eq!(h.core.scheduler().running.len(), 1);
    assert_eq!(h.core.scheduler().waiting.len(), 2);
    // Step 2: they join, reading the two full prompt blocks from the prefix cache.
    h.step();
    let sched = h.core.scheduler();
    assert_eq!(sched.running.len(), 3);
    let shared = &sched.running[0].block_table[..2];
    for s in &sched.running[1..] {
        assert_eq!(&s.block_table[..2], shared, "same physical blocks");
        assert_ne!(
            s.block_table[2], sched.running[0].block_table[2],
            "own tail"
        );
    }
    for &b in shared {
        assert_eq!(sched.kv.ref_count(b), 3);
    }
    h.run(100);

    let cached: Vec<usize> = clients
        .iter()
        .map(|c| c.finished().unwrap().cached_tokens)
        .collect();
    assert_eq!(cached, [0, 2 * BS, 2 * BS]);
    assert_eq!(h.metrics.prefix_hits.get(), (4 * BS) as f64);
    // Different seeds per choice: different texts, all of full length.
    let outs: Vec<Vec<u32>> = clients.iter().map(Client::tokens).collect();
    assert!(outs.iter().all(|o| o.len() == 4));
    assert!(outs[0] != outs[1] && outs[1] != outs[2], "{outs:?}");
    // Choice 0 is what the same request with n = 1 produces.
    assert_eq!(outs[0], solo(p.clone(), fixed_length(4, 9), 1_000.0));
    // Request-level metrics count the group once, as vLLM's parent request.
    assert_eq!(h.metrics.request_n.get_sample_count(), 1);
    assert_eq!(h.metrics.request_n.get_sample_sum(), 3.0);
    assert_eq!(h.metrics.request_prompt_tokens.get_sample_count(), 3);
    assert_eq!(h.pending.load(Ordering::Acquire), 0);
}

#[test]
fn a_group_whose_prompt_fits_one_block_does_not_wait() {
    let mut h = Harness::new(Setup::default());
    let clients = h.submit_group(1, 2, &prompt(1, BS), &fixed_length(2, 1));
    h.step();
    assert_eq!(h.core.scheduler().running.len(), 2);
    h.run(100);
    for c in &clients {
        c.assert_well_formed();
    }
}

#[test]
fn prompt_logprobs_skip_the_cache_and_come_before_the_first_token() {
    let mut h = Harness::new(Setup::default());
    let p = prompt(5, 2 * BS + 3);
    h.submit(1, p.clone(), fixed_length(2, 1), usize::MAX);
    h.run(100);
    let params = SamplingParams {
        logprobs: Some(3),
        prompt_logprobs: Some(2),
        ..fixed_length(3, 2)
    };
    let c = h.submit(2, p.clone(), params, usize::MAX);
    h.run(100);
    c.assert_well_formed();
    assert_eq!(c.finished().unwrap().cached_tokens, 0, "computed in full");
    let got = chunks(&c);
    let prompt_lp = got[0].prompt_logprobs.clone().unwrap();
    assert_eq!(prompt_lp.len(), p.len());
    assert!(prompt_lp[0].is_none());
    for (pos, e) in prompt_lp.iter().enumerate().skip(1) {
        let e = e.as_ref().unwrap();
        assert_eq!(e.token, p[pos]);
        assert_eq!(e.top.len(), 2);
        assert!(e.logprob <= 0.0);
    }
    assert!(
        got[1..].iter().all(|c| c.prompt_logprobs.is_none()),
        "sent once"
    );
    let ids: Vec<u32> = got.iter().flat_map(|c| c.ids.clone()).collect();
    let lps: Vec<_> = got.iter().flat_map(|c| c.logprobs.clone()).collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(lps.iter().map(|l| l.token).collect::<Vec<_>>(), ids);
    assert!(lps.iter().all(|l| l.top.len() == 3));
}

#[test]
fn max_tokens_zero_computes_the_prompt_and_generates_nothing() {
    let mut h = Harness::new(Setup::default());
    let p = prompt(6, 20);
    let params = SamplingParams {
        max_tokens: 0,
        prompt_logprobs: Some(1),
        ..SamplingParams::default()
    };
    let c = h.submit(1, p.clone(), params, usize::MAX);
    h.run(100);
    let events = c.events();
    assert_eq!(events.len(), 2, "{events:?}");
    match &events[0] {
        SeqEvent::Tokens(t) => {
            assert!(t.ids.is_empty());
            assert_eq!(t.prompt_logprobs.as_ref().map(Vec::len), Some(p.len()));
        }
        other => panic!("{other:?}"),
    }
    let info = c.finished().unwrap();
    assert_eq!(info.completion_tokens, 0);
    assert_eq!(info.reason, FinishReason::Length);
}

#[test]
fn a_full_client_gets_its_prompt_logprobs_later_not_never() {
    let mut h = Harness::new(Setup::default());
    let params = SamplingParams {
        max_tokens: 0,
        prompt_logprobs: Some(0),
        ..SamplingParams::default()
    };
    let c = h.submit(1, prompt(2, 12), params, 0);
    for _ in 0..3 {
        h.step();
    }
    assert!(c.events().is_empty());
    c.0.lock().unwrap().capacity = 8;
    h.run(100);
    let events = c.events();
    assert!(matches!(&events[0], SeqEvent::Tokens(t) if t.prompt_logprobs.is_some()));
    assert!(matches!(events.last(), Some(SeqEvent::Finished(_))));
}
