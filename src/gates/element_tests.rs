//! The judge tests itself: every output, at its first, a middle and its last element, is
//! made wrong in exactly that element (a large error, NaN, +Inf, −Inf), and the gate
//! must fail naming that element; a wrong shape or a missing output fails too. The same
//! for the invariance check. A gate that compares only part of an output (its first row,
//! every element but the last) fails these tests.

use super::invariance::judge_invariance;
use super::*;
use crate::cases::parse_fixed;
use crate::oracle::outputs::oracle_outputs;
use crate::oracle::Oracle;
use proptest::prelude::*;
use std::sync::OnceLock;

/// A prepared case: inputs, oracle and the oracle's own outputs (which pass every gate).
struct Prepared {
    case: Case,
    inputs: Inputs,
    oracle: Oracle,
    exact: Outputs,
}

fn prepare(fixed: &str) -> Prepared {
    let case = parse_fixed(fixed).unwrap();
    let inputs = Inputs::generate(&case);
    let oracle = Oracle::new(&case, &inputs);
    let exact = oracle_outputs(&case, &inputs);
    Prepared {
        case,
        inputs,
        oracle,
        exact,
    }
}

/// A logits-level case (β > 0: kl is judged) and a fused one; every position unmasked.
fn cases() -> &'static [Prepared; 2] {
    static P: OnceLock<[Prepared; 2]> = OnceLock::new();
    P.get_or_init(|| {
        [
            prepare("b: 2, t: 3, v: 37, dtype: f32, beta: 0.04, mask: all"),
            prepare("level: fused, b: 2, t: 3, h: 5, v: 37, dtype: f32, beta: 0.04, mask: all"),
        ]
    })
}

/// How one element is made wrong.
#[derive(Debug, Clone, Copy)]
enum Wrong {
    Off,
    Nan,
    PosInf,
    NegInf,
}

impl Wrong {
    fn apply(self, out: OutputName, x: f32) -> f32 {
        match (self, out) {
            // A flag can only be wrong by flipping.
            (Wrong::Off, OutputName::Clipped) => 1.0 - x,
            (Wrong::Off, _) => x + 1.0 + 2.0 * x.abs(),
            (Wrong::Nan, _) => f32::NAN,
            (Wrong::PosInf, _) => f32::INFINITY,
            (Wrong::NegInf, _) => f32::NEG_INFINITY,
        }
    }
}

/// `p.exact` with element `i` of `out` made wrong.
fn with_wrong(p: &Prepared, out: OutputName, i: usize, how: Wrong) -> Outputs {
    let mut o = p.exact.clone();
    let t = o.tensors.get_mut(&out).unwrap();
    t.data[i] = how.apply(out, t.data[i]);
    o
}

/// Asserts the gates fail on exactly `out` and that its message names element `i`.
fn assert_caught(p: &Prepared, reports: &[GateReport], out: OutputName, i: usize, what: &str) {
    let shape = &p.exact.get(out).unwrap().shape;
    let at = index(shape, i);
    for r in reports {
        if r.output == out {
            assert!(!r.passed, "{what}: {out} passed: {}", r.message);
            assert!(
                r.message.contains(&at),
                "{what}: {out}: the message does not name {at}: {}",
                r.message
            );
        } else {
            assert!(
                r.passed || !r.provided,
                "{what}: {} failed: {}",
                r.output,
                r.message
            );
        }
    }
    assert!(
        reports.iter().any(|r| r.output == out),
        "{what}: {out} not judged"
    );
}

/// Flat positions of an output worth testing: first, middle, last (and for a flag, the
/// ones the oracle does not leave ambiguous).
fn positions(p: &Prepared, out: OutputName) -> Vec<usize> {
    let n = p.exact.get(out).unwrap().data.len();
    let mut v = vec![0, n / 2, n - 1];
    v.dedup();
    if out == OutputName::Clipped {
        v.retain(|&i| !p.oracle.clipped_ambiguous[i]);
        assert!(!v.is_empty());
    }
    v
}

#[test]
fn the_oracle_outputs_pass_every_gate() {
    for p in cases() {
        let r = judge(&p.case, &p.inputs, &p.oracle, &p.exact);
        assert_eq!(r.len(), expected_shapes(&p.case).len());
        assert!(r.iter().all(|g| g.passed), "{r:?}");
        let r = judge_invariance(&p.case, &p.inputs, &p.oracle, &p.exact, &p.exact);
        assert!(r.iter().all(|g| g.passed), "{r:?}");
    }
}

#[test]
fn one_wrong_element_anywhere_in_any_output_fails_naming_it() {
    for p in cases() {
        for (out, _) in expected_shapes(&p.case) {
            for i in positions(p, out) {
                for how in [Wrong::Off, Wrong::Nan, Wrong::PosInf, Wrong::NegInf] {
                    let got = with_wrong(p, out, i, how);
                    let what = format!("{} {how:?} at {i}", p.case.id);
                    let r = judge(&p.case, &p.inputs, &p.oracle, &got);
                    assert_caught(p, &r, out, i, &what);
                    // The same outputs as a multi-device run against the one-device run.
                    let r = judge_invariance(&p.case, &p.inputs, &p.oracle, &got, &p.exact);
                    assert_caught(p, &r, out, i, &format!("invariance: {what}"));
                }
            }
        }
    }
}

#[test]
fn a_wrong_shape_or_a_missing_output_fails() {
    for p in cases() {
        for (out, shape) in expected_shapes(&p.case) {
            // One element short, and the right count in the wrong shape.
            let mut short = p.exact.clone();
            short.tensors.get_mut(&out).unwrap().data.pop();
            let mut reshaped = p.exact.clone();
            let t = reshaped.tensors.get_mut(&out).unwrap();
            t.shape = vec![t.data.len(), 1];
            let mut missing = p.exact.clone();
            missing.tensors.remove(&out);
            for (what, got, want) in [
                ("short", &short, "elements), expected"),
                (
                    "reshaped",
                    &reshaped,
                    &format!("expected {shape:?}") as &str,
                ),
                (
                    "missing",
                    &missing,
                    "missing from the implementation's outputs",
                ),
            ] {
                let r = judge(&p.case, &p.inputs, &p.oracle, got);
                let g = r.iter().find(|g| g.output == out).unwrap();
                assert!(
                    !g.passed && g.message.contains(want),
                    "{what} {out}: {}",
                    g.message
                );
            }
            // Invariance: a different shape from the one-device run, or no output.
            for got in [&reshaped, &missing] {
                let r = judge_invariance(&p.case, &p.inputs, &p.oracle, got, &p.exact);
                let g = r.iter().find(|g| g.output == out).unwrap();
                assert!(!g.passed, "invariance {out}: {}", g.message);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Any element of any output, made wrong in any way, fails its gate by name.
    #[test]
    fn any_single_wrong_element_is_caught(
        which in 0usize..2,
        out_k in 0usize..16,
        pos in any::<prop::sample::Index>(),
        how in prop::sample::select(vec![Wrong::Off, Wrong::Nan, Wrong::PosInf, Wrong::NegInf]),
    ) {
        let p = &cases()[which];
        let outs = expected_shapes(&p.case);
        let out = outs[out_k % outs.len()].0;
        let n = p.exact.get(out).unwrap().data.len();
        let i = pos.index(n);
        prop_assume!(out != OutputName::Clipped || !p.oracle.clipped_ambiguous[i]);
        let got = with_wrong(p, out, i, how);
        let r = judge(&p.case, &p.inputs, &p.oracle, &got);
        assert_caught(p, &r, out, i, &format!("{how:?} at {i}"));
    }
}
