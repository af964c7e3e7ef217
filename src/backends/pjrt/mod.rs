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

pub use config::{PjrtCpuConfig, PjrtDeviceConfig, PjrtGpuConfig, PjrtTpuConfig, TpuAotConfig};

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

use super::{Backend, BackendsConfig, Unavailable};
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

/// Adds the configured PJRT backends to `ok`, or says in `missing` why each is not there.
#[cfg(feature = "pjrt")]
pub(crate) fn available(
    b: &BackendsConfig,
    ok: &mut Vec<Arc<dyn Backend>>,
    missing: &mut Vec<Unavailable>,
) {
    let mut push = |name: String, r: anyhow::Result<Arc<dyn Backend>>| match r {
        Ok(x) => ok.push(x),
        Err(e) => missing.push(Unavailable {
            name,
            reason: format!("{e:#}"),
        }),
    };
    use profile::Profile;
    let arc = |r: anyhow::Result<exec::PjrtExec>| r.map(|x| Arc::new(x) as Arc<dyn Backend>);
    if let Some(c) = &b.pjrt_cpu {
        push("pjrt-cpu".into(), arc(exec::PjrtExec::cpu(c)));
    }
    if let Some(c) = &b.pjrt_gpu {
        push(
            "pjrt-gpu".into(),
            arc(exec::PjrtExec::open(
                Profile::Gpu,
                c.plugin.as_ref(),
                None,
                &c.implementations,
            )),
        );
    }
    if let Some(c) = &b.tpu_aot {
        for t in &c.topologies {
            push(
                tpu_aot_name(t),
                tpu_aot::TpuAot::new(c, t).map(|x| Arc::new(x) as Arc<dyn Backend>),
            );
        }
    }
    if let Some(c) = &b.pjrt_tpu {
        push(
            "pjrt-tpu".into(),
            arc(exec::PjrtExec::open(
                Profile::Tpu,
                c.plugin.as_ref(),
                None,
                &c.implementations,
            )),
        );
    }
}

/// Without the `pjrt` feature every PJRT backend is unavailable, with that reason.
#[cfg(not(feature = "pjrt"))]
pub(crate) fn available(
    b: &BackendsConfig,
    _ok: &mut Vec<Arc<dyn Backend>>,
    missing: &mut Vec<Unavailable>,
) {
    for name in b.names().into_iter().filter(|n| n != "reference") {
        missing.push(Unavailable {
            name,
            reason: "built without `pjrt` (the default feature; build with `--features pjrt`)"
                .into(),
        });
    }
}

/// The least host memory one trial takes on the CPU plugin before anything is compiled:
/// its arguments and the gradients it returns, two f32 copies of the differentiable
/// inputs (B·T·V logits, or hidden and lm_head). What the compiled module needs on top
/// (XLA's temporaries: f32 logits and softmax for jax_baseline, a chunk for xla_chunked)
/// is checked after the compile, against the memory free then (`worker`).
pub fn cpu_working_set_bytes(case: &crate::cases::Case) -> u64 {
    2 * 4 * case.input_elements() as u64
}
