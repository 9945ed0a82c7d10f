//! IEEE 754 half-precision to `f32` conversion, by bit manipulation.

/// Converts the bits of an IEEE 754 binary16 value to `f32` exactly
/// (zeros, subnormals, infinities and NaNs included).
pub fn f16_to_f32(bits: u16) -> f32 {
    let negative = bits & 0x8000 != 0;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x03ff);
    let sign = if negative { 1u32 << 31 } else { 0 };
    let out = match exponent {
        // Zero or subnormal: mantissa × 2^-24, exact in f32.
        0 => {
            let magnitude = mantissa as f32 * f32::from_bits(0x3380_0000);
            return if negative { -magnitude } else { magnitude };
        }
        // Infinity (mantissa 0) or NaN (payload kept).
        31 => sign | 0x7f80_0000 | (mantissa << 13),
        // Normal: rebias the exponent from 15 to 127.
        _ => sign | ((exponent + 112) << 23) | (mantissa << 13),
    };
    f32::from_bits(out)
}
