//! Finds chosen top-level members of a JSON object without building it: the usage reader wants
//! one member (`usage`) of an answer whose bulk is completion text, and a full serde walk of
//! every key and value cost more than the rest of reading the answer.
//!
//! The check is structural: strings must close, brackets must nest and match, and the top level
//! must be one object of `"key": value` members with nothing after it. Values that are not
//! wanted are skipped, not parsed (`[1 2]` inside one passes); the caller checks the values it
//! reads by their own rules.

/// Deepest nesting of a member's value: with the top-level object around it, the deepest
/// serde_json reads (127 levels in all).
const MAX_DEPTH: u32 = 126;
/// Bytes of a string searched for its end byte by byte before memchr takes over.
const SHORT: usize = 32;

/// The raw values of the members named `keys` in the JSON object `text`, in `keys` order.
/// `None` when `text` is not a well-formed object, or names one of `keys` twice (which of the
/// two a reader takes is up to the reader, so neither is trusted).
pub fn find<'a, const N: usize>(text: &'a [u8], keys: [&str; N]) -> Option<[Option<&'a [u8]>; N]> {
    let mut found = [None; N];
    let mut i = skip_ws(text, 0);
    if text.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(text, i + 1);
    if text.get(i) == Some(&b'}') {
        i += 1;
    } else {
        loop {
            let key_start = i;
            if text.get(i) != Some(&b'"') {
                return None;
            }
            let escaped;
            (i, escaped) = string_end(text, i + 1)?;
            let quoted_key = &text[key_start..i];
            i = skip_ws(text, i);
            if text.get(i) != Some(&b':') {
                return None;
            }
            let value_start = skip_ws(text, i + 1);
            i = value_end(text, value_start)?;
            let slot = if escaped {
                // A key with escapes (`"us\u0061ge"`) is what it decodes to: rare, so serde does it.
                let decoded: String = serde_json::from_slice(quoted_key).ok()?;
                keys.iter().position(|k| *k == decoded)
            } else {
                let key = &quoted_key[1..quoted_key.len() - 1];
                keys.iter().position(|k| k.as_bytes() == key)
            };
            if let Some(at) = slot
                && found[at].replace(&text[value_start..i]).is_some()
            {
                return None;
            }
            i = skip_ws(text, i);
            match text.get(i) {
                Some(b',') => i = skip_ws(text, i + 1),
                Some(b'}') => {
                    i += 1;
                    break;
                }
                _ => return None,
            }
        }
    }
    (skip_ws(text, i) == text.len()).then_some(found)
}

/// The first index at or after `i` that is not JSON whitespace.
fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = s.get(i) {
        i += 1;
    }
    i
}

/// The end (past the closing quote) of the string whose text starts at `i`, and whether it has
/// escapes.
#[inline]
fn string_end(s: &[u8], mut i: usize) -> Option<(usize, bool)> {
    let mut escaped = false;
    loop {
        i = quote_or_backslash(s, i)?;
        if s[i] == b'"' {
            return Some((i + 1, escaped));
        }
        // The escaped character, whatever it is, cannot end the string.
        escaped = true;
        i += 2;
    }
}

/// The first `"` or `\\` in `s` at or after `from`. Most strings (keys, roles, ids) are short:
/// eight bytes a step finds their end sooner than memchr's setup, which takes over for long
/// ones (the completion text).
#[inline]
fn quote_or_backslash(s: &[u8], mut from: usize) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const QUOTES: u64 = u64::from_ne_bytes([b'"'; 8]);
    const BACKSLASHES: u64 = u64::from_ne_bytes([b'\\'; 8]);
    let short_end = s.len().min(from.saturating_add(SHORT));
    while from + 8 <= short_end {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(&s[from..from + 8]);
        let w = u64::from_le_bytes(bytes);
        // A zero byte of `w ^ c` is a byte equal to `c`; the lowest one is flagged exactly.
        let (q, b) = (w ^ QUOTES, w ^ BACKSLASHES);
        let hits = (q.wrapping_sub(ONES) & !q | b.wrapping_sub(ONES) & !b) & HIGHS;
        if hits != 0 {
            return Some(from + hits.trailing_zeros() as usize / 8);
        }
        from += 8;
    }
    while from < short_end {
        if matches!(s[from], b'"' | b'\\') {
            return Some(from);
        }
        from += 1;
    }
    long_string_end(s, from)
}

/// [`quote_or_backslash`] past the first bytes of a long string: out of line, so that the
/// short strings' loop needs no registers saved.
#[cold]
#[inline(never)]
fn long_string_end(s: &[u8], from: usize) -> Option<usize> {
    Some(from + memchr::memchr2(b'"', b'\\', s.get(from..)?)?)
}

/// The end of the value that starts at `i`.
fn value_end(s: &[u8], i: usize) -> Option<usize> {
    match s.get(i)? {
        b'"' => string_end(s, i + 1).map(|(end, _)| end),
        b'{' | b'[' => nested_end(s, i),
        b',' | b'}' | b']' | b':' => None,
        _ => {
            // A number or literal: up to the next delimiter.
            let mut i = i;
            while let Some(&b) = s.get(i) {
                match b {
                    b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r' => break,
                    b'"' | b'{' | b'[' | b':' => return None,
                    _ => i += 1,
                }
            }
            Some(i)
        }
    }
}

/// The end of the object or array that opens at `i`, checking that brackets match: a stack of
/// one bit per level (1 for an object) up to [`MAX_DEPTH`].
fn nested_end(s: &[u8], mut i: usize) -> Option<usize> {
    let mut stack: u128 = 0;
    let mut depth = 0u32;
    loop {
        match *s.get(i)? {
            b'"' => {
                (i, _) = string_end(s, i + 1)?;
                continue;
            }
            b @ (b'{' | b'[') => {
                if depth == MAX_DEPTH {
                    return None;
                }
                stack = (stack << 1) | u128::from(b == b'{');
                depth += 1;
            }
            b @ (b'}' | b']') => {
                if (stack & 1 == 1) != (b == b'}') {
                    return None;
                }
                stack >>= 1;
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            // Numbers, literals, commas and colons need no look.
            _ => {}
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn get<'a>(text: &'a str, key: &str) -> Option<Option<&'a str>> {
        let [v] = find(text.as_bytes(), [key])?;
        Some(v.map(|v| std::str::from_utf8(v).unwrap()))
    }

    #[test]
    fn finds_top_level_members_only() {
        let t = r#" {"a":1, "usage" : {"p":[1,{"q":"}"}]}, "b":"\"usage\"", "c":{"usage":2}} "#;
        assert_eq!(get(t, "usage"), Some(Some(r#"{"p":[1,{"q":"}"}]}"#)));
        assert_eq!(get(t, "a"), Some(Some("1")));
        assert_eq!(get(t, "b"), Some(Some(r#""\"usage\"""#)));
        assert_eq!(get(t, "missing"), Some(None));
        assert_eq!(get("{}", "a"), Some(None));
        assert_eq!(get("{ }\n", "a"), Some(None));
        let [a, c] = find(br#"{"c":null,"a":[]}"#, ["a", "c"]).unwrap();
        assert_eq!((a, c), (Some(&b"[]"[..]), Some(&b"null"[..])));
    }

    #[test]
    fn an_escaped_key_is_what_it_decodes_to() {
        assert_eq!(get(r#"{"us\u0061ge":5}"#, "usage"), Some(Some("5")));
        assert_eq!(get(r#"{"a\"b":5}"#, "a\"b"), Some(Some("5")));
        assert_eq!(get(r#"{"x\\":5,"y":6}"#, "y"), Some(Some("6")));
    }

    #[test]
    fn malformed_or_ambiguous_objects_give_nothing() {
        for bad in [
            "",
            "[]",
            "\"usage\"",
            r#"{"usage":1"#,
            r#"{"usage":1,}"#,
            r#"{"usage" 1}"#,
            r#"{"usage":}"#,
            r#"{"usage":{"a":1}"#,
            r#"{"usage":[1}]}"#,
            r#"{"usage":{"a":1]}"#,
            r#"{"usage":"open}"#,
            r#"{"usage":1} x"#,
            r#"{"usage":1}{}"#,
            r#"{usage:1}"#,
            r#"{"a":1 "usage":2}"#,
            r#"{"usage":1,"usage":2}"#,
            r#"{"a":"\"#,
        ] {
            assert_eq!(get(bad, "usage"), None, "{bad}");
        }
    }

    #[test]
    fn nesting_past_serdes_limit_is_refused() {
        let nested = |n: usize| format!("{{\"a\":{}{}}}", "[".repeat(n), "]".repeat(n));
        assert_eq!(get(&nested(126), "b"), Some(None));
        assert!(serde_json::from_str::<Value>(&nested(126)).is_ok());
        for n in [127, 128, 129] {
            assert_eq!(get(&nested(n), "b"), None);
            assert!(serde_json::from_str::<Value>(&nested(n)).is_err());
        }
    }

    #[test]
    fn agrees_with_serde_on_every_well_formed_object() {
        let bodies = [
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"there\" \\ {"}}],"usage":{"prompt_tokens":3}}"#,
            r#"{"usage":null,"response":{"usage":{"input_tokens":1}}}"#,
            "{\n  \"usage\": {\"prompt_tokens\": 1e3},\n  \"z\": [true, false, null, -1.5]\n}",
        ];
        for body in bodies {
            let tree: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(body).unwrap();
            for key in ["usage", "response", "choices", "z", "id"] {
                let ours = get(body, key)
                    .unwrap()
                    .map(|v| serde_json::from_str::<serde_json::Value>(v).unwrap());
                assert_eq!(ours.as_ref(), tree.get(key), "{key} of {body}");
            }
        }
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "[a-z\"\\{}\\[\\]:,\\\\ \u{e9}\u{1F600}\n]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(6, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                prop::collection::btree_map("[a-z\"\\\\]{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Every member of any object serde writes (compact or pretty) is found as serde reads
        /// it back, and a truncated object is refused.
        #[test]
        fn finds_what_serde_wrote(
            members in prop::collection::btree_map("[a-z\"\\\\]{0,6}", json(), 0..6),
            pretty in any::<bool>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let object = Value::Object(members.clone().into_iter().collect());
            let text = if pretty {
                serde_json::to_string_pretty(&object).unwrap()
            } else {
                serde_json::to_string(&object).unwrap()
            };
            // Compared with serde's own reading of the text (floats may not round-trip).
            let tree: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(tree.len(), members.len());
            for (key, value) in &tree {
                let [raw] = find(text.as_bytes(), [key.as_str()]).unwrap();
                let read: Value = serde_json::from_slice(raw.unwrap()).unwrap();
                prop_assert_eq!(&read, value);
            }
            let [absent] = find(text.as_bytes(), ["\u{0}absent"]).unwrap();
            prop_assert!(absent.is_none());
            let short = &text.as_bytes()[..cut.index(text.len())];
            prop_assert!(find(short, ["x"]).is_none());
        }
    }
}
