//! The judge: the one place where a trial's evidence becomes its [`Verdict`]. Backends
//! measure (outputs, memory, derived cost, the speed figures) and say by type what their
//! run came to ([`crate::backends::Outcome`]); the gates compare outputs; the judge
//! weighs all of it against the configured budgets, lists the kinds of what failed
//! ([`Reason`]) and applies a configured expected failure ([`expected`]), whose stated
//! figure it checks against the measured one.
//!
//! | evidence | where it is measured | reason when it fails |
//! | --- | --- | --- |
//! | output gates, the one-device run, invariance | [`crate::gates`] | [`Reason::Gate`] |
//! | compiled peak against `max_peak_over_floor` | the backend's compiler | [`Reason::Memory`] |
//! | derived roofline against jax_baseline's | [`crate::cost`] | [`Reason::Speed`] |
//! | undeclared reduced-precision f32 matmuls | [`crate::precision`] | [`Reason::Precision`] |
//! | derived against declared kernel cost | [`crate::cost`] | [`Reason::Cost`] |
//! | the trajectory's drift against its envelope | [`crate::trajectory`] | [`Reason::Trajectory`] |
//! | outputs in other dtypes than SPEC's | the exporter ([`Outcome::BreaksContract`]) | [`Reason::Contract`] |

pub mod expected;
pub mod figure;
pub mod memory;
pub mod verdict;

pub use verdict::{Reason, Verdict};

use crate::backends::{Budget, Outcome, Refusal};
use crate::cost::speed::SpeedMeasure;
use crate::outcome::TrialOutcome;
use memory::BudgetReport;

/// The budgets a run trial is judged against (from its backend's configuration).
#[derive(Debug, Clone, Copy, Default)]
pub struct Budgets {
    /// The memory budget, if configured.
    pub memory: Option<Budget>,
    /// The bound on roofline / jax_baseline's roofline, if configured for the case.
    pub speed: Option<f64>,
}

/// The verdict of a backend's outcome that is not a run: `None` for [`Outcome::Ran`]
/// (its evidence is judged by [`judge_run`]). A contract breach also says so in
/// `detail` and its reason.
pub fn refused(outcome: &Outcome, out: &mut TrialOutcome) -> bool {
    let verdict = match outcome {
        Outcome::Ran(_) => return false,
        Outcome::NotApplicable(m) => Verdict::NotApplicable(m.clone()),
        Outcome::Unsupported(m) => Verdict::Ignored(m.clone()),
        Outcome::BreaksContract(m) => {
            out.detail = Some(Refusal::BreaksContract(m.clone()).to_string());
            out.reasons = vec![Reason::Contract];
            Verdict::Fail
        }
        Outcome::Failed(m) => Verdict::Error(m.clone()),
    };
    out.verdict = verdict;
    true
}

/// The verdict of a support check's refusal: not applicable, or ignored with its reason.
pub fn skipped(refusal: Refusal) -> Verdict {
    match refusal {
        Refusal::NotApplicable(m) => Verdict::NotApplicable(m),
        Refusal::Unsupported(m) => Verdict::Ignored(m),
        Refusal::BreaksContract(m) => Verdict::Error(format!(
            "a support check cannot break the contract: {}",
            Refusal::BreaksContract(m)
        )),
    }
}

/// Judges a run's evidence, already filled into `out` (gates, invariance, memory,
/// precision, derived cost), against `budgets` and the backend's `speed` figures. An
/// error already in `out.verdict` (the one-device run failed) stays unless a missing
/// figure replaces it.
pub fn judge_run(out: &mut TrialOutcome, budgets: Budgets, speed: Option<&SpeedMeasure>) {
    let mut error = match &out.verdict {
        Verdict::Error(e) => Some(e.clone()),
        _ => None,
    };
    if let Some(b) = budgets.memory {
        match BudgetReport::judge(b, out.memory.as_ref()) {
            Ok(r) => out.budget = Some(r),
            Err(e) => error = Some(e),
        }
    }
    match (budgets.speed, speed) {
        (Some(max), Some(m)) => out.speed = Some(m.judge(max)),
        (Some(_), None) if error.is_none() => {
            error = Some("a speed budget is configured but the backend measured no speed".into())
        }
        _ => {}
    }
    // A reference that is not finite judges nothing: an ERROR of the case.
    if let Some(g) = out.gates.iter().find(|g| g.oracle_nonfinite) {
        error = Some(format!("{}: {}", g.output, g.message));
    }
    out.reasons = reasons(out);
    out.verdict = match error {
        Some(e) => Verdict::Error(e),
        None if out.reasons.is_empty() => Verdict::Pass,
        None => Verdict::Fail,
    };
}

/// The kinds of every failed check in a run's evidence, in [`Reason`] order.
pub fn reasons(out: &TrialOutcome) -> Vec<Reason> {
    let mut r = Vec::new();
    let gate =
        out.gates.iter().any(|g| !g.passed) || out.invariance.as_ref().is_some_and(|i| !i.passed());
    if gate {
        r.push(Reason::Gate);
    }
    if out.budget.as_ref().is_some_and(|b| !b.passed) {
        r.push(Reason::Memory);
    }
    if out.speed.as_ref().is_some_and(|s| !s.passed) {
        r.push(Reason::Speed);
    }
    if out.precision.as_ref().is_some_and(|p| !p.passed) {
        r.push(Reason::Precision);
    }
    if out
        .derived
        .as_ref()
        .is_some_and(|d| !d.mismatches().is_empty())
    {
        r.push(Reason::Cost);
    }
    if out.trajectory.as_ref().is_some_and(|t| !t.passed()) {
        r.push(Reason::Trajectory);
    }
    r
}

/// Judges a trajectory trial whose series is in `out.trajectory`.
pub fn judge_trajectory(out: &mut TrialOutcome) {
    out.reasons = reasons(out);
    out.verdict = if out.reasons.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail
    };
}

/// A check that is not a run (a golden file, a should-fail variant) failed.
pub fn check_failed(out: &mut TrialOutcome, detail: String) {
    out.reasons = vec![Reason::Check];
    out.verdict = Verdict::Fail;
    out.detail = Some(detail);
}

#[cfg(test)]
mod tests;
