//! GGUF v3 model files: header, typed metadata, tensor infos and tensor data
//! (F32, F16, Q4_0, Q4_1 and Q8_0 dequantized to `f32`), parsed from bytes in memory.

mod f16;
mod quant;
mod reader;
#[cfg(test)]
mod tests;
mod value;

use std::collections::HashSet;
use std::fmt;

pub use f16::f16_to_f32;
pub use quant::GgmlType;
use reader::Reader;
pub use value::Value;
use value::read_value;

/// Tensor-data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The four bytes every GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// The only format version this parser accepts.
pub const VERSION: u32 = 3;
/// Most dimensions a tensor may have (ggml's limit).
const MAX_DIMS: usize = 4;

/// A parse or lookup failure, naming the offset and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufError(pub String);

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gguf: {}", self.0)
    }
}

impl std::error::Error for GgufError {}

/// Where one tensor lives and how it is stored.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions as stored, innermost (contiguous) first.
    pub dims: Vec<u64>,
    /// Storage type.
    pub kind: GgmlType,
    /// Byte offset from the start of the data section (a multiple of the alignment).
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements (product of `dims`; 1 for a scalar), or `None` on overflow.
    pub fn n_elements(&self) -> Option<usize> {
        self.dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
    }
}

/// A parsed GGUF file: everything before the tensor data, plus where that data starts.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufFile {
    /// Format version (always 3).
    pub version: u32,
    /// Metadata key/value pairs in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// Absolute byte offset of the data section.
    pub data_offset: u64,
    /// Data alignment in bytes (`general.alignment`, default 32).
    pub alignment: u64,
}

impl GgufFile {
    /// Parses a whole GGUF v3 file, checking that every sized tensor lies inside `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
        let mut r = Reader::new(bytes);
        let magic = r.take(4, "magic \"GGUF\"")?;
        if magic != MAGIC {
            return Err(GgufError(format!(
                "at offset 0: expected magic \"GGUF\", found {magic:02x?}"
            )));
        }
        let version = r.u32("version")?;
        if version != VERSION {
            let hint = if version.swap_bytes() == VERSION {
                " (big-endian file?)"
            } else {
                ""
            };
            return Err(GgufError(format!(
                "at offset 4: unsupported version {version}{hint}; only version {VERSION} is supported"
            )));
        }
        // Each tensor info is at least name length + n_dims + type + offset.
        let tensor_count = r.count(8 + 4 + 4 + 8, "tensor count")?;
        // Each metadata entry is at least key length + value type.
        let kv_count = r.count(8 + 4, "metadata count")?;

        let mut metadata = Vec::with_capacity(kv_count);
        let mut keys = HashSet::with_capacity(kv_count);
        for _ in 0..kv_count {
            let at = r.pos();
            let key = r.string("metadata key")?;
            let value_type = r.u32("metadata value type")?;
            let value = read_value(&mut r, value_type, 0)?;
            if !keys.insert(key.clone()) {
                return Err(GgufError(format!(
                    "at offset {at}: duplicate metadata key {key:?}"
                )));
            }
            metadata.push((key, value));
        }
        let alignment = alignment(&metadata)?;

        let mut tensors = Vec::with_capacity(tensor_count);
        for _ in 0..tensor_count {
            tensors.push(read_tensor_info(&mut r, alignment)?);
        }
        let data_offset = (r.pos() as u64).next_multiple_of(alignment);
        let file = GgufFile {
            version,
            metadata,
            tensors,
            data_offset,
            alignment,
        };
        for t in &file.tensors {
            if t.kind.block().is_some() {
                file.tensor_data(bytes, t)?;
            } else if file.data_offset.saturating_add(t.offset) > bytes.len() as u64 {
                return Err(GgufError(format!(
                    "tensor {:?}: offset {} is past the end of the file ({} bytes)",
                    t.name,
                    t.offset,
                    bytes.len()
                )));
            }
        }
        Ok(file)
    }

    /// The value of the first metadata entry named `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// An integer value of any width as `u64` (`None` if negative or not an integer).
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    /// A floating-point value (`F32`, or `F64` narrowed) as `f32`.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        match self.get(key)? {
            Value::F32(v) => Some(*v),
            Value::F64(v) => Some(*v as f32),
            _ => None,
        }
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The raw bytes of tensor `t` inside the whole-file buffer `bytes`.
    pub fn tensor_data<'a>(&self, bytes: &'a [u8], t: &TensorInfo) -> Result<&'a [u8], GgufError> {
        let n = t
            .n_elements()
            .ok_or_else(|| GgufError(format!("tensor {:?}: element count overflows", t.name)))?;
        let len = quant::byte_size(t.kind, n, &t.name)?;
        let start = self.data_offset.checked_add(t.offset);
        let range = start
            .and_then(|s| usize::try_from(s).ok())
            .and_then(|s| Some(s..s.checked_add(len)?))
            .filter(|r| r.end <= bytes.len());
        range.map(|r| &bytes[r]).ok_or_else(|| {
            GgufError(format!(
                "tensor {:?}: expected {len} bytes at offset {} + {}, but the file has {} bytes",
                t.name,
                self.data_offset,
                t.offset,
                bytes.len()
            ))
        })
    }

    /// Tensor `t` as `f32` values in storage order (F32, F16, Q4_0, Q4_1 and Q8_0).
    pub fn dequantize(&self, bytes: &[u8], t: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        Ok(quant::dequantize(t.kind, self.tensor_data(bytes, t)?))
    }
}

/// `general.alignment` if present (a non-zero power of two), else the default.
fn alignment(metadata: &[(String, Value)]) -> Result<u64, GgufError> {
    let Some((_, value)) = metadata.iter().find(|(k, _)| k == "general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match value.as_u64() {
        Some(a) if a.is_power_of_two() => Ok(a),
        _ => Err(GgufError(format!(
            "general.alignment: expected a power-of-two integer, found {value:?}"
        ))),
    }
}

/// Reads one tensor info and checks its dimension count and offset alignment.
fn read_tensor_info(r: &mut Reader<'_>, alignment: u64) -> Result<TensorInfo, GgufError> {
    let name = r.string("tensor name")?;
    let at = r.pos();
    let n_dims = r.u32("tensor dimension count")? as usize;
    if n_dims > MAX_DIMS {
        return Err(GgufError(format!(
            "at offset {at}: tensor {name:?} has {n_dims} dimensions, at most {MAX_DIMS} expected"
        )));
    }
    let mut dims = Vec::with_capacity(n_dims);
    for _ in 0..n_dims {
        dims.push(r.u64("tensor dimension")?);
    }
    let kind = GgmlType::from_id(r.u32("tensor ggml type")?);
    let at = r.pos();
    let offset = r.u64("tensor data offset")?;
    if !offset.is_multiple_of(alignment) {
        return Err(GgufError(format!(
            "at offset {at}: tensor {name:?} data offset {offset} is not a multiple of the alignment {alignment}"
        )));
    }
    Ok(TensorInfo {
        name,
        dims,
        kind,
        offset,
    })
}
