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
    ///
    /// ```
    /// use grpo_pjrt::{Bf16, NativeType};
    /// let bytes = [0x80, 0x3f, 0x20, 0xc0]; // bf16 1.0 and -2.5
    /// assert_eq!(Bf16::decode(&bytes), [Bf16::from_f32(1.0), Bf16::from_f32(-2.5)]);
    /// assert_eq!(i32::decode(&7i32.to_le_bytes()), [7]);
    /// ```
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

/// bfloat16, from the `half` crate (rounding to nearest even; `repr(transparent)` u16).
pub use half::bf16 as Bf16;
/// IEEE half precision, from the `half` crate.
pub use half::f16 as F16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_types_encode_as_their_bits() {
        // The device sees the raw 16-bit pattern: check the host encoding is exactly that.
        let x = [Bf16::from_f32(1.0), Bf16::from_f32(-2.5)];
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        assert_eq!(Bf16::decode(&bytes), x);
        assert_eq!(x[0].to_bits(), 0x3f80);
        let h = [F16::from_f32(0.5), F16::from_f32(65504.0)];
        let bytes: Vec<u8> = h.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        assert_eq!(F16::decode(&bytes), h);
        assert_eq!(<Bf16 as NativeType>::TYPE, ElementType::Bf16);
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
