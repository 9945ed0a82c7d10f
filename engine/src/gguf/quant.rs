//! ggml tensor types: their storage sizes and dequantization to `f32`.

use super::GgufError;
use super::f16::f16_to_f32;

/// Elements per block in the `Q4_0`, `Q4_1` and `Q8_0` formats.
pub const QK: usize = 32;

/// The storage type of a tensor, as the ggml type id in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float (id 0).
    F32,
    /// 16-bit IEEE half float (id 1).
    F16,
    /// Blocks of 32: f16 scale `d`, 16 bytes of 4-bit `q`; `x = d × (q − 8)` (id 2).
    Q4_0,
    /// Blocks of 32: f16 scale `d`, f16 minimum `m`, 16 bytes of 4-bit `q`; `x = d × q + m` (id 3).
    Q4_1,
    /// Blocks of 32: f16 scale `d`, 32 signed bytes `q`; `x = d × q` (id 8).
    Q8_0,
    /// Any other ggml type id; parsed but neither sized nor dequantized here.
    Other(u32),
}

impl GgmlType {
    /// Maps a ggml type id from the file.
    pub fn from_id(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            other => Self::Other(other),
        }
    }

    /// `(elements per block, bytes per block)`, or `None` for `Other`.
    pub fn block(self) -> Option<(usize, usize)> {
        match self {
            Self::F32 => Some((1, 4)),
            Self::F16 => Some((1, 2)),
            Self::Q4_0 => Some((QK, 2 + QK / 2)),
            Self::Q4_1 => Some((QK, 2 + 2 + QK / 2)),
            Self::Q8_0 => Some((QK, 2 + QK)),
            Self::Other(_) => None,
        }
    }
}

/// Bytes that `n_elements` of `kind` occupy; errors for unknown types or partial blocks.
pub(crate) fn byte_size(kind: GgmlType, n_elements: usize, name: &str) -> Result<usize, GgufError> {
    let (per_block, block_bytes) = kind
        .block()
        .ok_or_else(|| GgufError(format!("tensor {name:?}: unsupported ggml type {kind:?}")))?;
    if !n_elements.is_multiple_of(per_block) {
        return Err(GgufError(format!(
            "tensor {name:?}: {n_elements} elements is not a whole number of {per_block}-element {kind:?} blocks"
        )));
    }
    (n_elements / per_block)
        .checked_mul(block_bytes)
        .ok_or_else(|| GgufError(format!("tensor {name:?}: byte size overflows")))
}

/// Decodes `data` (exactly the tensor's bytes) of `kind` into `f32` values.
pub(crate) fn dequantize(kind: GgmlType, data: &[u8]) -> Vec<f32> {
    let half = |b: &[u8]| f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    match kind {
        GgmlType::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        GgmlType::F16 => data.chunks_exact(2).map(half).collect(),
        GgmlType::Q8_0 => data
            .chunks_exact(2 + QK)
            .flat_map(|b| {
                let d = half(b);
                b[2..].iter().map(move |&q| d * f32::from(q as i8))
            })
            .collect(),
        GgmlType::Q4_0 => nibbles(data, 2, |b| (half(b), -8.0 * half(b))),
        GgmlType::Q4_1 => nibbles(data, 4, |b| (half(b), half(&b[2..]))),
        GgmlType::Other(_) => Vec::new(),
    }
}

/// Decodes 4-bit blocks: a `header`-byte prefix, then 16 bytes whose low nibbles are
/// elements 0..16 and high nibbles elements 16..32; `scale(block)` gives `(d, m)` and
/// each value is `d × q + m`.
fn nibbles(data: &[u8], header: usize, scale: impl Fn(&[u8]) -> (f32, f32)) -> Vec<f32> {
    let mut out = Vec::with_capacity(data.len() / (header + QK / 2) * QK);
    for block in data.chunks_exact(header + QK / 2) {
        let (d, m) = scale(block);
        let qs = &block[header..];
        out.extend(qs.iter().map(|&q| d * f32::from(q & 0x0f) + m));
        out.extend(qs.iter().map(|&q| d * f32::from(q >> 4) + m));
    }
    out
}
