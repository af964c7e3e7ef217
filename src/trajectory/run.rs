//! The three loops of a trajectory run in lockstep (exact f64, plain-f32 reference,
//! implementation), with the per-step series the verdict and the report read.

use super::exact;
use super::loss_fns::{Eval, LossFn};
use super::optimizer::OptimizerState;
pub use super::point::StepPoint;
use super::problem::Problem;
use crate::cases::trajectory::TrajectorySpec;
use crate::inputs::Inputs;
use anyhow::{Context, Result};
use rayon::prelude::*;

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
fn flips(
    p: &Problem,
    data: &Inputs,
    (old_r, r): (&[f32], &Eval),
    (old_i, i): (&[f32], &Eval),
) -> (usize, usize) {
    let t_n = p.case.shape.t;
    let mut n = 0;
    let mut legit = 0;
    for k in 0..data.mask.len() {
        if data.mask[k] == 0.0 || r.clipped.get(k) == i.clipped.get(k) {
            continue;
        }
        n += 1;
        let lr = r.logp[k] as f64 - old_r[k] as f64;
        let li = i.logp[k] as f64 - old_i[k] as f64;
        if crate::oracle::branch_ambiguous(lr, li, data.advantages[k / t_n] as f64, &p.case.knobs) {
            legit += 1;
        }
    }
    (n, legit)
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
    fn rollout(&mut self, p: &Problem, data: &Inputs) -> Result<()> {
        let e = self.loss.eval(
            &p.case,
            &with_params(data, &data.ref_logp, &self.theta, &p.case),
        )?;
        self.old = e.logp;
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

/// Runs `spec` on `problem`: the exact loop, the plain-f32 `reference` and the
/// `implementation`, step by step; `progress(step)` after each step. Stops at the first
/// step whose implementation values are not finite (that point is the last one returned).
pub fn run(
    problem: &Problem,
    spec: &TrajectorySpec,
    reference: &mut dyn LossFn,
    implementation: &mut dyn LossFn,
    mut progress: impl FnMut(usize),
) -> Result<Vec<StepPoint>> {
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
    let norm0 = norm(&theta_e);
    let mut points = Vec::with_capacity(spec.steps);
    let mut round = 0;
    while points.len() < spec.steps {
        let data = problem.round(round);
        let mut rollout = data.clone();
        rollout.old_logp = data.ref_logp.clone();
        let old_e: Vec<f32> = exact::eval(&problem.case, &rollout, &theta_e)
            .logp
            .iter()
            .map(|&x| x as f32)
            .collect();
        r.rollout(problem, &data).context("plain-f32 reference")?;
        i.rollout(problem, &data)?;
        for _ in 0..spec.num_iterations {
            if points.len() == spec.steps {
                break;
            }
            let mut d = data.clone();
            d.old_logp = old_e.clone();
            let e = exact::eval(&problem.case, &d, &theta_e);
            opt_e.step(&mut theta_e, &e.grad);
            let er = r.step(problem, &data).context("plain-f32 reference")?;
            let ei = i.step(problem, &data)?;
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
                return Ok(points);
            }
        }
        round += 1;
    }
    Ok(points)
}
