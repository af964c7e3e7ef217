//! Settings of the PJRT backends (parsed and checked in every build, also without the
//! `pjrt` feature).

use crate::config::entry::{check_implementations, enabled, ImplConfig, ImplEntry};
use anyhow::{bail, Result};
use serde::Deserialize;
use std::path::PathBuf;

/// The accelerator a `pjrt-cpu` export emulates, so a CPU verdict is never kinder than the
/// platform it stands for: its reduced-precision f32 matmuls and what its compiler does to
/// 16-bit round trips (grpo_jax's `precision.py`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Emulates {
    /// XLA:TPU: DEFAULT f32 matmuls as one bf16 pass, HIGH as TF32 (coarser than its three
    /// passes), 16-bit round trips kept.
    #[default]
    Tpu,
    /// XLA:GPU on Ampere/Hopper: DEFAULT and HIGH as TF32, 16-bit round trips removed
    /// (excess precision).
    Gpu,
}

impl Emulates {
    /// `tpu` or `gpu`.
    pub fn name(self) -> &'static str {
        match self {
            Emulates::Tpu => "tpu",
            Emulates::Gpu => "gpu",
        }
    }
}

/// `pjrt-cpu` settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PjrtCpuConfig {
    /// PJRT plugin path (default: the venv's `xla_cpu_pjrt`; `GRPO_PJRT_PLUGIN` overrides).
    #[serde(default)]
    pub plugin: Option<PathBuf>,
    /// Number of CPU devices of the client (≥ 1).
    #[serde(default)]
    pub cpu_device_count: Option<i64>,
    /// The accelerator whose precision the exports emulate (docs/spec.md, "Precision").
    #[serde(default)]
    pub emulates: Emulates,
    /// Implementations to run, in order.
    #[serde(deserialize_with = "crate::config::entry::impl_list")]
    pub implementations: Vec<ImplEntry>,
}

/// `tpu-aot` settings: deviceless TPU compilation with libtpu, one backend per topology.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpuAotConfig {
    /// libtpu path (default: the venv's `libtpu/libtpu.so`; `GRPO_LIBTPU` overrides).
    #[serde(default)]
    pub plugin: Option<PathBuf>,
    /// Topologies to compile for, e.g. `v6e:2x2`, `v5e:2x2`, `v6e:2x4`.
    pub topologies: Vec<String>,
    /// Implementations to compile, with their `max_peak_over_floor` budgets.
    #[serde(deserialize_with = "crate::config::entry::impl_list")]
    pub implementations: Vec<ImplEntry>,
}

/// Settings of an execution backend on a device plugin: `pjrt-tpu` (TPU chips through a
/// libtpu client) and `pjrt-gpu` (an NVIDIA GPU through the CUDA PJRT plugin).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PjrtDeviceConfig {
    /// Plugin path (pjrt-tpu: default the venv's `libtpu/libtpu.so`, `GRPO_LIBTPU`
    /// overrides; pjrt-gpu: default the venv's `jax_plugins/xla_cuda13`, `GRPO_PJRT_PLUGIN`
    /// overrides).
    #[serde(default)]
    pub plugin: Option<PathBuf>,
    /// Implementations to run, with their `max_peak_over_floor` budgets.
    #[serde(deserialize_with = "crate::config::entry::impl_list")]
    pub implementations: Vec<ImplEntry>,
}

/// `pjrt-tpu` settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct PjrtTpuConfig(pub PjrtDeviceConfig);

/// `pjrt-gpu` settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct PjrtGpuConfig(pub PjrtDeviceConfig);

impl std::ops::Deref for PjrtTpuConfig {
    type Target = PjrtDeviceConfig;
    fn deref(&self) -> &PjrtDeviceConfig {
        &self.0
    }
}

impl std::ops::Deref for PjrtGpuConfig {
    type Target = PjrtDeviceConfig;
    fn deref(&self) -> &PjrtDeviceConfig {
        &self.0
    }
}

impl PjrtCpuConfig {
    /// Checks the settings.
    pub fn validate(&self, origin: &str) -> Result<()> {
        check_implementations(origin, "pjrt-cpu", &[], &self.implementations)?;
        if let Some(n) = self.cpu_device_count {
            if n < 1 {
                bail!("{origin}: backend `pjrt-cpu`: cpu_device_count must be ≥ 1 (got {n})");
            }
        }
        Ok(())
    }
}

/// `v6e:2x2`, `v5e:2x2`, `v5p:2x2x1`, `tpu7x:2x2x1`: generation, colon, dimensions.
fn topology_ok(t: &str) -> bool {
    let Some((gen, dims)) = t.split_once(':') else {
        return false;
    };
    let rest = gen.strip_prefix("tpu").or_else(|| gen.strip_prefix('v'));
    let gen_ok = rest.is_some_and(|r| {
        !r.is_empty()
            && r.starts_with(|c: char| c.is_ascii_digit())
            && r.chars().all(|c| c.is_ascii_alphanumeric())
    });
    let dims_ok = !dims.is_empty()
        && dims
            .split('x')
            .all(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()));
    gen_ok && dims_ok
}

impl TpuAotConfig {
    /// Checks the settings.
    pub fn validate(&self, origin: &str) -> Result<()> {
        check_implementations(origin, "tpu-aot", &self.topologies, &self.implementations)?;
        if self.topologies.is_empty() {
            bail!("{origin}: backend `tpu-aot` needs at least one topology (e.g. `topologies: [v6e:2x2]`)");
        }
        for (k, t) in self.topologies.iter().enumerate() {
            if self.topologies[..k].contains(t) {
                bail!("{origin}: backend `tpu-aot`: topology `{t}` is listed twice (each topology is one backend, `{}`)", super::tpu_aot_name(t));
            }
        }
        for t in &self.topologies {
            if !topology_ok(t) {
                bail!("{origin}: backend `tpu-aot`: topology `{t}` is not of the form `v6e:2x2` or `tpu7x:2x2x1` (generation:dimensions)");
            }
        }
        for c in self.implementations.iter().map(|e| e.resolved()) {
            for t in c.topologies.iter().flatten() {
                if !self.topologies.contains(t) {
                    bail!(
                        "{origin}: backend `tpu-aot`, implementation `{}`: topology `{t}` is not one of the backend's ({})",
                        c.display_name(),
                        self.topologies.join(", ")
                    );
                }
            }
        }
        Ok(())
    }
}

impl PjrtDeviceConfig {
    /// Checks the settings of backend `name`.
    pub fn validate(&self, origin: &str, name: &str) -> Result<()> {
        check_implementations(origin, name, &[], &self.implementations)
    }
}

impl TpuAotConfig {
    /// The enabled entries that compile for `topology` (every entry without `topologies`).
    pub fn implementations_for(&self, topology: &str) -> Vec<ImplConfig> {
        enabled(&self.implementations)
            .into_iter()
            .filter(|c| {
                c.topologies
                    .as_ref()
                    .is_none_or(|ts| ts.iter().any(|t| t == topology))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topologies() {
        for t in [
            "v6e:2x2",
            "v5e:2x2",
            "v6e:2x4",
            "v5p:2x2x1",
            "v4:2x2x1",
            "tpu7x:2x2x1",
        ] {
            assert!(topology_ok(t), "{t}");
        }
        for t in [
            "v6e", "v6e:", "6e:2x2", "v6e:2xx2", "v6e:2x2 ", ":2x2", "tpu:2x2", "vx:2x2",
        ] {
            assert!(!topology_ok(t), "{t}");
        }
    }
}
