//! Invariance gates: a multi-device run's outputs against the same implementation's
//! one-device outputs on the same inputs, "equal within f32 rounding".
//!
//! The reference is the one-device output; the scales are the oracle's (what each value
//! is computed from), so the bounds are the f32 gates' own:
//! - loss and per-token outputs: the gate tolerance of the case's tier (these outputs are
//!   f32 arithmetic on exact inputs whatever the dtype: the f32 rounding bound);
//! - gradients in f32: the f32 gradient tolerance; dlogits with the oracle gate's
//!   per-element scales (1 − p_y cancels when p_y ≈ 1, and two runs may form it
//!   differently) and, on a row in the oracle's edge band, up to the change of clip
//!   branch the oracle gate allows too;
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
            OutputName::Dlogits => dlogits(case, inputs, oracle, t, want, tol).report(
                name,
                &t.shape,
                tol,
                tier.clone(),
            ),
            OutputName::Dhidden | OutputName::DlmHead => {
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

/// dlogits against the one-device run with the oracle gate's per-element scales: an f32
/// kernel forms 1 − p_y with an absolute error of order ε·|g|/τ (it cancels when p_y ≈ 1),
/// and the two runs may form it differently (the vocab-parallel combine adds the chosen
/// column's g/τ and the shards' −g·p_y/τ separately). A row whose ratio lies in the
/// oracle's edge band may take the other branch of the clip in one run and not the
/// other: such a row is compared with the one-device row and with that row moved to the
/// other branch (by ±(row at g_alt − row at g), towards the branch it is not on), the
/// smaller error of the two, as the oracle gate compares a row with either branch.
fn dlogits(
    case: &Case,
    inputs: &Inputs,
    oracle: &Oracle,
    t: &OutTensor,
    want: &OutTensor,
    tol: Tolerance,
) -> Acc {
    use rayon::prelude::*;
    let v = case.shape.v;
    (0..case.shape.rows())
        .into_par_iter()
        .map_init(
            || (vec![0f64; v], vec![0f64; v]),
            |(scale, shift), r| {
                let got = &t.data[r * v..(r + 1) * v];
                let one = &want.data[r * v..(r + 1) * v];
                oracle.dlogits_row(case, inputs, r, oracle.g[r], |j, x, s| {
                    scale[j] = s;
                    shift[j] = x;
                });
                let row = |sign: f64, shift: &[f64]| {
                    let mut acc = Acc::default();
                    for (j, (&x, &w)) in got.iter().zip(one).enumerate() {
                        let w = w as f64 + sign * shift[j];
                        acc.add(r * v + j, x, w, scale[j], tol.floor);
                    }
                    acc
                };
                let same = row(0.0, shift);
                let Some(g_alt) = oracle.g_alt[r] else {
                    return same;
                };
                // shift = row at g_alt − row at g; the one-device row is on the branch
                // it is nearer to, and the other run may be on the other one.
                let (mut to_g, mut to_alt) = (0.0, 0.0);
                oracle.dlogits_row(case, inputs, r, g_alt, |j, x, _| {
                    let w = one[j] as f64;
                    to_g += (w - shift[j]).powi(2);
                    to_alt += (w - x).powi(2);
                    shift[j] = x - shift[j];
                });
                let other = row(if to_g <= to_alt { 1.0 } else { -1.0 }, shift);
                if other.d2 < same.d2 {
                    other
                } else {
                    same
                }
            },
        )
        .reduce(Acc::default, Acc::merge)
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
    use crate::cases::TierName;
    use crate::gates::tiers::scale;

    /// Identical outputs pass; a one-ulp bf16 flip passes; a missing shard's worth of
    /// gradient, or a loss off by 1e-4 relative, fails.
    #[test]
    fn within_rounding_passes_and_a_lost_contribution_fails() {
        let case = parse_fixed("b: 2, t: 4, v: 300, dtype: bf16").unwrap();
        let inputs = Inputs::generate(&case);
        let oracle = Oracle::new(&case, &inputs);
        // The oracle's outputs as the "one-device run" (gradients rounded to bf16).
        let one = crate::oracle::outputs::oracle_outputs(&case, &inputs);
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

    fn dlogits_gate(
        case: &Case,
        inputs: &Inputs,
        oracle: &Oracle,
        got: &Outputs,
        one: &Outputs,
    ) -> GateReport {
        judge_invariance(case, inputs, oracle, got, one)
            .into_iter()
            .find(|g| g.output == OutputName::Dlogits)
            .unwrap()
    }

    /// A peaked row (p_y within 1e-7 of 1): one run forms 1 − p_y exactly, the other
    /// from g/τ − g·p_y/τ in f32 (one ulp of g/τ off). That is f32 rounding, as the
    /// oracle gate says; ten times the element's f32 allowance is not.
    #[test]
    fn dlogits_allows_the_f32_rounding_of_one_minus_p_and_no_more() {
        let case = parse_fixed("b: 4, t: 8, v: 257, dtype: f32, profile: spike").unwrap();
        let inputs = Inputs::generate(&case);
        let oracle = Oracle::new(&case, &inputs);
        let one = crate::oracle::outputs::oracle_outputs(&case, &inputs);
        // The chosen element with the largest f32 allowance relative to its value.
        let v = case.shape.v;
        let tol = invariance_tolerance(&case, OutputName::Dlogits);
        let mut pick = (0, 0.0, 0.0); // (flat index, scale, value)
        for r in 0..case.shape.rows() {
            let y = inputs.chosen_ids[r] as usize;
            oracle.dlogits_row(&case, &inputs, r, oracle.g[r], |j, x, s| {
                if j == y && s > pick.1 && x.abs() < s * 1e-3 {
                    pick = (r * v + j, s, x);
                }
            });
        }
        let (at, scale, _) = pick;
        assert!(scale > 0.0, "the spike case has a peaked chosen column");
        let ulp = scale * f32::EPSILON as f64;
        let mut rounded = one.clone();
        rounded.tensors.get_mut(&OutputName::Dlogits).unwrap().data[at] += ulp as f32;
        let g = dlogits_gate(&case, &inputs, &oracle, &rounded, &one);
        assert!(
            g.passed,
            "one ulp of g/τ at the peaked column: {}",
            g.message
        );

        let mut wrong = one.clone();
        wrong.tensors.get_mut(&OutputName::Dlogits).unwrap().data[at] +=
            (10.0 * tol.floor * scale) as f32;
        let g = dlogits_gate(&case, &inputs, &oracle, &wrong, &one);
        assert!(!g.passed, "ten times the allowance passed: {}", g.message);
        assert!(
            g.message.contains(&index(&[4, 8, 257], at)),
            "{}",
            g.message
        );
    }

    /// A row on a clip edge may take either branch in either run: the other branch's row
    /// passes; a row on neither branch (the gradient doubled) fails, and so does the other
    /// branch on a row the oracle does not leave ambiguous.
    #[test]
    fn dlogits_allows_the_other_clip_branch_only_on_edge_rows() {
        let case = parse_fixed("b: 4, t: 8, v: 257, dtype: f32, profile: ratio_edges").unwrap();
        let inputs = Inputs::generate(&case);
        let oracle = Oracle::new(&case, &inputs);
        let one = crate::oracle::outputs::oracle_outputs(&case, &inputs);
        let v = case.shape.v;
        let row_at = |g: f64, r: usize, out: &mut Outputs| {
            let d = out.tensors.get_mut(&OutputName::Dlogits).unwrap();
            oracle.dlogits_row(&case, &inputs, r, g, |j, x, _| d.data[r * v + j] = x as f32);
        };
        let edge = (0..case.shape.rows())
            .find(|&r| {
                oracle.g_alt[r]
                    .is_some_and(|a| (a - oracle.g[r]).abs() > 1e-3 * oracle.g[r].abs().max(1e-9))
            })
            .expect("ratio_edges puts a row in the edge band");
        let mut other = one.clone();
        row_at(oracle.g_alt[edge].unwrap(), edge, &mut other);
        let g = dlogits_gate(&case, &inputs, &oracle, &other, &one);
        assert!(g.passed, "the other branch on an edge row: {}", g.message);

        let mut neither = one.clone();
        row_at(
            2.0 * oracle.g[edge] - oracle.g_alt[edge].unwrap(),
            edge,
            &mut neither,
        );
        let g = dlogits_gate(&case, &inputs, &oracle, &neither, &one);
        assert!(!g.passed, "a row on neither branch passed: {}", g.message);

        let plain = (0..case.shape.rows())
            .find(|&r| oracle.g_alt[r].is_none() && inputs.mask[r] != 0.0 && oracle.g[r] != 0.0)
            .unwrap();
        let mut moved = one.clone();
        row_at(oracle.g[plain] * 0.5, plain, &mut moved);
        let g = dlogits_gate(&case, &inputs, &oracle, &moved, &one);
        assert!(
            !g.passed,
            "a changed row off the edge band passed: {}",
            g.message
        );
    }

    /// The documented bounds: f32 gradients the f32 gradient tier; bf16 and f16 gradients
    /// one ulp of the largest element (2u) norm-wise and element-wise; per-token outputs
    /// the tier's own; every one times the multiplier in force.
    #[test]
    fn the_bounds_are_the_documented_ones() {
        let at = |dtype: &str| parse_fixed(&format!("b: 2, t: 4, v: 300, dtype: {dtype}")).unwrap();
        let f32_grad = tolerance(TierName::Standard, DType::F32, OutputName::Dlogits);
        assert_eq!(
            invariance_tolerance(&at("f32"), OutputName::Dlogits),
            f32_grad
        );
        for (dtype, u) in [("bf16", 2f64.powi(-8)), ("f16", 2f64.powi(-11))] {
            let t = invariance_tolerance(&at(dtype), OutputName::Dlogits);
            assert_eq!(
                (t.norm_rel, t.max_rel),
                (2.0 * u * scale(), 2.0 * u * scale()),
                "{dtype}"
            );
            assert_eq!(t.floor, f32_grad.floor);
            assert_eq!(
                invariance_tolerance(&at(dtype), OutputName::Entropy),
                tolerance(TierName::Standard, DType::F32, OutputName::Entropy)
            );
        }
        crate::gates::tiers::TEST_SCALE.with(|c| c.set(Some(0.5)));
        let t = invariance_tolerance(&at("bf16"), OutputName::Dlogits);
        crate::gates::tiers::TEST_SCALE.with(|c| c.set(None));
        assert_eq!(t.max_rel, 2f64.powi(-8));
    }

    /// β = 0: kl is whatever each run writes (ref_logp unread), so it is not compared;
    /// with β > 0 the same difference fails.
    #[test]
    fn kl_is_compared_only_when_beta_is_not_zero() {
        for (beta, passes) in [("0", true), ("0.04", false)] {
            let case =
                parse_fixed(&format!("b: 2, t: 4, v: 300, dtype: f32, beta: {beta}")).unwrap();
            let inputs = Inputs::generate(&case);
            let oracle = Oracle::new(&case, &inputs);
            let one = crate::oracle::outputs::oracle_outputs(&case, &inputs);
            let mut other = one.clone();
            for x in &mut other.tensors.get_mut(&OutputName::Kl).unwrap().data {
                *x += 1.0;
            }
            let g = judge_invariance(&case, &inputs, &oracle, &other, &one)
                .into_iter()
                .find(|g| g.output == OutputName::Kl)
                .unwrap();
            assert_eq!(g.passed, passes, "β = {beta}: {}", g.message);
        }
    }

    /// The one-device run on the other clip branch of an edge row: the multi-device run on
    /// the oracle's branch passes; beyond either branch fails.
    #[test]
    fn dlogits_edge_rows_work_from_either_branch_of_the_one_device_run() {
        let case = parse_fixed("b: 4, t: 8, v: 257, dtype: f32, profile: ratio_edges, beta: 0.04")
            .unwrap();
        let inputs = Inputs::generate(&case);
        let oracle = Oracle::new(&case, &inputs);
        let exact = crate::oracle::outputs::oracle_outputs(&case, &inputs);
        let v = case.shape.v;
        let row_at = |g: f64, r: usize, out: &mut Outputs| {
            let d = out.tensors.get_mut(&OutputName::Dlogits).unwrap();
            oracle.dlogits_row(&case, &inputs, r, g, |j, x, _| d.data[r * v + j] = x as f32);
        };
        // Every edge row whose branches differ (some have a zero branch, some not), with
        // the one-device run on either branch.
        let edges: Vec<usize> = (0..case.shape.rows())
            .filter(|&r| {
                oracle.g_alt[r].is_some_and(|a| (a - oracle.g[r]).abs() > 1e-3 * oracle.g[r].abs())
            })
            .collect();
        assert!(edges
            .iter()
            .any(|&r| oracle.g[r] != 0.0 && oracle.g_alt[r] != Some(0.0)));
        for &edge in &edges {
            let (g, alt) = (oracle.g[edge], oracle.g_alt[edge].unwrap());
            for (one_g, other_g) in [(g, alt), (alt, g)] {
                let mut one = exact.clone();
                row_at(one_g, edge, &mut one);
                for (got_g, passes) in [
                    (one_g, true),
                    (other_g, true),
                    (2.0 * other_g - one_g, false),
                    (2.0 * one_g - other_g, false),
                ] {
                    let mut got = exact.clone();
                    row_at(got_g, edge, &mut got);
                    let r = dlogits_gate(&case, &inputs, &oracle, &got, &one);
                    assert_eq!(
                        r.passed, passes,
                        "row {edge}, one device at {one_g}, got {got_g} (branches {g}, {alt}): {}",
                        r.message
                    );
                }
            }
        }
    }

    /// `clipped` is compared where mask = 1 outside the edge band, exactly; the count of
    /// compared tokens is reported.
    #[test]
    fn clipped_skips_masked_and_edge_tokens_and_counts_the_rest() {
        let case = parse_fixed("b: 4, t: 8, v: 300, dtype: f32, profile: ratio_edges").unwrap();
        let inputs = Inputs::generate(&case);
        let oracle = Oracle::new(&case, &inputs);
        let one = crate::oracle::outputs::oracle_outputs(&case, &inputs);
        let gate = |got: &Outputs| {
            judge_invariance(&case, &inputs, &oracle, got, &one)
                .into_iter()
                .find(|g| g.output == OutputName::Clipped)
                .unwrap()
        };
        let rows = case.shape.rows();
        let judged = (0..rows)
            .filter(|&i| inputs.mask[i] != 0.0 && !oracle.clipped_ambiguous[i])
            .count();
        let g = gate(&one);
        assert!(g.passed && g.compared == judged, "{g:?}");
        assert!(
            g.message.contains(&format!("identical over {judged}")),
            "{}",
            g.message
        );
        let masked = (0..rows).find(|&i| inputs.mask[i] == 0.0).unwrap();
        let edge = (0..rows)
            .find(|&i| inputs.mask[i] != 0.0 && oracle.clipped_ambiguous[i])
            .unwrap();
        let plain = (0..rows)
            .find(|&i| inputs.mask[i] != 0.0 && !oracle.clipped_ambiguous[i])
            .unwrap();
        for (at, passes) in [(masked, true), (edge, true), (plain, false)] {
            let mut flipped = one.clone();
            let x = &mut flipped.tensors.get_mut(&OutputName::Clipped).unwrap().data[at];
            *x = 1.0 - *x;
            assert_eq!(gate(&flipped).passed, passes, "flag flipped at {at}");
        }
    }
}
