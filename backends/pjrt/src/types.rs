//! Element types (`PJRT_Buffer_Type`) and the host types that map to them.

use crate::ffi;

/// Element type of a buffer (`PJRT_Buffer_Type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// Boolean (`PRED`), one byte per element, 0 or 1.
    Pred,
    /// `S8`.
    S8,
    /// `S16`.
    S16,
    /// `S32`.
    S32,
    /// `S64`.
    S64,
    /// `U8`.
    U8,
    /// `U16`.
    U16,
    /// `U32`.
    U32,
    /// `U64`.
    U64,
    /// IEEE half (`F16`).
    F16,
    /// `F32`.
    F32,
    /// `F64`.
    F64,
    /// bfloat16 (`BF16`).
    Bf16,
    /// Any other `PJRT_Buffer_Type` (raw value).
    Other(u32),
}

impl ElementType {
    /// From the raw `PJRT_Buffer_Type`.
    pub fn from_raw(t: ffi::PJRT_Buffer_Type) -> Self {
        match t {
            ffi::PJRT_Buffer_Type_PRED => Self::Pred,
            ffi::PJRT_Buffer_Type_S8 => Self::S8,
            ffi::PJRT_Buffer_Type_S16 => Self::S16,
            ffi::PJRT_Buffer_Type_S32 => Self::S32,
            ffi::PJRT_Buffer_Type_S64 => Self::S64,
            ffi::PJRT_Buffer_Type_U8 => Self::U8,
            ffi::PJRT_Buffer_Type_U16 => Self::U16,
            ffi::PJRT_Buffer_Type_U32 => Self::U32,
            ffi::PJRT_Buffer_Type_U64 => Self::U64,
            ffi::PJRT_Buffer_Type_F16 => Self::F16,
            ffi::PJRT_Buffer_Type_F32 => Self::F32,
            ffi::PJRT_Buffer_Type_F64 => Self::F64,
            ffi::PJRT_Buffer_Type_BF16 => Self::Bf16,
            other => Self::Other(other),
        }
    }

    /// To the raw `PJRT_Buffer_Type`.
    pub fn to_raw(self) -> ffi::PJRT_Buffer_Type {
        match self {
            Self::Pred => ffi::PJRT_Buffer_Type_PRED,
            Self::S8 => ffi::PJRT_Buffer_Type_S8,
            Self::S16 => ffi::PJRT_Buffer_Type_S16,
            Self::S32 => ffi::PJRT_Buffer_Type_S32,
            Self::S64 => ffi::PJRT_Buffer_Type_S64,
            Self::U8 => ffi::PJRT_Buffer_Type_U8,
            Self::U16 => ffi::PJRT_Buffer_Type_U16,
            Self::U32 => ffi::PJRT_Buffer_Type_U32,
            Self::U64 => ffi::PJRT_Buffer_Type_U64,
            Self::F16 => ffi::PJRT_Buffer_Type_F16,
            Self::F32 => ffi::PJRT_Buffer_Type_F32,
            Self::F64 => ffi::PJRT_Buffer_Type_F64,
            Self::Bf16 => ffi::PJRT_Buffer_Type_BF16,
            Self::Other(raw) => raw,
        }
    }

    /// Bytes per element in the dense host layout, `None` for `Other`.
    pub fn byte_size(self) -> Option<usize> {
        Some(match self {
            Self::Pred | Self::S8 | Self::U8 => 1,
            Self::S16 | Self::U16 | Self::F16 | Self::Bf16 => 2,
            Self::S32 | Self::U32 | Self::F32 => 4,
            Self::S64 | Self::U64 | Self::F64 => 8,
            Self::Other(_) => return None,
        })
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A host type with a fixed PJRT element type and the same in-memory
/// representation as the device's dense layout. Sealed.
pub trait NativeType: sealed::Sealed + Copy + 'static {
    /// The matching element type.
    const TYPE: ElementType;

    /// Decodes dense little-endian host bytes (length already checked).
    fn decode(bytes: &[u8]) -> Vec<Self> {
        let n = bytes.len() / std::mem::size_of::<Self>();
        let mut out = Vec::<Self>::with_capacity(n);
        // SAFETY: `Self` is a plain-old-data type for every implementor except
        // `bool`, which overrides this method; capacity is `n` elements.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                out.as_mut_ptr().cast::<u8>(),
                n * std::mem::size_of::<Self>(),
            );
            out.set_len(n);
        }
        out
    }
}

macro_rules! native {
    ($($t:ty => $e:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl NativeType for $t { const TYPE: ElementType = ElementType::$e; }
    )*};
}
native!(i8 => S8, i16 => S16, i32 => S32, i64 => S64, u8 => U8, u16 => U16, u32 => U32, u64 => U64,
        f32 => F32, f64 => F64, Bf16 => Bf16, F16 => F16);

impl sealed::Sealed for bool {}
impl NativeType for bool {
    const TYPE: ElementType = ElementType::Pred;
    fn decode(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
}

/// A bfloat16 value (raw bits). Conversions round to nearest even.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// Rounds an `f32` to bfloat16 (round to nearest even; NaN stays NaN).
    pub fn from_f32(x: f32) -> Self {
        let bits = x.to_bits();
        if x.is_nan() {
            return Bf16(((bits >> 16) as u16) | 0x0040);
        }
        let round = 0x7fff + ((bits >> 16) & 1);
        Bf16((bits.wrapping_add(round) >> 16) as u16)
    }

    /// Widens to `f32` (exact).
    pub fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }
}

/// An IEEE half-precision value (raw bits).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct F16(pub u16);

impl F16 {
    /// Widens to `f32` (exact).
    pub fn to_f32(self) -> f32 {
        let h = u32::from(self.0);
        let sign = (h & 0x8000) << 16;
        let exp = (h >> 10) & 0x1f;
        let man = h & 0x3ff;
        let bits = match (exp, man) {
            (0, 0) => sign,
            (0, m) => {
                // Subnormal: value = m * 2^-24.
                let v = m as f32 * f32::from_bits(0x3380_0000);
                return if sign != 0 { -v } else { v };
            }
            (0x1f, 0) => sign | 0x7f80_0000,
            (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
            (e, m) => sign | ((e + 112) << 23) | (m << 13),
        };
        f32::from_bits(bits)
    }

    /// Rounds an `f32` to half precision (round to nearest even, overflow to inf).
    pub fn from_f32(x: f32) -> Self {
        let bits = x.to_bits();
        let sign = ((bits >> 16) & 0x8000) as u16;
        if x.is_nan() {
            return F16(sign | 0x7e00);
        }
        let a = x.abs();
        if a >= 65520.0 {
            return F16(sign | 0x7c00);
        }
        if a < f32::from_bits(0x3880_0000) {
            // Below the smallest normal half (2^-14): subnormal grid of 2^-24,
            // `round_ties_even` gives round-to-nearest-even.
            let m = (a * f32::from_bits(0x4b80_0000)).round_ties_even() as u16;
            return F16(sign | m);
        }
        let abits = a.to_bits();
        let round = 0x0fff + ((abits >> 13) & 1);
        let r = abits + round;
        let exp = (r >> 23) - 112;
        F16(sign | ((exp << 10) as u16) | (((r >> 13) & 0x3ff) as u16))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(Bf16::from_f32(1.0).0, 0x3f80);
        assert_eq!(Bf16::from_f32(-2.5).to_f32(), -2.5);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
        // 1 + 3 * 2^-8 ties up to 1 + 2^-6.
        assert_eq!(
            Bf16::from_f32(1.0 + 3.0 / 256.0).to_f32(),
            1.0 + 4.0 / 256.0
        );
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
        assert_eq!(Bf16::from_f32(f32::INFINITY).to_f32(), f32::INFINITY);
    }

    #[test]
    fn f16_conversions() {
        let min_normal = 2f32.powi(-14);
        let min_subnormal = 2f32.powi(-24);
        for x in [
            0.0f32,
            -0.0,
            1.0,
            -2.0,
            0.5,
            65504.0,
            min_normal,
            -min_normal,
            min_subnormal,
            3.0 * min_subnormal,
        ] {
            assert_eq!(F16::from_f32(x).to_f32(), x, "{x}");
        }
        assert_eq!(F16::from_f32(1.0).0, 0x3c00);
        assert_eq!(F16::from_f32(65520.0).to_f32(), f32::INFINITY);
        assert_eq!(F16(0x0001).to_f32(), min_subnormal);
        assert_eq!(F16::from_f32(min_subnormal).0, 0x0001);
        // Half a subnormal step ties to even (zero).
        assert_eq!(F16::from_f32(min_subnormal / 2.0).0, 0x0000);
        assert!(F16::from_f32(f32::NAN).to_f32().is_nan());
        // 1 + 2^-11 ties to even (1.0); 1 + 3 * 2^-11 rounds up.
        assert_eq!(F16::from_f32(1.0 + 1.0 / 2048.0).0, 0x3c00);
        assert_eq!(F16::from_f32(1.0 + 3.0 / 2048.0).0, 0x3c02);
    }

    #[test]
    fn element_type_raw_round_trip() {
        for t in [
            ElementType::Pred,
            ElementType::S32,
            ElementType::F32,
            ElementType::Bf16,
            ElementType::F16,
            ElementType::U8,
        ] {
            assert_eq!(ElementType::from_raw(t.to_raw()), t);
        }
        assert_eq!(
            ElementType::from_raw(ffi::PJRT_Buffer_Type_F8E5M2),
            ElementType::Other(ffi::PJRT_Buffer_Type_F8E5M2)
        );
        assert_eq!(ElementType::Bf16.byte_size(), Some(2));
        assert_eq!(bool::decode(&[0, 1, 2]), vec![false, true, true]);
        assert_eq!(i32::decode(&7i32.to_le_bytes()), vec![7]);
    }
}
