//! The PJRT backends, built on our binding (`backends/pjrt`, crate `grpo-pjrt`) and on
//! the `grpo_jax` exporter:
//!
//! | backend | plugin | what differs |
//! | --- | --- | --- |
//! | `pjrt-cpu` ([`exec`], [`profile::Profile::Cpu`]) | XLA CPU (`xla_cpu_pjrt`) | executes, interpret-mode Pallas; its memory figures are host memory |
//! | `pjrt-gpu` ([`exec`], [`profile::Profile::Gpu`]) | the CUDA PJRT plugin | executes on an NVIDIA GPU: device memory, derived cost and roofline; no Pallas TPU kernels |
//! | `pjrt-tpu` ([`exec`], [`profile::Profile::Tpu`], `--features tpu`) | libtpu client | executes on TPU chips, Mosaic kernels |
//! | `tpu-aot-<topology>` ([`tpu_aot`]) | libtpu, no client | compiles the TPU export deviceless: peak HBM, cost analysis, budgets; no outputs |
//!
//! Shared: the execution backend ([`exec`]) with one [`profile`] per platform, the
//! exporter ([`export`]), the worker thread that owns a client (`worker`), plugin
//! discovery. The settings structs live here so a configuration parses (and is checked)
//! even in a build without the `pjrt` feature.

mod config;

pub use config::{
    Emulates, PjrtCpuConfig, PjrtDeviceConfig, PjrtGpuConfig, PjrtTpuConfig, TpuAotConfig,
};

#[cfg(feature = "pjrt")]
pub mod exec;
#[cfg(feature = "pjrt")]
pub mod export;
#[cfg(feature = "pjrt")]
pub mod profile;
#[cfg(feature = "pjrt")]
pub mod tpu_aot;
#[cfg(feature = "pjrt")]
mod worker;

use super::{Backend, Unavailable};
use std::sync::Arc;

/// `<repo>/.venv/lib/python3*/site-packages/<rel>`, the newest Python's, if it exists;
/// else the path that was looked for (with `python3*`), for the error message.
pub fn venv_site_file(rel: &str) -> Result<std::path::PathBuf, std::path::PathBuf> {
    let lib = crate::repo_root().join(".venv/lib");
    let mut found: Vec<std::path::PathBuf> = std::fs::read_dir(&lib)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                .map(|e| e.path().join("site-packages").join(rel))
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
        .pop()
        .ok_or_else(|| lib.join("python3*/site-packages").join(rel))
}

/// The backend name of a `tpu-aot` topology: `v6e:2x2` → `tpu-aot-v6e-2x2`.
pub fn tpu_aot_name(topology: &str) -> String {
    format!("tpu-aot-{}", topology.replace(':', "-"))
}

/// What each PJRT backend kind's settings give the configuration and the trial list
/// ([`super::registry::Section`]): its names, entries, plugin and how it opens.
mod sections {
    use super::*;
    use crate::backends::registry::Section;
    use crate::config::entry::{ImplConfig, ImplEntry};
    use std::path::{Path, PathBuf};

    /// Pushes `r` on `ok`, or its error on `missing` under `name`.
    #[cfg_attr(not(feature = "pjrt"), allow(dead_code))]
    fn push(
        name: String,
        r: anyhow::Result<Arc<dyn Backend>>,
        ok: &mut Vec<Arc<dyn Backend>>,
        missing: &mut Vec<Unavailable>,
    ) {
        match r {
            Ok(x) => ok.push(x),
            Err(e) => missing.push(Unavailable::of(name, &e)),
        }
    }

    /// Without the `pjrt` feature each PJRT backend is unavailable, with that reason.
    #[cfg(not(feature = "pjrt"))]
    fn without_pjrt(names: Vec<String>, missing: &mut Vec<Unavailable>) {
        for name in names {
            missing.push(Unavailable {
                name,
                reason: "built without `pjrt` (the default feature; build with `--features pjrt`)"
                    .into(),
                broken: false,
            });
        }
    }

    /// The section methods every PJRT kind shares: entries and plugin.
    macro_rules! entries_and_plugin {
        ($($field:tt)*) => {
            fn entries(&self) -> &[ImplEntry] {
                &self$($field)*.implementations
            }
            fn entries_mut(&mut self) -> &mut Vec<ImplEntry> {
                &mut self$($field)*.implementations
            }
            fn plugin(&self) -> Option<&Path> {
                self$($field)*.plugin.as_deref()
            }
            fn plugin_mut(&mut self) -> Option<&mut Option<PathBuf>> {
                Some(&mut self$($field)*.plugin)
            }
            fn clone_box(&self) -> Box<dyn Section> {
                Box::new(self.clone())
            }
            fn as_any(&self) -> &dyn std::any::Any {
                self
            }
        };
    }

    impl Section for PjrtCpuConfig {
        entries_and_plugin!();
        fn validate(&self, origin: &str, _section: &str) -> anyhow::Result<()> {
            PjrtCpuConfig::validate(self, origin)
        }
        fn open(
            &self,
            section: &str,
            ok: &mut Vec<Arc<dyn Backend>>,
            missing: &mut Vec<Unavailable>,
        ) {
            #[cfg(feature = "pjrt")]
            push(
                section.into(),
                exec::PjrtExec::cpu(self).map(|x| Arc::new(x) as Arc<dyn Backend>),
                ok,
                missing,
            );
            #[cfg(not(feature = "pjrt"))]
            {
                let _ = ok;
                without_pjrt(self.backend_names(section), missing);
            }
        }
    }

    impl Section for TpuAotConfig {
        entries_and_plugin!();
        fn validate(&self, origin: &str, _section: &str) -> anyhow::Result<()> {
            TpuAotConfig::validate(self, origin)
        }
        fn backend_names(&self, _section: &str) -> Vec<String> {
            self.topologies.iter().map(|t| tpu_aot_name(t)).collect()
        }
        fn implementations_on(&self, backend: &str) -> Vec<ImplConfig> {
            self.topologies
                .iter()
                .find(|t| tpu_aot_name(t) == backend)
                .map(|t| self.implementations_for(t))
                .unwrap_or_default()
        }
        fn open(
            &self,
            section: &str,
            ok: &mut Vec<Arc<dyn Backend>>,
            missing: &mut Vec<Unavailable>,
        ) {
            #[cfg(feature = "pjrt")]
            {
                let _ = section;
                for t in &self.topologies {
                    push(
                        tpu_aot_name(t),
                        tpu_aot::TpuAot::new(self, t).map(|x| Arc::new(x) as Arc<dyn Backend>),
                        ok,
                        missing,
                    );
                }
            }
            #[cfg(not(feature = "pjrt"))]
            {
                let _ = ok;
                without_pjrt(self.backend_names(section), missing);
            }
        }
    }

    /// A device plugin's execution backend of `profile`.
    #[cfg_attr(not(feature = "pjrt"), allow(unused_variables))]
    fn open_device(
        c: &PjrtDeviceConfig,
        section: &str,
        gpu: bool,
        ok: &mut Vec<Arc<dyn Backend>>,
        missing: &mut Vec<Unavailable>,
    ) {
        #[cfg(feature = "pjrt")]
        {
            let profile = if gpu {
                profile::Profile::Gpu
            } else {
                profile::Profile::Tpu
            };
            push(
                section.into(),
                exec::PjrtExec::open(profile, c.plugin.as_ref(), None, None, &c.implementations)
                    .map(|x| Arc::new(x) as Arc<dyn Backend>),
                ok,
                missing,
            );
        }
        #[cfg(not(feature = "pjrt"))]
        without_pjrt(vec![section.to_string()], missing);
    }

    /// The section of a device plugin's execution backend (`gpu`: pjrt-gpu, else
    /// pjrt-tpu).
    macro_rules! device_section {
        ($t:ty, $gpu:expr) => {
            impl Section for $t {
                entries_and_plugin!(.0);
                fn validate(&self, origin: &str, section: &str) -> anyhow::Result<()> {
                    self.0.validate(origin, section)
                }
                fn open(
                    &self,
                    section: &str,
                    ok: &mut Vec<Arc<dyn Backend>>,
                    missing: &mut Vec<Unavailable>,
                ) {
                    open_device(&self.0, section, $gpu, ok, missing)
                }
            }
        };
    }

    device_section!(PjrtGpuConfig, true);
    device_section!(PjrtTpuConfig, false);
}

/// The least host memory one trial takes on the CPU plugin before anything is compiled:
/// its arguments and the gradients it returns, two f32 copies of the differentiable
/// inputs (B·T·V logits, or hidden and lm_head). What the compiled module needs on top
/// (XLA's temporaries: f32 logits and softmax for jax_baseline, a chunk for xla_chunked)
/// is checked after the compile, against the memory free then (`worker`).
pub fn cpu_working_set_bytes(case: &crate::cases::Case) -> u64 {
    2 * 4 * case.input_elements() as u64
}
