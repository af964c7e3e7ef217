//! Backends: *where* an implementation runs. An implementation (what runs) is an id
//! from the configuration: a `grpo_jax` implementation exported to StableHLO, or one of
//! the in-process references. The PJRT binding (`backends/pjrt`, crate `grpo-pjrt`) is
//! what the PJRT backends are built on; it is not a backend itself.
//!
//! | backend | module | what it does |
//! | --- | --- | --- |
//! | `reference` | [`reference`] | the oracle and `naive_f32`, in process |
//! | `pjrt-cpu` | `pjrt::exec` (profile `Cpu`) | exports through `grpo_jax`, runs on the XLA CPU plugin |
//! | `pjrt-gpu` | `pjrt::exec` (profile `Gpu`) | runs on an NVIDIA GPU through the CUDA PJRT plugin |
//! | `tpu-aot-<topology>` | `pjrt::tpu_aot` | compiles the TPU export with libtpu, no chips: peak HBM, cost, budgets |
//! | `pjrt-tpu` | `pjrt::exec` (profile `Tpu`) | runs on TPU chips through libtpu (`--features tpu`) |
//! | `torch-<device>` | [`torch`] | runs PyTorch implementations in a supervised `grpo_torch` worker, on cpu or cuda |
//!
//! Trials are backend × implementation × case; a backend declares, as a predicate on the
//! case, what it cannot run (an ignored trial with that reason, never a pass).

pub mod outcome;
pub mod pjrt;
pub mod reference;
pub mod registry;
pub mod torch;

pub use outcome::{Outcome, Refusal};
pub use reference::{Mutation, NaiveF32, ReferenceBackend, ReferenceConfig};
pub use registry::{BackendKind, BackendsConfig, Section};

use crate::cases::Case;
use crate::inputs::Inputs;
use crate::outputs::Outputs;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Timing of one implementation on one case, in seconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Timing {
    /// Compilation (or export + compile), apart from execution.
    pub compile_s: Option<f64>,
    /// Each timed execution (after warm-up), stopped on output readiness.
    pub runs_s: Vec<f64>,
    /// `compile_s` is the compile of the same module for an earlier trial of this run
    /// (tpu-aot: cases that differ only in their data share one exported module).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compile_shared: bool,
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
        Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            0.5 * (v[n / 2 - 1] + v[n / 2])
        })
    }
}

/// Memory figures a backend can report, in bytes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Memory {
    /// Peak device memory: the compiler's, of the executable (pjrt, tpu-aot), or the cuda
    /// allocator's over the trial (torch-cuda; `source` says which).
    pub peak_bytes: Option<u64>,
    /// Temporaries.
    pub temp_bytes: Option<u64>,
    /// Arguments.
    pub argument_bytes: Option<u64>,
    /// Outputs.
    pub output_bytes: Option<u64>,
    /// Outputs aliased with arguments.
    pub alias_bytes: Option<u64>,
    /// Generated code.
    pub generated_code_bytes: Option<u64>,
    /// The floor: arguments + outputs − aliased (what any implementation must hold).
    pub floor_bytes: Option<u64>,
    /// Device peak of the production compile when it differs in kind from `peak_bytes`
    /// (tpu-aot: the default compile's peak, which counts buffers prefetched into VMEM).
    pub peak_with_vmem_prefetch_bytes: Option<u64>,
    /// The device allocator's peak bytes in use over the trial (upload, warm-up, timed
    /// runs; `PJRT_Device_MemoryStats` of the first device), where the trial raised the
    /// allocator's peak: a measurement, apart from the compiler's `peak_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_peak_bytes: Option<u64>,
    /// The device allocator's bytes in use before the trial's arguments were uploaded
    /// (executables and buffers of earlier trials still resident).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_in_use_before_bytes: Option<u64>,
    /// Whose compiler produced these figures (`XLA:CPU`: peak = floor always, says
    /// nothing about device memory; `libtpu <version> <topology>`: HBM).
    pub source: Option<String>,
}

impl Memory {
    /// Fills `floor_bytes` from arguments, outputs and aliases.
    pub fn with_floor(mut self) -> Memory {
        if let (Some(a), Some(o)) = (self.argument_bytes, self.output_bytes) {
            self.floor_bytes = Some((a + o).saturating_sub(self.alias_bytes.unwrap_or(0)));
        }
        self
    }

    /// Peak / floor, when both are known.
    pub fn peak_over_floor(&self) -> Option<f64> {
        match (self.peak_bytes, self.floor_bytes) {
            (Some(p), Some(f)) if f > 0 => Some(p as f64 / f as f64),
            _ => None,
        }
    }
}

/// Everything one run returns.
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    /// The SPEC outputs (None for a compile-only backend).
    pub outputs: Option<Outputs>,
    /// Timing, when the backend measures it.
    pub timing: Option<Timing>,
    /// Memory, when the backend reports it.
    pub memory: Option<Memory>,
    /// Compiler cost analysis (flops, transcendentals, bytes accessed), when available.
    pub cost: Option<BTreeMap<String, f64>>,
    /// Cost derived by the suite (TPU compiles): FLOPs, bytes, kernels checked.
    pub derived: Option<crate::cost::DerivedCost>,
    /// Why the cost could not be derived (a missing figure, shown as such).
    pub cost_error: Option<String>,
    /// Roofline time on the backend's TPU generation.
    pub roofline: Option<crate::cost::roofline::Roofline>,
    /// The figures a speed budget is judged on (this implementation's and jax_baseline's
    /// derived cost and roofline), when one is configured: the judge decides.
    pub speed: Option<crate::cost::speed::SpeedMeasure>,
    /// Measured time against the roofline (executing TPU backends).
    pub efficiency: Option<crate::cost::speed::Efficiency>,
    /// The precision class this trial's speed is compared within and that class's
    /// baseline (backends that derive a roofline against jax_baseline's).
    pub speed_class: Option<crate::cost::speed::SpeedClass>,
    /// Which environment exported the module (exporting backends).
    pub exporter: Option<ExporterInfo>,
    /// The precision of the module's f32 matmuls and its verdict (exporting backends).
    pub precision: Option<crate::precision::PrecisionReport>,
}

/// The environment an implementation's module was exported in, recorded with every trial
/// of an exporting backend: results from another jax or venv are not comparable blindly.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExporterInfo {
    /// `jax.__version__` of the exporter.
    pub jax_version: String,
    /// The Python interpreter that ran it.
    pub python: String,
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
        RunOptions {
            warmup: 1,
            repeats: 3,
        }
    }
}

/// Where implementations run.
pub trait Backend: Send + Sync {
    /// Backend name, the first part of a trial name (`reference`, `pjrt-cpu`, ...).
    fn name(&self) -> &str;

    /// Implementation names this backend runs (from the config, in order).
    fn implementations(&self) -> Vec<String>;

    /// `Err` when `implementation` cannot run `case` here: [`Refusal::Unsupported`] (the
    /// trial is ignored with that reason) or [`Refusal::NotApplicable`]. May need
    /// [`Backend::prepare`] first (the exporter's answer).
    fn supports(&self, implementation: &str, case: &Case) -> Result<(), Refusal>;

    /// Optional batch preparation of exactly the work that will run (e.g. export
    /// everything with one Python process).
    fn prepare(&self, _work: &[(&str, &Case)]) -> Result<()> {
        Ok(())
    }

    /// Runs one implementation on one case. An error that is (or wraps) a [`Refusal`]
    /// says which kind of outcome it is; [`Backend::outcome`] reads it by type.
    fn run(
        &self,
        implementation: &str,
        case: &Case,
        inputs: &Inputs,
        opts: &RunOptions,
    ) -> Result<RunResult>;

    /// [`Backend::run`] as a typed [`Outcome`].
    fn outcome(
        &self,
        implementation: &str,
        case: &Case,
        inputs: &Inputs,
        opts: &RunOptions,
    ) -> Outcome {
        Outcome::of(self.run(implementation, case, inputs, opts))
    }

    /// [`Backend::outcome`] for a prepared case, given its oracle (evaluated on `case`
    /// and `inputs`): a backend that returns the oracle itself uses it instead of
    /// evaluating it again. Default: [`Backend::outcome`].
    fn outcome_prepared(
        &self,
        implementation: &str,
        case: &Case,
        inputs: &Inputs,
        _oracle: &crate::oracle::Oracle,
        opts: &RunOptions,
    ) -> Outcome {
        self.outcome(implementation, case, inputs, opts)
    }

    /// Checks the configured implementations (ids, options) before anything runs; the
    /// error names each bad entry. Default: nothing to check.
    fn validate(&self) -> Result<()> {
        Ok(())
    }

    /// Why every trial of `implementation` is an error without running (after
    /// [`Backend::validate`]: e.g. its module hung while it was checked), if it is. Such
    /// trials are recorded without a worker and without exporting. Default: none.
    fn broken(&self, _implementation: &str) -> Option<String> {
        None
    }

    /// False for compile-only backends: no outputs, so no inputs or oracle are prepared
    /// and no output gates are judged (memory budgets are).
    fn executes(&self) -> bool {
        true
    }

    /// True when a multi-device case really runs on several devices here (PJRT clients);
    /// such trials also run the one-device twin for the invariance check. The reference
    /// backend computes the oracle whatever `devices` says.
    fn shards(&self) -> bool {
        false
    }

    /// The configured memory budget of an implementation, if any.
    fn budget(&self, _implementation: &str) -> Option<Budget> {
        None
    }

    /// The configured speed budget of an implementation on a case
    /// (`max_roofline_over_baseline` where `speed_cases` matches), if any: the backend then
    /// returns the [`RunResult::speed`] figures (or an error) and the judge decides.
    fn speed_budget(&self, _implementation: &str, _case: &Case) -> Option<f64> {
        None
    }
}

/// A memory budget: peak ≤ `max_peak_over_floor` × floor + `slack_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// Bound on peak / floor.
    pub max_peak_over_floor: f64,
    /// Fixed allowance, bytes.
    pub slack_bytes: u64,
}

impl Budget {
    /// The budget of a configured implementation, if it has one.
    pub fn of(c: &crate::config::entry::ImplConfig) -> Option<Budget> {
        c.max_peak_over_floor.map(|r| Budget {
            max_peak_over_floor: r,
            slack_bytes: c.peak_slack_bytes,
        })
    }
}

/// A backend that could not be set up: its name and why (one line with the fix).
#[derive(Debug, Clone)]
pub struct Unavailable {
    /// Backend name.
    pub name: String,
    /// Why.
    pub reason: String,
    /// The machine has what the backend runs on (no device is missing, or it needs none),
    /// so its environment is broken: its trials are errors, not ignored. False when a
    /// device or a build feature is absent.
    pub broken: bool,
}

/// The error a backend's setup returns when this machine lacks its device (or the build
/// its feature): the one reason its trials are ignored rather than errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NoDevice(pub String);

impl Unavailable {
    /// From a setup error: [`NoDevice`] in its chain is an absence, anything else a
    /// broken environment.
    pub fn of(name: String, e: &anyhow::Error) -> Unavailable {
        Unavailable {
            name,
            reason: format!("{e:#}"),
            broken: e.downcast_ref::<NoDevice>().is_none(),
        }
    }
}

/// The backends a configuration names that are available on this machine, and the
/// reason for each one that is not (each section's own probe, [`registry::Section::open`]);
/// exporting backends' modules get `export_timeout_s` each.
pub fn available(
    backends: &BackendsConfig,
    export_timeout_s: u64,
) -> (Vec<Arc<dyn Backend>>, Vec<Unavailable>) {
    #[cfg(feature = "pjrt")]
    pjrt::export::set_timeout(export_timeout_s);
    #[cfg(not(feature = "pjrt"))]
    let _ = export_timeout_s;
    backends.open()
}
