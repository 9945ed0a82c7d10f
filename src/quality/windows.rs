//! Drift windows per model and version: each answer adds its prompt length, output length,
//! cached share of the prompt and finish reason to the current window; when the window holds
//! `window` answers it is scored against the reference ([`super::drift::psi`]) and becomes the
//! next reference (`rolling`) or is dropped (`pinned`: the first full window stays the
//! reference). Pure: the caller exports the scores. Keys are bounded ([`MAX_KEYS`]).

use super::drift::{Binned, psi};
use crate::fast_maps::NamesMap;

/// Most (model, version) pairs tracked; models and versions come from config, so this only
/// guards against a config with very many of them.
pub const MAX_KEYS: usize = 256;

/// The features scored, as the `feature` label, in [`Scores`] order.
pub const FEATURES: [&str; 4] = [
    "prompt_tokens",
    "output_tokens",
    "cached_share",
    "finish_reason",
];

/// Finish reasons binned apart; any other is `other`.
const FINISH_REASONS: [&str; 4] = ["stop", "length", "tool_calls", "content_filter"];

/// The PSI of each of [`FEATURES`], where both windows held enough values.
pub type Scores = [Option<f64>; 4];

/// Which window the current one is compared with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Reference {
    /// The window before it.
    #[default]
    Rolling,
    /// The first full window, kept.
    Pinned,
}

/// How the windows are cut and compared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowSettings {
    /// Answers per window.
    pub window: u64,
    /// Rolling or pinned reference.
    pub reference: Reference,
    /// Fewest values of a feature in each window for it to be scored.
    pub min_count: u64,
}

/// One answer's features (a missing one is left out of its feature's window).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Observation<'a> {
    /// Prompt tokens.
    pub prompt_tokens: Option<u64>,
    /// Completion tokens.
    pub output_tokens: Option<u64>,
    /// Cached prompt tokens over prompt tokens.
    pub cached_share: Option<f64>,
    /// The first choice's finish reason.
    pub finish_reason: Option<&'a str>,
}

/// The windows of one model and version.
#[derive(Debug, Clone)]
struct Windows {
    answers: u64,
    current: [Binned; 4],
    reference: Option<[Binned; 4]>,
}

fn fresh() -> [Binned; 4] {
    [
        Binned::lengths(),
        Binned::lengths(),
        Binned::shares(),
        // One bin per known reason and one for the rest.
        Binned::new(&[1.0, 2.0, 3.0, 4.0]),
    ]
}

impl Windows {
    fn new() -> Self {
        Self {
            answers: 0,
            current: fresh(),
            reference: None,
        }
    }

    fn observe(&mut self, o: &Observation<'_>, s: &WindowSettings) -> Option<Scores> {
        let [prompt, output, cached, finish] = &mut self.current;
        if let Some(v) = o.prompt_tokens {
            prompt.add(v as f64);
        }
        if let Some(v) = o.output_tokens {
            output.add(v as f64);
        }
        if let Some(v) = o.cached_share {
            cached.add(v);
        }
        if let Some(r) = o.finish_reason {
            let bin = FINISH_REASONS.iter().position(|k| *k == r);
            finish.add_to_bin(bin.unwrap_or(FINISH_REASONS.len()));
        }
        self.answers += 1;
        if self.answers < s.window.max(1) {
            return None;
        }
        let current = std::mem::replace(&mut self.current, fresh());
        self.answers = 0;
        let scores = self.reference.as_ref().map(|reference| {
            let mut out: Scores = [None; 4];
            for (i, slot) in out.iter_mut().enumerate() {
                *slot = psi(&reference[i], &current[i], s.min_count).ok();
            }
            out
        });
        if s.reference == Reference::Rolling || self.reference.is_none() {
            self.reference = Some(current);
        }
        scores
    }
}

/// The drift windows of every (model, version) pair seen: by model, then version, so that an
/// answer of a pair already seen is looked up by its names as they are (no key built per answer),
/// and an answer of the same pair as the last one (most of them, with one model) is not looked
/// up at all.
#[derive(Debug, Default)]
pub struct DriftBook {
    /// Each pair's names and windows, in the order first seen (at most [`MAX_KEYS`]).
    slots: Vec<(String, String, Windows)>,
    /// Model, then version, to its slot.
    index: NamesMap<String, NamesMap<String, usize>>,
    /// The slot of the last answer.
    last: usize,
}

impl DriftBook {
    /// Adds `o` to the windows of `model` and `version`; the scores when a window just ended
    /// with a reference to compare it with. A pair past [`MAX_KEYS`] is not tracked.
    pub fn observe(
        &mut self,
        (model, version): (&str, &str),
        o: &Observation<'_>,
        s: &WindowSettings,
    ) -> Option<Scores> {
        let slot = self.slot(model, version)?;
        self.last = slot;
        self.slots
            .get_mut(slot)
            .and_then(|(_, _, w)| w.observe(o, s))
    }

    /// The slot of the pair, made when new and there is room.
    fn slot(&mut self, model: &str, version: &str) -> Option<usize> {
        if let Some((m, v, _)) = self.slots.get(self.last)
            && m == model
            && v == version
        {
            return Some(self.last);
        }
        if let Some(&i) = self.index.get(model).and_then(|v| v.get(version)) {
            return Some(i);
        }
        if self.slots.len() >= MAX_KEYS {
            return None;
        }
        let i = self.slots.len();
        self.slots
            .push((model.to_owned(), version.to_owned(), Windows::new()));
        self.index
            .entry(model.to_owned())
            .or_default()
            .insert(version.to_owned(), i);
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(reference: Reference) -> WindowSettings {
        WindowSettings {
            window: 100,
            reference,
            min_count: 50,
        }
    }

    fn answer(prompt: u64) -> Observation<'static> {
        Observation {
            prompt_tokens: Some(prompt),
            output_tokens: Some(20),
            cached_share: Some(0.0),
            finish_reason: Some("stop"),
        }
    }

    /// Feeds one window of 100 answers with prompts of `prompt` tokens; the scores it ended with.
    fn window(book: &mut DriftBook, s: &WindowSettings, prompt: u64) -> Option<Scores> {
        let mut last = None;
        for i in 0..100 {
            let got = book.observe(("m", "v"), &answer(prompt), s);
            if i < 99 {
                assert_eq!(got, None, "scored before the window was full");
            } else {
                last = got;
            }
        }
        last
    }

    #[test]
    fn the_first_window_is_only_a_reference_and_a_shift_scores_high() {
        let s = settings(Reference::Rolling);
        let mut book = DriftBook::default();
        assert_eq!(window(&mut book, &s, 100), None);
        let same = window(&mut book, &s, 100).expect("scored");
        assert!(
            same.iter().all(|p| p.is_some_and(|p| p.abs() < 1e-12)),
            "{same:?}"
        );
        // Prompts move from the [64, 128) bin to [1024, 2048): the whole mass moves, and the
        // PSI is 2 (1 - 1e-4) ln(1e4) by hand.
        let shifted = window(&mut book, &s, 1500).expect("scored");
        let want = 2.0 * (1.0 - 1e-4) * (1e4f64).ln();
        assert!((shifted[0].unwrap() - want).abs() < 1e-9, "{shifted:?}");
        assert_eq!(shifted[1], Some(0.0), "output lengths did not move");
        // Rolling: the shifted window is the new reference, so staying shifted is no drift.
        let again = window(&mut book, &s, 1500).expect("scored");
        assert!(again[0].unwrap().abs() < 1e-12);
    }

    #[test]
    fn a_pinned_reference_keeps_seeing_the_shift() {
        let s = settings(Reference::Pinned);
        let mut book = DriftBook::default();
        window(&mut book, &s, 100);
        window(&mut book, &s, 1500);
        let again = window(&mut book, &s, 1500).expect("scored");
        assert!(again[0].unwrap() > 0.2);
    }

    #[test]
    fn a_feature_with_too_few_values_is_not_scored_and_keys_are_bounded() {
        let s = settings(Reference::Rolling);
        let mut book = DriftBook::default();
        let bare = Observation::default();
        for _ in 0..200 {
            if let Some(scores) = book.observe(("m", "v"), &bare, &s) {
                assert_eq!(scores, [None; 4]);
            }
        }
        for i in 0..MAX_KEYS + 5 {
            book.observe(("m", &i.to_string()), &bare, &s);
        }
        assert_eq!(book.slots.len(), MAX_KEYS);
        assert_eq!(book.index["m"].len(), MAX_KEYS);
        // A pair past the bound is not tracked, and the last slot is not taken for it.
        assert_eq!(book.observe(("m", "late"), &bare, &s), None);
        assert_eq!(book.slots.len(), MAX_KEYS);
    }

    #[test]
    fn interleaved_pairs_keep_their_own_windows() {
        let s = settings(Reference::Rolling);
        let mut book = DriftBook::default();
        let answer = Observation {
            prompt_tokens: Some(100),
            ..Observation::default()
        };
        for i in 0..30 {
            let version = if i % 3 == 0 { "b" } else { "a" };
            book.observe(("m", version), &answer, &s);
            book.observe(("n", "a"), &answer, &s);
        }
        let answers = |m: &str, v: &str| {
            book.slots
                .iter()
                .find(|(sm, sv, _)| sm == m && sv == v)
                .map(|(_, _, w)| w.answers)
        };
        assert_eq!(answers("m", "a"), Some(20));
        assert_eq!(answers("m", "b"), Some(10));
        assert_eq!(answers("n", "a"), Some(30));
    }
}
