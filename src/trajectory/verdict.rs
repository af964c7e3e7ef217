//! The trajectory gate: an implementation's parameter drift from the exact trajectory
//! must stay within k times the plain-f32 reference's at every step (docs/tolerances.md,
//! "Trajectories", for k and the runs behind it).

use super::run::StepPoint;
use crate::spec::DType;
use serde::{Deserialize, Serialize};

/// The floor of the envelope: f32's unit roundoff 2⁻²⁴, the relative error of storing
/// an exactly updated θ in f32 once (the reference's drift after its first steps can be
/// smaller than that by cancellation; no f32 loop can promise less).
pub const DRIFT_FLOOR: f64 = 5.960464477539063e-8;

/// The least relative travel ‖θ_f64 − θ₀‖/‖θ₀‖ of the exact trajectory over its steps
/// for the trial to judge anything: below it a relative dlm_head bias at the f32 per-call
/// tier's size (the should-fail variant's 5e-5) stays inside the envelope (measured on the
/// ci f32 SGD problem: caught at travel 1.03e-2, missed at 7.4e-3; docs/trajectory.md,
/// "Parameter ranges"). lr 1e-30 or init_std 1e30 travel 0 and pass with drift 0.
pub const MIN_TRAVEL: f64 = 1e-2;

/// k of the gate by dtype of the differentiable input (times `GRPO_TOL_SCALE`).
pub fn k(dtype: DType) -> f64 {
    let base = match dtype {
        DType::F32 => K_F32,
        DType::Bf16 | DType::F16 => K_LOW,
    };
    base * crate::gates::tiers::scale()
}

/// k for f32 cases.
pub const K_F32: f64 = 4.0;
/// k for bf16 and f16 cases.
pub const K_LOW: f64 = 4.0;

/// The gate's verdict over a series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    /// Whether every step is within its bound (and finite).
    pub passed: bool,
    /// k in force.
    pub k: f64,
    /// Per step: the bound k·max(max_{s≤t} drift_reference, DRIFT_FLOOR).
    pub bounds: Vec<f64>,
    /// Steps judged: all of them, or those before the first step at which the
    /// implementation took the other branch than the reference at a branch edge.
    pub judged_steps: usize,
    /// One line: the first violation, or the worst ratio drift/bound.
    pub message: String,
}

/// Judges `points` (steps in order) with `k` against the plain-f32 reference; `steps` is
/// how many the trajectory asked for (a series that stopped early on a non-finite value
/// fails).
pub fn judge(points: &[StepPoint], k: f64, steps: usize) -> Judgement {
    judge_against(points, k, steps, "plain-f32")
}

/// [`judge`] against the honest loop `name`d in the messages (`plain-f32`, `bf16-class`):
/// the points' `drift_reference` and flips are that loop's.
pub fn judge_against(points: &[StepPoint], k: f64, steps: usize, name: &str) -> Judgement {
    let mut env: f64 = 0.0;
    let mut bounds = Vec::with_capacity(points.len());
    let mut worst: Option<(f64, &StepPoint, f64)> = None;
    let mut first_bad: Option<(&StepPoint, f64)> = None;
    let parted = points.iter().find(|p| p.ambiguous_flips > 0);
    let judged: &[StepPoint] = match parted {
        Some(p) => &points[..p.step - 1],
        None => points,
    };
    for p in judged {
        env = env.max(p.drift_reference);
        let bound = k * env.max(DRIFT_FLOOR);
        bounds.push(bound);
        let finite = p.loss_implementation.is_finite() && p.drift_implementation.is_finite();
        let ratio = p.drift_implementation / bound;
        if !finite || !(p.drift_implementation <= bound) || p.branch_flips.is_some_and(|n| n > 0) {
            first_bad.get_or_insert((p, bound));
        }
        if worst.is_none_or(|w| ratio > w.0) {
            worst = Some((ratio, p, bound));
        }
    }
    let last = judged.last();
    let parted_note = parted.map_or(String::new(), |p| {
        format!(
            "; steps {}–{} not judged: at step {} {} token(s) took the other branch than the {name} reference with a clip edge between the two loops' ratios (or within {} of them): either is right, the trajectories part there",
            p.step,
            points.len(),
            p.step,
            p.ambiguous_flips,
            crate::oracle::EDGE_BAND
        )
    });
    let travel = points.iter().map(|p| p.travelled).fold(f64::NAN, f64::max);
    let too_short = first_bad.is_none() && points.len() == steps && !(travel >= MIN_TRAVEL);
    let message = if too_short {
        format!(
            "tests nothing: the exact trajectory travelled {travel:.2e} of ‖θ₀‖ over {steps} steps, under {MIN_TRAVEL:e}, too little for a bias to show (raise lr or steps, or lower init_std: docs/trajectory.md, \"Parameter ranges\")"
        )
    } else if let Some((p, bound)) = first_bad {
        if !(p.loss_implementation.is_finite() && p.drift_implementation.is_finite()) {
            format!(
                "step {}: the implementation's loss {} / parameter drift {} is not finite",
                p.step, p.loss_implementation, p.drift_implementation
            )
        } else if let Some(n) = p.branch_flips.filter(|&n| n > 0) {
            format!(
                "step {}: {n} token(s) clipped the other way than the {name} reference, with no clip edge between the two loops' ratios",
                p.step
            )
        } else {
            format!(
                "step {}: parameter drift ‖θ − θ_f64‖/‖θ_f64‖ {:.3e} > bound {:.3e} = k {k} × the {name} reference's envelope {:.3e}",
                p.step,
                p.drift_implementation,
                bound,
                bound / k
            )
        }
    } else if points.len() < steps {
        format!(
            "the trajectory stopped after {} of {steps} steps",
            points.len()
        )
    } else if let (Some((ratio, p, bound)), Some(l)) = (worst, last) {
        format!(
            "drift within k {k} × the {name} envelope at {} {} steps (worst: step {}, {:.3e} ≤ {:.3e}, {:.2} of the bound); drift at step {} {:.3e} (reference {:.3e}), loss {:.6} (f64 {:.6}){parted_note}",
            if parted.is_some() { "the first" } else { "all" },
            judged.len(),
            p.step,
            p.drift_implementation,
            bound,
            ratio,
            l.step,
            l.drift_implementation,
            l.drift_reference,
            l.loss_implementation,
            l.loss_exact
        )
    } else if parted.is_some() {
        format!("nothing judged{parted_note}")
    } else {
        "no step was run".into()
    };
    Judgement {
        passed: first_bad.is_none() && points.len() == steps && !judged.is_empty() && !too_short,
        k,
        bounds,
        judged_steps: judged.len(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(step: usize, r: f64, i: f64) -> StepPoint {
        StepPoint {
            step,
            loss_exact: 1.0,
            loss_reference: 1.0,
            loss_implementation: 1.0,
            drift_reference: r,
            drift_implementation: i,
            clipped_fraction: 0.0,
            travelled: 0.1 * step as f64,
            branch_flips: Some(0),
            ambiguous_flips: 0,
            sign_flips: 0,
        }
    }

    /// A trajectory that barely moves judges nothing, however small its drift: it fails
    /// with the travel and the remedy; at MIN_TRAVEL it is judged.
    #[test]
    fn a_trajectory_that_does_not_travel_tests_nothing() {
        let mut pts = [pt(1, 1e-9, 1e-9), pt(2, 1e-9, 1e-9)];
        for p in &mut pts {
            p.travelled = MIN_TRAVEL * 0.99;
        }
        let j = judge(&pts, 4.0, 2);
        assert!(
            !j.passed
                && j.message
                    .starts_with("tests nothing: the exact trajectory travelled 9.90e-3"),
            "{}",
            j.message
        );
        pts[1].travelled = MIN_TRAVEL;
        assert!(judge(&pts, 4.0, 2).passed);
        for p in &mut pts {
            p.travelled = f64::NAN;
        }
        assert!(!judge(&pts, 4.0, 2).passed);
    }

    #[test]
    fn the_envelope_is_the_running_max_with_a_floor() {
        let pts = [pt(1, 1e-9, 2e-7), pt(2, 1e-6, 3e-6), pt(3, 5e-7, 3.9e-6)];
        let j = judge(&pts, 4.0, 3);
        assert!(j.passed, "{}", j.message);
        assert_eq!(j.bounds[0], 4.0 * DRIFT_FLOOR);
        assert_eq!(j.bounds[2], 4e-6, "the envelope does not shrink");
        let j = judge(
            &[pt(1, 1e-9, 2e-7), pt(2, 1e-6, 4.1e-6), pt(3, 1e-6, 0.0)],
            4.0,
            3,
        );
        assert!(!j.passed);
        assert!(
            j.message.starts_with("step 2: parameter drift"),
            "{}",
            j.message
        );
    }

    #[test]
    fn a_flip_at_an_edge_ends_the_judged_steps_and_one_elsewhere_fails() {
        let mut pts = vec![pt(1, 1e-7, 1e-7), pt(2, 1e-7, 1e-7), pt(3, 1e-7, 1e-3)];
        pts[2].branch_flips = Some(1);
        pts[2].ambiguous_flips = 1;
        let j = judge(&pts, 4.0, 3);
        assert!(j.passed && j.judged_steps == 2, "{j:?}");
        assert!(j.message.contains("steps 3–3 not judged"), "{}", j.message);
        pts[2].ambiguous_flips = 0;
        let j = judge(&pts, 4.0, 3);
        assert!(
            !j.passed && j.message.contains("no clip edge between"),
            "{}",
            j.message
        );
        let mut one = vec![pt(1, 1e-7, 1e-7)];
        one[0].branch_flips = Some(1);
        one[0].ambiguous_flips = 1;
        let j = judge(&one, 4.0, 1);
        assert!(
            !j.passed && j.message.starts_with("nothing judged"),
            "{}",
            j.message
        );
    }

    #[test]
    fn nan_and_short_series_fail() {
        let j = judge(&[pt(1, 1e-7, f64::NAN)], 4.0, 1);
        assert!(
            !j.passed && j.message.contains("not finite"),
            "{}",
            j.message
        );
        let j = judge(&[pt(1, 1e-7, 1e-7)], 4.0, 2);
        assert!(
            !j.passed && j.message.contains("stopped after 1 of 2"),
            "{}",
            j.message
        );
        assert!(!judge(&[], 4.0, 0).passed);
    }
}
