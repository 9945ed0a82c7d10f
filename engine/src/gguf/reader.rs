//! Bounds-checked little-endian cursor over a GGUF byte buffer.

use super::GgufError;

/// A read position in a byte slice; every read checks the remaining length first.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Starts reading at offset 0.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    /// The current offset from the start of the buffer.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left after the current offset.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// Takes `n` bytes, or fails naming the offset and `what` was expected.
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError(format!(
                "at offset {}: expected {what} ({n} bytes), but only {} bytes remain",
                self.pos,
                self.remaining()
            )));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// Takes exactly `N` bytes as an array.
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    /// Reads a `u8`.
    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    /// Reads a little-endian `u16`.
    pub(crate) fn u16(&mut self, what: &str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    /// Reads a little-endian `u32`.
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// Reads a little-endian `u64`.
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Reads a `u64` count and checks that `count * min_size` bytes could still follow.
    pub(crate) fn count(&mut self, min_size: usize, what: &str) -> Result<usize, GgufError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let fits = usize::try_from(n).ok().filter(|&n| {
            n.checked_mul(min_size)
                .is_some_and(|b| b <= self.remaining())
        });
        fits.ok_or_else(|| {
            GgufError(format!(
                "at offset {at}: {what} is {n}, but only {} bytes remain \
                 (each entry needs at least {min_size})",
                self.remaining()
            ))
        })
    }

    /// Reads a GGUF string: a `u64` byte length followed by UTF-8 bytes.
    pub(crate) fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.count(1, &format!("{what} length"))?;
        let at = self.pos;
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec())
            .map_err(|e| GgufError(format!("at offset {at}: expected UTF-8 {what}: {e}")))
    }
}
