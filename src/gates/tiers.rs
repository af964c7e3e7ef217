//! The one table of tolerances, keyed by (tier, dtype of the differentiable input, output).
//!
//! Why these numbers (docs/tolerances.md has the long form):
//! - Inputs are exact in every dtype, so per-token outputs are f32 arithmetic on exact
//!   data whatever the input dtype: norm-wise 1e-5, worst element 1e-4 of the largest.
//!   `floor` adds an absolute allowance proportional to the magnitude each value is
//!   computed from (the oracle's per-element scale): an f32 kernel cannot resolve an
//!   entropy of 1e-7 next to a logsumexp of 25. 1e-5 ≈ 170 f32 ulps.
//! - Gradients come back in the input dtype: bf16 rounding alone is up to u = 2^-8 ≈ 3.9e-3
//!   per element, f16 u = 2^-11 ≈ 4.9e-4. The worst element may use a factor 2 (bf16) and
//!   4 (f16) above that. Norm-wise, one rounding of each element can never exceed u·‖ref‖,
//!   so the norm-wise bound is that plus the f32 tier for the arithmetic before the
//!   rounding ([`rounded_norm_rel`]): a kernel that rounds more than once (a bf16
//!   accumulator across token blocks) shows there. Their floor covers the f32 arithmetic
//!   before the rounding, e.g. 1 − p_y when p_y ≈ 1 (see `oracle::row::gradient` for the
//!   per-element scale).
//! - `clipped` is exact away from the branch edges (see `oracle::EDGE_BAND`).

use crate::cases::TierName;
use crate::spec::{DType, OutputName};

/// Bounds of one (tier, dtype, output): pass iff
/// ‖out−ref‖₂ ≤ norm_rel·‖ref‖₂ + floor·‖scale‖₂ and, for every element,
/// |out_i−ref_i| ≤ max_rel·‖ref‖∞ + floor·scale_i.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Tolerance {
    /// Norm-wise relative bound.
    pub norm_rel: f64,
    /// Worst element, relative to the largest reference magnitude.
    pub max_rel: f64,
    /// Absolute allowance per unit of the oracle's error scale.
    pub floor: f64,
}

/// Environment variable that multiplies every tolerance (e.g. 0.1 for a stricter run).
pub const SCALE_ENV: &str = crate::env::TOL_SCALE;

/// The tolerance multiplier in force (1 unless `GRPO_TOL_SCALE` says otherwise).
pub fn scale() -> f64 {
    #[cfg(test)]
    if let Some(k) = TEST_SCALE.with(|c| c.get()) {
        return k;
    }
    env_scale()
}

#[cfg(test)]
thread_local! {
    /// A unit test's own multiplier in place of `GRPO_TOL_SCALE` (this thread only).
    pub(crate) static TEST_SCALE: std::cell::Cell<Option<f64>> = const { std::cell::Cell::new(None) };
}

/// Norm-wise and worst-element bound of an f32 gradient.
const F32_GRAD: f64 = 1e-4;

/// The unit roundoff of a dtype: half its relative spacing (2^-p for p significant bits).
pub fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::Bf16 => 2f64.powi(-8),
    }
}

/// Norm-wise bound of a gradient returned in `dtype` (narrower than f32): an f32 result v
/// within the f32 tier of the reference w, rounded once, is within u·‖v‖ of v, so
/// ‖round(v) − w‖ ≤ u·‖w‖ + (1 + u)·F32_GRAD·‖w‖ (plus the floor term).
pub fn rounded_norm_rel(dtype: DType) -> f64 {
    let u = unit_roundoff(dtype);
    u + (1.0 + u) * F32_GRAD
}

/// The tolerance of `output` for a case of `dtype` in `tier`.
pub fn tolerance(tier: TierName, dtype: DType, output: OutputName) -> Tolerance {
    use OutputName::*;
    let t = |norm_rel, max_rel, floor| Tolerance {
        norm_rel,
        max_rel,
        floor,
    };
    let base = match output {
        Loss => t(1e-5, 1e-5, 1e-5),
        PerTokenLogp | PerTokenLoss | Kl | Entropy => t(1e-5, 1e-4, 1e-5),
        Clipped => t(0.0, 0.0, 0.0),
        Dlogits | Dhidden | DlmHead => match dtype {
            DType::F32 => t(F32_GRAD, F32_GRAD, 1e-5),
            DType::F16 => t(rounded_norm_rel(DType::F16), 2e-3, 1e-5),
            DType::Bf16 => t(rounded_norm_rel(DType::Bf16), 8e-3, 1e-5),
        },
    };
    let k = match tier {
        TierName::Standard => 1.0,
        TierName::Loose => 10.0,
    } * scale();
    Tolerance {
        norm_rel: base.norm_rel * k,
        max_rel: base.max_rel * k,
        floor: base.floor * k,
    }
}

fn env_scale() -> f64 {
    // Front ends validate the environment at start-up (`crate::env::check_all`); a library
    // user who skipped that gets the same one-line message here rather than a silent 1.0.
    static SCALE: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *SCALE.get_or_init(|| crate::env::tol_scale().unwrap_or_else(|e| panic!("{e:#}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradient_tiers_cover_dtype_rounding() {
        // One rounding of each dtype must fit with room to spare; f32 must stay tight.
        let bf16_ulp = 2f64.powi(-9);
        let f16_ulp = 2f64.powi(-11);
        assert!(
            tolerance(TierName::Standard, DType::Bf16, OutputName::Dlogits).max_rel
                > 2.0 * bf16_ulp
        );
        assert!(
            tolerance(TierName::Standard, DType::F16, OutputName::Dlogits).max_rel > 2.0 * f16_ulp
        );
        assert!(
            tolerance(TierName::Standard, DType::F32, OutputName::Dlogits).max_rel
                < bf16_ulp / 10.0
        );
        // The documented table (docs/tolerances.md), standard tier.
        let t = |d, o| tolerance(TierName::Standard, d, o);
        let k = scale(); // 1 unless the run sets GRPO_TOL_SCALE
        let row = |x: Tolerance, want: [f64; 3]| {
            for (got, want) in [x.norm_rel, x.max_rel, x.floor].into_iter().zip(want) {
                assert!((got / k / want - 1.0).abs() < 1e-12, "{x:?} vs {want:?}");
            }
        };
        row(t(DType::F32, OutputName::Loss), [1e-5, 1e-5, 1e-5]);
        row(t(DType::F32, OutputName::Entropy), [1e-5, 1e-4, 1e-5]);
        row(t(DType::F32, OutputName::Dhidden), [1e-4, 1e-4, 1e-5]);
        row(
            t(DType::F16, OutputName::DlmHead),
            [5.88330078125e-4, 2e-3, 1e-5],
        );
        row(
            t(DType::Bf16, OutputName::Dlogits),
            [4.006640625e-3, 8e-3, 1e-5],
        );
        // Per-token outputs never depend on the input dtype.
        for o in OutputName::PER_TOKEN {
            assert_eq!(
                tolerance(TierName::Standard, DType::Bf16, o),
                tolerance(TierName::Standard, DType::F32, o)
            );
        }
    }

    /// `loose` is ×10 of every bound, and the multiplier in force (GRPO_TOL_SCALE, here a
    /// test's own) multiplies every bound of every tier.
    #[test]
    fn loose_and_the_multiplier_scale_every_bound() {
        for (d, o) in [
            (DType::F32, OutputName::Loss),
            (DType::Bf16, OutputName::Dlogits),
            (DType::F16, OutputName::PerTokenLogp),
        ] {
            let ratio = |a: Tolerance, b: Tolerance, k: f64| {
                for (x, y) in [
                    (a.norm_rel, b.norm_rel),
                    (a.max_rel, b.max_rel),
                    (a.floor, b.floor),
                ] {
                    assert!((x / y / k - 1.0).abs() < 1e-12, "{a:?} / {b:?} is not {k}");
                }
            };
            let s = tolerance(TierName::Standard, d, o);
            let l = tolerance(TierName::Loose, d, o);
            ratio(l, s, 10.0);
            TEST_SCALE.with(|c| c.set(Some(0.25)));
            let q = tolerance(TierName::Loose, d, o);
            TEST_SCALE.with(|c| c.set(None));
            ratio(q, l, 0.25 / scale());
        }
    }
}
