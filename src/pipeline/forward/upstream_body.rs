//! The request body as it goes upstream: the client's bytes with the gateway's edits (a renamed
//! model, a default or capped `max_tokens`, the usage chunk asked for) spliced in once, after
//! every phase has had its say. Nothing is re-parsed or re-serialized: a replaced field keeps its
//! place, a new one goes first, and every other byte is forwarded as the client sent it.

use std::ops::Range;

use hyper::body::Bytes;

/// The top-level fields the gateway may change, with where their values sit in the body.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpstreamBody {
    /// The client's body (deduplicated when it repeated a key): an object.
    raw: Bytes,
    /// Where an editable field's value is in `raw`, and whether it is `null`.
    spans: Vec<(&'static str, Range<usize>, bool)>,
    /// Field → JSON text to send instead; the last edit of a field wins.
    edits: Vec<(&'static str, String)>,
}

impl UpstreamBody {
    /// `raw` (a JSON object) with no edits yet; `fields` are the editable fields it has, each
    /// with its value as a slice of `raw`.
    pub fn new<'a>(raw: Bytes, fields: impl IntoIterator<Item = (&'static str, &'a str)>) -> Self {
        let base = raw.as_ptr() as usize;
        let spans = fields
            .into_iter()
            .filter_map(|(key, value)| {
                // Only a slice of `raw` has a place in it (same memory, so the same bytes).
                let start = (value.as_ptr() as usize).checked_sub(base)?;
                let end = start + value.len();
                (end <= raw.len()).then_some((key, start..end, value == "null"))
            })
            .collect();
        Self {
            raw,
            spans,
            edits: Vec::new(),
        }
    }

    /// The client's body, unedited.
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }

    /// Sends `key` as `json` (JSON text) instead of what the client sent, or adds it.
    pub fn set(&mut self, key: &'static str, json: String) {
        match self.edits.iter_mut().find(|(k, _)| *k == key) {
            Some(edit) => edit.1 = json,
            None => self.edits.push((key, json)),
        }
    }

    /// Sends `key` as the JSON string `text`.
    pub fn set_string(&mut self, key: &'static str, text: &str) {
        self.set(key, serde_json::Value::from(text).to_string());
    }

    /// Whether the upstream body has `key` (as sent, `null` included, or as set).
    pub fn has(&self, key: &str) -> bool {
        self.edits.iter().any(|(k, _)| *k == key) || self.spans.iter().any(|(k, ..)| *k == key)
    }

    /// Whether the upstream body has `key` with a value other than `null`.
    pub fn has_value(&self, key: &str) -> bool {
        match self.edits.iter().find(|(k, _)| *k == key) {
            Some((_, json)) => json != "null",
            None => self.spans.iter().any(|(k, _, null)| *k == key && !null),
        }
    }

    /// Whether any edit is pending.
    pub fn is_edited(&self) -> bool {
        !self.edits.is_empty()
    }

    /// The bytes to send: the client's, with every edit spliced in.
    pub fn bytes(&self) -> Bytes {
        self.bytes_with(&[])
    }

    /// [`Self::bytes`] with `extra` edits on top (a shadow copy's own), without keeping them.
    pub fn bytes_with(&self, extra: &[(&'static str, String)]) -> Bytes {
        if self.edits.is_empty() && extra.is_empty() {
            return self.raw.clone();
        }
        let mut edits: Vec<(&'static str, &str)> =
            self.edits.iter().map(|(k, v)| (*k, v.as_str())).collect();
        for (key, json) in extra {
            match edits.iter_mut().find(|(k, _)| k == key) {
                Some(edit) => edit.1 = json,
                None => edits.push((key, json)),
            }
        }
        let mut replaced: Vec<(Range<usize>, &str)> = Vec::new();
        let mut added = String::new();
        for (key, json) in edits {
            match self.spans.iter().find(|(k, ..)| *k == key) {
                Some((_, span, _)) => replaced.push((span.clone(), json)),
                None => {
                    if !added.is_empty() {
                        added.push(',');
                    }
                    added.push('"');
                    added.push_str(key);
                    added.push_str("\":");
                    added.push_str(json);
                }
            }
        }
        replaced.sort_by_key(|(span, _)| span.start);
        let raw = &self.raw[..];
        let mut out = Vec::with_capacity(raw.len() + added.len() + 64);
        let mut at = 0;
        if !added.is_empty() {
            // New fields go right after the opening brace, with a comma when others follow.
            let open = raw.iter().position(|&b| b == b'{').map_or(0, |i| i + 1);
            let empty = raw[open..]
                .iter()
                .find(|b| !b.is_ascii_whitespace())
                .is_none_or(|&b| b == b'}');
            out.extend_from_slice(&raw[..open]);
            out.extend_from_slice(added.as_bytes());
            if !empty {
                out.push(b',');
            }
            at = open;
        }
        for (span, json) in replaced {
            out.extend_from_slice(&raw[at..span.start]);
            out.extend_from_slice(json.as_bytes());
            at = span.end;
        }
        out.extend_from_slice(&raw[at..]);
        Bytes::from(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// A body whose editable fields are found the way validation finds them (serde's raw values).
    fn body(text: &str) -> UpstreamBody {
        let raw = Bytes::from(text.to_string());
        use serde_json::value::RawValue;
        fn present<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Option<&'de RawValue>, D::Error> {
            <&'de RawValue as serde::Deserialize>::deserialize(d).map(Some)
        }
        #[derive(serde::Deserialize)]
        struct F<'a> {
            #[serde(borrow, default, deserialize_with = "present")]
            model: Option<&'a RawValue>,
            #[serde(borrow, default, deserialize_with = "present")]
            max_tokens: Option<&'a RawValue>,
            #[serde(borrow, default, deserialize_with = "present")]
            stream_options: Option<&'a RawValue>,
        }
        let f: F = serde_json::from_slice(&raw).unwrap();
        let mut fields = Vec::new();
        for (k, v) in [
            ("model", f.model),
            ("max_tokens", f.max_tokens),
            ("stream_options", f.stream_options),
        ] {
            if let Some(v) = v {
                fields.push((k, v.get()));
            }
        }
        UpstreamBody::new(raw.clone(), fields)
    }

    fn json(b: &Bytes) -> Value {
        serde_json::from_slice(b).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(b)))
    }

    #[test]
    fn no_edit_sends_the_clients_bytes() {
        let text = r#" { "model" : "m",  "x": [1, 2] } "#;
        let b = body(text);
        assert!(!b.is_edited());
        assert_eq!(&b.bytes()[..], text.as_bytes());
    }

    #[test]
    fn a_replaced_field_keeps_its_place_and_the_rest_its_bytes() {
        let text = "{\"model\" :\n \"m\", \"max_tokens\": null, \"keep\": \"\\u00e9 {\\\"}\"}";
        let mut b = body(text);
        assert!(b.has("max_tokens") && !b.has_value("max_tokens"));
        b.set("model", "\"upstream-m\"".into());
        b.set("max_tokens", "64".into());
        b.set("max_tokens", "32".into());
        let sent = b.bytes();
        assert_eq!(
            std::str::from_utf8(&sent).unwrap(),
            "{\"model\" :\n \"upstream-m\", \"max_tokens\": 32, \"keep\": \"\\u00e9 {\\\"}\"}"
        );
        assert!(b.has_value("max_tokens"));
    }

    #[test]
    fn a_new_field_goes_first_in_empty_and_full_objects() {
        let mut b = body(r#"{"model":"m"}"#);
        b.set("stream_options", r#"{"include_usage":true}"#.into());
        let v = json(&b.bytes());
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["model"], "m");
        let mut e = body(" { } ");
        e.set("max_tokens", "5".into());
        e.set("model", "\"x\"".into());
        assert_eq!(
            json(&e.bytes()),
            serde_json::json!({"max_tokens": 5, "model": "x"})
        );
    }

    #[test]
    fn extra_edits_override_without_sticking() {
        let mut b = body(r#"{"model":"m","stream_options":{"include_usage":false}}"#);
        b.set("model", "\"a\"".into());
        let shadow = b.bytes_with(&[("model", "\"s\"".into()), ("stream_options", "null".into())]);
        assert_eq!(
            json(&shadow),
            serde_json::json!({"model": "s", "stream_options": null})
        );
        assert_eq!(json(&b.bytes())["model"], "a");
    }

    #[test]
    fn a_value_not_in_the_body_has_no_span() {
        let b = UpstreamBody::new(
            Bytes::from_static(b"{\"model\":\"m\"}"),
            [("model", "\"m\"")],
        );
        assert!(!b.has("model"));
    }
}
