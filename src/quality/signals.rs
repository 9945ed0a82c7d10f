//! Cheap quality signals of one answer, from the text the gateway already relays: an empty
//! answer, a repetition loop, the length limit hit, a refusal, invalid JSON where JSON was asked
//! for, malformed tool-call arguments. Pure functions of the answer; the caller samples which
//! answers are scored and counts the signals per tenant, model and version (never the text).

use serde::de::IgnoredAny;

/// A repetition loop: of the answer's word n-grams of this length...
const LOOP_NGRAM: usize = 4;
/// ...(an answer of at least this many n-grams' worth)...
const LOOP_MIN_REPEATS: usize = 4;
/// ...at least this share repeat one seen before (a loop of period p repeats all but p of them;
/// prose repeats almost none).
const LOOP_MIN_SHARE: f64 = 0.5;
/// Answers of fewer words than this are judged by character n-grams (text without spaces).
const FEW_WORDS: usize = 12;
/// Character n-gram length for text without spaces.
const LOOP_CHAR_NGRAM: usize = 8;
/// Most of an answer scored: a loop shows in its first part; bounded work per answer.
const MAX_SCORED_CHARS: usize = 64 * 1024;

/// Refusal phrases when the config lists none (matched case-insensitively, anywhere).
pub const DEFAULT_REFUSALS: &[&str] = &[
    "i can't help with",
    "i cannot help with",
    "i can't assist with",
    "i cannot assist with",
    "i'm sorry, but i can't",
    "i am unable to help",
    "as an ai language model",
];

/// What the request asked of its answer's shape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Asked {
    /// `response_format` asked for JSON (`json_object` or `json_schema`).
    pub json: bool,
    /// Tools were offered.
    pub tools: bool,
}

/// One answer as relayed: its text, finish reason and tool-call arguments.
#[derive(Debug, Clone, Copy, Default)]
pub struct Answer<'a> {
    /// The answer's text (content deltas joined, for a stream).
    pub text: &'a str,
    /// `finish_reason` of the (first) choice, if the worker gave one.
    pub finish_reason: Option<&'a str>,
    /// The `arguments` string of each tool call.
    pub tool_arguments: &'a [String],
}

/// The signals one answer raised.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals {
    /// Nothing but whitespace, and no tool call.
    pub empty: bool,
    /// A repeated n-gram loop.
    pub repetition: bool,
    /// Stopped at the length limit (`finish_reason: length`).
    pub length_limit: bool,
    /// Opens or contains a configured refusal phrase.
    pub refusal: bool,
    /// JSON was asked for and the text is not JSON.
    pub invalid_json: bool,
    /// Tools were offered and a tool call's arguments are not a JSON object.
    pub malformed_tool_args: bool,
}

impl Signals {
    /// The signal names raised, as metric labels.
    pub fn names(&self) -> impl Iterator<Item = &'static str> {
        [
            (self.empty, "empty"),
            (self.repetition, "repetition"),
            (self.length_limit, "length_limit"),
            (self.refusal, "refusal"),
            (self.invalid_json, "invalid_json"),
            (self.malformed_tool_args, "malformed_tool_args"),
        ]
        .into_iter()
        .filter_map(|(raised, name)| raised.then_some(name))
    }
}

/// Every label [`Signals::names`] can give, for pre-registered series.
pub const SIGNAL_NAMES: [&str; 6] = [
    "empty",
    "repetition",
    "length_limit",
    "refusal",
    "invalid_json",
    "malformed_tool_args",
];

/// Scores `answer` for a request that `asked` as it did; `refusals` lowercase phrases.
pub fn score(answer: &Answer<'_>, asked: Asked, refusals: &[String]) -> Signals {
    let text = head(answer.text, MAX_SCORED_CHARS);
    let lower = text.to_lowercase();
    Signals {
        empty: text.trim().is_empty() && answer.tool_arguments.is_empty(),
        repetition: is_loop(text),
        length_limit: answer.finish_reason == Some("length"),
        refusal: refusals
            .iter()
            .any(|p| !p.is_empty() && lower.contains(p.as_str())),
        invalid_json: asked.json
            && answer.tool_arguments.is_empty()
            && serde_json::from_str::<IgnoredAny>(answer.text).is_err(),
        malformed_tool_args: asked.tools
            && answer.tool_arguments.iter().any(|a| !is_json_object(a)),
    }
}

/// The default refusal phrases, lowercase, as the config holds them.
pub fn default_refusals() -> Vec<String> {
    DEFAULT_REFUSALS.iter().map(|p| p.to_string()).collect()
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn head(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn is_json_object(text: &str) -> bool {
    matches!(
        serde_json::from_str::<serde_json::Value>(text),
        Ok(serde_json::Value::Object(_))
    )
}

/// True when at least [`LOOP_MIN_SHARE`] of the n-grams repeat an earlier one: words, or
/// characters for text with few spaces.
fn is_loop(text: &str) -> bool {
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.len() >= FEW_WORDS {
        return dominant(&words, LOOP_NGRAM);
    }
    let chars: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
    dominant(&chars, LOOP_CHAR_NGRAM)
}

/// Whether enough of the `n`-grams of `items` repeat an earlier one.
fn dominant<T: std::hash::Hash + Eq>(items: &[T], n: usize) -> bool {
    if items.len() < n * LOOP_MIN_REPEATS {
        return false;
    }
    let distinct: std::collections::HashSet<&[T]> = items.windows(n).collect();
    let total = items.len() + 1 - n;
    let repeats = total - distinct.len();
    repeats as f64 >= LOOP_MIN_SHARE * total as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(text: &str) -> Signals {
        let answer = Answer {
            text,
            finish_reason: Some("stop"),
            tool_arguments: &[],
        };
        score(&answer, Asked::default(), &default_refusals())
    }

    #[test]
    fn a_healthy_answer_raises_nothing() {
        let s = plain(
            "Paris is the capital of France. It sits on the Seine and has been the seat of \
             government for most of the country's history, with a population near two million.",
        );
        assert_eq!(s, Signals::default());
        assert_eq!(s.names().count(), 0);
    }

    #[test]
    fn empty_and_length_limit() {
        assert!(plain("   \n").empty);
        let cut = Answer {
            text: "and then",
            finish_reason: Some("length"),
            tool_arguments: &[],
        };
        let s = score(&cut, Asked::default(), &[]);
        assert!(s.length_limit && !s.empty);
        // A tool call with no text is not an empty answer.
        let args = vec!["{\"city\":\"Paris\"}".to_string()];
        let call = Answer {
            text: "",
            finish_reason: Some("tool_calls"),
            tool_arguments: &args,
        };
        assert!(!score(&call, Asked::default(), &[]).empty);
    }

    #[test]
    fn a_repeated_phrase_is_a_loop_and_ordinary_prose_is_not() {
        let looped = "Here is the answer. ".to_string() + &"I will check that for you. ".repeat(12);
        assert!(plain(&looped).repetition);
        // Repeats of a common word are not a loop.
        let prose = "the cat sat on the mat and the dog lay by the door while the rain fell on \
                     the roof of the old house at the end of the lane";
        assert!(!plain(prose).repetition);
        // Text without spaces: character n-grams.
        assert!(plain(&"好的谢谢你的问题".repeat(10)).repetition);
        assert!(!plain("巴黎是法国的首都，位于塞纳河畔。").repetition);
    }

    #[test]
    fn refusals_match_the_configured_phrases_case_insensitively() {
        assert!(plain("I'm sorry, but I can't do that.").refusal);
        let custom = vec!["not allowed to say".to_string()];
        let answer = Answer {
            text: "That is Not Allowed To Say here.",
            ..Answer::default()
        };
        assert!(score(&answer, Asked::default(), &custom).refusal);
        assert!(!score(&answer, Asked::default(), &[]).refusal);
    }

    #[test]
    fn json_and_tool_arguments_are_checked_only_when_asked_for() {
        let json = Asked {
            json: true,
            tools: false,
        };
        let answer = |text| Answer {
            text,
            ..Answer::default()
        };
        assert!(!score(&answer("{\"a\": [1, 2]}"), json, &[]).invalid_json);
        assert!(score(&answer("Sure! {\"a\": 1}"), json, &[]).invalid_json);
        assert!(!score(&answer("Sure! {\"a\": 1}"), Asked::default(), &[]).invalid_json);
        let tools = Asked {
            json: false,
            tools: true,
        };
        let bad = vec!["{\"city\": \"Paris\"".to_string()];
        let list = vec!["[1, 2]".to_string()];
        let good = vec!["{}".to_string(), "{\"n\": 3}".to_string()];
        let judged = |args: &[String]| {
            let answer = Answer {
                text: "",
                finish_reason: Some("tool_calls"),
                tool_arguments: args,
            };
            score(&answer, tools, &[]).malformed_tool_args
        };
        assert!(judged(&bad));
        assert!(judged(&list));
        assert!(!judged(&good));
    }

    #[test]
    fn huge_answers_are_scored_on_a_bounded_head() {
        let big = "word ".repeat(100_000);
        let s = plain(&big);
        assert!(s.repetition);
        assert_eq!(head("héllo", 2), "h");
    }
}
