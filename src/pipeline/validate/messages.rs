//! A chat request's `messages`, read in the same pass over the body as its other fields.
//!
//! The usual shapes (objects whose `role` is a string and whose `content` is a string or an
//! array of part objects) are read here, borrowing text from the body where it has no escapes:
//! the prompt's text, and the media parts (images, audio, files) that the usage check allows
//! tokens for. Anything else (an item that is not an object, a key given twice, a `content` or a
//! part's `text` that is neither a string nor `null`) fails the whole typed read, and the
//! validate phase reads the body again with `messages` kept raw, the general way. A 6 KB chat
//! body used to be scanned twice for its messages (skimmed as a raw value, then read); now once.
//!
//! `PLAIN` is set when the body holds no control character at all (compact JSON, as clients
//! send it): no string in it can hold one either, so the texts are read as raw strings, found
//! by a vectorised search for their closing quote instead of serde's byte-by-byte check for
//! control characters (most of the validate phase's cost on a long prompt).

use std::borrow::Cow;

use infergate_engine::openai::fields::Text;
use serde::de::{Deserialize, Deserializer, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::routing::features::Turn;

/// Part types that are text, not media (the same list the raw reading uses).
pub const TEXT_PARTS: [&str; 4] = ["text", "input_text", "output_text", "refusal"];

/// Messages whose role and content were read as text (as raw strings when `PLAIN`).
pub struct TextMessages<'a, const PLAIN: bool = false>(pub Vec<TextMessage<'a>>);

impl<const PLAIN: bool> TextMessages<'_, PLAIN> {
    /// Parts of the messages' contents that are not text.
    pub fn media_parts(&self) -> u32 {
        self.0.iter().fold(0u32, |n, m| n.saturating_add(m.media))
    }
}

impl<'de, const PLAIN: bool> Deserialize<'de> for TextMessages<'de, PLAIN> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Only an array is a message list (serde would read a map into a Vec's visitor too).
        struct List<const PLAIN: bool>;
        impl<'de, const PLAIN: bool> Visitor<'de> for List<PLAIN> {
            type Value = TextMessages<'de, PLAIN>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of messages")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(4).min(64));
                while let Some(m) = seq.next_element::<Message<'de, PLAIN>>()? {
                    out.push(m.0);
                }
                Ok(TextMessages(out))
            }
        }
        d.deserialize_seq(List::<PLAIN>)
    }
}

/// One chat message: its role and the text of its content (a string, or its parts' texts
/// joined by newlines), with the count of its media parts.
pub struct TextMessage<'a> {
    role: Option<Cow<'a, str>>,
    content: Option<Cow<'a, str>>,
    media: u32,
}

/// A [`TextMessage`] as read in mode `PLAIN`.
struct Message<'a, const PLAIN: bool>(TextMessage<'a>);

impl<'de, const PLAIN: bool> Deserialize<'de> for Message<'de, PLAIN> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields<const PLAIN: bool>;
        impl<'de, const PLAIN: bool> Visitor<'de> for Fields<PLAIN> {
            type Value = Message<'de, PLAIN>;

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
                        "content" => {
                            content = Some(map.next_value::<Option<Content<'de, PLAIN>>>()?);
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let content = content.flatten();
                Ok(Message(TextMessage {
                    role: role.flatten(),
                    media: content.as_ref().map_or(0, |c| c.media),
                    content: content.map(|c| c.text),
                }))
            }
        }
        d.deserialize_map(Fields::<PLAIN>)
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
struct Content<'a, const PLAIN: bool> {
    text: Cow<'a, str>,
    media: u32,
}

impl<'de, const PLAIN: bool> Deserialize<'de> for Content<'de, PLAIN> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Either<const PLAIN: bool>;
        impl<'de, const PLAIN: bool> Visitor<'de> for Either<PLAIN> {
            type Value = Content<'de, PLAIN>;

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

            fn visit_borrowed_bytes<E: Error>(self, v: &'de [u8]) -> Result<Self::Value, E> {
                Ok(Content {
                    text: Cow::Borrowed(raw_text(v)?),
                    media: 0,
                })
            }

            fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Self::Value, E> {
                self.visit_string(raw_text(v)?.to_owned())
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
                while let Some(part) = seq.next_element::<Part<'de, PLAIN>>()? {
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
        if PLAIN {
            // A string comes as its raw bytes (escapes decoded), an array as parts.
            d.deserialize_bytes(Either::<PLAIN>)
        } else {
            d.deserialize_any(Either::<PLAIN>)
        }
    }
}

/// `v` as text, checked by SIMD; the standard check runs only to word the error.
pub fn utf8(v: &[u8]) -> Result<&str, std::str::Utf8Error> {
    simdutf8::basic::from_utf8(v).or_else(|_| std::str::from_utf8(v))
}

/// Raw string bytes as text: an error for escapes that decode to no character (a lone
/// surrogate). Borrowed bytes are valid already (the body was checked whole), but only a check
/// makes them a `str` without unsafe code.
fn raw_text<E: Error>(v: &[u8]) -> Result<&str, E> {
    utf8(v).map_err(E::custom)
}

/// A string's text, as raw bytes when `PLAIN`.
struct PartText<'a, const PLAIN: bool>(Cow<'a, str>);

impl<'de, const PLAIN: bool> Deserialize<'de> for PartText<'de, PLAIN> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if !PLAIN {
            return Text::deserialize(d).map(|t| PartText(t.0));
        }
        struct Raw;
        impl<'de> Visitor<'de> for Raw {
            type Value = Cow<'de, str>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_bytes<E: Error>(self, v: &'de [u8]) -> Result<Self::Value, E> {
                raw_text(v).map(Cow::Borrowed)
            }

            fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Self::Value, E> {
                raw_text(v).map(|t| Cow::Owned(t.to_owned()))
            }

            fn visit_borrowed_str<E: Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Cow::Borrowed(v))
            }

            fn visit_str<E: Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Cow::Owned(v.to_owned()))
            }
        }
        d.deserialize_bytes(Raw).map(PartText)
    }
}

/// One part of a content array: its `type` and `text`, every other key skipped.
struct Part<'a, const PLAIN: bool> {
    kind: Option<Cow<'a, str>>,
    text: Option<Cow<'a, str>>,
}

impl<'de, const PLAIN: bool> Deserialize<'de> for Part<'de, PLAIN> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields<const PLAIN: bool>;
        impl<'de, const PLAIN: bool> Visitor<'de> for Fields<PLAIN> {
            type Value = Part<'de, PLAIN>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a content part object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut kind, mut text) = (None, None);
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    match key.0.as_ref() {
                        "type" if kind.is_some() => return Err(twice()),
                        "type" => kind = Some(map.next_value::<Option<Text<'de>>>()?.map(|t| t.0)),
                        "text" if text.is_some() => return Err(twice()),
                        "text" => {
                            text = Some(
                                map.next_value::<Option<PartText<'de, PLAIN>>>()?
                                    .map(|t| t.0),
                            );
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Part {
                    kind: kind.flatten(),
                    text: text.flatten(),
                })
            }
        }
        d.deserialize_map(Fields::<PLAIN>)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed read of `json`, which must come out the same in both modes.
    fn read(json: &str) -> Option<TextMessages<'_>> {
        let strict: Option<TextMessages<'_>> = serde_json::from_str(json).ok();
        let plain: Option<TextMessages<'_, true>> = serde_json::from_str(json).ok();
        assert_eq!(
            strict.as_ref().map(|m| (turns(m), m.media_parts())),
            plain.as_ref().map(|m| (turns(m), m.media_parts())),
            "{json}"
        );
        strict
    }

    fn turns<'m, const P: bool>(m: &'m TextMessages<'_, P>) -> Vec<(&'m str, &'m str)> {
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
        let plain: TextMessages<'_, true> = serde_json::from_str(body).expect("plain");
        assert!(matches!(plain.0[0].content, Some(Cow::Borrowed(_))));
        // Escapes are decoded (the text is then owned).
        let m = read(r#"[{"role":"user","content":"a\nb \u00e9"}]"#).expect("escapes");
        assert_eq!(turns(&m), [("user", "a\nb é")]);
        // A lone surrogate decodes to no character: both modes refuse it.
        assert!(read(r#"[{"role":"user","content":"a\ud800b"}]"#).is_none());
        assert!(read(r#"[{"role":"user","content":[{"type":"text","text":"\udc00"}]}]"#).is_none());
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
