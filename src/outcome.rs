//! A trial's full result, one record line: what kind of check it was, its verdict and
//! the typed reasons, and every piece of evidence it was judged on.

use crate::gates::GateReport;
use crate::judge::memory::BudgetReport;
use crate::judge::verdict::{Reason, Verdict};
use crate::spec::OutputName;
use serde::{Deserialize, Serialize};

/// What kind of check a trial is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrialKind {
    /// An implementation on a case through a backend, judged by the gates (and budget).
    Run,
    /// The oracle re-derived now against the stored golden file.
    Golden,
    /// A deliberately wrong implementation that must fail some case of the suite.
    ShouldFail,
    /// One option set of `grpo-suite sweep` compiled deviceless on one topology.
    Sweep,
    /// N GRPO steps with an implementation against the exact trajectory (docs/trajectory.md).
    Trajectory,
}

/// A trial's full result (one record line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrialOutcome {
    /// The trial's name (`backend/implementation/case`, `golden/case`, `should-fail/...`).
    pub name: String,
    /// What kind of check.
    pub kind: TrialKind,
    /// Backend name (`golden` for golden trials).
    pub backend: String,
    /// Implementation name.
    pub implementation: String,
    /// Case id (`*` for should-fail trials, which range over the suite).
    pub case: String,
    /// Verdict.
    #[serde(flatten)]
    pub verdict: Verdict,
    /// The kinds of every check that failed (empty when none did).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<Reason>,
    /// One report per output.
    pub gates: Vec<GateReport>,
    /// The memory budget, when one is configured.
    pub budget: Option<BudgetReport>,
    /// Timing, when measured.
    pub timing: Option<crate::backends::Timing>,
    /// Memory, when reported.
    pub memory: Option<crate::backends::Memory>,
    /// Compiler cost analysis, when reported.
    pub cost: Option<std::collections::BTreeMap<String, f64>>,
    /// Cost derived by the suite (TPU compiles): FLOPs, HBM bytes, every Mosaic kernel's
    /// derived and declared cost, loop trip counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derived: Option<crate::cost::DerivedCost>,
    /// Why the cost could not be derived (a missing figure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_error: Option<String>,
    /// Roofline time on the backend's TPU generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roofline: Option<crate::cost::roofline::Roofline>,
    /// The speed budget (roofline against jax_baseline's), when configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<crate::cost::speed::SpeedReport>,
    /// Measured time against the roofline (executing TPU backends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<crate::cost::speed::Efficiency>,
    /// The precision class the trial's speed is compared within, and its baseline
    /// (deviceless TPU compiles): where `grpo-suite report` places it on the front.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_class: Option<crate::cost::speed::SpeedClass>,
    /// Free-form detail (golden diffs, which case caught a should-fail variant).
    pub detail: Option<String>,
    /// Multi-device runs on an executing backend: the same implementation on one device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invariance: Option<Invariance>,
    /// The exporter's jax and interpreter (exporting backends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter: Option<crate::backends::ExporterInfo>,
    /// The precision of the module's f32 matmuls and its verdict (exporting backends;
    /// absent when the module has no matmul with an f32 operand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<crate::precision::PrecisionReport>,
    /// Trajectory trials: the series and the gate's verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trajectory: Option<crate::trajectory::TrajectoryRecord>,
    /// Where the time of an executing trial went besides its run (its case's inputs and
    /// oracle, and its own judging).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<Phases>,
    /// Wall time of the whole trial (inputs, oracle, run, gates), seconds.
    pub wall_s: f64,
}

/// Where an executing trial's time went besides its run. The case's inputs and oracle are
/// computed once per case and shared by its trials (and its multi-device variants'), so
/// every trial of a case shows the same `inputs_s`, `forward_s` and `gradients_s`: they
/// are the case's, counted once in whichever trial came first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Phases {
    /// Generating the inputs (without a separate forward pass), seconds.
    pub inputs_s: f64,
    /// The oracle's forward pass and its per-token terms, seconds (at the logits level the
    /// forward statistics come with the rows, inside `inputs_s`; the terms are here).
    pub forward_s: f64,
    /// The oracle's fused-level gradients, seconds, once computed (by the first trial of
    /// the case that needed them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradients_s: Option<f64>,
    /// This trial's output gates and invariance checks, seconds.
    pub judge_s: f64,
}

/// The invariance check of a multi-device trial: the same implementation run on one
/// device on the same inputs, its own gates against the oracle, and the multi-device
/// outputs against it ([`crate::gates::judge_invariance`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Invariance {
    /// The one-device run's gates against the oracle.
    pub one_device_gates: Vec<GateReport>,
    /// The multi-device outputs against the one-device outputs.
    pub gates: Vec<GateReport>,
}

impl Invariance {
    /// Whether both the one-device run and the comparison pass.
    pub fn passed(&self) -> bool {
        self.one_device_gates
            .iter()
            .chain(&self.gates)
            .all(|g| g.passed)
    }
}

impl TrialOutcome {
    /// An outcome with nothing measured yet.
    pub fn new(
        name: String,
        kind: TrialKind,
        backend: &str,
        implementation: &str,
        case: &str,
    ) -> TrialOutcome {
        TrialOutcome {
            name,
            kind,
            backend: backend.into(),
            implementation: implementation.into(),
            case: case.into(),
            verdict: Verdict::Pass,
            reasons: Vec::new(),
            gates: Vec::new(),
            budget: None,
            timing: None,
            memory: None,
            cost: None,
            derived: None,
            cost_error: None,
            roofline: None,
            speed: None,
            efficiency: None,
            speed_class: None,
            detail: None,
            invariance: None,
            exporter: None,
            precision: None,
            trajectory: None,
            phases: None,
            wall_s: 0.0,
        }
    }

    /// The trial's name.
    pub fn name(&self) -> String {
        self.name.clone()
    }

    /// Whether only metrics failed: every failed check is a gate of `entropy`, `kl` or
    /// `clipped` (outputs no gradient flows through), on one device and in the invariance
    /// comparison alike, while the loss and its gradients are within their bounds. Users
    /// read such a failure apart from one of the loss (the run's summary counts them).
    pub fn fails_on_metrics_only(&self) -> bool {
        let metric = |g: &&GateReport| {
            matches!(
                g.output,
                OutputName::Entropy | OutputName::Kl | OutputName::Clipped
            )
        };
        let invariance = self
            .invariance
            .iter()
            .flat_map(|i| i.one_device_gates.iter().chain(&i.gates));
        let failed: Vec<&GateReport> = self
            .gates
            .iter()
            .chain(invariance)
            .filter(|g| !g.passed)
            .collect();
        !failed.is_empty()
            && failed.iter().all(metric)
            && self.reasons.iter().all(|r| *r == Reason::Gate)
    }

    /// The failing gate with the largest relative error, or the worst passing one.
    pub fn worst(&self) -> Option<&GateReport> {
        // Failing before passing, then by error (NaN errors of failed shape checks sort as equal).
        self.gates.iter().max_by(|a, b| {
            (!a.passed, a.norm_err)
                .partial_cmp(&(!b.passed, b.norm_err))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
    }

    /// The failures as text (one line per failing gate, the budget, the error or reason).
    pub fn failure_text(&self) -> String {
        let mut lines: Vec<String> = self
            .gates
            .iter()
            .filter(|g| !g.passed)
            .map(|g| g.message.clone())
            .collect();
        if let Some(hint) = clip_tie_hint(&self.case, &self.gates) {
            lines.push(hint.into());
        }
        if let Some(inv) = &self.invariance {
            lines.extend(
                inv.one_device_gates
                    .iter()
                    .filter(|g| !g.passed)
                    .map(|g| format!("one-device run: {}", g.message)),
            );
            lines.extend(
                inv.gates
                    .iter()
                    .filter(|g| !g.passed)
                    .map(|g| format!("invariance: {}", g.message)),
            );
        }
        if let Some(b) = self.budget.as_ref().filter(|b| !b.passed) {
            lines.push(b.message.clone());
        }
        if let Some(d) = &self.derived {
            lines.extend(d.mismatches().into_iter().map(String::from));
        }
        if let Some(s) = self.speed.as_ref().filter(|s| !s.passed) {
            lines.push(s.message.clone());
        }
        if let Some(m) = self.precision.as_ref().and_then(|p| p.message.as_ref()) {
            lines.push(m.clone());
        }
        match &self.verdict {
            Verdict::Error(e) => lines.insert(0, e.clone()),
            Verdict::Ignored(r) => lines.insert(0, format!("ignored: {r}")),
            Verdict::NotApplicable(r) => lines.insert(0, format!("not applicable: {r}")),
            Verdict::Stale(r) => lines.insert(0, format!("stale expected failure: {r}")),
            Verdict::UnexpectedPass(r) => lines.insert(0, r.clone()),
            Verdict::ExpectedFail(r) => lines.insert(0, format!("expected failure: {r}")),
            Verdict::Pass | Verdict::Fail => {}
        }
        if let Some(d) = &self.detail {
            if !self.verdict.is_ok() || lines.is_empty() {
                lines.push(d.clone());
            }
        }
        lines.join("\n")
    }
}

/// The hint a failed gradient gets on a case whose ratios sit exactly on the clip edges
/// (data profile `ratio_edges`): SPEC gives the whole unclipped gradient at a tie, and a
/// TRL-style `-min(r·A, clip(r)·A)` half of it (docs/external.md).
pub const CLIP_TIE_HINT: &str = "hint: this case puts ratios exactly on the clip edges, where SPEC gives the whole unclipped gradient -A·r; a kernel written -min(r·A, clip(r)·A) gives half of it there (the minimum's tie rule): branch explicitly (docs/external.md, \"clip edge\"; docs/spec.md, \"Branch rule and ties\")";

/// [`CLIP_TIE_HINT`] when `case_id` is a `ratio_edges` case, a gradient gate failed and
/// nothing a tie cannot move failed with it: a tie changes only the gradient (the two
/// branches agree in value there), so a failing loss, per-token loss, logp or KL has
/// another cause, which the hint would hide.
pub fn clip_tie_hint(case_id: &str, gates: &[GateReport]) -> Option<&'static str> {
    let edges = case_id.split('/').any(|seg| seg.starts_with("ratio_edges"));
    let failed =
        |names: &[OutputName]| gates.iter().any(|g| !g.passed && names.contains(&g.output));
    let gradient_failed = failed(&[
        OutputName::Dlogits,
        OutputName::Dhidden,
        OutputName::DlmHead,
    ]);
    let value_failed = failed(&[
        OutputName::Loss,
        OutputName::PerTokenLoss,
        OutputName::PerTokenLogp,
        OutputName::Kl,
    ]);
    (edges && gradient_failed && !value_failed).then_some(CLIP_TIE_HINT)
}

#[cfg(test)]
mod hint_tests {
    use super::*;

    fn gate(output: OutputName, passed: bool) -> GateReport {
        GateReport {
            passed,
            ..crate::gates::fail(output, "standard/f32".into(), "test".into())
        }
    }

    /// The tie hint explains a gradient that fails alone on a clip-edge case; with the
    /// loss failing too (which a tie cannot move), or on another profile, it is not shown.
    #[test]
    fn the_tie_hint_is_shown_only_where_a_tie_explains_the_failure() {
        let edges = "logits/f32/b2_t16_v2049/grpo/eps0.2-0.28/beta0.04/ratio_edges-random-mixed";
        let normal = "logits/f32/b2_t16_v2049/grpo/eps0.2-0.28/beta0.04/normal1-random-mixed";
        let grad = gate(OutputName::Dlogits, false);
        let ok = |o| gate(o, true);
        let both = [grad.clone(), gate(OutputName::Loss, false)];
        let alone = [
            grad.clone(),
            ok(OutputName::Loss),
            gate(OutputName::Entropy, false),
        ];
        assert_eq!(clip_tie_hint(edges, &alone), Some(CLIP_TIE_HINT));
        assert_eq!(clip_tie_hint(edges, &both), None);
        assert_eq!(clip_tie_hint(normal, &alone), None);
        assert_eq!(clip_tie_hint(edges, &[ok(OutputName::Dlogits)]), None);
    }
}
