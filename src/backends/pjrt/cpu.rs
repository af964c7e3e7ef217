//! The `pjrt-cpu` backend: JAX implementations exported to StableHLO by `backends/jax`
//! and run through our PJRT binding (`backends/pjrt`) on the XLA CPU plugin.

use super::export::{Exported, Exporter};
use super::worker::{HostArg, Worker};
use super::PjrtCpuConfig;
use crate::backends::{Backend, RunOptions, RunResult};
use crate::cases::Case;
use crate::config::ImplConfig;
use crate::inputs::Inputs;
use crate::outputs::Outputs;
use crate::spec::OutputName;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::sync::Mutex;

/// The CPU PJRT backend.
pub struct PjrtCpu {
    plugin: PathBuf,
    cpu_device_count: Option<i64>,
    impls: Vec<ImplConfig>,
    exporter: Exporter,
    worker: Mutex<Option<Worker>>,
}

const GIB: f64 = (1u64 << 30) as f64;

fn mem_total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    line.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kib| kib * 1024)
}

/// The CPU plugin to load: `GRPO_PJRT_PLUGIN`, else the config's `plugin`, else the venv's.
fn plugin_path(cfg_plugin: Option<&PathBuf>) -> Result<PathBuf> {
    if let Some(p) = crate::env::pjrt_plugin()? {
        return Ok(p);
    }
    let p = match cfg_plugin {
        Some(p) => p.clone(),
        None => super::venv_site_file("xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so").map_err(|looked| {
            anyhow::anyhow!(
                "no PJRT CPU plugin at {} (run scripts/setup.sh, which installs the pinned xla_cpu_pjrt wheel, or set {})",
                looked.display(),
                crate::env::PJRT_PLUGIN
            )
        })?,
    };
    if !p.is_file() {
        bail!(
            "PJRT plugin {} does not exist (run scripts/setup.sh or set {})",
            p.display(),
            crate::env::PJRT_PLUGIN
        );
    }
    Ok(p)
}

/// Outputs of a module, named by its manifest, as SPEC outputs.
pub(super) fn named_outputs(
    manifest: &super::export::Manifest,
    data: Vec<Vec<f32>>,
) -> Result<Outputs> {
    let mut outputs = Outputs::default();
    for n in &manifest.not_provided {
        let name = OutputName::parse(n)
            .with_context(|| format!("manifest: `{n}` (not provided) is not a SPEC output"))?;
        outputs.not_provided.insert(name);
    }
    for (spec, d) in manifest.outputs.iter().zip(data) {
        let name = OutputName::parse(&spec.name)
            .with_context(|| format!("module output `{}` is not a SPEC output", spec.name))?;
        if !outputs.not_provided.contains(&name) {
            outputs.insert(name, spec.shape.clone(), d); // a placeholder is dropped, never judged
        }
    }
    Ok(outputs)
}

/// The case's inputs in the module's argument order, checked against its manifest.
pub(super) fn host_args(
    manifest: &super::export::Manifest,
    case: &Case,
    inputs: &Inputs,
) -> Result<Vec<HostArg>> {
    let tensors = inputs.tensors(case);
    let mut args = Vec::new();
    for spec in &manifest.inputs {
        let t = tensors
            .iter()
            .find(|t| t.name == spec.name)
            .with_context(|| {
                format!(
                    "module wants input `{}`, which the case does not have",
                    spec.name
                )
            })?;
        if t.shape != spec.shape || t.dtype_name() != spec.dtype {
            bail!(
                "input `{}`: case has {:?} {}, module wants {:?} {}",
                spec.name,
                t.shape,
                t.dtype_name(),
                spec.shape,
                spec.dtype
            );
        }
        args.push(HostArg {
            dtype: spec.dtype.clone(),
            dims: spec.shape.iter().map(|&d| d as i64).collect(),
            bytes: t.to_le_bytes(),
        });
    }
    Ok(args)
}

impl PjrtCpu {
    /// The CPU backend from its settings. Errors say why it is unavailable (no venv, no plugin).
    pub fn new(cfg: &PjrtCpuConfig) -> Result<PjrtCpu> {
        let plugin = plugin_path(cfg.plugin.as_ref())?;
        Ok(PjrtCpu {
            plugin,
            cpu_device_count: cfg.cpu_device_count,
            impls: crate::config::enabled(&cfg.implementations),
            exporter: Exporter::new("cpu")?,
            worker: Mutex::new(None),
        })
    }

    fn options(&self, implementation: &str) -> Option<&ImplConfig> {
        super::export::find(&self.impls, implementation)
    }

    /// Modules exported so far (by this backend, in this process).
    pub fn exported_count(&self) -> usize {
        self.exporter.count()
    }

    fn with_worker<T>(&self, f: impl FnOnce(&Worker) -> Result<T>) -> Result<T> {
        let mut w = self.worker.lock().unwrap();
        if w.is_none() {
            *w = Some(Worker::start(self.plugin.clone(), self.cpu_device_count)?);
        }
        f(w.as_ref().unwrap())
    }

    /// Runs an implementation exported for another case (`run_as`) on `case`'s inputs:
    /// the wrong-knob tests use it to show the gates fail.
    pub fn run_exported_as(
        &self,
        implementation: &str,
        run_as: &Case,
        case: &Case,
        inputs: &Inputs,
        opts: &RunOptions,
    ) -> Result<RunResult> {
        let imp = self.options(implementation).with_context(|| {
            format!("pjrt-cpu has no implementation `{implementation}` configured")
        })?;
        let (manifest, module) = match self.exporter.get(imp, run_as)? {
            Exported::Ready { manifest, module } => (manifest, module),
            Exported::Unsupported(r) => bail!("unsupported: {r}"),
            Exported::Failed(e) => bail!("{e}"),
        };
        let args = host_args(&manifest, case, inputs)?;
        let spec = manifest.clone();
        let res = self
            .with_worker(|w| w.run(manifest, module, args, opts.warmup, opts.repeats))
            .map_err(|e| {
                super::export::explain_compile_failure(
                    e,
                    &spec,
                    &self.plugin,
                    "backends.pjrt-cpu.plugin",
                    crate::env::PJRT_PLUGIN,
                )
            })?;
        let outputs = named_outputs(&spec, res.outputs)?;
        let timing = if opts.repeats > 0 || res.timing.compile_s.is_some() {
            Some(res.timing)
        } else {
            None
        };
        Ok(RunResult {
            outputs: Some(outputs),
            timing,
            memory: res.memory,
            cost: res.cost,
            exporter: Some(self.exporter.info(imp, &spec)),
            precision: spec.precision(),
            ..Default::default()
        })
    }
}

impl Backend for PjrtCpu {
    fn name(&self) -> &str {
        "pjrt-cpu"
    }

    fn shards(&self) -> bool {
        true
    }

    fn implementations(&self) -> Vec<String> {
        self.impls
            .iter()
            .map(|c| c.display_name().to_string())
            .collect()
    }

    fn supports(&self, implementation: &str, case: &Case) -> Result<(), String> {
        let Some(imp) = self.options(implementation) else {
            return Err(format!(
                "pjrt-cpu has no implementation `{implementation}` configured"
            ));
        };
        // On the CPU plugin device memory is host memory, shared with the suite's own copy
        // of the inputs and the oracle: estimate and refuse rather than swap or get killed.
        let need = super::cpu_working_set_bytes(case);
        if let Some(total) = mem_total_bytes() {
            if need as f64 > 0.75 * total as f64 {
                return Err(format!(
                    "needs ~{:.1} GiB of host memory on the CPU device, this machine has {:.1} GiB",
                    need as f64 / GIB,
                    total as f64 / GIB
                ));
            }
        }
        self.exporter.support(imp, case)
    }

    fn validate(&self) -> Result<()> {
        self.exporter.check_config(&self.impls)
    }

    fn broken(&self, implementation: &str) -> Option<String> {
        super::export::find(&self.impls, implementation).and_then(|i| self.exporter.broken(i))
    }

    fn prepare(&self, work: &[(&str, &Case)]) -> Result<()> {
        self.exporter.prepare_named(&self.impls, work)
    }

    fn run(
        &self,
        implementation: &str,
        case: &Case,
        inputs: &Inputs,
        opts: &RunOptions,
    ) -> Result<RunResult> {
        self.run_exported_as(implementation, case, case, inputs, opts)
    }
}
