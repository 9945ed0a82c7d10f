//! A chat request's `messages`, read in the same pass over the body as its other fields.
//!
//! The usual shapes (objects whose `role` is a string and whose `content` is a string or an
//! array of part objects) are read here, borrowing text from the body where it has no escapes:
//! the prompt's text, and the media parts (images, audio, files) that the usage check allows
//! tokens for. Anything else (an item that is not an object, a key given twice, a `content` or a
//! part's `text` that is neither a string nor `null`) fails the whole typed read, and the
//! validate phase reads the body again with `messages` kept raw, the general way. A 6 KB chat
//! body used to be scanned twice for its messages (skimmed as a raw value, then read); now once.

use std::borrow::Cow;

use infergate_engine::openai::fields::Text;
use serde::de::{Deserialize, Deserializer, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::routing::features::Turn;

/// Part types that are text, not media (the same list the raw reading uses).
pub const TEXT_PARTS: [&str; 4] = ["text", "input_text", "output_text", "refusal"];

/// Messages whose role and content were read as text.
pub struct TextMessages<'a>(pub Vec<TextMessage<'a>>);

impl TextMessages<'_> {
    /// Parts of the messages' contents that are not text.
    pub fn media_parts(&self) -> u32 {
        self.0.iter().fold(0u32, |n, m| n.saturating_add(m.media))
    }
}

impl<'de> Deserialize<'de> for TextMessages<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Only an array is a message list (serde would read a map into a Vec's visitor too).
        struct List;
        impl<'de> Visitor<'de> for List {
            type Value = TextMessages<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of messages")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(4).min(64));
                while let Some(m) = seq.next_element::<TextMessage<'de>>()? {
                    out.push(m);
                }
                Ok(TextMessages(out))
            }
        }
        d.deserialize_seq(List)
    }
}

/// One chat message: its role and the text of its content (a string, or its parts' texts
/// joined by newlines), with the count of its media parts.
pub struct TextMessage<'a> {
    role: Option<Cow<'a, str>>,
    content: Option<Cow<'a, str>>,
    media: u32,
}

impl<'de> Deserialize<'de> for TextMessage<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = TextMessage<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a message object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut role, mut content) = (None, None);
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    match key.0.as_ref() {
                        "role" if role.is_some() => return Err(twice()),
                        "role" => role = Some(map.next_value::<Option<Text<'de>>>()?.map(|t| t.0)),
                        "content" if content.is_some() => return Err(twice()),
                        "content" => content = Some(map.next_value::<Option<Content<'de>>>()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let content = content.flatten();
                Ok(TextMessage {
                    role: role.flatten(),
                    media: content.as_ref().map_or(0, |c| c.media),
                    content: content.map(|c| c.text),
                })
            }
        }
        d.deserialize_map(Fields)
    }
}

impl Turn for TextMessage<'_> {
    fn role(&self) -> &str {
        self.role.as_deref().unwrap_or_default()
    }

    fn text(&self) -> &str {
        self.content.as_deref().unwrap_or_default()
    }
}

/// The typed read's error for a key given twice (the raw reading keeps the last value).
fn twice<E: Error>() -> E {
    E::custom("a message key given twice")
}

/// A message's `content`: a string, or an array of parts.
struct Content<'a> {
    text: Cow<'a, str>,
    media: u32,
}

impl<'de> Deserialize<'de> for Content<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> Visitor<'de> for Either {
            type Value = Content<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or an array of parts")
            }

            fn visit_borrowed_str<E: Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Content {
                    text: Cow::Borrowed(v),
                    media: 0,
                })
            }

            fn visit_str<E: Error>(self, v: &str) -> Result<Self::Value, E> {
                self.visit_string(v.to_owned())
            }

            fn visit_string<E: Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Content {
                    text: Cow::Owned(v),
                    media: 0,
                })
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut texts: Vec<Cow<'de, str>> = Vec::new();
                let mut media = 0u32;
                while let Some(part) = seq.next_element::<Part<'de>>()? {
                    if part
                        .kind
                        .as_deref()
                        .is_some_and(|k| !TEXT_PARTS.contains(&k))
                    {
                        media = media.saturating_add(1);
                    }
                    texts.extend(part.text);
                }
                let text = match texts.len() {
                    0 => Cow::Borrowed(""),
                    1 => texts.swap_remove(0),
                    _ => Cow::Owned(texts.join("\n")),
                };
                Ok(Content { text, media })
            }
        }
        d.deserialize_any(Either)
    }
}

/// One part of a content array: its `type` and `text`, every other key skipped.
struct Part<'a> {
    kind: Option<Cow<'a, str>>,
    text: Option<Cow<'a, str>>,
}

impl<'de> Deserialize<'de> for Part<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = Part<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a content part object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut kind, mut text) = (None, None);
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    let slot = match key.0.as_ref() {
                        "type" => &mut kind,
                        "text" => &mut text,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    if slot.is_some() {
                        return Err(twice());
                    }
                    *slot = Some(map.next_value::<Option<Text<'de>>>()?.map(|t| t.0));
                }
                Ok(Part {
                    kind: kind.flatten(),
                    text: text.flatten(),
                })
            }
        }
        d.deserialize_map(Fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(json: &str) -> Option<TextMessages<'_>> {
        serde_json::from_str(json).ok()
    }

    fn turns<'m>(m: &'m TextMessages<'_>) -> Vec<(&'m str, &'m str)> {
        m.0.iter().map(|t| (t.role(), t.text())).collect()
    }

    #[test]
    fn strings_and_text_parts_read_in_one_pass_borrowing_the_body() {
        let body = r#"[{"role":"system","content":"be brief"},
            {"role":"user","name":"x","content":[{"type":"text","text":"a"},
             {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},
             {"type":"input_text","text":"b"}]},
            {"role":"assistant","content":null}]"#;
        let m = read(body).expect("the usual shapes");
        assert_eq!(
            turns(&m),
            [("system", "be brief"), ("user", "a\nb"), ("assistant", "")]
        );
        assert_eq!(m.media_parts(), 1);
        assert!(matches!(m.0[0].content, Some(Cow::Borrowed(_))));
        // Escapes are decoded (the text is then owned).
        let m = read(r#"[{"role":"user","content":"a\nb \u00e9"}]"#).expect("escapes");
        assert_eq!(turns(&m), [("user", "a\nb é")]);
    }

    #[test]
    fn unusual_shapes_fail_so_the_raw_reading_judges_them() {
        for body in [
            r#"[{"role":"user","content":"a","content":"b"}]"#,
            r#"[{"role":"user","role":"system","content":"a"}]"#,
            r#"["not a message"]"#,
            r#"[{"role":1,"content":"a"}]"#,
            r#"[{"role":"user","content":7}]"#,
            r#"[{"role":"user","content":[{"type":"text","text":{"nested":1}}]}]"#,
            r#"[{"role":"user","content":["a part that is not an object"]}]"#,
            r#"{"role":"user","content":"a map, not an array"}"#,
        ] {
            assert!(read(body).is_none(), "{body}");
        }
    }
}
