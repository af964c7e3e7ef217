//! The `pjrt-tpu` backend: execution on TPU chips through a libtpu client, the same
//! gates as every backend, timing stopped on output readiness, compiled peak HBM with
//! its budget. Built with `--features tpu`; without the feature, or on a machine without
//! TPU chips, it is unavailable with that reason (its trials are listed as ignored).

use super::PjrtTpuConfig;
use crate::backends::Backend;
use anyhow::Result;
use std::sync::Arc;

/// Why a machine has no TPU chips, or None when it seems to have some (`/dev/accel*` on
/// v2–v4 and v5e VMs, `/dev/vfio/<n>` on v5p/v6e VMs).
pub fn no_chips_reason() -> Option<String> {
    let any = |dir: &str, pred: &dyn Fn(&str) -> bool| {
        std::fs::read_dir(dir)
            .map(|rd| rd.filter_map(|e| e.ok()).any(|e| pred(&e.file_name().to_string_lossy())))
            .unwrap_or(false)
    };
    let accel = any("/dev", &|n| n.starts_with("accel"));
    let vfio = any("/dev/vfio", &|n| n.chars().all(|c| c.is_ascii_digit()));
    if accel || vfio {
        None
    } else {
        Some("no TPU chips on this machine (no /dev/accel* or /dev/vfio/<n> devices)".into())
    }
}

#[cfg(not(feature = "tpu"))]
mod imp {
    use super::*;

    /// Placeholder: this build has no TPU execution.
    pub struct PjrtTpu;

    impl PjrtTpu {
        /// Always unavailable: built without the `tpu` feature.
        pub fn open(_cfg: &PjrtTpuConfig) -> Result<Arc<dyn Backend>> {
            anyhow::bail!("built without the `tpu` feature (on a TPU VM: cargo test --release --features tpu)")
        }
    }
}

#[cfg(feature = "tpu")]
mod imp {
    use super::super::cpu::{host_args, named_outputs};
    use super::super::export::{Exported, Exporter};
    use super::super::tpu_aot::{libtpu_path, libtpu_version, prepare_environment};
    use super::super::worker::Worker;
    use super::*;
    use crate::backends::{RunOptions, RunResult};
    use crate::cases::Case;
    use crate::config::ImplConfig;
    use crate::inputs::Inputs;
    use anyhow::{bail, Context};
    use std::sync::Mutex;
    use std::time::Duration;

    /// How long libtpu may take to create a client before the backend is declared unavailable.
    pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

    /// TPU execution through a libtpu client.
    pub struct PjrtTpu {
        impls: Vec<ImplConfig>,
        exporter: Exporter,
        worker: Mutex<Worker>,
    }

    impl PjrtTpu {
        /// Creates the libtpu client (bounded); unavailable without chips.
        pub fn new(cfg: &PjrtTpuConfig) -> Result<PjrtTpu> {
            if let Some(why) = no_chips_reason() {
                bail!("{why}");
            }
            prepare_environment();
            let plugin = libtpu_path(cfg.plugin.as_ref())?;
            let label = format!("libtpu {} (device HBM)", libtpu_version(&plugin));
            let worker = Worker::start_labelled(plugin, None, &label, Some(CLIENT_TIMEOUT))?;
            Ok(PjrtTpu { impls: crate::config::enabled(&cfg.implementations), exporter: Exporter::new("tpu")?, worker: Mutex::new(worker) })
        }

        /// The backend, as the registry wants it.
        pub fn open(cfg: &PjrtTpuConfig) -> Result<Arc<dyn Backend>> {
            Ok(Arc::new(PjrtTpu::new(cfg)?))
        }

        fn options(&self, implementation: &str) -> Option<&ImplConfig> {
            super::super::export::find(&self.impls, implementation)
        }
    }

    impl Backend for PjrtTpu {
        fn name(&self) -> &str {
            "pjrt-tpu"
        }

        fn shards(&self) -> bool {
            true
        }

        fn implementations(&self) -> Vec<String> {
            self.impls.iter().map(|c| c.display_name().to_string()).collect()
        }

        fn supports(&self, implementation: &str, case: &Case) -> Result<(), String> {
            let Some(imp) = self.options(implementation) else {
                return Err(format!("pjrt-tpu has no implementation `{implementation}` configured"));
            };
            self.exporter.support(imp, case)
        }

        fn validate(&self) -> Result<()> {
            self.exporter.check_config(&self.impls)
        }

        fn prepare(&self, work: &[(&str, &Case)]) -> Result<()> {
            self.exporter.prepare_named(&self.impls, work)
        }

        fn run(&self, implementation: &str, case: &Case, inputs: &Inputs, opts: &RunOptions) -> Result<RunResult> {
            let imp = self.options(implementation).with_context(|| format!("pjrt-tpu has no implementation `{implementation}`"))?;
            let (manifest, module) = match self.exporter.get(imp, case)? {
                Exported::Ready { manifest, module } => (manifest, module),
                Exported::Unsupported(r) => bail!("unsupported: {r}"),
                Exported::Failed(e) => bail!("{e}"),
            };
            let args = host_args(&manifest, case, inputs)?;
            let spec = manifest.clone();
            let res = self.worker.lock().unwrap().run(manifest, module, args, opts.warmup, opts.repeats)?;
            Ok(RunResult { outputs: Some(named_outputs(&spec, res.outputs)?), timing: Some(res.timing), memory: res.memory, cost: res.cost, ..Default::default() })
        }

        fn budget(&self, implementation: &str) -> Option<crate::backends::Budget> {
            self.options(implementation).and_then(crate::backends::Budget::of)
        }
    }
}

pub use imp::PjrtTpu;
