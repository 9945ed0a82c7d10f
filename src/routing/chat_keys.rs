//! A chat prompt written as the workers' chat template writes it, for its prefix keys.
//!
//! The gateway names a chat prompt's prefixes by hashing its canonical form (`role 0xFE content
//! 0xFF` a message; [`super::features::canonical_chat`]). A worker that reports its cache as
//! token ids (vLLM's KV events) caches the *templated* text instead, so the keys the gateway
//! rebuilds from those token ids never match the canonical form's. A pool whose `kv_events`
//! names its template (`chat_template: chatml`) hashes chat prompts in that template's text, with
//! the template's markers left out where the pool's tokenizer has them as special tokens (they
//! decode to nothing, so the rebuilt keys lack them too).

use crate::workers::vllm_events::vocab::Vocab;

/// ChatML's message markers.
const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";

/// How a pool's chat prompts are written before hashing: ChatML with these markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMarkup {
    /// Opens each message (`<|im_start|>`, or nothing where it is a special token).
    open: &'static str,
    /// Closes each message's content (`<|im_end|>`, or nothing).
    close: &'static str,
}

impl ChatMarkup {
    /// ChatML (Qwen, and our engine's default template) as `vocab` decodes it.
    pub fn chatml(vocab: &Vocab) -> Self {
        let keep = |marker: &'static str| if vocab.is_special(marker) { "" } else { marker };
        Self {
            open: keep(IM_START),
            close: keep(IM_END),
        }
    }

    /// The templated text of the canonical chat bytes `canonical`, with the generation prompt
    /// (`<|im_start|>assistant\n`) the worker appends.
    pub fn render(&self, canonical: &[u8]) -> Vec<u8> {
        let extra = canonical.iter().filter(|&&b| b == 0xFF).count()
            * (self.open.len() + self.close.len() + 2);
        let mut out = Vec::with_capacity(canonical.len() + extra + 32);
        for message in canonical.split(|&b| b == 0xFF) {
            let Some(at) = message.iter().position(|&b| b == 0xFE) else {
                continue;
            };
            out.extend_from_slice(self.open.as_bytes());
            out.extend_from_slice(&message[..at]);
            out.push(b'\n');
            out.extend_from_slice(&message[at + 1..]);
            out.extend_from_slice(self.close.as_bytes());
            out.push(b'\n');
        }
        out.extend_from_slice(self.open.as_bytes());
        out.extend_from_slice(b"assistant\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::features::canonical_chat;

    #[test]
    fn chatml_as_the_engine_renders_it() {
        let vocab = Vocab::cl100k().unwrap();
        let canonical = canonical_chat(&[("system", "Be brief."), ("user", "Hi!")]);
        assert_eq!(
            String::from_utf8(ChatMarkup::chatml(&vocab).render(&canonical)).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn special_markers_are_left_out_as_their_tokens_decode() {
        let json = r#"{"model":{"type":"BPE","vocab":{"a":0}},"decoder":{"type":"ByteLevel"},
            "added_tokens":[{"id":1,"content":"<|im_start|>","special":true},
                            {"id":2,"content":"<|im_end|>","special":true}]}"#;
        let vocab = Vocab::from_tokenizer_json(json).unwrap();
        let canonical = canonical_chat(&[("user", "Hi!")]);
        assert_eq!(
            ChatMarkup::chatml(&vocab).render(&canonical),
            b"user\nHi!\nassistant\n".to_vec()
        );
    }

    #[test]
    fn a_follow_up_turn_extends_the_text_before_its_generation_prompt() {
        let vocab = Vocab::cl100k().unwrap();
        let m = ChatMarkup::chatml(&vocab);
        let first = m.render(&canonical_chat(&[("system", "s"), ("user", "q")]));
        let next = m.render(&canonical_chat(&[
            ("system", "s"),
            ("user", "q"),
            ("assistant", "a"),
        ]));
        let shared = first.len() - b"<|im_start|>assistant\n".len();
        assert_eq!(first[..shared], next[..shared]);
    }
}
