//! One trial: (backend, implementation, case) → verdict with per-output gate reports.
//! Shared by the `grpo-suite run` command and the libtest harness.

use crate::backend::{Backend, Memory, RunOptions, Timing};
use crate::cases::Case;
use crate::gates::{self, GateReport};
use crate::inputs::Inputs;
use crate::oracle::Oracle;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// What became of a trial.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", content = "reason", rename_all = "snake_case")]
pub enum Verdict {
    /// Every gate passed.
    Pass,
    /// At least one gate failed.
    Fail,
    /// Not run: the backend or implementation does not support the case (why).
    Ignored(String),
    /// The run itself failed (compile error, crash of the plugin, ...).
    Error(String),
}

/// A trial's full result.
#[derive(Debug, Clone, Serialize)]
pub struct TrialOutcome {
    /// Backend name.
    pub backend: String,
    /// Implementation id.
    pub implementation: String,
    /// Case id.
    pub case: String,
    /// Verdict.
    #[serde(flatten)]
    pub verdict: Verdict,
    /// One report per output.
    pub gates: Vec<GateReport>,
    /// Timing, when measured.
    pub timing: Option<Timing>,
    /// Memory, when reported.
    pub memory: Option<Memory>,
    /// Compiler cost analysis, when reported.
    pub cost: Option<std::collections::BTreeMap<String, f64>>,
    /// Wall time of the whole trial (inputs, oracle, run, gates), seconds.
    pub wall_s: f64,
}

impl TrialOutcome {
    /// `backend/implementation/case`: the trial's name.
    pub fn name(&self) -> String {
        format!("{}/{}/{}", self.backend, self.implementation, self.case)
    }

    /// The failing gate with the largest relative error, or the worst passing one.
    pub fn worst(&self) -> Option<&GateReport> {
        // Failing before passing, then by error (NaN errors of failed shape checks sort as equal).
        self.gates.iter().max_by(|a, b| {
            (!a.passed, a.norm_err).partial_cmp(&(!b.passed, b.norm_err)).unwrap_or(std::cmp::Ordering::Equal)
        })
    }

    /// A multi-line explanation of a failure (one line per failing gate).
    pub fn failure_text(&self) -> String {
        match &self.verdict {
            Verdict::Error(e) => e.clone(),
            Verdict::Ignored(r) => format!("ignored: {r}"),
            _ => self.gates.iter().filter(|g| !g.passed).map(|g| g.message.clone()).collect::<Vec<_>>().join("\n"),
        }
    }
}

/// A case's inputs and oracle, computed once and shared by its trials.
pub struct Prepared {
    /// Inputs.
    pub inputs: Inputs,
    /// Oracle.
    pub oracle: Oracle,
}

impl Prepared {
    /// Generates inputs and evaluates the oracle.
    pub fn new(case: &Case) -> Prepared {
        let inputs = Inputs::generate(case);
        let oracle = Oracle::new(case, &inputs);
        Prepared { inputs, oracle }
    }
}

/// Shares [`Prepared`] between the trials of a case that run concurrently, and frees it
/// when the last of them is done (big cases hold gigabytes).
#[derive(Default)]
pub struct CaseCache {
    slots: Mutex<HashMap<String, (Arc<OnceLock<Arc<Prepared>>>, usize)>>,
}

impl CaseCache {
    /// Announces that `n` more trials will ask for `case`.
    pub fn expect(&self, case: &Case, n: usize) {
        let mut s = self.slots.lock().unwrap();
        s.entry(case.id.clone()).or_insert_with(|| (Arc::new(OnceLock::new()), 0)).1 += n;
    }

    /// The prepared case (computed by the first caller, others wait for it).
    pub fn get(&self, case: &Case) -> Arc<Prepared> {
        let cell = {
            let mut s = self.slots.lock().unwrap();
            s.entry(case.id.clone()).or_insert_with(|| (Arc::new(OnceLock::new()), 1)).0.clone()
        };
        cell.get_or_init(|| Arc::new(Prepared::new(case))).clone()
    }

    /// One trial of `case` is done; the last one frees the case.
    pub fn done(&self, case: &Case) {
        let mut s = self.slots.lock().unwrap();
        if let Some(e) = s.get_mut(&case.id) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 {
                s.remove(&case.id);
            }
        }
    }
}

/// Runs one trial on prepared data. Unsupported → Ignored; a backend error → Error.
pub fn run_trial(backend: &dyn Backend, implementation: &str, case: &Case, prep: &Prepared, opts: &RunOptions) -> TrialOutcome {
    let t0 = Instant::now();
    let mut out = TrialOutcome {
        backend: backend.name().to_string(),
        implementation: implementation.to_string(),
        case: case.id.clone(),
        verdict: Verdict::Pass,
        gates: Vec::new(),
        timing: None,
        memory: None,
        cost: None,
        wall_s: 0.0,
    };
    if let Err(reason) = backend.supports(implementation, case) {
        out.verdict = Verdict::Ignored(reason);
        return out;
    }
    match backend.run(implementation, case, &prep.inputs, opts) {
        Err(e) => out.verdict = Verdict::Error(format!("{e:#}")),
        Ok(res) => {
            out.gates = gates::judge(case, &prep.inputs, &prep.oracle, &res.outputs);
            out.timing = res.timing;
            out.memory = res.memory;
            out.cost = res.cost;
            if out.gates.iter().any(|g| !g.passed) {
                out.verdict = Verdict::Fail;
            }
        }
    }
    out.wall_s = t0.elapsed().as_secs_f64();
    out
}
