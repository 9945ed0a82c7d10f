//! OpenAI-compatible wire types: request parsing and validation, response shapes, chat templates.

mod chat_template;
mod embeddings;
mod error;
pub mod fields;
mod jinja_env;
mod logprobs;
pub mod params;
mod parse;
mod response;
mod responses;
pub mod sse;

pub use chat_template::ChatTemplate;
pub use embeddings::{
    EmbeddingsRequest, EncodingFormat, embeddings_response, l2_normalize, parse_embeddings,
};
pub use error::ApiError;
pub use logprobs::{LogprobEntry, TopEntry};
pub use parse::{
    ChatMessage, Endpoint, MAX_CHOICES, ParsedRequest, Prompt, parse_chat, parse_completion,
};
pub use response::{
    Choice, FinishReason, ResponseMeta, Usage, chunk, full_response, models_list, usage_chunk,
};
pub use responses::{
    ResponseFrame, ResponseStatus, ResponsesEcho, parse_responses, sse_event, text_part,
};
pub use sse::DONE;
