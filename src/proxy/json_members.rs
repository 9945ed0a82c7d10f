//! The members of a JSON object, read in one pass over its bytes without building it. Every
//! proxied answer is searched for its `usage` this way. On the bench's answer this costs about
//! 5,200 instructions against 5,850 for serde's typed read, which decodes and checks every key
//! and string on the way (BENCHMARKS.md).
//!
//! The walk checks what the callers rely on: the document is one object and nothing follows
//! it, strings end and their escapes are JSON's, brackets match, members are separated by `,`
//! and `:` where JSON puts them. It does not check the spelling of numbers and literals (nor
//! commas) inside the values it skips; the values a caller reads are checked by that caller.

/// Deepest nesting the walk follows inside one member's value; deeper is left to a full reader
/// (serde_json skips an unread value at any depth).
pub const MAX_DEPTH: u32 = 128;

/// Why an object was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unread {
    /// Not one well-formed object.
    Malformed,
    /// A key holds an escape: its text needs decoding, which this walk does not do.
    EscapedKey,
    /// A value nests deeper than [`MAX_DEPTH`].
    TooDeep,
}

/// Calls `each(key, value)` for every member of the object in `doc`, in order, with the key's
/// bytes (no quotes) and the value's raw bytes, then says whether the whole document was one
/// well-formed object (a caller keeps nothing it was given when it was not).
pub fn each_member<'a>(
    doc: &'a [u8],
    mut each: impl FnMut(&'a [u8], &'a [u8]),
) -> Result<(), Unread> {
    let mut c = Cursor { b: doc, i: 0 };
    c.skip_ws();
    c.expect(b'{')?;
    c.skip_ws();
    if c.peek() == Some(b'}') {
        c.i += 1;
        return c.end();
    }
    loop {
        if c.peek() != Some(b'"') {
            return Err(Unread::Malformed);
        }
        let start = c.i + 1;
        if c.string()? {
            return Err(Unread::EscapedKey);
        }
        let key = &doc[start..c.i - 1];
        c.skip_ws();
        c.expect(b':')?;
        c.skip_ws();
        let start = c.i;
        c.value()?;
        each(key, &doc[start..c.i]);
        c.skip_ws();
        match c.peek() {
            Some(b',') => {
                c.i += 1;
                c.skip_ws();
            }
            Some(b'}') => {
                c.i += 1;
                return c.end();
            }
            _ => return Err(Unread::Malformed),
        }
    }
}

/// Whether `value` (raw, as [`each_member`] gives it) is an array with no elements.
pub fn is_empty_array(value: &[u8]) -> bool {
    value.len() >= 2
        && value.first() == Some(&b'[')
        && value.last() == Some(&b']')
        && value[1..value.len() - 1]
            .iter()
            .all(|b| matches!(b, b' ' | b'\n' | b'\r' | b'\t'))
}

/// Byte classes for the skips: `1` where a string ends or needs a look (`"`, `\`, a raw
/// control character), `2` where nesting changes or a string starts (`"{}[]`). A table lookup
/// per byte keeps the walk at a few instructions a byte.
const CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = 1;
        b += 1;
    }
    t[b'\\' as usize] = 1;
    t[b'"' as usize] = 3;
    t[b'{' as usize] = 2;
    t[b'}' as usize] = 2;
    t[b'[' as usize] = 2;
    t[b']' as usize] = 2;
    t
};

/// A position in the document.
struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.i += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), Unread> {
        if self.peek() != Some(byte) {
            return Err(Unread::Malformed);
        }
        self.i += 1;
        Ok(())
    }

    /// Only whitespace is left.
    fn end(&mut self) -> Result<(), Unread> {
        self.skip_ws();
        match self.i == self.b.len() {
            true => Ok(()),
            false => Err(Unread::Malformed),
        }
    }

    /// The index of the next byte at or after `from` whose class has a bit of `mask`.
    fn next_of(&self, from: usize, mask: u8) -> Result<usize, Unread> {
        let rest = self.b.get(from..).unwrap_or_default();
        rest.iter()
            .position(|&b| CLASS[usize::from(b)] & mask != 0)
            .map(|at| from + at)
            .ok_or(Unread::Malformed)
    }

    /// Steps over the string that starts here; true when it holds an escape.
    fn string(&mut self) -> Result<bool, Unread> {
        let mut i = self.i + 1;
        let mut escaped = false;
        loop {
            i = self.next_of(i, 1)?;
            match self.b[i] {
                b'"' => {
                    self.i = i + 1;
                    return Ok(escaped);
                }
                b'\\' => {
                    escaped = true;
                    i += escape_len(self.b.get(i + 1..).unwrap_or_default())?;
                }
                // A raw control character is not allowed in a JSON string.
                _ => return Err(Unread::Malformed),
            }
        }
    }

    /// Steps over the value that starts here.
    fn value(&mut self) -> Result<(), Unread> {
        match self.peek() {
            Some(b'"') => self.string().map(|_| ()),
            Some(b'{' | b'[') => self.nested(),
            _ => {
                let start = self.i;
                while let Some(b) = self.peek() {
                    if matches!(b, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t') {
                        break;
                    }
                    if matches!(b, b'"' | b'{' | b'[' | b':') {
                        return Err(Unread::Malformed);
                    }
                    self.i += 1;
                }
                match self.i > start {
                    true => Ok(()),
                    false => Err(Unread::Malformed),
                }
            }
        }
    }

    /// Steps over the object or array that starts here; a bit per level says which it is.
    fn nested(&mut self) -> Result<(), Unread> {
        let mut objects: u128 = 0;
        let mut depth = 0u32;
        let mut i = self.i;
        loop {
            i = self.next_of(i, 2)?;
            match self.b[i] {
                b'"' => {
                    self.i = i;
                    self.string()?;
                    i = self.i;
                }
                open @ (b'{' | b'[') => {
                    if depth == MAX_DEPTH {
                        return Err(Unread::TooDeep);
                    }
                    objects = (objects << 1) | u128::from(open == b'{');
                    depth += 1;
                    i += 1;
                }
                close => {
                    if (objects & 1 == 1) != (close == b'}') {
                        return Err(Unread::Malformed);
                    }
                    objects >>= 1;
                    depth -= 1;
                    i += 1;
                    if depth == 0 {
                        self.i = i;
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// The length of the escape that starts with the backslash before `rest`: `\"`, `\\`, `\/`,
/// `\b`, `\f`, `\n`, `\r`, `\t`, or `\u` and four hex digits.
fn escape_len(rest: &[u8]) -> Result<usize, Unread> {
    match rest.first() {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(2),
        Some(b'u')
            if rest
                .get(1..5)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) =>
        {
            Ok(6)
        }
        _ => Err(Unread::Malformed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(doc: &str) -> Result<Vec<(String, String)>, Unread> {
        let mut out = Vec::new();
        each_member(doc.as_bytes(), |k, v| {
            out.push((
                String::from_utf8_lossy(k).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            ));
        })?;
        Ok(out)
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn members_come_with_their_raw_values_in_order() {
        let doc = " {\"a\" : 1,\"b\":\"x\\\"}\",\n\"c\":{\"d\":[1,{\"e\":\"]\"}]},\"f\":[],\"g\":null} \n";
        assert_eq!(
            members(doc),
            Ok(pairs(&[
                ("a", "1"),
                ("b", "\"x\\\"}\""),
                ("c", "{\"d\":[1,{\"e\":\"]\"}]}"),
                ("f", "[]"),
                ("g", "null"),
            ]))
        );
        assert_eq!(members("{}"), Ok(vec![]));
        assert_eq!(members(" { } "), Ok(vec![]));
    }

    #[test]
    fn what_is_not_one_object_is_not_read() {
        for doc in [
            "",
            "[]",
            "\"a\"",
            "{",
            "{\"a\":1",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{\"a\":}",
            "{\"a\":1}{}",
            "{\"a\":1} x",
            "{\"a\":{\"b\":1}",
            "{\"a\":[1}}",
            "{\"a\":{\"b\":1]}",
            "{\"a\":\"unterminated}",
            "{\"a\":\"raw\ncontrol\"}",
            "{a:1}",
            "{\"a\":1 2}",
            "{\"a\":tr\"ue}",
            "{\"a\":\"\\q\"}",
            "{\"a\":\"\\u00g0\"}",
            "{\"a\":\"\\u00\"}",
            "{\"a\":\"\\",
        ] {
            assert_eq!(members(doc), Err(Unread::Malformed), "{doc:?}");
        }
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(129), "]".repeat(129));
        assert_eq!(members(&deep), Err(Unread::TooDeep));
        let ok = format!("{{\"a\":{}{}}}", "[".repeat(128), "]".repeat(128));
        assert!(members(&ok).is_ok());
    }

    #[test]
    fn an_escaped_key_is_left_to_a_full_reader() {
        assert_eq!(members("{\"us\\u0061ge\":1}"), Err(Unread::EscapedKey));
        assert_eq!(
            members("{\"a\":\"\\u0061\"}"),
            Ok(pairs(&[("a", "\"\\u0061\"")]))
        );
    }

    #[test]
    fn empty_arrays_are_told_apart() {
        assert!(is_empty_array(b"[]"));
        assert!(is_empty_array(b"[ \n ]"));
        assert!(!is_empty_array(b"[1]"));
        assert!(!is_empty_array(b"[{}]"));
        assert!(!is_empty_array(b"null"));
        assert!(!is_empty_array(b"{}"));
        assert!(!is_empty_array(b"["));
        assert!(!is_empty_array(b"[x"));
    }
}
