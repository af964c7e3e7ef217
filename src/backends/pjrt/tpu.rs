//! The `pjrt-tpu` backend: execution on TPU chips through a libtpu client, the same
//! gates as every backend, timing stopped on output readiness, compiled peak HBM with
//! its budget. Compiled in every build with `pjrt` (so CI keeps it building); it opens
//! only in a `--features tpu` build on a machine with TPU chips, and is otherwise
//! unavailable with that reason (its trials are listed as ignored).

use super::PjrtTpuConfig;
use crate::backends::Backend;
use anyhow::Result;
use std::sync::Arc;

/// Why a machine has no TPU chips, or None when it seems to have some (`/dev/accel*` on
/// v2–v4 and v5e VMs, `/dev/vfio/<n>` on v5p/v6e VMs).
pub fn no_chips_reason() -> Option<String> {
    let any = |dir: &str, pred: &dyn Fn(&str) -> bool| {
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .any(|e| pred(&e.file_name().to_string_lossy()))
            })
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
        /// Creates the libtpu client (bounded); unavailable without chips, and in a build
        /// without the `tpu` feature (the code is compiled in every build with `pjrt`, so
        /// it keeps building; the feature is the user's choice to execute on chips).
        pub fn new(cfg: &PjrtTpuConfig) -> Result<PjrtTpu> {
            if let Some(why) = no_chips_reason() {
                bail!("{why}");
            }
            if !cfg!(feature = "tpu") {
                bail!("built without the `tpu` feature (on a TPU VM: cargo test --release --features tpu)");
            }
            prepare_environment();
            let plugin = libtpu_path(cfg.plugin.as_ref())?;
            let label = format!("libtpu {} (device HBM)", libtpu_version(&plugin));
            let worker = Worker::start_labelled(plugin, None, &label, Some(CLIENT_TIMEOUT))?;
            Ok(PjrtTpu {
                impls: crate::config::enabled(&cfg.implementations),
                exporter: Exporter::new("tpu")?,
                worker: Mutex::new(worker),
            })
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
            self.impls
                .iter()
                .map(|c| c.display_name().to_string())
                .collect()
        }

        fn supports(&self, implementation: &str, case: &Case) -> Result<(), String> {
            let Some(imp) = self.options(implementation) else {
                return Err(format!(
                    "pjrt-tpu has no implementation `{implementation}` configured"
                ));
            };
            self.exporter.support(imp, case)
        }

        fn validate(&self) -> Result<()> {
            self.exporter.check_config(&self.impls)
        }

        fn broken(&self, implementation: &str) -> Option<String> {
            super::super::export::find(&self.impls, implementation)
                .and_then(|i| self.exporter.broken(i))
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
            let imp = self
                .options(implementation)
                .with_context(|| format!("pjrt-tpu has no implementation `{implementation}`"))?;
            let (manifest, module) = match self.exporter.get(imp, case)? {
                Exported::Ready { manifest, module } => (manifest, module),
                Exported::Unsupported(r) => bail!("unsupported: {r}"),
                Exported::Failed(e) => bail!("{e}"),
            };
            let args = host_args(&manifest, case, inputs)?;
            let spec = manifest.clone();
            let res = self.worker.lock().unwrap().run(
                manifest,
                module,
                args,
                opts.warmup,
                opts.repeats,
            )?;
            let mut out = RunResult {
                outputs: Some(named_outputs(&spec, res.outputs)?),
                timing: Some(res.timing),
                memory: res.memory,
                cost: res.cost,
                exporter: Some(self.exporter.info(imp, &spec)),
                precision: spec.precision(),
                ..Default::default()
            };
            fill_speed(&mut out, res.derived, res.device_kind.as_deref(), case);
            Ok(out)
        }

        fn budget(&self, implementation: &str) -> Option<crate::backends::Budget> {
            self.options(implementation)
                .and_then(crate::backends::Budget::of)
        }
    }
}

pub use imp::PjrtTpu;

/// Fills a TPU execution's derived cost, its roofline on the device's generation and the
/// efficiency measured / roofline (from the median timed run).
pub fn fill_speed(
    out: &mut crate::backends::RunResult,
    derived: Option<Result<crate::cost::DerivedCost, String>>,
    device_kind: Option<&str>,
    case: &crate::cases::Case,
) {
    use crate::cost::roofline::{generation_of_device_kind, roofline};
    match derived {
        Some(Ok(d)) => {
            out.derived = Some(d.with_ratios(case, out.memory.as_ref().and_then(|m| m.floor_bytes)))
        }
        Some(Err(e)) => out.cost_error = Some(e),
        None => {}
    }
    if let (Some(d), Some(g)) = (
        &out.derived,
        device_kind.and_then(generation_of_device_kind),
    ) {
        let r = roofline(d, g);
        if let Some(t) = out.timing.as_ref().and_then(|t| t.median_s()) {
            out.efficiency = crate::cost::speed::Efficiency::of(t, &r);
        }
        out.roofline = Some(r);
    }
}

#[cfg(test)]
mod speed_tests {
    use super::*;
    use crate::backends::{RunResult, Timing};
    use crate::cost::{DerivedCost, Work};

    #[test]
    fn a_tpu_run_records_its_roofline_and_measured_over_roofline() {
        let case = crate::cases::parse_fixed("b: 1, t: 1024, v: 8192, dtype: bf16").unwrap();
        // 16.38 MB moved: 10 µs on v6e (1638 GB/s); measured median 25 µs → 2.5×.
        let d = DerivedCost {
            work: Work {
                hbm_bytes: 16.38e6,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut out = RunResult {
            timing: Some(Timing {
                compile_s: None,
                runs_s: vec![30e-6, 25e-6, 20e-6],
                compile_shared: false,
            }),
            ..Default::default()
        };
        fill_speed(&mut out, Some(Ok(d)), Some("TPU v6 lite"), &case);
        let (r, e) = (
            out.roofline.as_ref().unwrap(),
            out.efficiency.as_ref().unwrap(),
        );
        assert_eq!(r.generation, "v6e");
        assert!((r.time_s - 10e-6).abs() < 1e-12, "{r:?}");
        assert!((e.measured_over_roofline - 2.5).abs() < 1e-9, "{e:?}");
        // Logits level: passes over the logits' 16.78 MB.
        assert!(
            (out.derived.as_ref().unwrap().logits_passes.unwrap()
                - 16.38e6 / (1024.0 * 8192.0 * 2.0))
                .abs()
                < 1e-12
        );
        // A device kind without published peaks: no roofline, no efficiency, no guess.
        let mut other = RunResult {
            timing: Some(Timing {
                compile_s: None,
                runs_s: vec![1.0],
                compile_shared: false,
            }),
            ..Default::default()
        };
        fill_speed(
            &mut other,
            Some(Ok(DerivedCost::default())),
            Some("TPU v4"),
            &case,
        );
        assert!(other.roofline.is_none() && other.efficiency.is_none() && other.derived.is_some());
        let mut failed = RunResult::default();
        fill_speed(
            &mut failed,
            Some(Err("no HLO".into())),
            Some("TPU v6 lite"),
            &case,
        );
        assert_eq!(failed.cost_error.as_deref(), Some("no HLO"));
    }
}
