//! The `pjrt-cpu` backend: JAX implementations exported to StableHLO by `backends/jax`
//! and run through our PJRT binding (`backends/pjrt`) on the XLA CPU plugin.

mod export;
mod worker;

pub use export::{Exported, Manifest, TensorSpec};

use super::{Backend, RunOptions, RunResult};
use crate::cases::Case;
use crate::config::{BackendConfig, ImplConfig};
use crate::inputs::Inputs;
use crate::outputs::Outputs;
use crate::spec::OutputName;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use worker::{HostArg, Worker};

/// Environment variable naming the Python interpreter of the exporter.
pub const PYTHON_ENV: &str = "GRPO_PYTHON";
/// Environment variable naming the artifact cache directory.
pub const ARTIFACTS_ENV: &str = "GRPO_ARTIFACTS";

/// A PJRT backend for one plugin (the CPU plugin by default).
pub struct PjrtBackend {
    name: String,
    platform: String,
    plugin: PathBuf,
    python: PathBuf,
    cache_dir: PathBuf,
    cpu_device_count: Option<i64>,
    impls: Vec<ImplConfig>,
    exported: Mutex<HashMap<(String, String), Exported>>,
    worker: Mutex<Option<Worker>>,
}

const GIB: f64 = (1u64 << 30) as f64;

/// Rough peak host memory of one trial on the CPU plugin: the suite's inputs (f32), the
/// upload copy, device arguments, XLA temporaries (softmax, f32 upcast) and dlogits, all
/// O(B·T·V): 7 f32 copies.
pub fn cpu_working_set_bytes(case: &Case) -> u64 {
    let per_token = match case.level {
        crate::spec::Level::Logits => case.shape.v,
        crate::spec::Level::Fused => case.shape.v + 2 * case.shape.h.unwrap_or(0),
    };
    7 * 4 * (case.shape.rows() * per_token) as u64
}

fn mem_total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

fn venv_python() -> PathBuf {
    std::env::var_os(PYTHON_ENV).map(PathBuf::from).unwrap_or_else(|| crate::repo_root().join(".venv/bin/python"))
}

impl PjrtBackend {
    /// The CPU backend from its config. Errors say why it is unavailable (no venv, no plugin).
    pub fn cpu(cfg: &BackendConfig) -> Result<PjrtBackend> {
        let plugin = match (std::env::var_os(grpo_pjrt::PLUGIN_ENV), &cfg.plugin) {
            (None, Some(p)) => p.clone(),
            _ => grpo_pjrt::default_plugin_path().map_err(|e| anyhow!("{e}"))?,
        };
        if !plugin.is_file() {
            bail!("PJRT plugin {} does not exist (run scripts/setup.sh or set {})", plugin.display(), grpo_pjrt::PLUGIN_ENV);
        }
        let python = venv_python();
        if !python.exists() {
            bail!("no Python for the exporter at {} (run scripts/setup.sh or set {PYTHON_ENV})", python.display());
        }
        let cache_dir = std::env::var_os(ARTIFACTS_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| crate::repo_root().join("target/grpo-artifacts"));
        Ok(PjrtBackend {
            name: "pjrt-cpu".into(),
            platform: "cpu".into(),
            plugin,
            python,
            cache_dir,
            cpu_device_count: cfg.cpu_device_count,
            impls: cfg.enabled(),
            exported: Mutex::new(HashMap::new()),
            worker: Mutex::new(None),
        })
    }

    fn options(&self, implementation: &str) -> Option<&ImplConfig> {
        self.impls.iter().find(|c| c.display_name() == implementation)
    }

    /// Exports what is not exported yet (one Python process for the batch).
    fn ensure_exported(&self, work: &[(&str, &Case)]) -> Result<()> {
        let todo: Vec<(&str, &ImplConfig, &Case)> = {
            let done = self.exported.lock().unwrap();
            work.iter()
                .filter(|(name, c)| !done.contains_key(&(name.to_string(), c.id.clone())))
                .filter_map(|(name, c)| self.options(name).map(|o| (*name, o, *c)))
                .collect()
        };
        if todo.is_empty() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.cache_dir)
            .with_context(|| format!("cannot create artifact cache {}", self.cache_dir.display()))?;
        let requests: Vec<_> = todo.iter().map(|(_, o, c)| (o.id.as_str(), &o.options, *c)).collect();
        let results = export::export_batch(&self.python, &self.cache_dir, &self.platform, &requests)?;
        let mut done = self.exported.lock().unwrap();
        for ((name, _, c), r) in todo.iter().zip(results) {
            done.insert((name.to_string(), c.id.clone()), r);
        }
        Ok(())
    }

    fn exported(&self, implementation: &str, case: &Case) -> Result<Exported> {
        self.ensure_exported(&[(implementation, case)])?;
        Ok(self.exported.lock().unwrap()[&(implementation.to_string(), case.id.clone())].clone())
    }

    fn with_worker<T>(&self, f: impl FnOnce(&Worker) -> Result<T>) -> Result<T> {
        let mut w = self.worker.lock().unwrap();
        if w.is_none() {
            *w = Some(Worker::start(self.plugin.clone(), self.cpu_device_count)?);
        }
        f(w.as_ref().unwrap())
    }
}

impl Backend for PjrtBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn implementations(&self) -> Vec<String> {
        self.impls.iter().map(|c| c.display_name().to_string()).collect()
    }

    fn supports(&self, implementation: &str, case: &Case) -> Result<(), String> {
        if self.options(implementation).is_none() {
            return Err(format!("{} has no implementation `{implementation}` configured", self.name));
        }
        // On the CPU plugin device memory is host memory, shared with the suite's own copy
        // of the inputs and the oracle: estimate and refuse rather than swap or get killed.
        let need = cpu_working_set_bytes(case);
        if let Some(total) = mem_total_bytes() {
            if need as f64 > 0.75 * total as f64 {
                return Err(format!(
                    "needs ~{:.1} GiB of host memory on the CPU device, this machine has {:.1} GiB",
                    need as f64 / GIB,
                    total as f64 / GIB
                ));
            }
        }
        match self.exported(implementation, case) {
            Ok(Exported::Unsupported(reason)) => Err(reason),
            // Export failures are trial errors (in `run`), never silent skips.
            _ => Ok(()),
        }
    }

    fn prepare(&self, work: &[(&str, &Case)]) -> Result<()> {
        self.ensure_exported(work)
    }

    fn run(&self, implementation: &str, case: &Case, inputs: &Inputs, opts: &RunOptions) -> Result<RunResult> {
        let (manifest, module) = match self.exported(implementation, case)? {
            Exported::Ready { manifest, module } => (manifest, module),
            Exported::Unsupported(r) => bail!("unsupported: {r}"),
            Exported::Failed(e) => bail!("{e}"),
        };
        let tensors = inputs.tensors(case);
        let mut args = Vec::new();
        for spec in &manifest.inputs {
            let t = tensors
                .iter()
                .find(|t| t.name == spec.name)
                .with_context(|| format!("module wants input `{}`, which the case does not have", spec.name))?;
            if t.shape != spec.shape || t.dtype_name() != spec.dtype {
                bail!(
                    "input `{}`: case has {:?} {}, module wants {:?} {}",
                    spec.name, t.shape, t.dtype_name(), spec.shape, spec.dtype
                );
            }
            args.push(HostArg { dtype: spec.dtype.clone(), dims: spec.shape.iter().map(|&d| d as i64).collect(), bytes: t.to_le_bytes() });
        }
        let outs_spec = manifest.outputs.clone();
        let res = self.with_worker(|w| w.run(manifest, module, args, opts.warmup, opts.repeats))?;
        let mut outputs = Outputs::default();
        for (spec, data) in outs_spec.iter().zip(res.outputs) {
            let name = OutputName::parse(&spec.name)
                .with_context(|| format!("module output `{}` is not a SPEC output", spec.name))?;
            outputs.insert(name, spec.shape.clone(), data);
        }
        let timing = if opts.repeats > 0 || res.timing.compile_s.is_some() { Some(res.timing) } else { None };
        Ok(RunResult { outputs, timing, memory: res.memory, cost: res.cost })
    }
}

/// Outcome of an export-only check.
#[derive(Debug, Clone, PartialEq)]
pub enum ExportVerdict {
    /// The module exported and holds a Mosaic kernel (`tpu_custom_call`).
    Lowered,
    /// The implementation does not support the case (why).
    Unsupported(String),
    /// Export failed or produced no Mosaic kernel (the lowering's message).
    Failed(String),
}

/// Exports each (implementation, case) for TPU on this machine (no TPU or libtpu needed:
/// Pallas lowers to Mosaic `tpu_custom_call`s at export) and judges each result.
/// Returns (display name, case id, verdict) in input order.
pub fn tpu_export_check(impls: &[ImplConfig], cases: &[&Case]) -> Result<Vec<(String, String, ExportVerdict)>> {
    let python = venv_python();
    let cache_dir = std::env::var_os(ARTIFACTS_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("target/grpo-artifacts"));
    std::fs::create_dir_all(&cache_dir)?;
    let pairs: Vec<(&ImplConfig, &Case)> = impls.iter().flat_map(|i| cases.iter().map(move |c| (i, *c))).collect();
    let requests: Vec<_> = pairs.iter().map(|(i, c)| (i.id.as_str(), &i.options, *c)).collect();
    let results = export::export_batch(&python, &cache_dir, "tpu", &requests)?;
    Ok(pairs
        .iter()
        .zip(results)
        .map(|((i, c), r)| {
            let v = match r {
                Exported::Unsupported(why) => ExportVerdict::Unsupported(why),
                Exported::Failed(e) => ExportVerdict::Failed(e),
                Exported::Ready { module, .. } => match std::fs::read(&module) {
                    Err(e) => ExportVerdict::Failed(format!("cannot read {}: {e}", module.display())),
                    Ok(bytes) if bytes.windows(15).any(|w| w == b"tpu_custom_call") => ExportVerdict::Lowered,
                    Ok(_) => ExportVerdict::Failed(format!(
                        "{} has no Mosaic kernel (tpu_custom_call): did the export fall back to interpret mode?",
                        module.display()
                    )),
                },
            };
            (i.display_name().to_string(), c.id.clone(), v)
        })
        .collect())
}
