//! What differs between the PJRT execution backends, one [`Profile`] per platform; the
//! backend itself ([`super::exec::PjrtExec`]) is the same for all of them.
//!
//! | profile | backend | plugin (default; the env variable and the config's `plugin` override) | exports for | memory figures |
//! | --- | --- | --- | --- | --- |
//! | [`Profile::Cpu`] | `pjrt-cpu` | the venv's `xla_cpu_pjrt` (`GRPO_PJRT_PLUGIN`) | `cpu` | host memory |
//! | [`Profile::Gpu`] | `pjrt-gpu` | the venv's `jax_plugins/xla_cuda13` (`GRPO_PJRT_PLUGIN`) | `cuda` | device memory |
//! | [`Profile::Tpu`] | `pjrt-tpu` | the venv's `libtpu` (`GRPO_LIBTPU`) | `tpu` | device HBM |

use anyhow::{anyhow, bail, Result};
use grpo_pjrt::{ClientOptions, NamedValue};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One PJRT platform the execution backend runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// XLA:CPU (`xla_cpu_pjrt`): executes everywhere, Pallas in interpret mode.
    Cpu,
    /// XLA:GPU through the CUDA PJRT plugin: NVIDIA GPUs.
    Gpu,
    /// libtpu: TPU chips (a `--features tpu` build on a TPU VM).
    Tpu,
}

/// The CUDA PJRT plugins looked for in the venv, newest CUDA first: jax's
/// `jax-cuda13-pjrt` and `jax-cuda12-pjrt` wheels.
pub const CUDA_PLUGINS: [&str; 2] = [
    "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
    "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
];

/// How long a device plugin may take to create its client before the backend is
/// declared unavailable (libtpu without chips must fail fast, not hang).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

impl Profile {
    /// The backend's name, as in configs and records.
    pub fn backend(self) -> &'static str {
        match self {
            Profile::Cpu => "pjrt-cpu",
            Profile::Gpu => "pjrt-gpu",
            Profile::Tpu => "pjrt-tpu",
        }
    }

    /// The platform modules are exported for (`jax.export(platforms=[...])`).
    pub fn platform(self) -> &'static str {
        match self {
            Profile::Cpu => "cpu",
            Profile::Gpu => "cuda",
            Profile::Tpu => "tpu",
        }
    }

    /// The PJRT client platform names this profile accepts from its plugin.
    pub fn client_platforms(self) -> &'static [&'static str] {
        match self {
            Profile::Cpu => &["cpu", "host"],
            Profile::Gpu => &["cuda", "gpu"],
            Profile::Tpu => &["tpu"],
        }
    }

    /// The environment variable that overrides the plugin.
    pub fn plugin_env(self) -> &'static str {
        match self {
            Profile::Cpu | Profile::Gpu => crate::env::PJRT_PLUGIN,
            Profile::Tpu => crate::env::LIBTPU,
        }
    }

    /// The config key of the plugin, for messages.
    pub fn plugin_key(self) -> String {
        format!("backends.{}.plugin", self.backend())
    }

    /// Why this machine cannot run the profile, or None when it seems it can: the GPU
    /// needs an NVIDIA device node, the TPU chips (and a `--features tpu` build).
    pub fn unavailable_reason(self) -> Option<String> {
        match self {
            Profile::Cpu => None,
            Profile::Gpu => no_gpu_reason(Path::new("/dev")),
            Profile::Tpu => no_chips_reason().or_else(|| {
                (!cfg!(feature = "tpu")).then(|| {
                    "built without the `tpu` feature (on a TPU VM: cargo test --release --features tpu)".into()
                })
            }),
        }
    }

    /// The plugin to load: the environment variable, else the config's `plugin`, else
    /// the venv's. The error says where it looked and how to install it.
    pub fn plugin(self, configured: Option<&PathBuf>) -> Result<PathBuf> {
        if self == Profile::Tpu {
            return super::tpu_aot::libtpu_path(configured);
        }
        if let Some(p) = crate::env::pjrt_plugin()? {
            return Ok(p);
        }
        if let Some(p) = configured {
            if !p.is_file() {
                bail!(
                    "PJRT plugin {} (the config's `plugin`) does not exist (run scripts/setup.sh or set {})",
                    p.display(),
                    crate::env::PJRT_PLUGIN
                );
            }
            return Ok(p.clone());
        }
        let wanted: &[&str] = match self {
            Profile::Cpu => &["xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"],
            _ => &CUDA_PLUGINS,
        };
        let mut looked = Vec::new();
        for rel in wanted {
            match super::venv_site_file(rel) {
                Ok(p) => return Ok(p),
                Err(l) => looked.push(l.display().to_string()),
            }
        }
        Err(anyhow!(
            "no {} at {} (run scripts/setup.sh, which installs the pinned {}, or set {})",
            match self {
                Profile::Cpu => "PJRT CPU plugin",
                _ => "CUDA PJRT plugin",
            },
            looked.join(" or "),
            match self {
                Profile::Cpu => "xla_cpu_pjrt wheel",
                _ => "jax-cuda13-pjrt wheel where an NVIDIA driver is present",
            },
            crate::env::PJRT_PLUGIN
        ))
    }

    /// The client's create options.
    pub fn client_options(self, cpu_device_count: Option<i64>) -> ClientOptions {
        match self {
            Profile::Cpu => ClientOptions {
                cpu_device_count,
                ..Default::default()
            },
            // The BFC allocator grows as needed instead of taking 75% of the GPU at start:
            // its peak then is what the trials used, and other processes keep their memory.
            Profile::Gpu => ClientOptions {
                named_values: vec![NamedValue::bool("preallocate", false)],
                ..Default::default()
            },
            Profile::Tpu => ClientOptions::default(),
        }
    }

    /// Whether the client is created when the backend opens (a device plugin: its
    /// failure makes the backend unavailable, its trials ignored) or at the first trial
    /// (the CPU plugin: listing trials costs nothing).
    pub fn eager(self) -> bool {
        self != Profile::Cpu
    }

    /// The label of the memory figures (`Memory::source`).
    pub fn memory_label(self, plugin: &Path) -> String {
        match self {
            Profile::Cpu => "XLA:CPU (host memory: peak = arguments + outputs)".into(),
            Profile::Gpu => format!(
                "XLA:GPU {} (device memory)",
                plugin
                    .file_name()
                    .map_or_else(String::new, |f| f.to_string_lossy().into_owned())
            ),
            Profile::Tpu => format!(
                "libtpu {} (device HBM)",
                super::tpu_aot::libtpu_version(plugin)
            ),
        }
    }

    /// Whether the compiled peak is judged against a memory budget (device memory; on
    /// the CPU plugin peak = arguments + outputs says nothing).
    pub fn judges_memory(self) -> bool {
        self != Profile::Cpu
    }

    /// Whether the case's host-memory estimate is checked before it runs (the CPU
    /// plugin's device memory is this machine's memory).
    pub fn device_is_host(self) -> bool {
        self == Profile::Cpu
    }

    /// How the cost of this profile's compiled modules is derived, if it is.
    pub fn derives_cost(self) -> Option<crate::cost::Accelerator> {
        match self {
            Profile::Cpu => None,
            Profile::Gpu => Some(crate::cost::Accelerator::Gpu),
            Profile::Tpu => Some(crate::cost::Accelerator::Tpu),
        }
    }
}

/// Why a machine has no TPU chips, or None when it seems to have some (`/dev/accel*` on
/// v2–v4 and v5e VMs, `/dev/vfio/<n>` on v5p/v6e VMs).
pub fn no_chips_reason() -> Option<String> {
    let accel = dir_has("/dev", &|n| n.starts_with("accel"));
    let vfio = dir_has("/dev/vfio", &|n| n.chars().all(|c| c.is_ascii_digit()));
    if accel || vfio {
        None
    } else {
        Some("no TPU chips on this machine (no /dev/accel* or /dev/vfio/<n> devices)".into())
    }
}

/// Why a machine has no NVIDIA GPU, or None when `dev` (normally `/dev`) has a device
/// node `nvidia<n>`.
pub fn no_gpu_reason(dev: &Path) -> Option<String> {
    let has = dir_has(&dev.to_string_lossy(), &|n| {
        n.strip_prefix("nvidia")
            .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
    });
    (!has).then(|| {
        format!(
            "no NVIDIA GPU on this machine ({}/nvidia0 absent)",
            dev.display()
        )
    })
}

fn dir_has(dir: &str, pred: &dyn Fn(&str) -> bool) -> bool {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .any(|e| pred(&e.file_name().to_string_lossy()))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_needs_an_nvidia_device_node() {
        let dir = std::env::temp_dir().join(format!("grpo-nogpu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("nvidiactl"), b"").unwrap();
        let why = no_gpu_reason(&dir).expect("nvidiactl alone is no GPU");
        assert!(why.contains("nvidia0 absent"), "{why}");
        std::fs::write(dir.join("nvidia0"), b"").unwrap();
        assert_eq!(no_gpu_reason(&dir), None);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn each_profile_keeps_its_backend_name_and_export_platform() {
        let rows: Vec<(&str, &str, bool)> = [Profile::Cpu, Profile::Gpu, Profile::Tpu]
            .iter()
            .map(|p| (p.backend(), p.platform(), p.judges_memory()))
            .collect();
        assert_eq!(
            rows,
            [
                ("pjrt-cpu", "cpu", false),
                ("pjrt-gpu", "cuda", true),
                ("pjrt-tpu", "tpu", true)
            ]
        );
        let gpu = Profile::Gpu.client_options(Some(4)).to_named_values();
        assert!(
            gpu.iter().all(|v| v.name != "cpu_device_count"),
            "a CPU-only option would make the CUDA plugin refuse the client"
        );
    }
}
