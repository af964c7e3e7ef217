//! The gate's arithmetic at its boundaries: an error 1% under a bound passes and 1% over
//! fails, for the norm-wise bound (norm_rel·‖ref‖₂ + floor·‖scale‖₂) and for the element
//! bound (max_rel·‖ref‖∞ + floor·scale_i) separately; the reported figures are the
//! documented ones; ties and merges name the first element. Large errors (the element
//! tests) pass through any slightly wrong formula; these do not. Written against the
//! mutants `cargo mutants` left alive in `Acc` (docs/tolerances.md).

use super::*;
use crate::cases::parse_fixed;
use crate::oracle::outputs::oracle_outputs;
use crate::oracle::Oracle;

const TIER: &str = "standard/f32";

/// An accumulator over `want` with errors `err` and scales `scale`, in one pass or split
/// at `split` and merged (the parallel gates merge per-row accumulators).
fn acc(want: &[f64], err: &[f64], scale: &[f64], floor: f64, split: Option<usize>) -> Acc {
    let add = |range: std::ops::Range<usize>| {
        let mut a = Acc::default();
        for i in range {
            a.add(i, (want[i] + err[i]) as f32, want[i], scale[i], floor);
        }
        a
    };
    match split {
        None => add(0..want.len()),
        Some(k) => add(0..k).merge(add(k..want.len())),
    }
}

fn report(a: &Acc, n: usize, tol: Tolerance) -> GateReport {
    a.report(OutputName::Dlogits, &[n], tol, TIER.into())
}

/// Values exact in f32, so that `want + err` as f32 is the intended error.
const WANT: [f64; 4] = [3.0, -4.0, 12.0, 0.5];
const SCALE: [f64; 4] = [1.0, 2.0, 0.0, 2.0];

#[test]
fn the_norm_bound_holds_at_its_edge() {
    // Element bound out of the way; norm bound = 1e-3·‖want‖ + 1e-2·‖scale‖.
    let tol = Tolerance {
        norm_rel: 1e-3,
        max_rel: 10.0,
        floor: 1e-2,
    };
    let r_norm = WANT.iter().map(|x| x * x).sum::<f64>().sqrt();
    let s_norm = SCALE.iter().map(|x| x * x).sum::<f64>().sqrt();
    let bound = 1e-3 * r_norm + 1e-2 * s_norm;
    for split in [None, Some(1), Some(3)] {
        for (k, passes) in [(0.99, true), (1.01, false)] {
            // The error along (1, 1, 1, 1)/2: norm k·bound; each element exactly in f32
            // once added to WANT (the check below reads the achieved error back).
            let e = k * bound / 2.0;
            let err = [e, -e, e, e];
            let a = acc(&WANT, &err, &SCALE, tol.floor, split);
            let d = (a.d2).sqrt();
            assert!(
                (d / bound - k).abs() < 1e-3,
                "achieved {} of the bound",
                d / bound
            );
            let r = report(&a, 4, tol);
            assert_eq!(
                r.passed, passes,
                "{k}× the norm bound, split {split:?}: {}",
                r.message
            );
            assert!(
                (r.norm_err / (d / r_norm) - 1.0).abs() < 1e-9,
                "{}",
                r.norm_err
            );
            assert!(
                (r.bound_used / (d / bound) - 1.0).abs() < 1e-9,
                "{}",
                r.bound_used
            );
            assert!((r.max_abs_err - err.iter().fold(0f64, |m, x| m.max(x.abs()))).abs() < 1e-6);
            assert_eq!(r.compared, 4);
            if !passes {
                assert!(r.message.contains("norm error"), "{}", r.message);
            }
        }
    }
}

#[test]
fn the_element_bound_holds_at_its_edge_and_names_the_element() {
    // Norm bound out of the way; element i may be off by 1e-3·max|want| + 1e-2·scale_i.
    let tol = Tolerance {
        norm_rel: 10.0,
        max_rel: 1e-3,
        floor: 1e-2,
    };
    let rinf = 12.0;
    for at in 0..4 {
        let allow = 1e-3 * rinf + 1e-2 * SCALE[at];
        for split in [None, Some(2)] {
            for (k, passes) in [(0.99, true), (1.01, false)] {
                let mut err = [0.0; 4];
                err[at] = k * allow;
                let a = acc(&WANT, &err, &SCALE, tol.floor, split);
                let r = report(&a, 4, tol);
                assert_eq!(r.passed, passes, "{k}× at [{at}]: {}", r.message);
                if !passes {
                    assert!(r.message.contains("worst element exceeds"), "{}", r.message);
                    assert!(
                        r.message.contains(&format!("worst at [{at}]")),
                        "{}",
                        r.message
                    );
                }
            }
        }
    }
}

#[test]
fn ties_and_merges_name_the_first_element() {
    let tol = Tolerance {
        norm_rel: 0.0,
        max_rel: 0.0,
        floor: 0.0,
    };
    let want = [1.0, 1.0, 1.0, 1.0];
    let scale = [0.0; 4];
    let err = [0.0, 0.5, 0.5, 0.0]; // equal errors at [1] and [2]
    for split in [None, Some(2), Some(1)] {
        let r = report(&acc(&want, &err, &scale, 0.0, split), 4, tol);
        assert!(
            r.message.contains("worst at [1]"),
            "{split:?}: {}",
            r.message
        );
    }
    // Non-finite values: the first one is named, whichever side of a merge it is on.
    let mut a = Acc::default();
    let mut b = Acc::default();
    for i in 0..3 {
        a.add(i, if i == 2 { f32::NAN } else { 1.0 }, 1.0, 0.0, 0.0);
    }
    for i in 3..6 {
        b.add(i, if i == 4 { f32::INFINITY } else { 1.0 }, 1.0, 0.0, 0.0);
    }
    for merged in [a.clone().merge(b.clone()), b.merge(a)] {
        let r = report(&merged, 6, tol);
        assert!(
            !r.passed && r.message.contains("NaN at [2]"),
            "{}",
            r.message
        );
        assert_eq!(r.compared, 6);
    }
    // A non-finite reference: the first one is named, across a merge too.
    let mut a = Acc::default();
    let mut b = Acc::default();
    a.add(0, 1.0, 1.0, 0.0, 0.0);
    a.add(1, 1.0, f64::INFINITY, 0.0, 0.0);
    b.add(2, 1.0, f64::NAN, 0.0, 0.0);
    for merged in [a.clone().merge(b.clone()), b.merge(a)] {
        let r = report(&merged, 3, tol);
        assert!(
            r.oracle_nonfinite && r.message.contains("at [1] (inf)"),
            "{}",
            r.message
        );
    }
}

#[test]
fn zero_references_report_zero_or_infinite_relative_error() {
    let tol = Tolerance {
        norm_rel: 1e-3,
        max_rel: 1e-3,
        floor: 0.0,
    };
    let zeros = [0.0; 3];
    let r = report(&acc(&zeros, &zeros, &zeros, 0.0, None), 3, tol);
    assert!(
        r.passed && r.norm_err == 0.0 && r.bound_used == 0.0,
        "{r:?}"
    );
    let r = report(&acc(&zeros, &[0.0, 1e-3, 0.0], &zeros, 0.0, None), 3, tol);
    assert!(!r.passed, "{}", r.message);
    assert!(
        r.norm_err.is_infinite() && r.bound_used.is_infinite(),
        "{r:?}"
    );
    assert_eq!(r.max_abs_err, 1e-3f32 as f64);
}

#[test]
fn index_is_row_major() {
    assert_eq!(index(&[2, 3, 4], 0), "[0, 0, 0]");
    assert_eq!(index(&[2, 3, 4], 23), "[1, 2, 3]");
    assert_eq!(index(&[2, 3, 4], 13), "[1, 0, 1]");
    assert_eq!(index(&[5], 4), "[4]");
    assert_eq!(index(&[], 0), "[]");
}

#[test]
fn a_record_without_provided_reads_as_provided() {
    let json = r#"{"output":"loss","passed":true,"norm_err":0.0,"max_abs_err":0.0,
        "compared":1,"bound_used":0.0,"tier":"standard/f32","message":"loss: ok"}"#;
    let r: GateReport = serde_json::from_str(json).unwrap();
    assert!(r.provided && !r.oracle_nonfinite);
}

/// β = 0: kl is not judged (any finite value passes) but must be finite; an output the
/// implementation declares it does not provide is reported as such, never compared.
#[test]
fn kl_at_beta_zero_and_outputs_not_provided() {
    let case = parse_fixed("b: 2, t: 4, v: 300, dtype: f32, beta: 0").unwrap();
    let inputs = Inputs::generate(&case);
    let oracle = Oracle::new(&case, &inputs);
    let exact = oracle_outputs(&case, &inputs);
    let kl_of = |out: &Outputs| {
        judge(&case, &inputs, &oracle, out)
            .into_iter()
            .find(|g| g.output == OutputName::Kl)
            .unwrap()
    };
    let mut garbage = exact.clone();
    for (i, x) in garbage
        .tensors
        .get_mut(&OutputName::Kl)
        .unwrap()
        .data
        .iter_mut()
        .enumerate()
    {
        *x = 1e3 + i as f32;
    }
    let g = kl_of(&garbage);
    assert!(
        g.passed && g.message.contains("values not judged"),
        "{}",
        g.message
    );
    let mut nan = exact.clone();
    nan.tensors.get_mut(&OutputName::Kl).unwrap().data[5] = f32::NAN;
    let g = kl_of(&nan);
    assert!(
        !g.passed && g.message.contains("non-finite value at [1, 1]"),
        "{}",
        g.message
    );
    // β > 0 judges kl's values: the same garbage fails there.
    let judged = parse_fixed("b: 2, t: 4, v: 300, dtype: f32, beta: 0.04").unwrap();
    let inputs2 = Inputs::generate(&judged);
    let oracle2 = Oracle::new(&judged, &inputs2);
    let mut garbage2 = oracle_outputs(&judged, &inputs2);
    for x in &mut garbage2.tensors.get_mut(&OutputName::Kl).unwrap().data {
        *x = 1e3;
    }
    let g = judge(&judged, &inputs2, &oracle2, &garbage2)
        .into_iter()
        .find(|g| g.output == OutputName::Kl)
        .unwrap();
    assert!(!g.passed, "{}", g.message);

    let mut missing = exact.clone();
    missing.tensors.remove(&OutputName::Entropy);
    missing.not_provided.insert(OutputName::Entropy);
    let g = judge(&case, &inputs, &oracle, &missing)
        .into_iter()
        .find(|g| g.output == OutputName::Entropy)
        .unwrap();
    assert!(g.passed && !g.provided && g.compared == 0, "{g:?}");
    assert!(g.message.contains("not provided"), "{}", g.message);
}

/// `clipped` is compared where mask = 1 outside the oracle's edge band, and exactly:
/// a flipped flag at a masked token or at an edge token passes, anywhere else it fails;
/// the count of compared tokens is reported.
#[test]
fn clipped_skips_masked_and_edge_tokens_and_counts_the_rest() {
    let case = parse_fixed("b: 4, t: 8, v: 300, dtype: f32, profile: ratio_edges").unwrap();
    let inputs = Inputs::generate(&case);
    let oracle = Oracle::new(&case, &inputs);
    let exact = oracle_outputs(&case, &inputs);
    let gate = |out: &Outputs| {
        judge(&case, &inputs, &oracle, out)
            .into_iter()
            .find(|g| g.output == OutputName::Clipped)
            .unwrap()
    };
    let rows = case.shape.rows();
    let judged = (0..rows)
        .filter(|&i| inputs.mask[i] != 0.0 && !oracle.clipped_ambiguous[i])
        .count();
    let g = gate(&exact);
    assert!(g.passed && g.compared == judged, "{g:?}");
    let masked = (0..rows)
        .find(|&i| inputs.mask[i] == 0.0)
        .expect("a masked token");
    let edge = (0..rows)
        .find(|&i| inputs.mask[i] != 0.0 && oracle.clipped_ambiguous[i])
        .expect("ratio_edges puts an unmasked token in the edge band");
    let plain = (0..rows)
        .find(|&i| inputs.mask[i] != 0.0 && !oracle.clipped_ambiguous[i])
        .unwrap();
    for (at, passes) in [(masked, true), (edge, true), (plain, false)] {
        let mut flipped = exact.clone();
        let x = &mut flipped.tensors.get_mut(&OutputName::Clipped).unwrap().data[at];
        *x = 1.0 - *x;
        let g = gate(&flipped);
        assert_eq!(g.passed, passes, "flag flipped at {at}: {}", g.message);
    }
}

/// A dlogits row whose ratio is on a clip edge is judged against the nearer of the two
/// branches: the row of the other branch passes; a row on neither fails.
#[test]
fn dlogits_takes_the_nearer_branch_on_edge_rows() {
    let case = parse_fixed("b: 4, t: 8, v: 300, dtype: f32, profile: ratio_edges").unwrap();
    let inputs = Inputs::generate(&case);
    let oracle = Oracle::new(&case, &inputs);
    let exact = oracle_outputs(&case, &inputs);
    let v = case.shape.v;
    let with_row = |g: f64, r: usize| {
        let mut out = exact.clone();
        let d = out.tensors.get_mut(&OutputName::Dlogits).unwrap();
        oracle.dlogits_row(&case, &inputs, r, g, |j, x, _| d.data[r * v + j] = x as f32);
        judge(&case, &inputs, &oracle, &out)
            .into_iter()
            .find(|g| g.output == OutputName::Dlogits)
            .unwrap()
    };
    let edge = (0..case.shape.rows())
        .find(|&r| {
            oracle.g_alt[r].is_some_and(|a| (a - oracle.g[r]).abs() > 1e-3 * oracle.g[r].abs())
        })
        .expect("ratio_edges puts a row in the edge band");
    let (g, alt) = (oracle.g[edge], oracle.g_alt[edge].unwrap());
    let r = with_row(alt, edge);
    assert!(r.passed, "the other branch: {}", r.message);
    let r = with_row(2.0 * alt - g, edge);
    assert!(!r.passed, "beyond the other branch: {}", r.message);
    let r = with_row(2.0 * g - alt, edge);
    assert!(!r.passed, "beyond this branch: {}", r.message);
}
