//! The two seams of the suite: a [`Backend`] (where an implementation runs) and an
//! implementation id (what runs). Trials are backend × implementation × case; a backend
//! declares, as a predicate on the case, what it cannot run (an ignored trial with that
//! reason, never a pass).

mod naive;
pub mod pjrt;
mod reference;

pub use naive::{Mutation, NaiveF32};
pub use reference::ReferenceBackend;

use crate::cases::Case;
use crate::inputs::Inputs;
use crate::outputs::Outputs;
use serde::Serialize;

/// Timing of one implementation on one case, in seconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timing {
    /// Compilation (or export + compile), apart from execution.
    pub compile_s: Option<f64>,
    /// Each timed execution (after warm-up), stopped on output readiness.
    pub runs_s: Vec<f64>,
}

impl Timing {
    /// Median of the timed runs.
    pub fn median_s(&self) -> Option<f64> {
        let mut v = self.runs_s.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) })
    }
}

/// Memory figures a backend can report, in bytes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Memory {
    /// Compiler's peak device memory of the executable.
    pub peak_bytes: Option<u64>,
    /// Temporaries.
    pub temp_bytes: Option<u64>,
    /// Arguments.
    pub argument_bytes: Option<u64>,
    /// Outputs.
    pub output_bytes: Option<u64>,
}

/// Everything one run returns.
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    /// The SPEC outputs.
    pub outputs: Outputs,
    /// Timing, when the backend measures it.
    pub timing: Option<Timing>,
    /// Memory, when the backend reports it.
    pub memory: Option<Memory>,
    /// Compiler cost analysis (flops, transcendentals, bytes accessed), when available.
    pub cost: Option<std::collections::BTreeMap<String, f64>>,
}

/// How a run is measured.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    /// Untimed executions before timing.
    pub warmup: usize,
    /// Timed executions.
    pub repeats: usize,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions { warmup: 1, repeats: 3 }
    }
}

/// Where implementations run.
pub trait Backend: Send + Sync {
    /// Backend name, the first part of a trial name (`reference`, `pjrt-cpu`, ...).
    fn name(&self) -> &str;

    /// Implementation ids this backend can run.
    fn implementations(&self) -> Vec<String>;

    /// `Err(reason)` when `implementation` cannot run `case` here (the trial is ignored
    /// with that reason).
    fn supports(&self, implementation: &str, case: &Case) -> Result<(), String>;

    /// Optional batch preparation (e.g. export and compile everything once).
    fn prepare(&self, _work: &[(&str, &Case)]) -> anyhow::Result<()> {
        Ok(())
    }

    /// Runs one implementation on one case.
    fn run(&self, implementation: &str, case: &Case, inputs: &Inputs, opts: &RunOptions) -> anyhow::Result<RunResult>;
}

/// Backend names a configuration may use.
pub const KNOWN: [&str; 2] = ["reference", "pjrt-cpu"];

/// The backends a configuration names that are available on this machine, and the
/// reason for each one that is not.
pub fn available(config: &crate::config::Config) -> (Vec<Box<dyn Backend>>, Vec<(String, String)>) {
    let mut ok: Vec<Box<dyn Backend>> = Vec::new();
    let mut missing = Vec::new();
    for (name, cfg) in &config.backends {
        match name.as_str() {
            "reference" => ok.push(Box::new(ReferenceBackend::new(cfg))),
            "pjrt-cpu" => match pjrt::PjrtBackend::cpu(cfg) {
                Ok(b) => ok.push(Box::new(b)),
                Err(e) => missing.push((name.clone(), format!("{e:#}"))),
            },
            other => missing.push((other.to_string(), "unknown backend".into())),
        }
    }
    (ok, missing)
}
