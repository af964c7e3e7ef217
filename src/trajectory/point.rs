//! One step of a trajectory's three loops, as recorded.

use serde::{Deserialize, Serialize};

/// One optimizer step of the three loops (a non-finite figure is written as JSON null and
/// read back as NaN: a diverged implementation's record stays readable).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepPoint {
    /// Step number, from 1.
    pub step: usize,
    /// Loss of the exact loop's call before this step.
    #[serde(deserialize_with = "crate::gates::nan_if_null")]
    pub loss_exact: f64,
    /// Loss of the plain-f32 reference's call.
    #[serde(deserialize_with = "crate::gates::nan_if_null")]
    pub loss_reference: f64,
    /// Loss of the implementation's call.
    #[serde(deserialize_with = "crate::gates::nan_if_null")]
    pub loss_implementation: f64,
    /// ‖θ_ref − θ_f64‖ / ‖θ_f64‖ after the step.
    #[serde(deserialize_with = "crate::gates::nan_if_null")]
    pub drift_reference: f64,
    /// ‖θ_impl − θ_f64‖ / ‖θ_f64‖ after the step.
    #[serde(deserialize_with = "crate::gates::nan_if_null")]
    pub drift_implementation: f64,
    /// Fraction of the unmasked tokens the exact loop's call clipped.
    #[serde(deserialize_with = "crate::gates::nan_if_null")]
    pub clipped_fraction: f64,
    /// ‖θ_f64 − θ₀‖ / ‖θ₀‖ after the step: how far the exact trajectory has travelled.
    #[serde(deserialize_with = "crate::gates::nan_if_null")]
    pub travelled: f64,
    /// Unmasked tokens whose clip decision differs between the implementation and the
    /// plain-f32 reference at this step (None: not counted, the implementation gives no
    /// `clipped`; the record's `left_out` says so).
    pub branch_flips: Option<usize>,
    /// Of those, the ones where a branch edge lies between the two loops' log-ratios (or
    /// within `oracle::EDGE_BAND` of them): either branch is right, the trajectories part.
    /// Without `clipped`: every token with such an edge (it may have flipped).
    pub ambiguous_flips: usize,
    /// dlm_head elements whose sign differs between the implementation and the plain-f32
    /// reference at this step (what a sign-like update, Adam's early steps, follows).
    #[serde(default)]
    pub sign_flips: usize,
}
