//! The three loops of a trajectory run in lockstep (exact f64, plain-f32 reference,
//! implementation), with the per-step series the verdict and the report read.

use super::exact;
use super::loss_fns::{Eval, LossFn};
use super::optimizer::OptimizerState;
pub use super::point::StepPoint;
use super::problem::Problem;
use crate::cases::trajectory::TrajectorySpec;
use crate::inputs::Inputs;
use crate::precision_class::PrecisionClass;
use anyhow::{Context, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// ‖a − b‖ / ‖b‖ in f64.
pub fn drift(a: &[f32], b: &[f64]) -> f64 {
    let (d, n) = a
        .par_iter()
        .zip(b)
        .map(|(&x, &y)| ((x as f64 - y).powi(2), y * y))
        .reduce(|| (0.0, 0.0), |p, q| (p.0 + q.0, p.1 + q.1));
    (d / n).sqrt()
}

/// Clip decisions of the implementation that differ from the reference's (unmasked
/// tokens), and how many of them may legitimately differ: a branch edge lies between (or
/// within `oracle::EDGE_BAND` of) the two loops' own log-ratios for the token.
///
/// Without both loops' `clipped` the decisions cannot be compared: the count of flips is
/// None (left out, [`Series::left_out`] says why), and the legitimate ones are the tokens
/// that may have flipped, those with an edge between the two log-ratios (0 without both
/// loops' logp: nothing is known of the implementation's ratios).
fn flips(
    p: &Problem,
    data: &Inputs,
    (old_r, r): (&[f32], &Eval),
    (old_i, i): (&[f32], &Eval),
) -> (Option<usize>, usize) {
    let t_n = p.case.shape.t;
    let (Some(lp_r), Some(lp_i)) = (&r.logp, &i.logp) else {
        return (None, 0);
    };
    let clipped = r.clipped.as_ref().zip(i.clipped.as_ref());
    let mut n = 0;
    let mut legit = 0;
    for k in 0..data.mask.len() {
        if data.mask[k] == 0.0 || clipped.is_some_and(|(a, b)| a[k] == b[k]) {
            continue;
        }
        n += 1;
        let lr = lp_r[k] as f64 - old_r[k] as f64;
        let li = lp_i[k] as f64 - old_i[k] as f64;
        if crate::oracle::branch_ambiguous(lr, li, data.advantages[k / t_n] as f64, &p.case.knobs) {
            legit += 1;
        }
    }
    (clipped.map(|_| n), legit)
}

fn norm(x: &[f64]) -> f64 {
    x.par_iter().map(|&y| y * y).sum::<f64>().sqrt()
}

fn with_params(data: &Inputs, old: &[f32], theta: &[f32], case: &crate::cases::Case) -> Inputs {
    let dt = case.dtype;
    Inputs {
        lm_head: theta.iter().map(|&x| dt.round(x)).collect(),
        old_logp: old.to_vec(),
        ..data.clone()
    }
}

/// An f32 loop: parameters, optimizer, and how it evaluates the loss.
struct F32Loop<'a> {
    theta: Vec<f32>,
    opt: OptimizerState<f32>,
    loss: &'a mut dyn LossFn,
    old: Vec<f32>,
}

impl F32Loop<'_> {
    /// The loop's own logp at its parameters becomes its old_logp; an implementation that
    /// gives no logp takes `exact`, the exact loop's.
    fn rollout(&mut self, p: &Problem, data: &Inputs, exact: &[f32]) -> Result<()> {
        let e = self.loss.eval(
            &p.case,
            &with_params(data, &data.ref_logp, &self.theta, &p.case),
        )?;
        self.old = e.logp.unwrap_or_else(|| exact.to_vec());
        Ok(())
    }

    fn step(&mut self, p: &Problem, data: &Inputs) -> Result<Eval> {
        let e = self
            .loss
            .eval(&p.case, &with_params(data, &self.old, &self.theta, &p.case))?;
        anyhow::ensure!(
            e.dlm_head.len() == self.theta.len(),
            "dlm_head has {} elements, the LM head {}",
            e.dlm_head.len(),
            self.theta.len()
        );
        self.opt.step(&mut self.theta, &e.dlm_head);
        Ok(e)
    }
}

/// One step of a precision class's honest loop, against the implementation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClassStep {
    /// ‖θ_class − θ_f64‖ / ‖θ_f64‖ after the step.
    #[serde(deserialize_with = "crate::gates::nan_if_null")]
    pub drift: f64,
    /// Unmasked tokens the implementation clipped the other way than this loop (None:
    /// not counted, the implementation gives no `clipped`).
    pub branch_flips: Option<usize>,
    /// Of those, the ones with a clip edge between the two loops' log-ratios.
    pub ambiguous_flips: usize,
}

/// A precision class's honest loop over a trajectory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassSeries {
    /// The class.
    pub class: PrecisionClass,
    /// Per step.
    pub steps: Vec<ClassStep>,
    /// Fraction of the dlm_head elements whose sign at step 1 agrees with the exact
    /// gradient's (elements where the exact gradient is 0 not counted).
    #[serde(deserialize_with = "crate::gates::nan_if_null")]
    pub sign_agreement: f64,
}

impl ClassSeries {
    /// `points` with this loop in place of the plain-f32 reference (drift and flips), for
    /// the gate.
    pub fn as_points(&self, points: &[StepPoint]) -> Vec<StepPoint> {
        points
            .iter()
            .zip(&self.steps)
            .map(|(p, c)| StepPoint {
                drift_reference: c.drift,
                branch_flips: c.branch_flips,
                ambiguous_flips: c.ambiguous_flips,
                ..*p
            })
            .collect()
    }
}

/// What the loops of a trajectory recorded.
#[derive(Debug, Clone)]
pub struct Series {
    /// Per step, the exact loop, the plain-f32 reference and the implementation.
    pub points: Vec<StepPoint>,
    /// Each extra precision class's honest loop (in the order given to [`run`]).
    pub classes: Vec<ClassSeries>,
    /// Step 1's dlm_head sign agreement with the exact gradient: the plain-f32
    /// reference's and the implementation's.
    pub sign_agreement: (f64, f64),
    /// Figures left out and why (an implementation that declares `clipped` or
    /// `per_token_logp` not provided).
    pub left_out: Vec<String>,
}

/// Fraction of `g`'s elements whose sign agrees with `exact`'s (exact zeros skipped).
fn sign_agreement(g: &[f32], exact: &[f64]) -> f64 {
    let (agree, n) = g
        .par_iter()
        .zip(exact)
        .filter(|(_, &e)| e != 0.0)
        .map(|(&x, &e)| (usize::from((x > 0.0) == (e > 0.0) && x != 0.0), 1usize))
        .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    agree as f64 / n as f64
}

/// Runs `spec` on `problem`: the exact loop, the plain-f32 `reference`, the honest loop of
/// each precision class in `classes` and the `implementation`, step by step;
/// `progress(step)` after each step. Stops at the first step whose implementation values
/// are not finite (that point is the last one returned).
pub fn run(
    problem: &Problem,
    spec: &TrajectorySpec,
    reference: &mut dyn LossFn,
    classes: &mut [(PrecisionClass, &mut dyn LossFn)],
    implementation: &mut dyn LossFn,
    mut progress: impl FnMut(usize),
) -> Result<Series> {
    let n = problem.theta0.len();
    let mut theta_e: Vec<f64> = problem.theta0.iter().map(|&x| x as f64).collect();
    let mut opt_e = OptimizerState::<f64>::new(spec.optimizer, spec.lr, n);
    let mut r = F32Loop {
        theta: problem.theta0.clone(),
        opt: OptimizerState::new(spec.optimizer, spec.lr, n),
        loss: reference,
        old: Vec::new(),
    };
    let mut i = F32Loop {
        theta: problem.theta0.clone(),
        opt: OptimizerState::new(spec.optimizer, spec.lr, n),
        loss: implementation,
        old: Vec::new(),
    };
    let names: Vec<PrecisionClass> = classes.iter().map(|c| c.0).collect();
    let mut class_loops: Vec<F32Loop> = classes
        .iter_mut()
        .map(|(_, loss)| F32Loop {
            theta: problem.theta0.clone(),
            opt: OptimizerState::new(spec.optimizer, spec.lr, n),
            loss: &mut **loss,
            old: Vec::new(),
        })
        .collect();
    let mut class_series: Vec<ClassSeries> = names
        .iter()
        .map(|c| ClassSeries {
            class: *c,
            steps: Vec::with_capacity(spec.steps),
            sign_agreement: f64::NAN,
        })
        .collect();
    let mut agreement = (f64::NAN, f64::NAN);
    let mut left_out = Vec::new();
    let norm0 = norm(&theta_e);
    let mut points = Vec::with_capacity(spec.steps);
    let mut round = 0;
    'rounds: while points.len() < spec.steps {
        let data = problem.round(round);
        let mut rollout = data.clone();
        rollout.old_logp = data.ref_logp.clone();
        let old_e: Vec<f32> = exact::eval(&problem.case, &rollout, &theta_e)
            .logp
            .iter()
            .map(|&x| x as f32)
            .collect();
        r.rollout(problem, &data, &old_e)
            .context("plain-f32 reference")?;
        for (c, l) in names.iter().zip(&mut class_loops) {
            l.rollout(problem, &data, &old_e)
                .with_context(|| format!("the {c} class's reference"))?;
        }
        i.rollout(problem, &data, &old_e)?;
        for _ in 0..spec.num_iterations {
            if points.len() == spec.steps {
                break;
            }
            let mut d = data.clone();
            d.old_logp = old_e.clone();
            let e = exact::eval(&problem.case, &d, &theta_e);
            opt_e.step(&mut theta_e, &e.grad);
            let er = r.step(problem, &data).context("plain-f32 reference")?;
            let mut ecs = Vec::with_capacity(class_loops.len());
            for (c, l) in names.iter().zip(&mut class_loops) {
                ecs.push(
                    l.step(problem, &data)
                        .with_context(|| format!("the {c} class's reference"))?,
                );
            }
            let ei = i.step(problem, &data)?;
            for ((series, l), ec) in class_series.iter_mut().zip(&class_loops).zip(&ecs) {
                let (branch_flips, ambiguous_flips) =
                    flips(problem, &data, (&l.old, ec), (&i.old, &ei));
                series.steps.push(ClassStep {
                    drift: drift(&l.theta, &theta_e),
                    branch_flips,
                    ambiguous_flips,
                });
                if points.is_empty() {
                    series.sign_agreement = sign_agreement(&ec.dlm_head, &e.grad);
                }
            }
            if points.is_empty() {
                agreement = (
                    sign_agreement(&er.dlm_head, &e.grad),
                    sign_agreement(&ei.dlm_head, &e.grad),
                );
                left_out = left_out_of(&ei);
            }
            let (branch_flips, ambiguous_flips) =
                flips(problem, &data, (&r.old, &er), (&i.old, &ei));
            let p = StepPoint {
                step: points.len() + 1,
                loss_exact: e.loss,
                loss_reference: er.loss,
                loss_implementation: ei.loss,
                drift_reference: drift(&r.theta, &theta_e),
                drift_implementation: drift(&i.theta, &theta_e),
                clipped_fraction: e.clipped_fraction,
                travelled: drift(&problem.theta0, &theta_e) * norm(&theta_e) / norm0,
                branch_flips,
                ambiguous_flips,
                sign_flips: er
                    .dlm_head
                    .par_iter()
                    .zip(&ei.dlm_head)
                    .filter(|(a, b)| {
                        (a.is_sign_negative() != b.is_sign_negative()) && (**a != 0.0 || **b != 0.0)
                    })
                    .count(),
            };
            points.push(p);
            progress(p.step);
            if !(p.loss_implementation.is_finite() && p.drift_implementation.is_finite()) {
                break 'rounds;
            }
        }
        round += 1;
    }
    Ok(Series {
        points,
        classes: class_series,
        sign_agreement: agreement,
        left_out,
    })
}

/// What a trajectory leaves out for an implementation that does not give every output
/// (a whole-loss library): each figure and why.
fn left_out_of(e: &Eval) -> Vec<String> {
    let mut out = Vec::new();
    if e.logp.is_none() {
        out.push("the implementation's own logp (it gives no `per_token_logp`): each rollout's old_logp is the exact loop's".to_string());
    }
    if e.clipped.is_none() {
        out.push("branch flips (the implementation gives no `clipped`): not counted; a token with a clip edge between the two loops' log-ratios parts the trajectories".to_string());
    }
    out
}
