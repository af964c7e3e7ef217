//! One trial's result: verdicts, gate and budget reports, the shared per-case data, and
//! the execution of one (backend, implementation, case). The trial list itself is
//! [`crate::trials`].

use crate::backends::{Backend, Budget, Memory, RunOptions, Timing};
use crate::cases::Case;
use crate::gates::{self, GateReport};
use crate::inputs::Inputs;
use crate::oracle::Oracle;
use crate::outputs::Outputs;
use crate::spec::OutputName;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// What became of a trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", content = "reason", rename_all = "snake_case")]
pub enum Verdict {
    /// Every gate passed.
    Pass,
    /// At least one gate (or the memory budget) failed.
    Fail,
    /// Not run: the backend or implementation does not support the case (why).
    Ignored(String),
    /// The run itself failed (export, compile, crash of the plugin, ...).
    Error(String),
    /// Failed (or errored) as a configured expected failure says it would (the entry).
    ExpectedFail(String),
    /// Passed although an expected-failure entry says it fails: the run fails until the
    /// entry is removed.
    UnexpectedPass(String),
}

/// The marker of an ignored reason that is not a limitation but a combination that does
/// not exist: an implementation of one level asked for a case of the other, or a case
/// needing more devices than a topology has. Such trials
/// are recorded, but neither shown in the run table nor counted as ignored.
pub const NOT_APPLICABLE: &str = "not applicable: ";

impl Verdict {
    /// Ignored because the combination does not apply (see [`NOT_APPLICABLE`]).
    pub fn is_not_applicable(&self) -> bool {
        matches!(self, Verdict::Ignored(r) if r.contains(NOT_APPLICABLE))
    }

    /// Whether the run may stay green with this verdict.
    pub fn is_ok(&self) -> bool {
        matches!(
            self,
            Verdict::Pass | Verdict::Ignored(_) | Verdict::ExpectedFail(_)
        )
    }

    /// Short label for tables.
    pub fn label(&self) -> String {
        match self {
            Verdict::Pass => "pass".into(),
            Verdict::Fail => "FAIL".into(),
            Verdict::Error(_) => "ERROR".into(),
            Verdict::Ignored(r) => format!("ignored: {r}"),
            Verdict::ExpectedFail(_) => "expected fail".into(),
            Verdict::UnexpectedPass(_) => "UNEXPECTED PASS".into(),
        }
    }
}

/// The memory budget of a trial: compiled peak against `max_peak_over_floor` × floor +
/// `slack_bytes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetReport {
    /// The configured bound on peak / floor.
    pub max_peak_over_floor: f64,
    /// The configured fixed allowance, bytes.
    pub slack_bytes: u64,
    /// Compiled peak, bytes.
    pub peak_bytes: u64,
    /// Arguments + outputs − aliased, bytes.
    pub floor_bytes: u64,
    /// peak / floor.
    pub ratio: f64,
    /// peak ≤ max_peak_over_floor × floor + slack_bytes.
    pub passed: bool,
    /// One line: peak, floor, ratio, budget.
    pub message: String,
}

impl BudgetReport {
    /// Judges `memory` against `budget`; an error when the figures are missing.
    pub fn judge(b: Budget, memory: Option<&Memory>) -> Result<BudgetReport, String> {
        let budget = b.max_peak_over_floor;
        let m = memory
            .ok_or("a memory budget is configured but the backend reported no memory figures")?;
        let (Some(peak), Some(floor)) = (m.peak_bytes, m.floor_bytes) else {
            return Err(
                "a memory budget is configured but the compiler reported no peak or no floor"
                    .into(),
            );
        };
        if floor == 0 {
            return Err("floor (arguments + outputs − aliased) is 0 bytes".into());
        }
        let ratio = peak as f64 / floor as f64;
        let bound = budget * floor as f64 + b.slack_bytes as f64;
        let passed = peak as f64 <= bound;
        let slack = if b.slack_bytes > 0 {
            format!(" + {}", human_bytes(b.slack_bytes))
        } else {
            String::new()
        };
        let message =
            format!(
            "memory: peak {} / floor {} = {ratio:.3}×; budget {budget}× floor{slack} = {}: {}{}",
            human_bytes(peak),
            human_bytes(floor),
            human_bytes(bound as u64),
            if passed { "within" } else { "OVER BUDGET" },
            m.source.as_ref().map(|s| format!(" ({s})")).unwrap_or_default()
        );
        Ok(BudgetReport {
            max_peak_over_floor: budget,
            slack_bytes: b.slack_bytes,
            peak_bytes: peak,
            floor_bytes: floor,
            ratio,
            passed,
            message,
        })
    }
}

/// Bytes for people: `2.489 GB`, `1.21 MB`, `812 B` (decimal units, as the issues and
/// notes quote compiler figures).
pub fn human_bytes(b: u64) -> String {
    let x = b as f64;
    if x >= 1e9 {
        format!("{:.3} GB", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.3} MB", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.2} kB", x / 1e3)
    } else {
        format!("{b} B")
    }
}

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
    /// One report per output.
    pub gates: Vec<GateReport>,
    /// The memory budget, when one is configured.
    pub budget: Option<BudgetReport>,
    /// Timing, when measured.
    pub timing: Option<Timing>,
    /// Memory, when reported.
    pub memory: Option<Memory>,
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
    /// Wall time of the whole trial (inputs, oracle, run, gates), seconds.
    pub wall_s: f64,
}

/// The invariance check of a multi-device trial: the same implementation run on one
/// device on the same inputs, its own gates against the oracle, and the multi-device
/// outputs against it ([`gates::judge_invariance`]).
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
            detail: None,
            invariance: None,
            exporter: None,
            precision: None,
            trajectory: None,
            wall_s: 0.0,
        }
    }

    /// The trial's name.
    pub fn name(&self) -> String {
        self.name.clone()
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

/// [`CLIP_TIE_HINT`] when `case_id` is a `ratio_edges` case and a gradient gate failed.
pub fn clip_tie_hint(case_id: &str, gates: &[GateReport]) -> Option<&'static str> {
    let edges = case_id.split('/').any(|seg| seg.starts_with("ratio_edges"));
    let gradient_failed = gates.iter().any(|g| {
        !g.passed
            && matches!(
                g.output,
                OutputName::Dlogits | OutputName::Dhidden | OutputName::DlmHead
            )
    });
    (edges && gradient_failed).then_some(CLIP_TIE_HINT)
}

/// One-device outputs of an implementation on a backend, keyed `backend/implementation`:
/// each computed once (by the first caller; others wait) or its error.
type OneDeviceRuns = Mutex<HashMap<String, Arc<OnceLock<Result<Arc<Outputs>, String>>>>>;

/// A case's inputs and oracle, computed once and shared by its trials and by the trials
/// of its multi-device variants (same data, [`Case::data_id`]).
pub struct Prepared {
    /// Inputs.
    pub inputs: Inputs,
    /// Oracle.
    pub oracle: Oracle,
    /// The one-device runs the variants' invariance checks compare against: the batch-
    /// and vocab-sharded trials of an implementation share one.
    one_device: OneDeviceRuns,
}

impl Prepared {
    /// Generates inputs and evaluates the oracle (from the forward statistics generation
    /// computed anyway: one forward pass per case, not two).
    pub fn new(case: &Case) -> Prepared {
        let (inputs, stats) = Inputs::generate_with_stats(case);
        let oracle = Oracle::with_stats(case, &inputs, stats);
        Prepared {
            inputs,
            oracle,
            one_device: Mutex::default(),
        }
    }

    /// `implementation`'s outputs on `backend` for `case`'s one-device twin, run by the
    /// first caller.
    fn one_device_run(
        &self,
        backend: &dyn Backend,
        implementation: &str,
        twin: &Case,
        opts: &RunOptions,
    ) -> Result<Arc<Outputs>, String> {
        let cell = self
            .one_device
            .lock()
            .unwrap()
            .entry(format!("{}/{implementation}", backend.name()))
            .or_default()
            .clone();
        cell.get_or_init(|| {
            let res = backend
                .run(implementation, twin, &self.inputs, opts)
                .map_err(|e| format!("{e:#}"))?;
            res.outputs
                .map(Arc::new)
                .ok_or_else(|| "the backend returned no outputs".to_string())
        })
        .clone()
    }
}

/// Shares [`Prepared`] between the trials that use the same data (a case and its
/// multi-device variants, keyed by [`Case::data_id`]) while they run, and frees it when
/// the last of them is done (big cases hold gigabytes).
#[derive(Default)]
pub struct CaseCache {
    slots: Mutex<HashMap<String, (Arc<OnceLock<Arc<Prepared>>>, usize)>>,
}

impl CaseCache {
    /// Announces that `n` more trials will ask for `case`.
    pub fn expect(&self, case: &Case, n: usize) {
        let mut s = self.slots.lock().unwrap();
        s.entry(case.data_id().to_string())
            .or_insert_with(|| (Arc::new(OnceLock::new()), 0))
            .1 += n;
    }

    /// The prepared case (computed by the first caller, others wait for it).
    pub fn get(&self, case: &Case) -> Arc<Prepared> {
        let cell = {
            let mut s = self.slots.lock().unwrap();
            s.entry(case.data_id().to_string())
                .or_insert_with(|| (Arc::new(OnceLock::new()), 1))
                .0
                .clone()
        };
        cell.get_or_init(|| Arc::new(Prepared::new(case))).clone()
    }

    /// Whether `case`'s inputs and oracle are already computed (and held).
    pub fn is_ready(&self, case: &Case) -> bool {
        self.slots
            .lock()
            .unwrap()
            .get(case.data_id())
            .is_some_and(|(cell, _)| cell.get().is_some())
    }

    /// One trial of `case` is done; the last one frees the case.
    pub fn done(&self, case: &Case) {
        let mut s = self.slots.lock().unwrap();
        if let Some(e) = s.get_mut(case.data_id()) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 {
                s.remove(case.data_id());
            }
        }
    }
}

/// Runs one implementation on one case and judges it: output gates when the backend
/// executes (on `prep`, which it then needs), the memory budget when one is configured.
/// A backend error is `Error`; support is checked by the caller.
pub fn run_trial(
    backend: &dyn Backend,
    implementation: &str,
    case: &Case,
    prep: Option<&Prepared>,
    opts: &RunOptions,
) -> TrialOutcome {
    let t0 = Instant::now();
    let name = format!("{}/{implementation}/{}", backend.name(), case.id);
    let mut out = TrialOutcome::new(
        name,
        TrialKind::Run,
        backend.name(),
        implementation,
        &case.id,
    );
    let empty = Inputs::default();
    let inputs = prep.map(|p| &p.inputs).unwrap_or(&empty);
    match backend.run(implementation, case, inputs, opts) {
        Err(e) => {
            let message = format!("{e:#}");
            match message.find(BREAKS_CONTRACT) {
                Some(i) => {
                    out.verdict = Verdict::Fail;
                    out.detail = Some(message[i..].to_string());
                }
                None => out.verdict = error_or_not_applicable(message),
            }
        }
        Ok(res) => {
            out.timing = res.timing;
            out.memory = res.memory;
            out.cost = res.cost;
            out.derived = res.derived;
            out.cost_error = res.cost_error;
            out.roofline = res.roofline;
            out.speed = res.speed;
            out.efficiency = res.efficiency;
            out.exporter = res.exporter;
            out.precision = res.precision;
            match (res.outputs, prep) {
                (Some(outputs), Some(p)) => {
                    out.gates = gates::judge(case, &p.inputs, &p.oracle, &outputs);
                    if case.devices > 1 && backend.shards() {
                        match invariance(backend, implementation, case, p, &outputs, opts) {
                            Ok(inv) => out.invariance = Some(inv),
                            Err(e) => {
                                out.verdict = Verdict::Error(format!(
                                    "the one-device run for the invariance check: {e}"
                                ))
                            }
                        }
                    }
                }
                (Some(_), None) => {
                    out.verdict =
                        Verdict::Error("internal: outputs without a prepared oracle".into());
                }
                (None, _) if backend.executes() => {
                    out.verdict = Verdict::Error("the backend returned no outputs".into())
                }
                (None, _) => {}
            }
            if let Some(budget) = backend.budget(implementation) {
                match BudgetReport::judge(budget, out.memory.as_ref()) {
                    Ok(b) => out.budget = Some(b),
                    Err(e) => out.verdict = Verdict::Error(e),
                }
            }
            if backend.speed_budget(implementation, case).is_some()
                && out.speed.is_none()
                && out.verdict == Verdict::Pass
            {
                out.verdict = Verdict::Error(
                    "a speed budget is configured but the backend judged none".into(),
                );
            }
            // A reference that is not finite judges nothing: an ERROR of the case.
            if let Some(g) = out.gates.iter().find(|g| g.oracle_nonfinite) {
                out.verdict = Verdict::Error(format!("{}: {}", g.output, g.message));
            }
            let gates_failed = out.gates.iter().any(|g| !g.passed)
                || out.invariance.as_ref().is_some_and(|i| !i.passed());
            let budget_failed = out.budget.as_ref().is_some_and(|b| !b.passed)
                || out.speed.as_ref().is_some_and(|s| !s.passed)
                || out.precision.as_ref().is_some_and(|p| !p.passed)
                || out
                    .derived
                    .as_ref()
                    .is_some_and(|d| !d.mismatches().is_empty());
            if out.verdict == Verdict::Pass && (gates_failed || budget_failed) {
                out.verdict = Verdict::Fail;
            }
        }
    }
    out.wall_s = t0.elapsed().as_secs_f64();
    out
}

/// The marker of a backend error that is the implementation's failure on the case, not
/// the run's: its module breaks SPEC's output contract (outputs of SPEC's shapes in other
/// dtypes). Such a trial is a FAIL, with the message as its detail.
pub const BREAKS_CONTRACT: &str = "breaks SPEC's output contract: ";

/// A backend's run error, or, when the backend says the case does not apply to this
/// machine (a message containing [`NOT_APPLICABLE`], e.g. more devices than a TPU VM has
/// chips), an ignored trial that is not counted as ignored.
fn error_or_not_applicable(message: String) -> Verdict {
    match message.find(NOT_APPLICABLE) {
        Some(i) => Verdict::Ignored(message[i..].to_string()),
        None => Verdict::Error(message),
    }
}

/// Runs `case`'s one-device twin (same data, `devices: 1`) of `implementation` on
/// `backend` (once per prepared data, see [`Prepared`]) and judges the multi-device
/// `outputs` against it.
fn invariance(
    backend: &dyn Backend,
    implementation: &str,
    case: &Case,
    p: &Prepared,
    outputs: &Outputs,
    opts: &RunOptions,
) -> Result<Invariance, String> {
    let twin = case.one_device_twin();
    let one = p.one_device_run(backend, implementation, &twin, opts)?;
    Ok(Invariance {
        one_device_gates: gates::judge(&twin, &p.inputs, &p.oracle, &one),
        gates: gates::judge_invariance(case, &p.inputs, &p.oracle, outputs, &one),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(peak: u64, arg: u64, out: u64) -> Memory {
        Memory {
            peak_bytes: Some(peak),
            argument_bytes: Some(arg),
            output_bytes: Some(out),
            alias_bytes: Some(0),
            ..Default::default()
        }
        .with_floor()
    }

    #[test]
    fn budget_passes_at_and_fails_above_the_bound() {
        let b = |r, s| Budget {
            max_peak_over_floor: r,
            slack_bytes: s,
        };
        let r = BudgetReport::judge(b(1.05, 0), Some(&mem(105, 60, 40))).unwrap();
        assert!(r.passed && (r.ratio - 1.05).abs() < 1e-12, "{r:?}");
        let r = BudgetReport::judge(b(1.05, 0), Some(&mem(200, 60, 40))).unwrap();
        assert!(
            !r.passed && r.message.contains("2.000×") && r.message.contains("OVER BUDGET"),
            "{}",
            r.message
        );
        // The slack is absolute: it admits a fixed overhead, not a proportional one.
        assert!(
            BudgetReport::judge(b(1.05, 50), Some(&mem(155, 60, 40)))
                .unwrap()
                .passed
        );
        assert!(
            !BudgetReport::judge(b(1.05, 50), Some(&mem(156, 60, 40)))
                .unwrap()
                .passed
        );
        assert!(BudgetReport::judge(b(1.05, 0), None).is_err());
        assert!(BudgetReport::judge(b(1.05, 0), Some(&Memory::default())).is_err());
    }

    #[test]
    fn a_run_error_that_says_not_applicable_is_not_an_error() {
        // As a worker's error arrives (the TPU wording: backends/pjrt/worker.rs's tests).
        let tpu = format!("pjrt-tpu: worker: {NOT_APPLICABLE}the case needs 16 devices, this machine's PJRT client has 8 (TPU v6e)");
        let v = error_or_not_applicable(tpu);
        assert!(v.is_not_applicable() && v.is_ok(), "{v:?}");
        let Verdict::Ignored(reason) = v else {
            unreachable!()
        };
        assert!(reason.starts_with(NOT_APPLICABLE), "{reason}");
        let cpu = "the module is partitioned over 16 devices but the PJRT client has 4 (raise the backend's cpu_device_count to 16)";
        assert!(matches!(error_or_not_applicable(cpu.into()), Verdict::Error(m) if m == cpu));
    }

    #[test]
    fn only_pass_ignored_and_expected_fail_are_ok() {
        assert!(
            Verdict::Pass.is_ok()
                && Verdict::Ignored("x".into()).is_ok()
                && Verdict::ExpectedFail("x".into()).is_ok()
        );
        assert!(
            !Verdict::Fail.is_ok()
                && !Verdict::Error("x".into()).is_ok()
                && !Verdict::UnexpectedPass("x".into()).is_ok()
        );
    }

    /// Only an ignored reason carrying the marker is not applicable: a limitation that
    /// mentions a level is still an ignored trial, and a failure never is.
    #[test]
    fn not_applicable_is_an_ignored_reason_with_the_marker() {
        assert!(
            Verdict::Ignored("pallas_fused: not applicable: level 'logits'".into())
                .is_not_applicable()
        );
        assert!(
            !Verdict::Ignored("ext: not supported: dtype 'bf16', level 'fused'".into())
                .is_not_applicable()
        );
        assert!(!Verdict::Error("not applicable: level 'logits'".into()).is_not_applicable());
        let mk = |v: Verdict| {
            let mut o = TrialOutcome::new("n".into(), TrialKind::Run, "b", "i", "c");
            o.verdict = v;
            o
        };
        let outcomes = [
            mk(Verdict::Pass),
            mk(Verdict::Ignored("x: not applicable: level 'fused'".into())),
            mk(Verdict::Ignored("compile-only".into())),
        ];
        let t = crate::trials::Tally::of(&outcomes);
        assert_eq!((t.passed, t.ignored, t.not_applicable), (1, 1, 1));
    }

    /// A case and its multi-device variants share one prepared data set (inputs, oracle,
    /// one-device runs), freed when the last of their trials is done.
    #[test]
    fn sharded_variants_share_their_one_device_data_and_runs() {
        let one = crate::cases::parse_fixed("b: 4, t: 8, v: 300").unwrap();
        let batch =
            crate::cases::parse_fixed("b: 4, t: 8, v: 300, devices: 4, sharding: batch").unwrap();
        let vocab =
            crate::cases::parse_fixed("b: 4, t: 8, v: 300, devices: 4, sharding: vocab").unwrap();
        assert!(batch.id != vocab.id && batch.data_id() == one.id && vocab.data_id() == one.id);
        let cache = CaseCache::default();
        for c in [&one, &batch, &vocab] {
            cache.expect(c, 1);
        }
        let (p1, p2) = (cache.get(&batch), cache.get(&vocab));
        assert!(Arc::ptr_eq(&p1, &p2) && cache.is_ready(&one));
        // The one-device run of an implementation is made once for both variants.
        let backend = crate::backends::reference::ReferenceBackend::default();
        let opts = RunOptions {
            warmup: 0,
            repeats: 0,
        };
        let a = p1
            .one_device_run(&backend, "oracle", &batch.one_device_twin(), &opts)
            .unwrap();
        let b = p2
            .one_device_run(&backend, "oracle", &vocab.one_device_twin(), &opts)
            .unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let c = p1
            .one_device_run(&backend, "naive_f32", &batch.one_device_twin(), &opts)
            .unwrap();
        assert!(
            !Arc::ptr_eq(&a, &c),
            "another implementation runs on its own"
        );
        drop((p1, p2));
        cache.done(&batch);
        cache.done(&vocab);
        assert!(
            cache.is_ready(&one),
            "the one-device case's trial still holds it"
        );
        cache.done(&one);
        assert!(!cache.is_ready(&one), "freed after the last trial");
    }

    /// A prepared fused case computes its f64 gradients once: the first gate evaluation
    /// fills the oracle's cache, the second (another trial of the case) reads it.
    #[test]
    fn a_prepared_fused_case_computes_its_gradients_once() {
        use crate::oracle::FUSED_GRADS_COMPUTED;
        let case = crate::cases::parse_fixed("level: fused, b: 2, t: 8, h: 64, v: 2049").unwrap();
        let p = Prepared::new(&case);
        let outputs = crate::backends::reference::oracle_outputs(&case, &p.inputs);
        assert!(p.oracle.fused_grads_cached().is_none());
        let before = FUSED_GRADS_COMPUTED.with(|c| c.get());
        let first = gates::judge(&case, &p.inputs, &p.oracle, &outputs);
        let cached = p
            .oracle
            .fused_grads_cached()
            .expect("computed by the first evaluation");
        let (ptr, data) = (cached as *const _, cached.dlm_head.as_ptr());
        let second = gates::judge(&case, &p.inputs, &p.oracle, &outputs);
        assert_eq!(FUSED_GRADS_COMPUTED.with(|c| c.get()) - before, 1);
        let again = p.oracle.fused_grads(&case, &p.inputs);
        assert!(std::ptr::eq(ptr, again) && std::ptr::eq(data, again.dlm_head.as_ptr()));
        for r in [&first, &second] {
            assert!(r.iter().all(|g| g.passed), "{r:?}");
            assert!(r
                .iter()
                .any(|g| g.output == crate::spec::OutputName::DlmHead));
        }
    }
}
