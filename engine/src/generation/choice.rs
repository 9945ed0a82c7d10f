//! One choice of a request on its way to the client: its sequence's token events become
//! detokenized, stop-checked text (with the prompt first under `echo`), log-probability entries
//! with their text, and the running cumulative logprob that `best_of` ranks by.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::logprobs::TokenLogprob;
use crate::openai::{FinishReason, LogprobEntry, TopEntry};
use crate::output_text::OutputText;
use crate::request::SamplingParams;
use crate::sequence::{self, FinishInfo, TokenChunk};
use crate::tokenizer::{EngineTokenizer, IncrementalDecoder};

/// What one event added to a choice: visible text and the entries of its tokens.
#[derive(Debug, Default)]
pub(crate) struct Delta {
    /// Newly visible text (may be empty).
    pub text: String,
    /// Log-probability entries of the tokens behind it (empty unless asked for).
    pub logprobs: Vec<LogprobEntry>,
}

/// The client-side state of one sequence.
pub(crate) struct ChoiceState {
    out: OutputText,
    decoder: IncrementalDecoder,
    stop: Arc<AtomicBool>,
    /// The prompt's text, still to be put in front of the output (`echo`).
    echo: Option<String>,
    /// The prompt's first token, which its logprobs name only by position.
    first_prompt_token: u32,
    /// Build log-probability entries for the client.
    want_logprobs: bool,
    /// Characters of token text so far: the next entry's `text_offset`.
    offset: usize,
    /// Sum of the logprobs of the tokens shown (ranks `best_of`).
    pub cumulative_logprob: f64,
    /// Set once the sequence ended.
    pub finish: Option<FinishReason>,
    /// The engine's final accounting.
    pub info: Option<FinishInfo>,
    /// Generated tokens the client is charged for.
    pub completion_tokens: usize,
    /// Whether this choice's first chunk went out (streaming).
    pub first_sent: bool,
}

impl ChoiceState {
    /// A choice of a request with `params`, raising `stop` when a stop string matches; `echo`
    /// is the prompt text to show first, `first_prompt_token` the prompt's first token.
    pub fn new(
        params: &SamplingParams,
        stop: Arc<AtomicBool>,
        echo: Option<String>,
        first_prompt_token: u32,
        want_logprobs: bool,
    ) -> Self {
        Self {
            out: OutputText::new(params.stop.clone(), params.min_tokens),
            decoder: IncrementalDecoder::new(),
            stop,
            echo,
            first_prompt_token,
            want_logprobs,
            offset: 0,
            cumulative_logprob: 0.0,
            finish: None,
            info: None,
            completion_tokens: 0,
            first_sent: false,
        }
    }

    /// Adds the tokens of one engine event.
    pub fn on_tokens(&mut self, tokenizer: &EngineTokenizer, chunk: TokenChunk) -> Delta {
        let mut delta = self.take_echo();
        if let Some(prompt) = chunk.prompt_logprobs.filter(|_| self.want_logprobs) {
            // Echoed prompt tokens come first; the first has no context, so no logprob.
            for e in &prompt {
                let entry = match e {
                    Some(lp) => self.entry(tokenizer, lp),
                    None => self.bare_entry(tokenizer, self.first_prompt_token),
                };
                delta.logprobs.push(entry);
            }
        }
        let mut logprobs = chunk.logprobs.into_iter();
        for t in chunk.ids {
            if self.out.stopped() {
                // Tokens the engine made before it saw the stop flag: not shown.
                break;
            }
            let lp = logprobs.next();
            if let Some(lp) = &lp {
                self.cumulative_logprob += f64::from(lp.logprob);
            }
            let piece = self.decoder.push(tokenizer, t);
            delta.text += &self.out.push(&piece);
            if let Some(lp) = lp.filter(|_| self.want_logprobs) {
                let entry = self.entry(tokenizer, &lp);
                delta.logprobs.push(entry);
            }
            if self.out.stopped() {
                // The engine ends the sequence at its next step and reports its accounting;
                // the answer completes on that report.
                self.stop.store(true, Ordering::Release);
            }
        }
        delta
    }

    /// Ends the choice; returns the text still held back.
    pub fn on_finished(&mut self, tokenizer: &EngineTokenizer, info: FinishInfo) -> Delta {
        let mut delta = self.take_echo();
        self.completion_tokens = if self.out.stopped() {
            self.out.tokens()
        } else {
            info.completion_tokens
        };
        self.finish = Some(match info.reason {
            _ if self.out.stopped() => FinishReason::Stop,
            sequence::FinishReason::Stop => FinishReason::Stop,
            sequence::FinishReason::Length => FinishReason::Length,
        });
        self.info = Some(info);
        if !self.out.stopped() {
            // Text of tokens a decoding window still held (a character left incomplete is
            // dropped there, never shown as U+FFFD).
            let tail = self.decoder.finish(tokenizer);
            if !tail.is_empty() {
                delta.text += &self.out.push_text(&tail);
            }
        }
        delta.text += &self.out.finish();
        delta
    }

    /// The echoed prompt, the first time anything is shown.
    fn take_echo(&mut self) -> Delta {
        Delta {
            text: self.echo.take().unwrap_or_default(),
            logprobs: Vec::new(),
        }
    }

    /// The wire entry of `lp`, at the current offset.
    fn entry(&mut self, tokenizer: &EngineTokenizer, lp: &TokenLogprob) -> LogprobEntry {
        let mut e = self.bare_entry(tokenizer, lp.token);
        e.logprob = Some(lp.logprob);
        e.top = lp
            .top
            .iter()
            .map(|&(id, logprob)| {
                let (token, bytes) = piece(tokenizer, id);
                TopEntry {
                    token,
                    bytes,
                    logprob,
                }
            })
            .collect();
        e
    }

    /// An entry of `token` without a logprob (the first prompt token), advancing the offset.
    fn bare_entry(&mut self, tokenizer: &EngineTokenizer, token: u32) -> LogprobEntry {
        let (text, bytes) = piece(tokenizer, token);
        let text_offset = self.offset;
        self.offset += text.chars().count();
        LogprobEntry {
            token: text,
            bytes,
            logprob: None,
            top: Vec::new(),
            text_offset,
        }
    }
}

/// A token's text and exact bytes: byte-exact tokenizers give the bytes (text is their lossy
/// reading, as a lone piece of a UTF-8 character has no text); others decode the token alone.
pub(crate) fn piece(tokenizer: &EngineTokenizer, token: u32) -> (String, Vec<u8>) {
    match tokenizer.token_bytes(token) {
        Some(bytes) => (String::from_utf8_lossy(&bytes).into_owned(), bytes),
        None => {
            let text = tokenizer.decode(&[token]);
            let bytes = text.clone().into_bytes();
            (text, bytes)
        }
    }
}
