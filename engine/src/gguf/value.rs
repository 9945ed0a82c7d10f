//! GGUF metadata values: the thirteen value types and their bounds-checked decoding.

use super::GgufError;
use super::reader::Reader;

/// Deepest nesting of arrays inside arrays that is accepted.
const MAX_ARRAY_DEPTH: usize = 8;

/// A metadata value, one variant per GGUF value type (ids 0..=12 in this order).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7 (one byte, 0 or 1).
    Bool(bool),
    /// Type 8 (u64 length + UTF-8 bytes).
    String(String),
    /// Type 9 (element type u32 + count u64 + elements).
    Array(Vec<Value>),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

impl Value {
    /// An integer value of any width as `u64` (`None` if negative or not an integer).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
}

/// Smallest encoded size of one value of `value_type` (for capping array counts).
fn min_size(value_type: u32) -> usize {
    match value_type {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        9 => 4 + 8,
        _ => 8,
    }
}

/// Reads one value of GGUF type `value_type`; `depth` counts enclosing arrays.
pub(crate) fn read_value(
    r: &mut Reader<'_>,
    value_type: u32,
    depth: usize,
) -> Result<Value, GgufError> {
    let at = r.pos();
    Ok(match value_type {
        0 => Value::U8(r.u8("u8 value")?),
        1 => Value::I8(r.u8("i8 value")? as i8),
        2 => Value::U16(r.u16("u16 value")?),
        3 => Value::I16(r.u16("i16 value")? as i16),
        4 => Value::U32(r.u32("u32 value")?),
        5 => Value::I32(r.u32("i32 value")? as i32),
        6 => Value::F32(f32::from_bits(r.u32("f32 value")?)),
        7 => match r.u8("bool value")? {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            b => {
                return Err(GgufError(format!(
                    "at offset {at}: expected bool 0 or 1, found {b}"
                )));
            }
        },
        8 => Value::String(r.string("string value")?),
        9 => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError(format!(
                    "at offset {at}: arrays nested deeper than {MAX_ARRAY_DEPTH}"
                )));
            }
            let element_type = r.u32("array element type")?;
            if element_type > 12 {
                return Err(GgufError(format!(
                    "at offset {at}: expected array element type 0..=12, found {element_type}"
                )));
            }
            let n = r.count(min_size(element_type), "array length")?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(read_value(r, element_type, depth + 1)?);
            }
            Value::Array(items)
        }
        10 => Value::U64(r.u64("u64 value")?),
        11 => Value::I64(r.u64("i64 value")? as i64),
        12 => Value::F64(f64::from_bits(r.u64("f64 value")?)),
        other => {
            return Err(GgufError(format!(
                "at offset {}: expected metadata value type 0..=12, found {other}",
                at.saturating_sub(4)
            )));
        }
    })
}
