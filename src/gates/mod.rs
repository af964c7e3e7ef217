//! Gates: an implementation's outputs against the oracle, output by output.
//!
//! Every gate is norm-wise plus worst-element (see [`tiers::Tolerance`]); NaN or Inf in an
//! output fails whatever the tolerance. Per-token loss, kl and clipped are compared where
//! mask = 1 (SPEC leaves masked positions free); kl only when β ≠ 0 (ref_logp is unread
//! otherwise). Rows whose ratio sits within `oracle::EDGE_BAND` of a branch edge accept
//! either branch's gradient.

mod fused_branch;
pub mod invariance;
pub mod tiers;

use crate::cases::Case;
use crate::inputs::Inputs;
use crate::oracle::Oracle;
use crate::outputs::{OutTensor, Outputs};
use crate::spec::{Level, OutputName};
pub use invariance::judge_invariance;
use rayon::prelude::*;
use serde::Serialize;
pub use tiers::{tolerance, Tolerance};

/// The verdict of one output.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct GateReport {
    /// Which output.
    pub output: OutputName,
    /// Whether it is within tolerance (and finite).
    pub passed: bool,
    /// ‖out−ref‖₂ / ‖ref‖₂ (0 when both are 0, inf when only ref is 0). NaN when nothing
    /// numeric was compared (JSON has no NaN: written as null, read back as NaN).
    #[serde(deserialize_with = "nan_if_null")]
    pub norm_err: f64,
    /// max |out−ref| (NaN / null as for `norm_err`).
    #[serde(deserialize_with = "nan_if_null")]
    pub max_abs_err: f64,
    /// Elements compared.
    pub compared: usize,
    /// Fraction of the norm-wise bound the error uses (‖out−ref‖ / bound; ≤ 1 passes that
    /// check): the gate's margin, plotted by `grpo-suite report`.
    #[serde(default, deserialize_with = "nan_if_null")]
    pub bound_used: f64,
    /// The bounds applied.
    #[serde(skip, default)]
    pub tolerance: Tolerance,
    /// `tier/dtype` the bounds came from.
    pub tier: String,
    /// One line: what failed, where, both values, the tier (or a summary when passing).
    pub message: String,
    /// False when the implementation declares it does not produce this output (then
    /// nothing was compared: `compared` is 0 and the message says so).
    #[serde(default = "provided_default")]
    pub provided: bool,
    /// The reference itself is not finite here: nothing can be judged, and the trial is an
    /// ERROR of the case, never a pass or an implementation's failure.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oracle_nonfinite: bool,
    /// Elements of the output that are not finite (NaN or ±inf): what an expected failure
    /// states as `non_finite_<output>` (a kernel that turns masked garbage into NaN).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub non_finite: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn provided_default() -> bool {
    true
}

/// serde_json writes a non-finite f64 as null; read null back as NaN.
pub fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    use serde::Deserialize;
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Streaming accumulator of one comparison.
#[derive(Debug, Clone)]
struct Acc {
    n: usize,
    d2: f64,
    r2: f64,
    s2: f64,
    rinf: f64,
    dmax: f64,
    excess: f64,
    worst: Option<(usize, f64, f64)>,
    nonfinite: Option<(usize, f32)>,
    /// How many values are not finite.
    n_nonfinite: usize,
    /// The first reference value that is not finite (the case is outside the contract).
    ref_nonfinite: Option<(usize, f64)>,
}

impl Default for Acc {
    fn default() -> Self {
        Acc {
            n: 0,
            d2: 0.0,
            r2: 0.0,
            s2: 0.0,
            rinf: 0.0,
            dmax: 0.0,
            excess: f64::NEG_INFINITY,
            worst: None,
            nonfinite: None,
            n_nonfinite: 0,
            ref_nonfinite: None,
        }
    }
}

impl Acc {
    fn add(&mut self, i: usize, got: f32, want: f64, scale: f64, floor: f64) {
        self.n += 1;
        if !want.is_finite() {
            if self.ref_nonfinite.is_none() {
                self.ref_nonfinite = Some((i, want));
            }
            return;
        }
        if !got.is_finite() {
            if self.nonfinite.is_none() {
                self.nonfinite = Some((i, got));
            }
            self.n_nonfinite += 1;
            return;
        }
        let d = (got as f64 - want).abs();
        self.d2 += d * d;
        self.r2 += want * want;
        self.s2 += scale * scale;
        self.rinf = self.rinf.max(want.abs());
        self.dmax = self.dmax.max(d);
        let e = d - floor * scale;
        if e > self.excess {
            self.excess = e;
            self.worst = Some((i, got as f64, want));
        }
    }

    fn merge(mut self, o: Acc) -> Acc {
        self.n += o.n;
        self.d2 += o.d2;
        self.r2 += o.r2;
        self.s2 += o.s2;
        self.rinf = self.rinf.max(o.rinf);
        self.dmax = self.dmax.max(o.dmax);
        if o.excess > self.excess {
            self.excess = o.excess;
            self.worst = o.worst;
        }
        self.n_nonfinite += o.n_nonfinite;
        self.nonfinite = match (self.nonfinite, o.nonfinite) {
            (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
            (a, b) => a.or(b),
        };
        self.ref_nonfinite = match (self.ref_nonfinite, o.ref_nonfinite) {
            (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
            (a, b) => a.or(b),
        };
        self
    }

    fn report(
        &self,
        output: OutputName,
        shape: &[usize],
        tol: Tolerance,
        tier: String,
    ) -> GateReport {
        if let Some((i, w)) = self.ref_nonfinite {
            return GateReport {
                oracle_nonfinite: true,
                ..fail(
                    output,
                    tier,
                    format!(
                        "the oracle is not finite at {} ({w}): the case is outside the f32 contract",
                        index(shape, i)
                    ),
                )
            };
        }
        let norm_err = if self.r2 > 0.0 {
            (self.d2 / self.r2).sqrt()
        } else if self.d2 == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        let mut passed = true;
        let mut why = Vec::new();
        if let Some((i, x)) = self.nonfinite {
            passed = false;
            why.push(format!("non-finite value {x} at {}", index(shape, i)));
        }
        let norm_bound = tol.norm_rel * self.r2.sqrt() + tol.floor * self.s2.sqrt();
        if self.d2.sqrt() > norm_bound {
            passed = false;
            why.push(format!(
                "abs norm error ‖got − want‖ {:.3e} > bound {:.3e} (rel {norm_err:.2e}, the table's figure)",
                self.d2.sqrt(),
                norm_bound
            ));
        }
        let max_bound = tol.max_rel * self.rinf;
        if self.excess > max_bound {
            passed = false;
            why.push(format!(
                "worst element exceeds its bound by {:.3e} (max_rel·‖ref‖∞ = {:.3e})",
                self.excess, max_bound
            ));
        }
        let worst = match self.worst {
            Some((i, g, w)) => format!("worst at {}: got {g:.9e}, want {w:.9e}", index(shape, i)),
            None => "no finite element".into(),
        };
        let message = if passed {
            format!(
                "{output}: ok, rel {norm_err:.2e}, max {:.2e} over {} ({tier})",
                self.dmax, self.n
            )
        } else {
            format!("{output}: FAIL {}; {worst}; tier {tier}", why.join("; "))
        };
        let bound_used = if norm_bound > 0.0 {
            self.d2.sqrt() / norm_bound
        } else if self.d2 == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        GateReport {
            output,
            passed,
            norm_err,
            max_abs_err: self.dmax,
            compared: self.n,
            bound_used,
            tolerance: tol,
            tier,
            message,
            provided: true,
            oracle_nonfinite: false,
            non_finite: self.n_nonfinite,
        }
    }
}

/// Formats a flat index as a multi-index of `shape`.
pub fn index(shape: &[usize], mut i: usize) -> String {
    if shape.is_empty() {
        return "[]".into();
    }
    let mut idx = vec![0; shape.len()];
    for (k, &d) in shape.iter().enumerate().rev() {
        idx[k] = i % d.max(1);
        i /= d.max(1);
    }
    format!("{idx:?}")
}

/// A failed gate that compared nothing (a missing or misshapen output): `message` says why.
pub fn fail(output: OutputName, tier: String, message: String) -> GateReport {
    GateReport {
        output,
        passed: false,
        norm_err: f64::NAN,
        max_abs_err: f64::NAN,
        compared: 0,
        bound_used: f64::NAN,
        tolerance: Tolerance {
            norm_rel: 0.0,
            max_rel: 0.0,
            floor: 0.0,
        },
        tier,
        message: format!("{output}: FAIL {message}"),
        provided: true,
        oracle_nonfinite: false,
        non_finite: 0,
    }
}

/// Expected shape of every output of a case.
pub fn expected_shapes(case: &Case) -> Vec<(OutputName, Vec<usize>)> {
    let s = case.shape;
    let mut v = vec![(OutputName::Loss, vec![])];
    for o in OutputName::PER_TOKEN {
        v.push((o, vec![s.b, s.t]));
    }
    match case.level {
        Level::Logits => v.push((OutputName::Dlogits, vec![s.b, s.t, s.v])),
        Level::Fused => {
            let h = s.h.unwrap_or(0);
            v.push((OutputName::Dhidden, vec![s.b, s.t, h]));
            v.push((OutputName::DlmHead, vec![h, s.v]));
        }
    }
    v
}

/// A passing report of an output whose values are not compared (the message says why).
fn unjudged(output: OutputName, tolerance: Tolerance, tier: String, message: String) -> GateReport {
    GateReport {
        output,
        passed: true,
        norm_err: 0.0,
        max_abs_err: 0.0,
        compared: 0,
        bound_used: 0.0,
        tolerance,
        tier,
        message,
        provided: true,
        oracle_nonfinite: false,
        non_finite: 0,
    }
}

/// Judges every output of `got` for `case`; one report per expected output.
pub fn judge(case: &Case, inputs: &Inputs, oracle: &Oracle, got: &Outputs) -> Vec<GateReport> {
    let mut reports = Vec::new();
    for (name, shape) in expected_shapes(case) {
        let tol = tolerance(case.tier, case.dtype, name);
        let tier = format!("{}/{}", case.tier, case.dtype);
        if got.not_provided.contains(&name) {
            let message = format!("{name}: not provided by the implementation (not gated)");
            reports.push(GateReport {
                provided: false,
                ..unjudged(name, tol, tier, message)
            });
            continue;
        }
        let t = match got.get(name) {
            None => {
                reports.push(fail(
                    name,
                    tier,
                    "missing from the implementation's outputs".into(),
                ));
                continue;
            }
            Some(t) => t,
        };
        if t.shape != shape || t.data.len() != shape.iter().product::<usize>() {
            reports.push(fail(
                name,
                tier,
                format!(
                    "shape {:?} ({} elements), expected {shape:?}",
                    t.shape,
                    t.data.len()
                ),
            ));
            continue;
        }
        if name == OutputName::Kl && case.knobs.beta == 0.0 {
            // Not judged: with β = 0 ref_logp is unread, kl is whatever the kernel writes,
            // but it must still be finite.
            reports.push(match t.data.iter().position(|x| !x.is_finite()) {
                Some(i) => fail(
                    name,
                    tier,
                    format!("non-finite value at {} (β = 0)", index(&shape, i)),
                ),
                None => unjudged(
                    name,
                    tol,
                    tier,
                    "kl: finite; values not judged (β = 0 leaves ref_logp unread)".into(),
                ),
            });
            continue;
        }
        let report = match name {
            OutputName::Loss => {
                let mut acc = Acc::default();
                acc.add(0, t.data[0], oracle.loss, oracle.loss_scale, tol.floor);
                acc.report(name, &shape, tol, tier)
            }
            OutputName::Clipped => judge_clipped(case, inputs, oracle, t, tier),
            OutputName::PerTokenLogp | OutputName::Entropy => {
                let want = if name == OutputName::Entropy {
                    oracle.entropy()
                } else {
                    oracle.per_token_logp()
                };
                per_token(t, want, &oracle.scale_logp, |_| true, tol)
                    .report(name, &shape, tol, tier)
            }
            OutputName::PerTokenLoss => per_token(
                t,
                &oracle.per_token_loss,
                &oracle.scale_loss,
                |i| inputs.mask[i] != 0.0,
                tol,
            )
            .report(name, &shape, tol, tier),
            OutputName::Kl => per_token(
                t,
                &oracle.kl,
                &oracle.scale_kl,
                |i| inputs.mask[i] != 0.0,
                tol,
            )
            .report(name, &shape, tol, tier),
            OutputName::Dlogits => {
                judge_dlogits(case, inputs, oracle, t, tol).report(name, &shape, tol, tier)
            }
            OutputName::Dhidden | OutputName::DlmHead => {
                // Computed once per oracle (so once per prepared case), shared by every trial.
                let g = oracle.fused_grads(case, inputs);
                let branches = oracle.fused_branch_rows(case, inputs);
                let (h, v) = (case.shape.h.unwrap_or(0), case.shape.v);
                let (acc, moved) = if name == OutputName::Dhidden {
                    fused_branch::dhidden(&t.data, &g.dhidden, h, branches)
                } else {
                    fused_branch::dlm_head(&t.data, &g.dlm_head, h, v, inputs, branches)
                };
                let mut report = acc.report(name, &shape, tol, tier);
                if moved > 0 {
                    report.message += &format!(
                        " ({moved} of {} token rows at a clip edge judged on their other branch)",
                        branches.len()
                    );
                }
                report
            }
        };
        reports.push(report);
    }
    reports
}

fn per_token(
    t: &OutTensor,
    want: &[f64],
    scale: &[f64],
    include: impl Fn(usize) -> bool,
    tol: Tolerance,
) -> Acc {
    let mut acc = Acc::default();
    for (i, (&x, &w)) in t.data.iter().zip(want).enumerate() {
        if include(i) {
            acc.add(i, x, w, scale[i], tol.floor);
        } else if !x.is_finite() && acc.nonfinite.is_none() {
            acc.nonfinite = Some((i, x));
        }
    }
    acc
}

fn judge_clipped(
    case: &Case,
    inputs: &Inputs,
    oracle: &Oracle,
    t: &OutTensor,
    tier: String,
) -> GateReport {
    let shape = vec![case.shape.b, case.shape.t];
    let mut wrong = Vec::new();
    let mut n = 0;
    for (i, &x) in t.data.iter().enumerate() {
        if !(x == 0.0 || x == 1.0) {
            return fail(
                OutputName::Clipped,
                tier,
                format!("value {x} at {} is not 0 or 1", index(&shape, i)),
            );
        }
        if inputs.mask[i] == 0.0 || oracle.clipped_ambiguous[i] {
            continue;
        }
        n += 1;
        if (x == 1.0) != oracle.clipped[i] {
            wrong.push(i);
        }
    }
    let tol = Tolerance {
        norm_rel: 0.0,
        max_rel: 0.0,
        floor: 0.0,
    };
    match wrong.first() {
        None => GateReport {
            output: OutputName::Clipped,
            passed: true,
            norm_err: 0.0,
            max_abs_err: 0.0,
            compared: n,
            bound_used: 0.0,
            tolerance: tol,
            tier: tier.clone(),
            message: format!("clipped: ok, exact over {n} ({tier})"),
            provided: true,
            oracle_nonfinite: false,
            non_finite: 0,
        },
        Some(&i) => fail(
            OutputName::Clipped,
            tier,
            format!(
                "{} of {n} tokens differ; first at {}: got {}, want {}",
                wrong.len(),
                index(&shape, i),
                t.data[i],
                oracle.clipped[i] as u8
            ),
        ),
    }
}

fn judge_dlogits(
    case: &Case,
    inputs: &Inputs,
    oracle: &Oracle,
    t: &OutTensor,
    tol: Tolerance,
) -> Acc {
    let v = case.shape.v;
    (0..case.shape.rows())
        .into_par_iter()
        .map_init(
            || vec![(0f64, 0f64); v],
            |want, r| {
                let got = &t.data[r * v..(r + 1) * v];
                let row_acc = |g: f64, want: &mut Vec<(f64, f64)>| {
                    oracle.dlogits_row(case, inputs, r, g, |j, x, s| want[j] = (x, s));
                    let mut acc = Acc::default();
                    for (j, (&x, &(w, s))) in got.iter().zip(want.iter()).enumerate() {
                        acc.add(r * v + j, x, w, s, tol.floor);
                    }
                    acc
                };
                let a = row_acc(oracle.g[r], want);
                match oracle.g_alt[r] {
                    Some(g2) => {
                        let b = row_acc(g2, want);
                        if b.d2 < a.d2 {
                            b
                        } else {
                            a
                        }
                    }
                    None => a,
                }
            },
        )
        .reduce(Acc::default, Acc::merge)
}

#[cfg(test)]
mod bound_tests;
#[cfg(test)]
mod element_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_finite_reference_never_passes() {
        // Whatever the implementation returns, a reference value that is not finite makes
        // the gate fail (the runner turns it into an ERROR of the case), at any position.
        let tol = Tolerance {
            norm_rel: 1e-3,
            max_rel: 1e-2,
            floor: 1e-6,
        };
        for bad in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
            for at in [0usize, 2, 4] {
                for got in [1.0f32, f32::INFINITY, f32::NAN] {
                    let mut acc = Acc::default();
                    for i in 0..5 {
                        let want = if i == at { bad } else { 1.0 };
                        acc.add(i, if i == at { got } else { 1.0 }, want, 1.0, tol.floor);
                    }
                    let r = acc.report(OutputName::Dlogits, &[5], tol, "standard/f32".into());
                    assert!(!r.passed, "{bad} at {at}, got {got}: {}", r.message);
                    assert!(r.oracle_nonfinite);
                    assert!(
                        r.message.contains(&format!(
                            "the oracle is not finite at [{at}] ({bad}): the case is outside the f32 contract"
                        )),
                        "{}",
                        r.message
                    );
                }
            }
        }
    }

    #[test]
    fn a_failed_gate_with_nan_errors_survives_a_json_round_trip() {
        // Found when a wrong external kernel failed `clipped`: the record could not be read back.
        let r = fail(
            OutputName::Clipped,
            "standard/bf16".into(),
            "3 of 16 flags differ".into(),
        );
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"norm_err\":null"), "{text}");
        let back: GateReport = serde_json::from_str(&text).unwrap();
        assert!(
            back.norm_err.is_nan() && back.max_abs_err.is_nan() && !back.passed && back.provided
        );
    }
}
