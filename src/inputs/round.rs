//! [`DType::round`] written so that loops over it vectorise (the `half` crate converts one
//! value at a time, through a CPU-feature check per call): the same bits for every f32
//! that is not a NaN, checked against `DType::round` over all 2³² bit patterns by
//! `same_bits_as_dtype_round_everywhere` (ignored by default: 20 s on 2 cores; a
//! strided sample of 2²⁴ patterns runs in the normal suite).

use crate::spec::DType;

/// bf16 round-to-nearest-even of `x`, back in f32 (non-NaN `x`): the rule of `half`'s
/// `f32_to_bf16` (round up when the dropped half-ulp bit is set and either a lower bit or
/// the kept last bit is), on the bits.
#[inline(always)]
pub fn bf16(x: f32) -> f32 {
    let b = x.to_bits();
    let up = (b & 0x8000 != 0) & (b & 0x1_7FFF != 0);
    f32::from_bits(((b >> 16) + up as u32) << 16)
}

/// f16 round-to-nearest-even of `x`, back in f32 (non-NaN `x`). With a = |x|:
/// a ≥ 65520 rounds to ∞; a < 2⁻¹⁴ to a multiple of 2⁻²⁴ ((a + ½) − ½ rounds there, the
/// f32 spacing at ½ being 2⁻²⁴); otherwise to 11 significant bits: (a + c) − c with
/// c = 2^(e+13) for a ∈ [2^e, 2^(e+1)), where the f32 spacing of a + c is 2^(e−10), the
/// f16 spacing at a, and f32's ties-to-even is f16's (the last bits have the same parity).
#[inline(always)]
pub fn f16(x: f32) -> f32 {
    let a = x.abs();
    let c = f32::from_bits((a.to_bits() & 0x7F80_0000) + (13 << 23));
    let normal = (a + c) - c;
    let subnormal = (a + 0.5) - 0.5;
    let r = if a >= 65520.0 {
        f32::INFINITY
    } else if a < 1.0 / 16384.0 {
        subnormal
    } else {
        normal
    };
    r.copysign(x)
}

/// `dt.round(x)` for non-NaN `x`, vectorisable.
#[inline(always)]
pub fn round(dt: DType, x: f32) -> f32 {
    match dt {
        DType::F32 => x,
        DType::Bf16 => bf16(x),
        DType::F16 => f16(x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// Mismatches of [`round`] against `DType::round` over bit patterns `start + k·step`.
    fn mismatches(dt: DType, step: u64) -> Vec<u32> {
        (0..(1u64 << 32) / step)
            .into_par_iter()
            .filter_map(|k| {
                let b = (k * step) as u32;
                let x = f32::from_bits(b);
                (!x.is_nan() && round(dt, x).to_bits() != dt.round(x).to_bits()).then_some(b)
            })
            .collect()
    }

    #[test]
    fn same_bits_as_dtype_round_on_a_sample_and_at_the_edges() {
        for dt in [DType::Bf16, DType::F16, DType::F32] {
            // 2²⁴ patterns spread over every exponent (an odd step visits every low-bit pattern).
            assert_eq!(mismatches(dt, 255), Vec::<u32>::new(), "{dt}");
            // Ties, f16's overflow and subnormal thresholds, bf16's overflow.
            let edges = [
                65504.0f32,
                65519.0,
                65520.0,
                65536.0,
                1.0 / 16384.0,
                2f32.powi(-24),
                2f32.powi(-25),
                f32::MAX,
                1.0,
                0.0,
            ];
            for e in edges {
                for d in -300i32..300 {
                    for s in [1.0f32, -1.0] {
                        let x = f32::from_bits((e.to_bits() as i32 + d).max(0) as u32) * s;
                        if x.is_nan() {
                            continue;
                        }
                        assert_eq!(round(dt, x).to_bits(), dt.round(x).to_bits(), "{dt} {x:e}");
                    }
                }
            }
        }
    }

    #[test]
    #[ignore = "exhaustive over all 2^32 f32 patterns (~20 s per dtype); the sampled test above runs always"]
    fn same_bits_as_dtype_round_everywhere() {
        for dt in [DType::Bf16, DType::F16] {
            assert_eq!(mismatches(dt, 1), Vec::<u32>::new(), "{dt}");
        }
    }
}
