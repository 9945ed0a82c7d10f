//! OpenAI-compatible wire types: request parsing and validation, response shapes, chat templates.

mod chat_template;
mod error;
mod fields;
mod jinja_env;
mod logprobs;
mod parse;
mod response;

pub use chat_template::ChatTemplate;
pub use error::ApiError;
pub use logprobs::{LogprobEntry, TopEntry};
pub use parse::{
    ChatMessage, Endpoint, MAX_CHOICES, ParsedRequest, Prompt, parse_chat, parse_completion,
};
pub use response::{
    Choice, DONE, FinishReason, ResponseMeta, Usage, chunk, full_response, models_list, usage_chunk,
};
