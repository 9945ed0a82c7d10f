//! Replayed regression prompts (`quality.regression`): a fixed prompt set, read from a JSONL
//! file, replayed every `interval` against each version of the listed models and scored by the
//! same rules as sampled answers ([`super::signals`]), for the slow decay a canary window cannot
//! see. The pure parts live here: the prompt file's parsing ([`parse_prompts`]) and when a round
//! is due ([`Schedule`]). The task that sends them, and the (model, version) pairs a round
//! visits (read from the canary splits), are `crate::pipeline::replay`'s.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

/// Time between rounds when the config gives none.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(600);
/// Most prompts one file may hold (a round sends each to every version, one at a time).
pub const MAX_PROMPTS: usize = 1000;
/// Longest wait before the schedule looks at the config again (a reload may shorten the
/// interval, or turn replay on or off).
pub const RECHECK: Duration = Duration::from_secs(1);
/// The version label of a model without a canary split (as the sampler labels it).
pub const DEFAULT_VERSION: &str = "default";

/// The fields a prompt line may have.
const FIELDS: [&str; 6] = [
    "id",
    "messages",
    "prompt",
    "max_tokens",
    "response_format",
    "tools",
];

/// `quality.regression:` as the snapshot holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct RegressionConfig {
    /// The prompts, in file order (shared: a reload that keeps them copies no text).
    pub prompts: Arc<[RegressionPrompt]>,
    /// Time from the start of one round to the start of the next.
    pub interval: Duration,
    /// The models (as clients name them) whose versions are replayed.
    pub models: Vec<String>,
}

/// Which endpoint a prompt calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptKind {
    /// `messages`: `/v1/chat/completions`.
    Chat,
    /// `prompt`: `/v1/completions`.
    Completion,
}

/// One prompt of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct RegressionPrompt {
    /// The operator's name for it (unique in the file; in debug logs, never in metrics).
    pub id: String,
    /// Its endpoint.
    pub kind: PromptKind,
    /// The request's fields but `model`, as written.
    fields: Map<String, Value>,
}

impl RegressionPrompt {
    /// The request body for `model` (never streamed: the answer is held and scored whole).
    pub fn body(&self, model: &str) -> Vec<u8> {
        let mut body = Map::with_capacity(self.fields.len() + 1);
        body.insert("model".into(), Value::String(model.into()));
        body.extend(self.fields.iter().map(|(k, v)| (k.clone(), v.clone())));
        serde_json::to_vec(&Value::Object(body)).unwrap_or_default()
    }
}

/// Reads a prompts file: one JSON object a line (blank lines skipped), `{"id", "messages"` or
/// `"prompt", "max_tokens", "response_format"?, "tools"?}`. Every problem, each with its 1-based
/// line (`None`: the file as a whole).
pub fn parse_prompts(text: &str) -> Result<Vec<RegressionPrompt>, Vec<(Option<u64>, String)>> {
    let mut prompts = Vec::new();
    let mut errors = Vec::new();
    let mut seen: HashMap<String, u64> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let n = i as u64 + 1;
        if line.trim().is_empty() {
            continue;
        }
        if prompts.len() + errors.len() >= MAX_PROMPTS {
            errors.push((Some(n), format!("more than {MAX_PROMPTS} prompts")));
            break;
        }
        match prompt(line) {
            Ok(p) => match seen.get(&p.id) {
                Some(first) => errors.push((
                    Some(n),
                    format!("id `{}` is used twice (first on line {first})", p.id),
                )),
                None => {
                    seen.insert(p.id.clone(), n);
                    prompts.push(p);
                }
            },
            Err(e) => errors.push((Some(n), e)),
        }
    }
    if prompts.is_empty() && errors.is_empty() {
        errors.push((None, "the file holds no prompts".into()));
    }
    if errors.is_empty() {
        Ok(prompts)
    } else {
        Err(errors)
    }
}

/// One line's prompt, or what is wrong with it.
fn prompt(line: &str) -> Result<RegressionPrompt, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(mut fields) = value else {
        return Err("a prompt is a JSON object".into());
    };
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "unknown field `{unknown}` (a prompt has id, messages or prompt, max_tokens, \
             response_format, tools)"
        ));
    }
    let id = match fields.remove("id") {
        Some(Value::String(id)) if !id.trim().is_empty() => id,
        _ => return Err("`id` must be a non-empty string".into()),
    };
    let kind = match (fields.get("messages"), fields.get("prompt")) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "prompt `{id}`: give `messages` or `prompt`, not both"
            ));
        }
        (None, None) => {
            return Err(format!(
                "prompt `{id}` needs `messages` (chat) or `prompt` (completion)"
            ));
        }
        (Some(Value::Array(m)), None) if !m.is_empty() && m.iter().all(is_message) => {
            PromptKind::Chat
        }
        (Some(_), None) => {
            return Err(format!(
                "prompt `{id}`: `messages` must be a non-empty array of objects with a string `role`"
            ));
        }
        (None, Some(Value::String(p))) if !p.is_empty() => PromptKind::Completion,
        (None, Some(_)) => {
            return Err(format!(
                "prompt `{id}`: `prompt` must be a non-empty string"
            ));
        }
    };
    match fields.get("max_tokens").and_then(Value::as_u64) {
        Some(n) if n >= 1 && n <= u64::from(u32::MAX) => {}
        _ => {
            return Err(format!(
                "prompt `{id}`: `max_tokens` must be a whole number of at least 1"
            ));
        }
    }
    if let Some(f) = fields.get("response_format")
        && !f.get("type").is_some_and(Value::is_string)
    {
        return Err(format!(
            "prompt `{id}`: `response_format` must be an object with a string `type`"
        ));
    }
    if let Some(t) = fields.get("tools")
        && t.as_array().is_none_or(|t| t.is_empty())
    {
        return Err(format!("prompt `{id}`: `tools` must be a non-empty array"));
    }
    Ok(RegressionPrompt { id, kind, fields })
}

fn is_message(m: &Value) -> bool {
    m.get("role").is_some_and(Value::is_string)
}

/// What the replay task does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Start a round now.
    Run,
    /// Look again after this long.
    Wait(Duration),
}

/// When rounds are due: one `interval` after replay was turned on, then one `interval` after
/// each round's start. A round that overran its interval is followed by one round at once, never
/// by the rounds it missed. Time is passed in, so tests need no clock.
#[derive(Debug, Default)]
pub struct Schedule {
    /// When replay was turned on, or the last round started.
    from: Option<Instant>,
}

impl Schedule {
    /// The next step at `now` under the `interval` now in force (`None`: replay is off).
    pub fn step(&mut self, interval: Option<Duration>, now: Instant) -> Step {
        let Some(interval) = interval else {
            self.from = None;
            return Step::Wait(RECHECK);
        };
        let from = *self.from.get_or_insert(now);
        let due = from + interval;
        if now >= due {
            self.from = Some(now);
            return Step::Run;
        }
        Step::Wait((due - now).min(RECHECK))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT: &str = r#"{"id": "capital", "messages": [{"role": "user", "content": "Capital of France?"}], "max_tokens": 16}"#;
    const JSON: &str = r#"{"id": "json", "prompt": "Give JSON.", "max_tokens": 8, "response_format": {"type": "json_object"}}"#;

    #[test]
    fn a_file_of_chat_and_completion_prompts_is_read_in_order() {
        let text = format!("{CHAT}\n\n   \n{JSON}\n");
        let prompts = parse_prompts(&text).unwrap();
        let ids: Vec<&str> = prompts.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["capital", "json"]);
        assert_eq!(prompts[0].kind, PromptKind::Chat);
        assert_eq!(prompts[1].kind, PromptKind::Completion);
        let body: Value = serde_json::from_slice(&prompts[1].body("m")).unwrap();
        assert_eq!(body["model"], "m");
        assert_eq!(body["prompt"], "Give JSON.");
        assert_eq!(body["max_tokens"], 8);
        assert_eq!(body["response_format"]["type"], "json_object");
        assert!(body.get("id").is_none(), "the id stays here");
        assert!(body.get("stream").is_none(), "never streamed");
    }

    #[test]
    fn every_bad_line_is_reported_with_its_number() {
        let lines = [
            CHAT,
            "not json",
            "[1, 2]",
            r#"{"id": "x", "prompt": "a", "max_tokens": 1, "temperature": 0}"#,
            r#"{"prompt": "a", "max_tokens": 1}"#,
            r#"{"id": "both", "prompt": "a", "messages": [{"role": "user"}], "max_tokens": 1}"#,
            r#"{"id": "none", "max_tokens": 1}"#,
            r#"{"id": "roles", "messages": [{"content": "hi"}], "max_tokens": 1}"#,
            r#"{"id": "empty", "prompt": "", "max_tokens": 1}"#,
            r#"{"id": "zero", "prompt": "a", "max_tokens": 0}"#,
            r#"{"id": "frac", "prompt": "a", "max_tokens": 1.5}"#,
            r#"{"id": "fmt", "prompt": "a", "max_tokens": 1, "response_format": "json"}"#,
            r#"{"id": "tools", "prompt": "a", "max_tokens": 1, "tools": []}"#,
            CHAT,
        ];
        let errors = parse_prompts(&lines.join("\n")).unwrap_err();
        let at: Vec<Option<u64>> = errors.iter().map(|e| e.0).collect();
        assert_eq!(at, (2..=14).map(Some).collect::<Vec<_>>(), "{errors:#?}");
        let says = |line: u64, needle: &str| {
            let (_, msg) = &errors[line as usize - 2];
            assert!(
                msg.contains(needle),
                "line {line}: {msg:?} lacks {needle:?}"
            );
        };
        says(2, "not JSON");
        says(3, "a prompt is a JSON object");
        says(4, "unknown field `temperature`");
        says(5, "`id` must be a non-empty string");
        says(6, "not both");
        says(7, "needs `messages` (chat) or `prompt`");
        says(8, "string `role`");
        says(9, "`prompt` must be a non-empty string");
        says(10, "`max_tokens` must be a whole number");
        says(11, "`max_tokens` must be a whole number");
        says(12, "`response_format` must be an object");
        says(13, "`tools` must be a non-empty array");
        says(14, "id `capital` is used twice (first on line 1)");
    }

    #[test]
    fn an_empty_file_or_one_past_the_bound_is_refused() {
        assert_eq!(
            parse_prompts("\n  \n").unwrap_err(),
            [(None, "the file holds no prompts".to_string())]
        );
        let many: Vec<String> = (0..=MAX_PROMPTS)
            .map(|i| format!(r#"{{"id": "p{i}", "prompt": "a", "max_tokens": 1}}"#))
            .collect();
        let errors = parse_prompts(&many.join("\n")).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0, Some(MAX_PROMPTS as u64 + 1));
        assert!(parse_prompts(&many[..MAX_PROMPTS].join("\n")).is_ok());
    }

    #[test]
    fn rounds_start_one_interval_apart_without_catching_up() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let every = Some(Duration::from_millis(200));
        let mut s = Schedule::default();
        // The first round is one interval after replay is on.
        assert_eq!(s.step(every, at(0)), Step::Wait(Duration::from_millis(200)));
        assert_eq!(
            s.step(every, at(150)),
            Step::Wait(Duration::from_millis(50))
        );
        assert_eq!(s.step(every, at(200)), Step::Run);
        // Start to start: a round that took 50 ms leaves 150.
        assert_eq!(
            s.step(every, at(250)),
            Step::Wait(Duration::from_millis(150))
        );
        // A round that overran by three intervals: one round at once, then a full interval.
        assert_eq!(s.step(every, at(1000)), Step::Run);
        assert_eq!(
            s.step(every, at(1001)),
            Step::Wait(Duration::from_millis(199))
        );
        // Long intervals are looked at again every RECHECK; a reload's shorter one applies.
        let hour = Some(Duration::from_secs(3600));
        assert_eq!(s.step(hour, at(1001)), Step::Wait(RECHECK));
        assert_eq!(s.step(every, at(1200)), Step::Run);
    }

    #[test]
    fn turned_off_it_waits_and_turned_on_again_it_starts_a_fresh_interval() {
        let t0 = Instant::now();
        let every = Some(Duration::from_millis(200));
        let mut s = Schedule::default();
        assert_eq!(s.step(every, t0), Step::Wait(Duration::from_millis(200)));
        assert_eq!(
            s.step(None, t0 + Duration::from_secs(5)),
            Step::Wait(RECHECK)
        );
        let back = t0 + Duration::from_secs(6);
        assert_eq!(s.step(every, back), Step::Wait(Duration::from_millis(200)));
        assert_eq!(s.step(every, back + Duration::from_millis(200)), Step::Run);
    }
}
