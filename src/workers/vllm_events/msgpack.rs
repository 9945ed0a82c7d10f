//! A bounded MessagePack reader for vLLM's KV-event payloads: the handful of types msgspec
//! writes for them (nil, bool, ints, floats, str, bin, array, map) into a borrowed tree.
//!
//! In-tree rather than a crate because the bounds are the point: every declared length is
//! checked against the bytes left before anything is allocated, nesting is capped, and the
//! number of values in one payload is capped, so a rogue publisher's payload costs at most a
//! small multiple of its (already capped) size. Extension types are refused: msgspec writes
//! none for these events.

/// One decoded value; strings and byte strings borrow the payload.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    /// `nil` (Python `None`).
    Nil,
    /// `true` / `false`.
    Bool(bool),
    /// A non-negative integer.
    Uint(u64),
    /// A negative integer.
    Int(i64),
    /// A float (32-bit ones widened).
    Float(f64),
    /// A UTF-8 string.
    Str(&'a str),
    /// A byte string (`bin`), or a `str` that is not UTF-8.
    Bin(&'a [u8]),
    /// An array.
    Array(Vec<Value<'a>>),
    /// A map, in wire order.
    Map(Vec<(Value<'a>, Value<'a>)>),
}

impl<'a> Value<'a> {
    /// The value of `key` when this is a map with a string key `key`.
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        match self {
            Value::Map(entries) => entries
                .iter()
                .find(|(k, _)| matches!(k, Value::Str(s) if *s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Why a payload was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// It ends inside a value, or a length exceeds what is left.
    Truncated,
    /// Arrays and maps nest deeper than allowed.
    TooDeep,
    /// More values than allowed in one payload.
    TooMany,
    /// A type byte this reader does not accept (extension types, 0xc1).
    Unsupported(u8),
    /// Bytes left after the top-level value.
    Trailing,
}

/// Deepest nesting accepted (a batch is 4 deep: batch, events, event, hashes).
pub const MAX_DEPTH: usize = 8;

/// Decodes one whole payload holding at most `max_values` values.
pub fn decode(bytes: &[u8], max_values: usize) -> Result<Value<'_>, DecodeError> {
    let mut r = Reader {
        buf: bytes,
        pos: 0,
        left: max_values,
    };
    let v = r.value(0)?;
    if r.pos != bytes.len() {
        return Err(DecodeError::Trailing);
    }
    Ok(v)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Values still allowed.
    left: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn uint(&mut self, n: usize) -> Result<u64, DecodeError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn int(&mut self, n: usize) -> Result<i64, DecodeError> {
        let raw = self.uint(n)?;
        // Sign-extend from n bytes.
        let shift = 64 - 8 * n as u32;
        Ok(((raw << shift) as i64) >> shift)
    }

    /// A declared element count, refused when even one byte per element would not fit.
    fn count(&mut self, n: u64, per_item: usize) -> Result<usize, DecodeError> {
        let n = usize::try_from(n).map_err(|_| DecodeError::Truncated)?;
        let needed = n.checked_mul(per_item).ok_or(DecodeError::Truncated)?;
        if needed > self.buf.len() - self.pos {
            return Err(DecodeError::Truncated);
        }
        if n > self.left {
            return Err(DecodeError::TooMany);
        }
        Ok(n)
    }

    fn value(&mut self, depth: usize) -> Result<Value<'a>, DecodeError> {
        if self.left == 0 {
            return Err(DecodeError::TooMany);
        }
        self.left -= 1;
        let b = self.take(1)?[0];
        Ok(match b {
            0x00..=0x7f => Value::Uint(u64::from(b)),
            0x80..=0x8f => self.map(u64::from(b & 0x0f), depth)?,
            0x90..=0x9f => self.array(u64::from(b & 0x0f), depth)?,
            0xa0..=0xbf => self.str(usize::from(b & 0x1f))?,
            0xc0 => Value::Nil,
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4..=0xc6 => {
                let n = self.uint(1 << (b - 0xc4))?;
                let n = usize::try_from(n).map_err(|_| DecodeError::Truncated)?;
                Value::Bin(self.take(n)?)
            }
            0xca => Value::Float(f64::from(f32::from_bits(self.uint(4)? as u32))),
            0xcb => Value::Float(f64::from_bits(self.uint(8)?)),
            0xcc..=0xcf => Value::Uint(self.uint(1 << (b - 0xcc))?),
            0xd0..=0xd3 => {
                let v = self.int(1 << (b - 0xd0))?;
                if v >= 0 {
                    Value::Uint(v as u64)
                } else {
                    Value::Int(v)
                }
            }
            0xd9..=0xdb => {
                let n = self.uint(1 << (b - 0xd9))?;
                let n = usize::try_from(n).map_err(|_| DecodeError::Truncated)?;
                self.str(n)?
            }
            0xdc | 0xdd => {
                let n = self.uint(if b == 0xdc { 2 } else { 4 })?;
                self.array(n, depth)?
            }
            0xde | 0xdf => {
                let n = self.uint(if b == 0xde { 2 } else { 4 })?;
                self.map(n, depth)?
            }
            0xe0..=0xff => Value::Int(i64::from(b as i8)),
            other => return Err(DecodeError::Unsupported(other)),
        })
    }

    fn str(&mut self, n: usize) -> Result<Value<'a>, DecodeError> {
        let bytes = self.take(n)?;
        Ok(match std::str::from_utf8(bytes) {
            Ok(s) => Value::Str(s),
            Err(_) => Value::Bin(bytes),
        })
    }

    fn array(&mut self, n: u64, depth: usize) -> Result<Value<'a>, DecodeError> {
        if depth >= MAX_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        let n = self.count(n, 1)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.value(depth + 1)?);
        }
        Ok(Value::Array(out))
    }

    fn map(&mut self, n: u64, depth: usize) -> Result<Value<'a>, DecodeError> {
        if depth >= MAX_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        let n = self.count(n, 2)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let k = self.value(depth + 1)?;
            let v = self.value(depth + 1)?;
            out.push((k, v));
        }
        Ok(Value::Map(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_of_every_width() {
        let cases: &[(&[u8], Value<'_>)] = &[
            (&[0x05], Value::Uint(5)),
            (&[0xff], Value::Int(-1)),
            (&[0xc0], Value::Nil),
            (&[0xc3], Value::Bool(true)),
            (&[0xcc, 0xfa], Value::Uint(250)),
            (&[0xcd, 0x01, 0x00], Value::Uint(256)),
            (
                &[0xcf, 0xda, 0xb7, 0, 0, 0, 0, 0, 0x01],
                Value::Uint(0xdab7_0000_0000_0001),
            ),
            (&[0xd0, 0x80], Value::Int(-128)),
            (&[0xd1, 0xff, 0x00], Value::Int(-256)),
            (&[0xd3, 0, 0, 0, 0, 0, 0, 0, 7], Value::Uint(7)),
            (&[0xa2, b'h', b'i'], Value::Str("hi")),
            (&[0xd9, 1, b'x'], Value::Str("x")),
            (&[0xc4, 2, 0xfe, 0xff], Value::Bin(&[0xfe, 0xff])),
            (&[0xa1, 0xff], Value::Bin(&[0xff])),
            (&[0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0], Value::Float(1.0)),
            (&[0xca, 0x3f, 0x80, 0, 0], Value::Float(1.0)),
        ];
        for (bytes, want) in cases {
            assert_eq!(decode(bytes, 16).as_ref(), Ok(want), "{bytes:02x?}");
        }
    }

    #[test]
    fn containers_and_lookup() {
        // {"type": "X", "a": [1, nil]}
        let bytes = [
            0x82, 0xa4, b't', b'y', b'p', b'e', 0xa1, b'X', 0xa1, b'a', 0x92, 0x01, 0xc0,
        ];
        let v = decode(&bytes, 16).unwrap();
        assert_eq!(v.get("type"), Some(&Value::Str("X")));
        assert_eq!(
            v.get("a"),
            Some(&Value::Array(vec![Value::Uint(1), Value::Nil]))
        );
        assert_eq!(v.get("b"), None);
    }

    #[test]
    fn garbage_is_refused_without_allocating_its_claims() {
        // An array32 claiming 4 billion elements in 5 bytes.
        assert_eq!(
            decode(&[0xdd, 0xff, 0xff, 0xff, 0xff], 1 << 20),
            Err(DecodeError::Truncated)
        );
        // A map claiming more pairs than bytes.
        assert_eq!(decode(&[0x83, 0x01, 0x01], 16), Err(DecodeError::Truncated));
        // bin32 past the end.
        assert_eq!(
            decode(&[0xc6, 0, 0, 1, 0, 1], 16),
            Err(DecodeError::Truncated)
        );
        assert_eq!(decode(&[], 16), Err(DecodeError::Truncated));
        assert_eq!(decode(&[0xc1], 16), Err(DecodeError::Unsupported(0xc1)));
        assert_eq!(
            decode(&[0xd4, 1, 2], 16),
            Err(DecodeError::Unsupported(0xd4))
        );
        assert_eq!(decode(&[0x01, 0x02], 16), Err(DecodeError::Trailing));
        // Nesting past the cap.
        let deep = vec![0x91u8; MAX_DEPTH + 1];
        let mut deep = deep;
        deep.push(0xc0);
        assert_eq!(decode(&deep, 64), Err(DecodeError::TooDeep));
        // More values than allowed.
        assert_eq!(
            decode(&[0x93, 1, 2, 3], 3),
            Err(DecodeError::TooMany),
            "4 values, 3 allowed"
        );
        assert!(decode(&[0x93, 1, 2, 3], 4).is_ok());
    }

    #[test]
    fn every_prefix_of_a_valid_payload_is_refused_not_panicking() {
        let bytes = [
            0x93, 0xcb, 0x41, 0xd0, 0, 0, 0, 0, 0, 0, 0x91, 0x92, 0xa3, b'a', b'b', b'c', 0xc4, 1,
            9, 0x00,
        ];
        assert!(decode(&bytes, 64).is_ok());
        for end in 0..bytes.len() {
            assert!(decode(&bytes[..end], 64).is_err(), "prefix of {end} bytes");
        }
    }
}
