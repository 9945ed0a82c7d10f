//! The content of generated requests: tenant, prefix group, session and prompt token ids. Group
//! prefixes come from (seed, group) alone, and a session's next turn starts with its previous
//! prompt and answer, so prefix caches see exactly the sharing real traffic has.

use super::dist::sample_pair;
use super::model::{Mix, PrefixGroups};
use super::rng::{Rng, Zipf};

/// Sub-stream tag for group prefixes: stream = GROUP_STREAM + group.
const GROUP_STREAM: u64 = 1 << 40;

/// What one generated request looks like, before it gets an id and a time.
pub(super) struct Shape {
    pub tenant: Option<String>,
    pub class: Option<String>,
    pub session: Option<String>,
    pub group: Option<usize>,
    pub prompt: Vec<u32>,
    pub output_tokens: u32,
}

/// A session in progress in one of the slots.
struct Live {
    name: String,
    tenant: Option<String>,
    group: Option<usize>,
    turns_left: u32,
    /// Everything the next turn's prompt starts with: prefix, earlier turns and answers.
    history: Vec<u32>,
}

/// Draws request shapes from a `Mix`, deterministically from the seed.
pub(super) struct Shaper {
    mix: Mix,
    seed: u64,
    words: &'static [u32],
    shape_rng: Rng,
    text_rng: Rng,
    zipf: Option<Zipf>,
    prefixes: Vec<Option<Vec<u32>>>,
    slots: Vec<Option<Live>>,
    sessions_started: u64,
}

impl Shaper {
    /// A shaper for `mix` under `seed`, drawing prompt tokens from `words`.
    pub(super) fn new(mix: Mix, seed: u64, words: &'static [u32]) -> Self {
        let zipf = mix
            .prefix_groups
            .as_ref()
            .map(|g| Zipf::new(g.count, g.zipf));
        let groups = mix.prefix_groups.as_ref().map_or(0, |g| g.count);
        let slots = mix.sessions.as_ref().map_or(0, |s| s.count);
        Self {
            mix,
            seed,
            words,
            shape_rng: Rng::derive(seed, 2),
            text_rng: Rng::derive(seed, 3),
            zipf,
            prefixes: vec![None; groups],
            slots: (0..slots).map(|_| None).collect(),
            sessions_started: 0,
        }
    }

    /// The next request's shape.
    pub(super) fn next_shape(&mut self) -> Shape {
        if self.slots.is_empty() {
            let group = self.pick_group();
            let tenant = self.pick_tenant();
            let (class, len, output_tokens) = self.lengths(false);
            let mut prompt = self.prefix(group);
            self.extend_fresh(&mut prompt, len);
            return Shape {
                tenant,
                class,
                session: None,
                group,
                prompt,
                output_tokens,
            };
        }
        let slot = self.shape_rng.index(self.slots.len());
        let (mut live, first) = match self.slots[slot].take() {
            Some(live) => (live, false),
            None => (self.start_session(), true),
        };
        let (class, len, output_tokens) = self.lengths(first);
        let mut prompt = std::mem::take(&mut live.history);
        self.extend_fresh(&mut prompt, len);
        live.turns_left = live.turns_left.saturating_sub(1);
        let shape = Shape {
            tenant: live.tenant.clone(),
            class,
            session: Some(live.name.clone()),
            group: live.group,
            prompt: prompt.clone(),
            output_tokens,
        };
        if live.turns_left > 0 {
            // The answer joins the history at its token length.
            live.history = prompt;
            self.extend_fresh(&mut live.history, output_tokens);
            self.slots[slot] = Some(live);
        }
        shape
    }

    /// A new session for an empty slot.
    fn start_session(&mut self) -> Live {
        let name = format!("s{}", self.sessions_started);
        self.sessions_started += 1;
        let group = self.pick_group();
        let tenant = self.pick_tenant();
        let turns = self
            .mix
            .sessions
            .as_ref()
            .map_or(1, |s| s.turns.sample(&mut self.shape_rng).max(1));
        Live {
            name,
            tenant,
            group,
            turns_left: turns,
            history: self.prefix(group),
        }
    }

    /// The class of a request drawn at random, and its new-turn and output lengths, correlated
    /// as configured; a session's first turn takes its length from `sessions.first_turn` when
    /// set.
    fn lengths(&mut self, first_turn: bool) -> (Option<String>, u32, u32) {
        let classes = &self.mix.classes;
        let i = match classes.len() {
            0 => return (None, 0, 0),
            1 => 0,
            _ => {
                let weights: Vec<f64> = classes.iter().map(|c| c.weight).collect();
                self.shape_rng.weighted(&weights)
            }
        };
        let Some(class) = classes.get(i) else {
            return (None, 0, 0);
        };
        let first = self
            .mix
            .sessions
            .as_ref()
            .and_then(|s| s.first_turn.as_ref());
        let prompt = match first {
            Some(dist) if first_turn => dist,
            _ => &class.prompt_tokens,
        };
        let (rng, corr) = (&mut self.shape_rng, class.correlation);
        let (len, output) = sample_pair(prompt, &class.output_tokens, corr, rng);
        (Some(class.name.clone()), len, output)
    }

    /// A prefix group for a new request or session, or none (outside `share`).
    fn pick_group(&mut self) -> Option<usize> {
        let PrefixGroups { share, .. } = self.mix.prefix_groups.as_ref()?;
        let zipf = self.zipf.as_ref()?;
        let used = self.shape_rng.uniform() < *share;
        let group = zipf.sample(&mut self.shape_rng);
        used.then_some(group)
    }

    /// A tenant by weight, or none when the workload has no mix.
    fn pick_tenant(&mut self) -> Option<String> {
        let tenants = &self.mix.tenants;
        if tenants.is_empty() {
            return None;
        }
        let weights: Vec<f64> = tenants.iter().map(|t| t.weight).collect();
        let i = self.shape_rng.weighted(&weights);
        tenants.get(i).map(|t| t.name.clone())
    }

    /// The group's system prompt (empty for no group), generated once from (seed, group).
    fn prefix(&mut self, group: Option<usize>) -> Vec<u32> {
        let (Some(g), Some(groups)) = (group, self.mix.prefix_groups.as_ref()) else {
            return Vec::new();
        };
        let tokens = groups.tokens;
        let words = self.words;
        let seed = self.seed;
        let Some(cached) = self.prefixes.get_mut(g) else {
            return Vec::new();
        };
        cached
            .get_or_insert_with(|| {
                let mut rng = Rng::derive(seed, GROUP_STREAM + g as u64);
                let mut prefix = Vec::new();
                fresh_words(&mut prefix, tokens, words, &mut rng);
                prefix
            })
            .clone()
    }

    /// Appends `n` fresh word tokens.
    fn extend_fresh(&mut self, out: &mut Vec<u32>, n: u32) {
        fresh_words(out, n, self.words, &mut self.text_rng);
    }
}

/// Appends `n` word tokens drawn uniformly from `words` (nothing when `words` is empty).
pub(super) fn fresh_words(out: &mut Vec<u32>, n: u32, words: &[u32], rng: &mut Rng) {
    if words.is_empty() {
        return;
    }
    out.reserve(n as usize);
    out.extend((0..n).map(|_| words[rng.index(words.len())]));
}
