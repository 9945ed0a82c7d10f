//! Quality faults: an engine told to answer worse on purpose (repetition loops, empty answers,
//! refusals, broken JSON, answers that run to `max_tokens`), so the gateway's quality signals and
//! the canary's quality judgement can be tested against the real engine.
//!
//! A faulty answer is scripted at the token level: the step loop emits the script's tokens in
//! place of the sampled ones (see [`Script::token_at`]). The answer is still generated step by
//! step, streamed and counted like any other, so streamed and whole answers agree and `usage`
//! matches the text. The pick is deterministic in the request number and the seed, as
//! [`crate::launch::Faults::should_fail`] is.

use std::sync::Arc;

use crate::tokenizer::EngineTokenizer;

/// The phrase a repetition loop repeats (a few words, so the loop shows within a short answer).
const LOOP_PHRASE: &str = " and then the same thing again";
/// A refusal the gateway's default `refusal_phrases` match.
const REFUSAL: &str = "I'm sorry, but I can't help with that request.";
/// JSON cut off mid-object: never valid, whatever follows.
const BROKEN_JSON: &str = "{\"answer\": \"the result is";
/// Salt of the misbehaviour draw, so it is independent of the error-rate draw on the same seed.
const DRAW_SALT: u64 = 0x5155_414c_4954_5921;

/// What the flags ask: the share of answers of each kind of misbehaviour (0..1 each, at most 1
/// together).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MisbehaveRates {
    /// Answers that loop over one short phrase until `max_tokens` (`--fault-repeat-rate`).
    pub repeat: f64,
    /// Answers with no content at all (`--fault-empty-rate`).
    pub empty: f64,
    /// Answers that refuse (`--fault-refusal-rate`).
    pub refusal: f64,
    /// JSON answers cut off mid-object, when the request gives `response_format`
    /// (`--fault-broken-json-rate`).
    pub broken_json: f64,
    /// Every answer ignores EOS and runs to `max_tokens` (`--fault-longer-answers`).
    pub longer_answers: bool,
}

impl MisbehaveRates {
    /// Checks every rate is a share and that they fit one draw together.
    pub fn validate(&self) -> Result<(), String> {
        let named = [
            ("--fault-repeat-rate", self.repeat),
            ("--fault-empty-rate", self.empty),
            ("--fault-refusal-rate", self.refusal),
            ("--fault-broken-json-rate", self.broken_json),
        ];
        for (flag, rate) in named {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("{flag} must be between 0 and 1, got {rate}"));
            }
        }
        let sum: f64 = named.iter().map(|(_, r)| r).sum();
        if sum > 1.0 + 1e-9 {
            return Err(format!(
                "the --fault-*-rate shares of misbehaving answers add up to {sum}, more than 1"
            ));
        }
        Ok(())
    }
}

/// How one answer misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A loop of one phrase until `max_tokens`.
    Repeat,
    /// No content.
    Empty,
    /// A refusal.
    Refusal,
    /// Truncated JSON (only where JSON may have been asked for).
    BrokenJson,
}

/// Tokens an answer emits in place of sampled ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Script {
    /// These tokens, then end of sequence (empty: the answer ends at once).
    Once(Vec<u32>),
    /// These tokens over and over: the answer ends only at `max_tokens` (or a stop string).
    Cycle(Vec<u32>),
}

impl Script {
    /// The token to emit as output token number `i` (0-based); `None` means end of sequence.
    pub fn token_at(&self, i: usize) -> Option<u32> {
        match self {
            Self::Once(tokens) => tokens.get(i).copied(),
            Self::Cycle(tokens) if tokens.is_empty() => None,
            Self::Cycle(tokens) => Some(tokens[i % tokens.len()]),
        }
    }
}

/// The engine's quality faults: the rates plus each script tokenized once at start.
#[derive(Debug, Clone, Default)]
pub struct Misbehave {
    rates: MisbehaveRates,
    seed: u64,
    scripts: Option<Scripts>,
}

#[derive(Debug, Clone)]
struct Scripts {
    repeat: Arc<Script>,
    empty: Arc<Script>,
    refusal: Arc<Script>,
    broken_json: Arc<Script>,
}

impl Misbehave {
    /// Faults at `rates`, drawn with `seed`, scripted in `tokenizer`'s tokens.
    pub fn new(
        rates: MisbehaveRates,
        seed: u64,
        tokenizer: &EngineTokenizer,
    ) -> Result<Self, String> {
        rates.validate()?;
        let encode = |text: &str| tokenizer.encode(text, false);
        let scripts = Scripts {
            repeat: Arc::new(Script::Cycle(encode(LOOP_PHRASE)?)),
            empty: Arc::new(Script::Once(Vec::new())),
            refusal: Arc::new(Script::Once(encode(REFUSAL)?)),
            broken_json: Arc::new(Script::Once(encode(BROKEN_JSON)?)),
        };
        Ok(Self {
            rates,
            seed,
            scripts: Some(scripts),
        })
    }

    /// Whether every answer ignores EOS (`--fault-longer-answers`).
    pub fn longer_answers(&self) -> bool {
        self.rates.longer_answers
    }

    /// How request number `n` misbehaves, if at all: one uniform draw per request, split into
    /// consecutive intervals of the rates, so each kind gets exactly its share. `json` says the
    /// request gave `response_format`; without it a broken-JSON draw answers normally.
    pub fn kind(&self, n: u64, json: bool) -> Option<Kind> {
        let r = self.rates;
        if r.repeat + r.empty + r.refusal + r.broken_json <= 0.0 {
            return None;
        }
        let h = xxhash_rust::xxh3::xxh3_64_with_seed(&n.to_le_bytes(), self.seed ^ DRAW_SALT);
        let u = (h >> 11) as f64 / (1u64 << 53) as f64;
        let mut edge = 0.0;
        for (kind, rate) in [
            (Kind::Repeat, r.repeat),
            (Kind::Empty, r.empty),
            (Kind::Refusal, r.refusal),
            (Kind::BrokenJson, r.broken_json),
        ] {
            edge += rate;
            if u < edge {
                return (kind != Kind::BrokenJson || json).then_some(kind);
            }
        }
        None
    }

    /// The script request number `n` answers with, if it misbehaves.
    pub fn script(&self, n: u64, json: bool) -> Option<Arc<Script>> {
        let scripts = self.scripts.as_ref()?;
        Some(match self.kind(n, json)? {
            Kind::Repeat => scripts.repeat.clone(),
            Kind::Empty => scripts.empty.clone(),
            Kind::Refusal => scripts.refusal.clone(),
            Kind::BrokenJson => scripts.broken_json.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::SimTokenizer;

    fn sim_tokenizer() -> EngineTokenizer {
        EngineTokenizer::Sim(SimTokenizer::shared().unwrap())
    }

    fn misbehave(rates: MisbehaveRates) -> Misbehave {
        Misbehave::new(rates, 7, &sim_tokenizer()).unwrap()
    }

    #[test]
    fn no_rates_no_misbehaviour() {
        let m = misbehave(MisbehaveRates::default());
        assert!((1..1000).all(|n| m.script(n, true).is_none()));
        assert!(Misbehave::default().script(1, true).is_none());
    }

    #[test]
    fn each_kind_gets_its_share_and_the_draw_is_deterministic() {
        let rates = MisbehaveRates {
            repeat: 0.05,
            empty: 0.1,
            refusal: 0.2,
            broken_json: 0.15,
            longer_answers: false,
        };
        let m = misbehave(rates);
        let count = |kind: Kind| {
            (1..=20_000)
                .filter(|&n| m.kind(n, true) == Some(kind))
                .count()
        };
        for (kind, rate) in [
            (Kind::Repeat, 0.05),
            (Kind::Empty, 0.1),
            (Kind::Refusal, 0.2),
            (Kind::BrokenJson, 0.15),
        ] {
            let share = count(kind) as f64 / 20_000.0;
            assert!((share - rate).abs() < 0.01, "{kind:?}: {share} vs {rate}");
        }
        let again = misbehave(rates);
        assert!((1..500).all(|n| m.kind(n, true) == again.kind(n, true)));
        let other_seed = Misbehave::new(rates, 8, &sim_tokenizer()).unwrap();
        assert!((1..500).any(|n| m.kind(n, true) != other_seed.kind(n, true)));
    }

    #[test]
    fn broken_json_only_where_a_format_was_asked() {
        let m = misbehave(MisbehaveRates {
            broken_json: 1.0,
            ..MisbehaveRates::default()
        });
        assert_eq!(m.kind(3, true), Some(Kind::BrokenJson));
        assert_eq!(m.kind(3, false), None);
    }

    #[test]
    fn scripts_decode_to_what_the_gateway_detects() {
        let tok = sim_tokenizer();
        let decode = |script: &Script, len: usize| {
            let ids: Vec<u32> = (0..len).map_while(|i| script.token_at(i)).collect();
            tok.decode(&ids)
        };
        let all = |rates| misbehave(rates).script(1, true).unwrap();
        let repeat = all(MisbehaveRates {
            repeat: 1.0,
            ..MisbehaveRates::default()
        });
        let text = decode(&repeat, 64);
        assert!(text.matches(LOOP_PHRASE).count() >= 8, "{text}");
        assert!(
            repeat.token_at(10_000).is_some(),
            "a loop never ends by itself"
        );

        let empty = all(MisbehaveRates {
            empty: 1.0,
            ..MisbehaveRates::default()
        });
        assert_eq!(empty.token_at(0), None);

        let refusal = all(MisbehaveRates {
            refusal: 1.0,
            ..MisbehaveRates::default()
        });
        assert_eq!(decode(&refusal, 1000), REFUSAL);
        assert!(REFUSAL.to_lowercase().contains("i'm sorry, but i can't"));

        let json = all(MisbehaveRates {
            broken_json: 1.0,
            ..MisbehaveRates::default()
        });
        let text = decode(&json, 1000);
        assert_eq!(text, BROKEN_JSON);
        assert!(serde_json::from_str::<serde_json::Value>(&text).is_err());
    }

    #[test]
    fn rates_are_checked() {
        let bad = |rates: MisbehaveRates| Misbehave::new(rates, 0, &sim_tokenizer()).is_err();
        assert!(bad(MisbehaveRates {
            repeat: 1.5,
            ..MisbehaveRates::default()
        }));
        assert!(bad(MisbehaveRates {
            empty: -0.1,
            ..MisbehaveRates::default()
        }));
        assert!(bad(MisbehaveRates {
            repeat: 0.6,
            refusal: 0.6,
            ..MisbehaveRates::default()
        }));
        assert!(bad(MisbehaveRates {
            repeat: f64::NAN,
            ..MisbehaveRates::default()
        }));
    }
}
