//! What a trajectory trial runs: the optimizer, its step size, the number of steps and
//! GRPO iterations per batch, as written under a case group's `trajectories:` key.

use crate::cases::{Case, Suite};
use crate::spec::{Level, LogitsDtype};
use serde::{Deserialize, Serialize};

/// The host optimizer of a trajectory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// θ ← θ − lr·g.
    Sgd,
    /// Adam (β₁ 0.9, β₂ 0.999, ε 1e-8, bias-corrected).
    Adam,
}

impl Optimizer {
    /// Name as written in YAML and in trial names.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::Adam => "adam",
        }
    }
}

/// One trajectory of a case (docs/trajectory.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrajectorySpec {
    /// Suites the trajectory trials belong to (`full` is implied).
    pub suites: Vec<Suite>,
    /// Host optimizer.
    pub optimizer: Optimizer,
    /// Step size.
    pub lr: f64,
    /// Optimizer steps.
    pub steps: usize,
    /// GRPO iterations per generation batch (≥ 2: the ratio moves off 1 from the second).
    #[serde(default = "default_iterations")]
    pub num_iterations: usize,
    /// Sequences per prompt group (B must be a multiple): advantages are normalised per group.
    pub group_size: usize,
    /// θ₀ ~ N(0, init_std²/H): the initial logits have standard deviation ≈ init_std.
    #[serde(default = "default_init_std")]
    pub init_std: f64,
}

fn default_init_std() -> f64 {
    1.0
}

fn default_iterations() -> usize {
    2
}

const GIB: f64 = (1u64 << 30) as f64;

/// Host bytes a trajectory of `steps` keeps until its record is written: per step its
/// [`StepPoint`](crate::trajectory::point::StepPoint), the gate's bound (an f64) and the point's JSON
/// text in the record line (measured on a point with full-length numbers). Saturates.
pub fn memory_estimate(steps: usize) -> u64 {
    let p = crate::trajectory::point::StepPoint {
        step: usize::MAX / 2,
        loss_exact: -0.123_456_789_012_345_67,
        loss_reference: -0.123_456_789_012_345_67,
        loss_implementation: -0.123_456_789_012_345_67,
        drift_reference: 1.234_567_890_123_456_7e-100,
        drift_implementation: 1.234_567_890_123_456_7e-100,
        clipped_fraction: 0.123_456_789_012_345_67,
        travelled: 0.123_456_789_012_345_67,
        branch_flips: Some(usize::MAX / 2),
        ambiguous_flips: usize::MAX / 2,
        sign_flips: usize::MAX / 2,
    };
    let json = serde_json::to_string(&p).map_or(512, |s| s.len());
    let per_step = std::mem::size_of::<crate::trajectory::point::StepPoint>()
        + std::mem::size_of::<f64>()
        + json;
    (steps as u64).saturating_mul(per_step as u64)
}

impl TrajectorySpec {
    /// The trajectory's part of a trial name, e.g. `sgd-lr0.1-it2-s20`.
    pub fn label(&self) -> String {
        format!(
            "{}-lr{}-it{}-s{}{}",
            self.optimizer.name(),
            self.lr,
            self.num_iterations,
            self.steps,
            if self.init_std == 1.0 {
                String::new()
            } else {
                format!("-init{}", self.init_std)
            }
        )
    }

    /// Whether the trajectory runs in `suite`.
    pub fn in_suite(&self, suite: Suite) -> bool {
        suite == Suite::Full || self.suites.contains(&suite)
    }

    /// Checks the trajectory against its case; the message says what is wrong.
    pub fn validate(&self, case: &Case) -> Result<(), String> {
        if case.level != Level::Fused {
            return Err(
                "trajectories need a fused-level case (the LM head is the parameter)".into(),
            );
        }
        if case.knobs.logits_dtype != LogitsDtype::F32 {
            return Err("trajectories need logits_dtype f32 (a rounded product has no exact gradient to follow)".into());
        }
        if case.knobs.importance_sampling_level != crate::spec::IsLevel::Token {
            return Err("trajectories judge token-level importance sampling only (the branch bookkeeping is per token)".into());
        }
        if case.devices != 1 {
            return Err("trajectories run on one-device cases".into());
        }
        if case.compile_only {
            return Err("a compile-only case has no trajectory".into());
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return Err(format!("trajectory lr must be > 0, got {}", self.lr));
        }
        if !(self.init_std > 0.0 && self.init_std.is_finite()) {
            return Err(format!(
                "trajectory init_std must be > 0, got {}",
                self.init_std
            ));
        }
        if self.steps == 0 {
            return Err("trajectory steps must be >= 1".into());
        }
        let need = memory_estimate(self.steps);
        if let Some(h) = crate::host_memory::tightest(crate::host_memory::headrooms()) {
            if need > h.free / 2 {
                return Err(format!(
                    "trajectory steps = {}: its per-step series would keep ~{:.1} GiB ({} B a step: points, bounds and the record's text), more than half of the {:.1} GiB free under {}",
                    self.steps,
                    need as f64 / GIB,
                    need / self.steps as u64,
                    h.free as f64 / GIB,
                    h.source
                ));
            }
        }
        if self.num_iterations < 2 {
            return Err(format!(
                "trajectory num_iterations must be >= 2 (the ratio is 1 on the first iteration of a batch), got {}",
                self.num_iterations
            ));
        }
        if self.group_size < 2 || case.shape.b % self.group_size != 0 {
            return Err(format!(
                "trajectory group_size must be >= 2 and divide b = {}, got {}",
                case.shape.b, self.group_size
            ));
        }
        if self.suites.is_empty() {
            return Err("trajectory suites must not be empty".into());
        }
        Ok(())
    }
}
