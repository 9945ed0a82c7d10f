//! `sim` backend: step time from the roofline model of a GPU and model preset; output tokens are
//! synthetic placeholder text, deterministic per request.
//!
//! The text makes its nature obvious and follows the prompt: each output token is a word token
//! of the prompt itself (a space and a lowercase word), picked at random, so "Tell me about
//! rivers and stones" answers with a shuffle like " rivers about stones me and rivers". A prompt
//! without such words gets words of the whole vocabulary. Each output token is one whole word,
//! so an answer of N tokens is N words. Only the pick of the token reads the prompt: a sampled
//! request's random draws, and so where it stops, depend on its seed alone, as they always did.
//!
//! Log-probabilities, when asked for, are those of this sampler's own distribution (see
//! [`dist`]): synthetic numbers that are consistent with what it draws, not a model's.

mod dist;

use crate::backend::{Backend, Sampled};
use crate::host_time::{HostCost, HostWork};
use crate::roofline::{RooflineModel, StepCost};
use crate::scheduler::Batch;
use crate::sequence::Sequence;

/// Random prompt positions tried for a token to echo (bounded, so a long prompt of few words
/// costs no more per token than a short one; a prompt a quarter words misses 1 time in 10^4).
const ECHO_PROBES: u64 = 32;

/// The simulated forward pass.
pub struct SimBackend {
    model: RooflineModel,
    vocab: Vec<u32>,
    /// Bit set over token ids: which are in `vocab` (the prompt tokens fit to echo).
    in_vocab: Vec<u64>,
    eos: u32,
    eos_probability: f64,
    block_size: usize,
    /// Modelled host time per step (zero by default).
    host: HostCost,
    /// Share of the modelled capture time warm-up waits (`--sim-capture-time-scale`).
    capture_time_scale: f64,
}

impl SimBackend {
    /// A backend costing steps with `model`, echoing prompt tokens found in `vocab` (else
    /// sampling `vocab`); without `ignore_eos` a sequence ends after `mean_output_tokens` tokens
    /// on average (geometric).
    pub fn new(
        model: RooflineModel,
        vocab: Vec<u32>,
        eos: u32,
        mean_output_tokens: f64,
        block_size: usize,
    ) -> Self {
        let words = vocab
            .iter()
            .map(|&t| t as usize / 64 + 1)
            .max()
            .unwrap_or(0);
        let mut in_vocab = vec![0u64; words];
        for &t in &vocab {
            in_vocab[t as usize / 64] |= 1 << (t % 64);
        }
        Self {
            block_size,
            model,
            vocab,
            in_vocab,
            eos,
            eos_probability: 1.0 / mean_output_tokens.max(1.0),
            host: HostCost::default(),
            capture_time_scale: crate::warmup::DEFAULT_SIM_CAPTURE_TIME_SCALE,
        }
    }

    /// The same backend with `host` as the modelled host time of each step (a host-bound
    /// engine idles its accelerator for it between steps).
    pub fn with_host_cost(mut self, host: HostCost) -> Self {
        self.host = host;
        self
    }

    /// This backend charging `scale` x the modelled capture time per size at warm-up.
    pub fn with_capture_time_scale(mut self, scale: f64) -> Self {
        self.capture_time_scale = scale;
        self
    }

    /// Whether `token` is in the vocabulary.
    fn in_vocab(&self, token: u32) -> bool {
        self.in_vocab
            .get(token as usize / 64)
            .is_some_and(|w| w & (1 << (token % 64)) != 0)
    }

    /// The placeholder token for draw `r`: a vocabulary token at a random prompt position
    /// derived from `r` (every word position of the prompt equally likely), else the vocabulary
    /// token `r mod vocabulary size`.
    fn placeholder(&self, seq: &Sequence, r: u64) -> u32 {
        let prompt = &seq.tokens[..seq.prompt_len.min(seq.tokens.len())];
        if !prompt.is_empty() {
            let mut state = r;
            let echoed = (0..ECHO_PROBES)
                .map(|_| prompt[(splitmix64(&mut state) % prompt.len() as u64) as usize])
                .find(|&t| self.in_vocab(t));
            if let Some(t) = echoed {
                return t;
            }
        }
        self.vocab[(r % self.vocab.len() as u64) as usize]
    }
}

/// splitmix64: a tiny, well-mixed PRNG step.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Backend for SimBackend {
    fn execute(&mut self, batch: &Batch, _running: &[Sequence]) -> StepCost {
        self.model.step_cost(&batch.shape)
    }

    fn capture_budget(&self) -> Option<usize> {
        self.model.capture_sizes().last().copied()
    }

    fn host_seconds(&self, batch: &Batch, running: &[Sequence]) -> Option<f64> {
        Some(self.host.seconds(&HostWork::of(batch, running)))
    }

    /// Charges the capture-cost model's time for the size (scaled) and reports its memory.
    fn warm_up(
        &mut self,
        cost: &crate::capture_cost::SizeCost,
    ) -> Result<crate::warmup::Warmed, String> {
        Ok(crate::warmup::Warmed {
            bytes: cost.bytes,
            charge_seconds: cost.seconds * self.capture_time_scale,
        })
    }

    fn sample(&mut self, seq: &mut Sequence) -> Sampled {
        let greedy = seq.params.temperature == 0.0 || seq.params.top_k == 1;
        // Greedy output depends only on the tokens so far (same prompt, same answer);
        // sampled output on the request's seed.
        let mut state = if greedy {
            let parent = seq.block_hashes.last().copied().unwrap_or(0);
            let tail_from = seq.block_hashes.len() * self.block_size;
            let mut h = parent ^ seq.tokens.len() as u64;
            for &t in seq.tokens.iter().skip(tail_from) {
                h = h.rotate_left(5) ^ u64::from(t);
                splitmix64(&mut h);
            }
            h
        } else {
            seq.rng_state
        };
        let r = splitmix64(&mut state);
        let e = splitmix64(&mut state);
        if !greedy {
            seq.rng_state = state;
        }
        let can_stop = !seq.params.ignore_eos && seq.num_output() >= seq.params.min_tokens;
        let token = if can_stop && (e >> 11) as f64 / (1u64 << 53) as f64 <= self.eos_probability {
            self.eos
        } else {
            self.placeholder(seq, r)
        };
        let logprob = seq.params.logprobs.map(|k| {
            let p_eos = if can_stop { self.eos_probability } else { 0.0 };
            self.logprob_entry(&self.distribution(seq, p_eos), token, k)
        });
        Sampled { token, logprob }
    }

    fn prompt_logprobs(&mut self, seq: &mut Sequence) {
        let Some(k) = seq.params.prompt_logprobs else {
            return;
        };
        // A prompt token is scored by the distribution the first output token is drawn from,
        // without its EOS share: the same for every position.
        let known = seq.num_computed.min(seq.prompt_len.saturating_sub(1));
        if seq.prompt_logprobs.len() > known {
            return;
        }
        let dist = self.distribution(seq, 0.0);
        for p in seq.prompt_logprobs.len()..=known {
            let entry = self.logprob_entry(&dist, seq.tokens[p], k);
            seq.prompt_logprobs.push(Some(entry));
        }
    }

    fn eos_token(&self) -> u32 {
        self.eos
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;
    use crate::request::SamplingParams;
    use crate::roofline::RooflineConfig;
    use crate::sequence::{EventSink, NewRequest, SendError, SeqEvent};
    use crate::tokenizer::SimTokenizer;

    struct NoSink;

    impl EventSink for NoSink {
        fn try_send(&mut self, _: SeqEvent) -> Result<(), SendError> {
            Ok(())
        }
        fn is_closed(&self) -> bool {
            false
        }
    }

    const BS: usize = 16;

    fn backend(mean_output_tokens: f64) -> (SimBackend, &'static SimTokenizer) {
        let tok = SimTokenizer::shared().unwrap();
        let model = RooflineModel::new(
            presets::gpu("h100").unwrap(),
            presets::model("llama-3-8b").unwrap(),
            RooflineConfig::default(),
        );
        let b = SimBackend::new(
            model,
            tok.word_tokens().to_vec(),
            tok.eos(),
            mean_output_tokens,
            BS,
        );
        (b, tok)
    }

    /// Samples up to `max` tokens (stopping at EOS) for `prompt`.
    fn generate(b: &mut SimBackend, prompt: Vec<u32>, params: SamplingParams) -> Vec<u32> {
        let max = params.max_tokens;
        let req = NewRequest {
            id: 1,
            prompt,
            params,
            sink: Box::new(NoSink),
            prefix_keys: None,
        };
        let mut seq = Sequence::new(req, BS, 0.0);
        let mut out = Vec::new();
        while out.len() < max {
            let t = b.sample(&mut seq).token;
            if b.is_eos(t) {
                break;
            }
            out.push(t);
            seq.push_token(t, BS);
        }
        out
    }

    fn params(temperature: f32, seed: u64, ignore_eos: bool) -> SamplingParams {
        SamplingParams {
            max_tokens: 40,
            temperature,
            seed: Some(seed),
            ignore_eos,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn text_is_made_of_the_prompts_own_words() {
        let (mut b, tok) = backend(1e9);
        let a = tok.encode("Tell me about rivers and stones in the valley");
        let c = tok.encode("A recipe for bread with flour and water");
        for temperature in [0.0, 1.0] {
            let out_a = generate(&mut b, a.clone(), params(temperature, 3, true));
            let out_c = generate(&mut b, c.clone(), params(temperature, 3, true));
            assert_eq!(out_a.len(), 40);
            assert!(
                out_a.iter().all(|t| a.contains(t)),
                "{}",
                tok.decode(&out_a)
            );
            assert!(
                out_c.iter().all(|t| c.contains(t)),
                "{}",
                tok.decode(&out_c)
            );
            let (text_a, text_c) = (tok.decode(&out_a), tok.decode(&out_c));
            assert_ne!(text_a, text_c);
            // One word per token, so usage and word counts agree.
            assert_eq!(text_a.split_whitespace().count(), 40, "{text_a:?}");
        }
    }

    #[test]
    fn the_same_prompt_and_seed_give_the_same_text() {
        let (mut b, tok) = backend(1e9);
        let p = tok.encode("a quiet village near the sea where boats come in");
        let x = generate(&mut b, p.clone(), params(1.0, 9, true));
        assert_eq!(x, generate(&mut b, p.clone(), params(1.0, 9, true)));
        assert_ne!(x, generate(&mut b, p.clone(), params(1.0, 10, true)));
        let g = generate(&mut b, p.clone(), params(0.0, 1, true));
        assert_eq!(
            g,
            generate(&mut b, p, params(0.0, 2, true)),
            "greedy ignores the seed"
        );
    }

    #[test]
    fn a_prompt_without_words_falls_back_to_the_vocabulary() {
        let (mut b, tok) = backend(1e9);
        let p = tok.encode("1234 5678 !!!");
        let out = generate(&mut b, p, params(1.0, 5, true));
        assert_eq!(out.len(), 40);
        assert!(out.iter().all(|t| tok.word_tokens().contains(t)));
    }

    #[test]
    fn logprobs_are_those_of_the_distribution_it_samples_from() {
        let (mut b, tok) = backend(1e9);
        let p = tok.encode(" rivers and stones rivers");
        assert!(p.iter().all(|t| tok.word_tokens().contains(t)), "{p:?}");
        let mut seen = std::collections::HashMap::<u32, (usize, f32)>::new();
        let draws = 4_000;
        for seed in 0..draws {
            let params = SamplingParams {
                logprobs: Some(5),
                ..params(1.0, seed, true)
            };
            let req = NewRequest {
                id: 1,
                prompt: p.clone(),
                params,
                sink: Box::new(NoSink),
                prefix_keys: None,
            };
            let mut seq = Sequence::new(req, BS, 0.0);
            let s = b.sample(&mut seq);
            let lp = s.logprob.unwrap();
            assert_eq!(lp.token, s.token);
            assert_eq!(lp.top.len(), 5, "padded to k with words it never draws");
            assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1), "sorted");
            let mass: f64 = lp.top.iter().map(|t| f64::from(t.1).exp()).sum();
            assert!(mass <= 1.0 + 1e-6);
            let entry = seen.entry(s.token).or_insert((0, lp.logprob));
            entry.0 += 1;
        }
        // " rivers" is half the prompt's words, " and" and " stones" a quarter each.
        assert_eq!(seen.len(), 3, "{seen:?}");
        for (count, logprob) in seen.values() {
            let p = f64::from(*logprob).exp();
            assert!((p - 0.5).abs() < 1e-6 || (p - 0.25).abs() < 1e-6, "{p}");
            let freq = *count as f64 / draws as f64;
            assert!((freq - p).abs() < 0.03, "{freq} vs {p}");
        }
    }

    #[test]
    fn a_sampled_requests_length_depends_on_its_seed_alone() {
        // EOS is drawn from the seed's stream before the pick, so the prompt never moves it.
        let (mut b, tok) = backend(8.0);
        let prompts = ["rivers and stones", "bread and water", "1234 !!!"];
        for seed in 0..20 {
            let lens: Vec<usize> = prompts
                .iter()
                .map(|p| generate(&mut b, tok.encode(p), params(1.0, seed, false)).len())
                .collect();
            assert!(lens.iter().all(|&l| l == lens[0]), "seed {seed}: {lens:?}");
        }
    }
}
