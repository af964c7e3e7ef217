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
        self.impls.iter().find(|c| c.id == implementation)
    }

    /// Exports what is not exported yet (one Python process for the batch).
    fn ensure_exported(&self, work: &[(&str, &Case)]) -> Result<()> {
        let todo: Vec<(&str, &serde_json::Map<String, serde_json::Value>, &Case)> = {
            let done = self.exported.lock().unwrap();
            work.iter()
                .filter(|(i, c)| !done.contains_key(&(i.to_string(), c.id.clone())))
                .filter_map(|(i, c)| self.options(i).map(|o| (*i, &o.options, *c)))
                .collect()
        };
        if todo.is_empty() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.cache_dir)
            .with_context(|| format!("cannot create artifact cache {}", self.cache_dir.display()))?;
        let results = export::export_batch(&self.python, &self.cache_dir, &self.platform, &todo)?;
        let mut done = self.exported.lock().unwrap();
        for ((i, _, c), r) in todo.iter().zip(results) {
            done.insert((i.to_string(), c.id.clone()), r);
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
        self.impls.iter().map(|c| c.id.clone()).collect()
    }

    fn supports(&self, implementation: &str, case: &Case) -> Result<(), String> {
        if self.options(implementation).is_none() {
            return Err(format!("{} has no implementation `{implementation}` configured", self.name));
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
