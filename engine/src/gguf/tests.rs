//! Tests: a small in-memory GGUF v3 writer, parse and dequantize round trips against
//! hand-computed values, and truncated or corrupt input that must fail without panicking.

use super::*;

/// Appends GGUF-encoded pieces to a byte buffer.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn string(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A metadata entry: key, value type, then the already-encoded value.
    fn kv(&mut self, key: &str, value_type: u32, encoded: &[u8]) -> &mut Self {
        self.string(key).u32(value_type).bytes(encoded)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], kind: u32, offset: u64) -> &mut Self {
        self.string(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(kind).u64(offset)
    }
    fn pad_to(&mut self, alignment: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(alignment) {
            self.0.push(0);
        }
        self
    }
}

fn header(w: &mut Writer, tensors: u64, kvs: u64) {
    w.bytes(b"GGUF").u32(3).u64(tensors).u64(kvs);
}

const F16_ONE_HALF: u16 = 0x3800; // 0.5
const F16_QUARTER: u16 = 0x3400; // 0.25
const F16_MINUS_ONE: u16 = 0xbc00; // -1.0
const F16_TWO: u16 = 0x4000; // 2.0

/// A file with metadata of every type and four tensors: F32 [4,2], Q8_0 [32], Q4_1 [32], Q4_0 [32].
fn sample() -> Vec<u8> {
    let mut w = Writer::default();
    header(&mut w, 4, 15);
    w.kv("general.architecture", 8, &[5, 0, 0, 0, 0, 0, 0, 0])
        .bytes(b"llama")
        .kv("u8", 0, &[200])
        .kv("i8", 1, &[0xfe])
        .kv("u16", 2, &60000u16.to_le_bytes())
        .kv("i16", 3, &(-300i16).to_le_bytes())
        .kv("llama.block_count", 4, &30u32.to_le_bytes())
        .kv("i32", 5, &(-7i32).to_le_bytes())
        .kv("llama.rope.freq_base", 6, &10000.0f32.to_le_bytes())
        .kv("bool", 7, &[1])
        .kv("u64", 10, &(1u64 << 40).to_le_bytes())
        .kv("i64", 11, &(-5i64).to_le_bytes())
        .kv("f64", 12, &0.125f64.to_le_bytes())
        .kv("general.alignment", 4, &32u32.to_le_bytes());
    w.string("tokenizer.ggml.tokens").u32(9).u32(8).u64(3);
    w.string("<s>").string("hi").string("ĠParis");
    w.string("nested").u32(9).u32(9).u64(1).u32(5).u64(2);
    w.bytes(&1i32.to_le_bytes()).bytes(&(-1i32).to_le_bytes());
    w.tensor("a", &[4, 2], 0, 0)
        .tensor("q8", &[32], 8, 32)
        .tensor("q41", &[32], 3, 96)
        .tensor("q40", &[32], 2, 128)
        .pad_to(32);
    let data = w.0.len();
    for i in 0..8 {
        w.bytes(&(i as f32 * 0.5).to_le_bytes());
    }
    // q8 at +32: d = 0.5, q[i] = i - 16.
    w.bytes(&F16_ONE_HALF.to_le_bytes());
    w.bytes(&(0..32).map(|i| (i - 16i8) as u8).collect::<Vec<_>>());
    w.pad_to(32);
    assert_eq!(w.0.len() - data, 96);
    // q41 at +96: d = 0.25, m = -1, low nibble j, high nibble 15 - j.
    w.bytes(&F16_QUARTER.to_le_bytes())
        .bytes(&F16_MINUS_ONE.to_le_bytes());
    w.bytes(&(0..16u8).map(|j| j | ((15 - j) << 4)).collect::<Vec<_>>());
    w.pad_to(32);
    // q40 at +128: d = 2, same nibbles.
    w.bytes(&F16_TWO.to_le_bytes());
    w.bytes(&(0..16u8).map(|j| j | ((15 - j) << 4)).collect::<Vec<_>>());
    w.0
}

#[test]
fn parses_metadata_of_every_type() {
    let f = GgufFile::parse(&sample()).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.data_offset % 32, 0);
    assert_eq!(f.get_str("general.architecture"), Some("llama"));
    assert_eq!(f.get("u8"), Some(&Value::U8(200)));
    assert_eq!(f.get("i8"), Some(&Value::I8(-2)));
    assert_eq!(f.get("u16"), Some(&Value::U16(60000)));
    assert_eq!(f.get("i16"), Some(&Value::I16(-300)));
    assert_eq!(f.get_u64("llama.block_count"), Some(30));
    assert_eq!(f.get("i32"), Some(&Value::I32(-7)));
    assert_eq!(f.get_u64("i32"), None);
    assert_eq!(f.get_f32("llama.rope.freq_base"), Some(10000.0));
    assert_eq!(f.get("bool"), Some(&Value::Bool(true)));
    assert_eq!(f.get_u64("u64"), Some(1 << 40));
    assert_eq!(f.get("i64"), Some(&Value::I64(-5)));
    assert_eq!(f.get_f32("f64"), Some(0.125));
    assert_eq!(f.get_u64("u8"), Some(200));
    let tokens = ["<s>", "hi", "ĠParis"].map(|s| Value::String(s.into()));
    assert_eq!(
        f.get("tokenizer.ggml.tokens"),
        Some(&Value::Array(tokens.to_vec()))
    );
    let inner = Value::Array(vec![Value::I32(1), Value::I32(-1)]);
    assert_eq!(f.get("nested"), Some(&Value::Array(vec![inner])));
    assert_eq!(f.get("missing"), None);
    assert_eq!(f.get_str("u8"), None);
}

#[test]
fn parses_tensor_infos_and_dequantizes() {
    let bytes = sample();
    let f = GgufFile::parse(&bytes).unwrap();
    let names: Vec<_> = f.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "q8", "q41", "q40"]);
    let [a, q8, q41, q40] = &f.tensors[..] else {
        panic!("four tensors")
    };
    assert_eq!(
        (a.dims.as_slice(), a.kind, a.offset),
        (&[4, 2][..], GgmlType::F32, 0)
    );
    assert_eq!(
        (q8.kind, q41.kind, q40.kind),
        (GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4_0)
    );
    assert_eq!(f.tensor_data(&bytes, q8).unwrap().len(), 34);
    assert_eq!(f.tensor_data(&bytes, q41).unwrap().len(), 20);

    assert_eq!(
        f.dequantize(&bytes, a).unwrap(),
        [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    );

    let x = f.dequantize(&bytes, q8).unwrap();
    assert_eq!((x.len(), x[0], x[16], x[31]), (32, -8.0, 0.0, 7.5));
    assert!(
        x.iter()
            .enumerate()
            .all(|(i, &v)| v == 0.5 * (i as f32 - 16.0))
    );

    let x = f.dequantize(&bytes, q41).unwrap();
    assert_eq!((x.len(), x[0], x[1], x[15]), (32, -1.0, -0.75, 2.75));
    assert_eq!((x[16], x[17], x[31]), (2.75, 2.5, -1.0));
    for j in 0..16 {
        assert_eq!(x[j], 0.25 * j as f32 - 1.0);
        assert_eq!(x[16 + j], 0.25 * (15 - j) as f32 - 1.0);
    }

    let x = f.dequantize(&bytes, q40).unwrap();
    assert_eq!(
        (x[0], x[8], x[15], x[16], x[31]),
        (-16.0, 0.0, 14.0, 14.0, -16.0)
    );
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample();
    for n in 0..bytes.len() {
        assert!(
            GgufFile::parse(&bytes[..n]).is_err(),
            "prefix of {n} bytes parsed"
        );
    }
}

#[test]
fn every_single_byte_corruption_is_handled() {
    let bytes = sample();
    for i in 0..bytes.len() {
        for flip in [0x01, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= flip;
            if let Ok(f) = GgufFile::parse(&b) {
                for t in &f.tensors {
                    let _ = f.dequantize(&b, t);
                }
            }
        }
    }
}

#[test]
fn wrong_magic_and_version_are_clear_errors() {
    let mut bytes = sample();
    bytes[0] = b'X';
    let e = GgufFile::parse(&bytes).unwrap_err().to_string();
    assert!(e.contains("offset 0") && e.contains("magic"), "{e}");

    let mut bytes = sample();
    bytes[4] = 2;
    let e = GgufFile::parse(&bytes).unwrap_err().to_string();
    assert!(e.contains("unsupported version 2"), "{e}");
}

#[test]
fn huge_counts_fail_without_allocating() {
    let mut w = Writer::default();
    header(&mut w, u64::MAX, 0);
    let e = GgufFile::parse(&w.0).unwrap_err().0;
    assert!(e.contains("tensor count"), "{e}");

    let mut w = Writer::default();
    header(&mut w, 0, 1);
    w.string("k").u32(8).u64(u64::MAX);
    let e = GgufFile::parse(&w.0).unwrap_err().0;
    assert!(e.contains("string value length"), "{e}");

    let mut w = Writer::default();
    header(&mut w, 0, 1);
    w.string("k").u32(9).u32(0).u64(1 << 60);
    let e = GgufFile::parse(&w.0).unwrap_err().0;
    assert!(e.contains("array length"), "{e}");
}

#[test]
fn custom_alignment_sets_data_offset() {
    let mut w = Writer::default();
    header(&mut w, 1, 1);
    w.kv("general.alignment", 4, &64u32.to_le_bytes())
        .tensor("t", &[2], 1, 0)
        .pad_to(64)
        .bytes(&0x3c00u16.to_le_bytes())
        .bytes(&0xc000u16.to_le_bytes());
    let f = GgufFile::parse(&w.0).unwrap();
    // The 90-byte header pads up to 128, the next multiple of 64.
    assert_eq!((f.alignment, f.data_offset), (64, 128));
    assert_eq!(f.dequantize(&w.0, &f.tensors[0]).unwrap(), [1.0, -2.0]);
}

#[test]
fn f16_conversion() {
    assert_eq!(f16_to_f32(0x3c00), 1.0);
    assert_eq!(f16_to_f32(0xc000), -2.0);
    assert_eq!(f16_to_f32(0x7bff), 65504.0);
    assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
    assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
    assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
    assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
    assert!(f16_to_f32(0x7e00).is_nan());
}
