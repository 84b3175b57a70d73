//! Element types and reduction operators, with the numeric codes the bindings pass across.
use crate::error::{Error, Result};

/// Writes a C-like enum whose discriminants are the numeric codes the bindings pass across, each
/// variant's code and name on one line, with `from_code` (a code back to its variant; any other is
/// Error::Unsupported: "`$what` code c: wirespeed supports `$supported`") and `name`.
macro_rules! coded_enum {
    (
        pub enum $ty:ident ($what:literal, supports $supported:expr) {
            $($(#[$vdoc:meta])* $v:ident = $code:literal => $name:literal,)*
        }
    ) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $ty {
            $($(#[$vdoc])* $v = $code,)*
        }

        impl $ty {
            pub fn from_code(c: u32) -> Result<$ty> {
                match c {
                    $($code => Ok($ty::$v),)*
                    _ => Err(Error::Unsupported(format!(concat!($what, " code {}: wirespeed supports {}"), c, $supported))),
                }
            }
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$v => $name,)*
                }
            }
        }
    };
}

pub const SUPPORTED_DTYPES: &str =
    "float32, float16, bfloat16, float64, int8, uint8, int16, uint16, int32, uint32, int64, uint64, bool";

coded_enum! {
    pub enum DType ("dtype", supports SUPPORTED_DTYPES) {
        F32 = 0 => "float32",
        F16 = 1 => "float16",
        BF16 = 2 => "bfloat16",
        F64 = 3 => "float64",
        I8 = 4 => "int8",
        U8 = 5 => "uint8",
        I32 = 6 => "int32",
        I64 = 7 => "int64",
        I16 = 8 => "int16",
        U16 = 9 => "uint16",
        U32 = 10 => "uint32",
        U64 = 11 => "uint64",
        /// torch.bool: one byte holding 0 or 1.
        Bool = 12 => "bool",
    }
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }
}

coded_enum! {
    pub enum ReduceOp ("reduce op", supports "sum, prod, min, max, avg, band, bor, bxor") {
        Sum = 0 => "sum",
        Prod = 1 => "prod",
        Min = 2 => "min",
        Max = 3 => "max",
        Avg = 4 => "avg",
        BAnd = 5 => "band",
        BOr = 6 => "bor",
        BXor = 7 => "bxor",
    }
}

impl ReduceOp {
    pub fn is_bitwise(self) -> bool {
        matches!(self, ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor)
    }
}

/// Whether `op` is defined on `dtype`, checked before an op starts so every rank refuses it alike:
/// bitwise ops need integers or bool, and an average of booleans means nothing.
pub fn check(dtype: DType, op: ReduceOp) -> Result<()> {
    if op.is_bitwise() && dtype.is_float() {
        return Err(Error::Unsupported(format!("{} is defined on integer and bool tensors, not {}", op.name(), dtype.name())));
    }
    if op == ReduceOp::Avg && dtype == DType::Bool {
        return Err(Error::Unsupported("avg is not defined on bool tensors; use max (any) or min (all)".into()));
    }
    Ok(())
}

/// IEEE half to single, exact.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    if exp == 0 {
        let v = man as f32 * (1.0 / 16_777_216.0); // subnormal (or zero): man * 2^-24, exact
        return f32::from_bits(v.to_bits() | sign);
    }
    if exp == 0x1f {
        return f32::from_bits(sign | 0x7f80_0000 | (man << 13));
    }
    f32::from_bits(sign | ((exp + 112) << 23) | (man << 13))
}

/// Single to IEEE half, rounding to nearest even (overflow to infinity), as torch's conversion does.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && (r & 1) == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && (r & 1) == 1) {
        r += 1; // a carry into the exponent is the correct rounding (up to infinity)
    }
    sign | r as u16
}

pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Single to bfloat16, rounding to nearest even; NaN stays NaN.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let r = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    (r >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_combinations_are_checked() {
        for c in 0..13 {
            assert_eq!(DType::from_code(c).unwrap() as u32, c);
        }
        assert!(DType::from_code(13).is_err());
        for c in 0..8 {
            assert_eq!(ReduceOp::from_code(c).unwrap() as u32, c);
        }
        assert!(check(DType::I16, ReduceOp::BXor).is_ok());
        assert!(check(DType::Bool, ReduceOp::BAnd).is_ok());
        assert!(check(DType::BF16, ReduceOp::BOr).is_err());
        assert!(check(DType::Bool, ReduceOp::Avg).is_err());
        assert_eq!(DType::U64.size(), 8);
        assert_eq!(DType::Bool.size(), 1);
    }

    #[test]
    fn half_round_trips_every_value() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f16_to_f32(f32_to_f16(f)).is_nan());
            } else {
                assert_eq!(f32_to_f16(f), h, "{h:#x}");
            }
        }
    }

    #[test]
    fn half_rounds_to_nearest_even() {
        assert_eq!(f32_to_f16(2049.0), f32_to_f16(2048.0)); // tie goes to even
        assert_eq!(f32_to_f16(2051.0), f32_to_f16(2052.0));
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds up past the largest finite half
        assert_eq!(f32_to_f16(5.960_464_5e-8), 1); // smallest subnormal
        assert_eq!(f32_to_f16(2.98e-8), 0);
    }

    #[test]
    fn bfloat16_round_trips_and_rounds_even() {
        for h in (0..=u16::MAX).step_by(7) {
            let f = bf16_to_f32(h);
            if !f.is_nan() {
                assert_eq!(f32_to_bf16(f), h);
            }
        }
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie to even (down)
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82); // tie to even (up)
    }
}
