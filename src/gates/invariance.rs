//! Invariance gates: a multi-device run's outputs against the same implementation's
//! one-device outputs on the same inputs, "equal within f32 rounding".
//!
//! The reference is the one-device output; the scales are the oracle's (what each value
//! is computed from), so the bounds are the f32 gates' own:
//! - loss and per-token outputs: the gate tolerance of the case's tier (these outputs are
//!   f32 arithmetic on exact inputs whatever the dtype: the f32 rounding bound);
//! - gradients in f32: the f32 gradient tolerance;
//! - gradients in bf16 / f16: the two runs' f32 values may straddle a rounding boundary
//!   of the output dtype, so each element may differ by one unit in the last place of
//!   the largest element (2u relative, u = 2^-8 for bf16, 2^-11 for f16), norm-wise
//!   likewise;
//! - clipped: identical where mask = 1, except at tokens inside the oracle's edge band.
//!
//! Per-token loss and kl are compared where mask = 1 (SPEC leaves masked values free).

use super::{fail, index, per_token, tolerance, unjudged, Acc, GateReport, Tolerance};
use crate::cases::Case;
use crate::inputs::Inputs;
use crate::oracle::Oracle;
use crate::outputs::{OutTensor, Outputs};
use crate::spec::{DType, OutputName};

/// Unit roundoff of a gradient output's dtype (f32: none extra).
fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 0.0,
        DType::Bf16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
    }
}

/// The invariance tolerance of `output` (see the module doc).
pub fn invariance_tolerance(case: &Case, output: OutputName) -> Tolerance {
    let tol = tolerance(case.tier, DType::F32, output);
    match output {
        OutputName::Dlogits | OutputName::Dhidden | OutputName::DlmHead
            if case.dtype != DType::F32 =>
        {
            let one_ulp = 2.0 * unit_roundoff(case.dtype) * super::tiers::scale();
            Tolerance {
                norm_rel: one_ulp,
                max_rel: one_ulp,
                floor: tol.floor,
            }
        }
        _ => tol,
    }
}

/// One report per output of `reference` (the one-device run): `got` (the multi-device
/// run) against it. Outputs the implementation does not provide are skipped.
pub fn judge_invariance(
    case: &Case,
    inputs: &Inputs,
    oracle: &Oracle,
    got: &Outputs,
    reference: &Outputs,
) -> Vec<GateReport> {
    let tier = format!("{}/{} vs 1 device", case.tier, case.dtype);
    let mut reports = Vec::new();
    for (&name, want) in &reference.tensors {
        let tol = invariance_tolerance(case, name);
        let t = match got.get(name) {
            Some(t) if t.shape == want.shape => t,
            Some(t) => {
                reports.push(fail(
                    name,
                    tier.clone(),
                    format!(
                        "shape {:?}, the one-device run gave {:?}",
                        t.shape, want.shape
                    ),
                ));
                continue;
            }
            None => {
                reports.push(fail(
                    name,
                    tier.clone(),
                    "missing from the multi-device outputs".into(),
                ));
                continue;
            }
        };
        let masked = |i: usize| inputs.mask[i] != 0.0;
        let report = match name {
            OutputName::Loss => {
                let mut acc = Acc::default();
                acc.add(
                    0,
                    t.data[0],
                    want.data[0] as f64,
                    oracle.loss_scale,
                    tol.floor,
                );
                acc.report(name, &t.shape, tol, tier.clone())
            }
            OutputName::Kl if case.knobs.beta == 0.0 => unjudged(
                name,
                tol,
                tier.clone(),
                "kl: not compared (β = 0 leaves ref_logp unread)".into(),
            ),
            OutputName::Clipped => clipped(inputs, oracle, t, want, tier.clone()),
            OutputName::PerTokenLogp | OutputName::Entropy => {
                per_token(t, &widen(want), &oracle.scale_logp, |_| true, tol).report(
                    name,
                    &t.shape,
                    tol,
                    tier.clone(),
                )
            }
            OutputName::PerTokenLoss => per_token(t, &widen(want), &oracle.scale_loss, masked, tol)
                .report(name, &t.shape, tol, tier.clone()),
            OutputName::Kl => per_token(t, &widen(want), &oracle.scale_kl, masked, tol).report(
                name,
                &t.shape,
                tol,
                tier.clone(),
            ),
            OutputName::Dlogits | OutputName::Dhidden | OutputName::DlmHead => {
                let mut acc = Acc::default();
                for (i, (&x, &w)) in t.data.iter().zip(&want.data).enumerate() {
                    acc.add(i, x, w as f64, 0.0, 0.0);
                }
                acc.report(name, &t.shape, tol, tier.clone())
            }
        };
        reports.push(report);
    }
    reports
}

fn widen(t: &OutTensor) -> Vec<f64> {
    t.data.iter().map(|&x| x as f64).collect()
}

fn clipped(
    inputs: &Inputs,
    oracle: &Oracle,
    t: &OutTensor,
    want: &OutTensor,
    tier: String,
) -> GateReport {
    let tol = Tolerance {
        norm_rel: 0.0,
        max_rel: 0.0,
        floor: 0.0,
    };
    let mut n = 0;
    let mut wrong = Vec::new();
    for i in 0..t.data.len() {
        if inputs.mask[i] == 0.0 || oracle.clipped_ambiguous[i] {
            continue;
        }
        n += 1;
        if t.data[i] != want.data[i] {
            wrong.push(i);
        }
    }
    match wrong.first() {
        None => GateReport {
            compared: n,
            message: format!("clipped: identical over {n} ({tier})"),
            ..unjudged(OutputName::Clipped, tol, tier, String::new())
        },
        Some(&i) => fail(
            OutputName::Clipped,
            tier,
            format!(
                "{} of {n} tokens differ; first at {}: got {}, one device {}",
                wrong.len(),
                index(&t.shape, i),
                t.data[i],
                want.data[i]
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::parse_fixed;

    /// Identical outputs pass; a one-ulp bf16 flip passes; a missing shard's worth of
    /// gradient, or a loss off by 1e-4 relative, fails.
    #[test]
    fn within_rounding_passes_and_a_lost_contribution_fails() {
        let case = parse_fixed("b: 2, t: 4, v: 300, dtype: bf16").unwrap();
        let inputs = Inputs::generate(&case);
        let oracle = Oracle::new(&case, &inputs);
        // The oracle's outputs as the "one-device run" (gradients rounded to bf16).
        let one = crate::backends::reference::oracle_outputs(&case, &inputs);
        assert!(judge_invariance(&case, &inputs, &oracle, &one, &one)
            .iter()
            .all(|g| g.passed));

        let mut flip = one.clone();
        let d = flip.tensors.get_mut(&OutputName::Dlogits).unwrap();
        let j = d
            .data
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
            .unwrap()
            .0;
        d.data[j] = half::bf16::from_bits(half::bf16::from_f32(d.data[j]).to_bits() + 1).to_f32();
        assert!(
            judge_invariance(&case, &inputs, &oracle, &flip, &one)
                .iter()
                .all(|g| g.passed),
            "one ulp"
        );

        let mut lost = one.clone();
        let d = lost.tensors.get_mut(&OutputName::Dlogits).unwrap();
        for x in &mut d.data[..150] {
            *x = 0.0; // the first vocab shard's columns of row 0, as if it never contributed
        }
        let r = judge_invariance(&case, &inputs, &oracle, &lost, &one);
        assert!(
            r.iter()
                .any(|g| g.output == OutputName::Dlogits && !g.passed),
            "{r:?}"
        );

        let mut loss = one.clone();
        loss.tensors.get_mut(&OutputName::Loss).unwrap().data[0] *= 1.0 + 1e-3;
        let r = judge_invariance(&case, &inputs, &oracle, &loss, &one);
        assert!(
            r.iter().any(|g| g.output == OutputName::Loss && !g.passed),
            "{r:?}"
        );
    }
}
