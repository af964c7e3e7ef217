//! Trajectory conformance (docs/trajectory.md): N GRPO steps of a tiny, fully specified
//! training problem with an implementation's loss, against the same steps in exact
//! (f64) arithmetic and with a plain-f32 reference, so that a small *biased* error that
//! every per-call gate lets through shows up as it compounds.
//!
//! - [`spec`]: what a case group's `trajectories:` entry says (optimizer, lr, steps).
//! - [`problem`]: θ₀ and each generation batch's data.
//! - [`optimizer`]: SGD and Adam on the host (f32 or f64 state).
//! - [`exact`]: the f64 loss and gradient, through the oracle's kernels.
//! - [`loss_fns`]: an implementation through its backend, or the host's f32 product
//!   around a logits-level function (the plain-f32 reference, logits-level kernels).
//! - [`run`]: the three loops in lockstep and the per-step series.
//! - [`verdict`]: the gate (drift within k× the plain-f32 envelope).

pub mod exact;
pub mod loss_fns;
pub mod optimizer;
pub mod point;
pub mod problem;
pub mod run;
pub mod verdict;

pub use crate::cases::trajectory::{Optimizer, TrajectorySpec};
pub use loss_fns::{BackendFused, HostLogits, LogitsFn, LossFn};
pub use problem::Problem;
pub use run::StepPoint;
pub use verdict::Judgement;

use serde::{Deserialize, Serialize};

/// Relative bias of the should-fail variant's dlm_head: half the f32 per-call gradient
/// bound (1e-4, docs/tolerances.md), written out here so that a loosened tier does not
/// move it.
pub const SHOULD_FAIL_BIAS: f32 = 5e-5;

/// What a trajectory trial records: the trajectory, the series and the verdict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrajectoryRecord {
    /// The trajectory's label (`sgd-lr0.1-it2-s20`).
    pub label: String,
    /// Its definition.
    pub spec: TrajectorySpec,
    /// How the implementation was evaluated: `fused` (its own LM-head gradient) or
    /// `host-logits` (a logits-level kernel, the host's f32 product around it).
    pub via: String,
    /// Per step.
    pub points: Vec<StepPoint>,
    /// The gate.
    pub judgement: Judgement,
}

/// Runs one trajectory and judges it.
pub fn execute(
    case: &crate::cases::Case,
    spec: &TrajectorySpec,
    implementation: &mut dyn LossFn,
    via: &str,
    progress: impl FnMut(usize),
) -> anyhow::Result<TrajectoryRecord> {
    let problem = Problem::new(case, spec);
    let mut reference = HostLogits {
        via: LogitsFn::Naive,
        bias: 0.0,
    };
    let points = run::run(&problem, spec, &mut reference, implementation, progress)?;
    let judgement = verdict::judge(&points, verdict::k(case.dtype), spec.steps);
    Ok(TrajectoryRecord {
        label: spec.label(),
        spec: spec.clone(),
        via: via.into(),
        points,
        judgement,
    })
}

#[cfg(test)]
mod tests;
