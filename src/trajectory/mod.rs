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
//! - [`verdict`]: the gate (drift within k× an honest loop's envelope), judged against
//!   the plain-f32 reference and each precision class's loop: the class a trial reaches
//!   is the strictest whose gate passes ([`crate::precision_class`]).

pub mod exact;
pub mod loss_fns;
pub mod optimizer;
pub mod point;
pub mod problem;
pub mod run;
pub mod verdict;

pub use crate::cases::trajectory::{Optimizer, TrajectorySpec};
pub use loss_fns::{BackendFused, HostLogits, LogitsFn, LossFn, Rounding};
pub use problem::Problem;
pub use run::StepPoint;
pub use verdict::Judgement;

use crate::precision_class::PrecisionClass;
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
    /// The gate against the plain-f32 reference (the `f32` class).
    pub judgement: Judgement,
    /// The gate against each precision class's honest loop, the strictest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<ClassVerdict>,
    /// The class the implementation reached: the strictest whose gate passes (none when
    /// not even `bf16`'s does).
    #[serde(default)]
    pub class: Option<PrecisionClass>,
    /// The class the configuration requires of this trial.
    #[serde(default)]
    pub required_class: Option<PrecisionClass>,
    /// The implementation's step-1 dlm_head sign agreement with the exact gradient.
    #[serde(default)]
    pub sign_agreement: Option<f64>,
    /// The class its module's precision manifest implies (exported implementations:
    /// [`crate::precision::PrecisionReport::expected_class`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_class: Option<PrecisionClass>,
    /// Figures left out, each with why (an implementation that gives no `clipped` or no
    /// `per_token_logp`: a whole-loss library). Never an error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
    /// On a backend that emulates an accelerator (pjrt-cpu): why the class reached is
    /// stricter than the precision manifest implies ([`TrajectoryRecord::above_manifest`]):
    /// the emulation did not compute what the accelerator would. Fails the trial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emulation_gap: Option<String>,
}

/// The gate against one precision class's honest loop.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClassVerdict {
    /// The class.
    pub class: PrecisionClass,
    /// The gate (k and floor as for the plain-f32 reference).
    pub judgement: Judgement,
    /// The honest loop's step-1 dlm_head sign agreement with the exact gradient.
    #[serde(deserialize_with = "crate::gates::nan_if_null")]
    pub sign_agreement: f64,
    /// The loop's drift and flips per step (empty for `f32`, whose loop is the plain-f32
    /// reference of `points`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<run::ClassStep>,
}

impl TrajectoryRecord {
    /// Whether the trial passes: the class reached is at least the one required (a record
    /// without classes: the plain-f32 gate).
    pub fn passed(&self) -> bool {
        self.emulation_gap.is_none()
            && match self.required_class {
                Some(r) => self.class.is_some_and(|c| c >= r),
                None => self.judgement.passed,
            }
    }

    /// Why the class reached is stricter than the precision manifest implies, when the
    /// trajectory can tell: the manifest class's own honest loop fails the plain-f32 gate
    /// (it is told apart from f32 here) while the implementation reaches a stricter class.
    /// On a backend that emulates the accelerator that means the module did not compute
    /// what the accelerator would (SGD trajectories often cannot tell: none is reported).
    pub fn above_manifest(&self) -> Option<String> {
        let (e, c) = (self.expected_class?, self.class?);
        if c <= e {
            return None;
        }
        let loop_e = self.classes.iter().find(|v| v.class == e)?;
        let as_impl: Vec<StepPoint> = self
            .points
            .iter()
            .zip(&loop_e.steps)
            .map(|(p, s)| StepPoint {
                drift_implementation: s.drift,
                branch_flips: Some(0),
                ambiguous_flips: 0,
                ..*p
            })
            .collect();
        let told_apart = verdict::judge(&as_impl, self.judgement.k, self.spec.steps);
        (!told_apart.passed).then(|| {
            format!(
                "class {c}, above the {e} its precision manifest implies, where the {e}-class loop is told apart from f32 ({}): the emulation did not compute what the accelerator would",
                told_apart.message
            )
        })
    }

    /// The gate against the required class's loop (the plain-f32 one without classes).
    pub fn required_judgement(&self) -> &Judgement {
        self.required_class
            .and_then(|r| self.classes.iter().find(|c| c.class == r))
            .map_or(&self.judgement, |c| &c.judgement)
    }

    /// The class's gate ratio: the worst drift / bound over the judged steps.
    pub fn worst_ratio(&self, j: &Judgement) -> f64 {
        self.points
            .iter()
            .zip(&j.bounds)
            .take(j.judged_steps)
            .map(|(p, b)| p.drift_implementation / b)
            .fold(0.0, |a: f64, r| {
                if a.is_nan() || r.is_nan() {
                    f64::NAN
                } else {
                    a.max(r)
                }
            })
    }

    /// One line: the class reached against the one required, each class's worst ratio,
    /// then the required class's gate line (its failure, or how close it came).
    pub fn summary(&self) -> String {
        let Some(required) = self.required_class else {
            return self.judgement.message.clone();
        };
        let per_class = self
            .classes
            .iter()
            .map(|c| format!("{} {:.3}", c.class, self.worst_ratio(&c.judgement)))
            .collect::<Vec<_>>()
            .join(", ");
        let head = match self.class {
            Some(c) if c >= required => format!("class {c} (requires {required})"),
            Some(c) => format!("class {c}, below the required {required}"),
            None => format!("below every class (requires {required})"),
        };
        // A trajectory that reaches less than the dots imply: the kernel rounds where its
        // manifest does not show it (the other way, the trajectory could not tell).
        let manifest = match (self.expected_class, self.class) {
            (Some(e), c) if c.is_none_or(|c| c < e) => format!(
                "; below the {e} its precision manifest implies (the kernel rounds outside its dots)"
            ),
            _ => String::new(),
        };
        let gap = self
            .emulation_gap
            .as_ref()
            .map_or(String::new(), |g| format!("; FAIL: {g}"));
        let left_out = if self.left_out.is_empty() {
            String::new()
        } else {
            format!("; left out: {}", self.left_out.join("; "))
        };
        format!(
            "{head}{manifest}{gap}; drift/bound per class: {per_class}; against the {required} loop: {}{left_out}",
            self.required_judgement().message
        )
    }
}

/// The classes with an honest loop of their own besides the plain-f32 reference.
const CLASS_LOOPS: [PrecisionClass; 3] = [
    PrecisionClass::Bf16x3,
    PrecisionClass::Tf32,
    PrecisionClass::Bf16,
];

/// Runs one trajectory and judges it against every class's honest loop; the trial must
/// reach `required`.
pub fn execute(
    case: &crate::cases::Case,
    spec: &TrajectorySpec,
    implementation: &mut dyn LossFn,
    via: &str,
    required: PrecisionClass,
    progress: impl FnMut(usize),
) -> anyhow::Result<TrajectoryRecord> {
    let problem = Problem::new(case, spec);
    let honest = |class| HostLogits {
        via: LogitsFn::Naive,
        bias: 0.0,
        class: Rounding::Class(class),
    };
    let mut reference = honest(PrecisionClass::F32);
    let mut loops: Vec<HostLogits> = CLASS_LOOPS.iter().map(|&c| honest(c)).collect();
    let mut refs: Vec<(PrecisionClass, &mut dyn LossFn)> = CLASS_LOOPS
        .iter()
        .copied()
        .zip(loops.iter_mut().map(|l| l as &mut dyn LossFn))
        .collect();
    let series = run::run(
        &problem,
        spec,
        &mut reference,
        &mut refs,
        implementation,
        progress,
    )?;
    let k = verdict::k(case.dtype);
    let judgement = verdict::judge(&series.points, k, spec.steps);
    let mut classes = vec![ClassVerdict {
        class: PrecisionClass::F32,
        judgement: judgement.clone(),
        sign_agreement: series.sign_agreement.0,
        steps: Vec::new(),
    }];
    for cs in series.classes {
        let name = format!("{}-class", cs.class);
        classes.push(ClassVerdict {
            class: cs.class,
            judgement: verdict::judge_against(&cs.as_points(&series.points), k, spec.steps, &name),
            sign_agreement: cs.sign_agreement,
            steps: cs.steps,
        });
    }
    let class = classes.iter().find(|c| c.judgement.passed).map(|c| c.class);
    Ok(TrajectoryRecord {
        label: spec.label(),
        spec: spec.clone(),
        via: via.into(),
        points: series.points,
        judgement,
        classes,
        class,
        required_class: Some(required),
        sign_agreement: Some(series.sign_agreement.1),
        expected_class: None,
        left_out: series.left_out,
        emulation_gap: None,
    })
}

#[cfg(test)]
mod tests;
