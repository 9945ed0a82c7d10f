//! Chat templates: Hugging Face Jinja templates rendered with minijinja, or built-in ChatML.

use std::path::Path;

use minijinja::{Environment, context};
use serde_json::Value;

use super::{ApiError, ChatMessage, jinja_env};

/// Name the compiled template is stored under in its environment.
const NAME: &str = "chat";

/// A compiled chat template (Jinja, as in Hugging Face `tokenizer_config.json`).
#[derive(Clone)]
pub struct ChatTemplate {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    /// ChatML rendered without Jinja, so the default cannot fail to compile.
    ChatMl,
    /// A compiled Jinja template with the special tokens it is rendered with.
    Jinja {
        env: Box<Environment<'static>>,
        bos_token: String,
        eos_token: String,
    },
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::ChatMl => f.write_str("ChatTemplate(ChatML)"),
            Kind::Jinja { .. } => f.write_str("ChatTemplate(Jinja)"),
        }
    }
}

impl ChatTemplate {
    /// ChatML: `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
    /// `<|im_start|>assistant\n` when a generation prompt is asked for.
    pub fn default_chatml() -> Self {
        Self { kind: Kind::ChatMl }
    }

    /// Compiles a Jinja template as Hugging Face does (`trim_blocks`, `lstrip_blocks`).
    pub fn from_source(src: &str, bos_token: &str, eos_token: &str) -> Result<Self, String> {
        let mut env = jinja_env::environment();
        env.add_template_owned(NAME, src.to_owned())
            .map_err(|e| format!("invalid chat template: {e}"))?;
        Ok(Self {
            kind: Kind::Jinja {
                env: Box::new(env),
                bos_token: bos_token.to_owned(),
                eos_token: eos_token.to_owned(),
            },
        })
    }

    /// Loads the template of a Hugging Face model directory from its `tokenizer_config.json`.
    ///
    /// A sibling `chat_template.jinja` takes precedence (as in recent `transformers`), then the
    /// config's `chat_template` (a string, or a list of `{name, template}` where `default` is
    /// taken), then a sibling `chat_template.json`. `Ok(None)` when the model has no template.
    pub fn from_tokenizer_config(path: &Path) -> Result<Option<Self>, String> {
        let config = read_json(path)?;
        let bos_token = special_token(config.get("bos_token"));
        let eos_token = special_token(config.get("eos_token"));
        let dir = path.parent().unwrap_or(Path::new("."));

        let jinja_file = dir.join("chat_template.jinja");
        let source = if jinja_file.is_file() {
            Some(
                std::fs::read_to_string(&jinja_file)
                    .map_err(|e| format!("reading {}: {e}", jinja_file.display()))?,
            )
        } else {
            match template_field(path, config.get("chat_template"))? {
                Some(src) => Some(src),
                None => {
                    let json_file = dir.join("chat_template.json");
                    if json_file.is_file() {
                        template_field(&json_file, read_json(&json_file)?.get("chat_template"))?
                    } else {
                        None
                    }
                }
            }
        };
        source
            .map(|src| Self::from_source(&src, &bos_token, &eos_token))
            .transpose()
    }

    /// Renders `messages` into the prompt text; template errors (and `raise_exception`) are 400s.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ApiError> {
        match &self.kind {
            Kind::ChatMl => Ok(render_chatml(messages, add_generation_prompt)),
            Kind::Jinja {
                env,
                bos_token,
                eos_token,
            } => {
                let template = env.get_template(NAME).map_err(template_error)?;
                template
                    .render(context! {
                        messages => messages,
                        add_generation_prompt => add_generation_prompt,
                        bos_token => bos_token,
                        eos_token => eos_token,
                    })
                    .map_err(template_error)
            }
        }
    }
}

fn render_chatml(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|im_start|>");
        out.push_str(&m.role);
        out.push('\n');
        out.push_str(&m.content);
        out.push_str("<|im_end|>\n");
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

/// A rendering failure as a 400; `raise_exception` messages are passed through unadorned.
fn template_error(e: minijinja::Error) -> ApiError {
    let raised = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<jinja_env::Raised>());
    let message = match raised {
        Some(raised) => raised.0.clone(),
        None => format!("chat template error: {e}"),
    };
    ApiError::bad_request(message, None)
}

fn read_json(path: &Path) -> Result<Value, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))
}

/// A `bos_token`/`eos_token` entry: a string or an added-token object `{"content": ...}`.
fn special_token(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(map)) => map
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

/// A `chat_template` entry: a string, or a list of named templates of which `default` is used.
fn template_field(path: &Path, value: Option<&Value>) -> Result<Option<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(entries)) => entries
            .iter()
            .find(|entry| entry.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|entry| entry.get("template").and_then(Value::as_str))
            .map(|s| Some(s.to_owned()))
            .ok_or_else(|| {
                format!(
                    "{}: `chat_template` list has no template named `default`",
                    path.display()
                )
            }),
        Some(_) => Err(format!(
            "{}: `chat_template` must be a string or a list",
            path.display()
        )),
    }
}

#[cfg(test)]
#[path = "chat_template_tests.rs"]
mod tests;
