//! The OpenAI surface, checked with the official SDKs and by hand.

mod openai_sdk;
mod openai_surface;
