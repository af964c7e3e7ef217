//! The PJRT execution backend: JAX implementations exported to StableHLO by
//! `backends/jax`, compiled and run through our binding (`backends/pjrt`) on one PJRT
//! plugin. One type serves `pjrt-cpu`, `pjrt-gpu` and `pjrt-tpu`; what differs between
//! them is a [`Profile`].

use super::export::{Exported, Exporter, Manifest};
use super::profile::Profile;
use super::worker::{HostArg, Worker};
use crate::backends::{Backend, Refusal, RunOptions, RunResult};
use crate::cases::Case;
use crate::config::entry::{ImplConfig, ImplEntry};
use crate::inputs::Inputs;
use crate::outputs::Outputs;
use crate::spec::OutputName;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::sync::Mutex;

/// Executes exported modules on one PJRT plugin (see the module doc).
pub struct PjrtExec {
    profile: Profile,
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

/// Outputs of a module, named by its manifest, as SPEC outputs.
pub(super) fn named_outputs(manifest: &Manifest, data: Vec<Vec<f32>>) -> Result<Outputs> {
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
pub(super) fn host_args(manifest: &Manifest, case: &Case, inputs: &Inputs) -> Result<Vec<HostArg>> {
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

impl PjrtExec {
    /// The backend of `profile` from its settings. Errors say why it is unavailable (no
    /// device, no plugin, a client the plugin would not create).
    pub fn open(
        profile: Profile,
        plugin: Option<&PathBuf>,
        cpu_device_count: Option<i64>,
        emulates: Option<super::Emulates>,
        implementations: &[ImplEntry],
    ) -> Result<PjrtExec> {
        if let Some(why) = profile.unavailable_reason() {
            return Err(crate::backends::NoDevice(why).into());
        }
        if profile == Profile::Tpu {
            super::tpu_aot::prepare_environment();
        }
        let plugin = profile.plugin(plugin)?;
        let exec = PjrtExec {
            profile,
            plugin,
            cpu_device_count,
            impls: crate::config::entry::enabled(implementations),
            exporter: Exporter::new(profile.platform(), emulates)?,
            worker: Mutex::new(None),
        };
        if profile.eager() {
            exec.with_worker(|_| Ok(()))?;
        }
        Ok(exec)
    }

    /// `pjrt-cpu` from its settings.
    pub fn cpu(cfg: &super::PjrtCpuConfig) -> Result<PjrtExec> {
        PjrtExec::open(
            Profile::Cpu,
            cfg.plugin.as_ref(),
            cfg.cpu_device_count,
            Some(cfg.emulates),
            &cfg.implementations,
        )
    }

    /// The profile this backend runs.
    pub fn profile(&self) -> Profile {
        self.profile
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
            *w = Some(Worker::start(
                self.plugin.clone(),
                self.profile,
                self.profile.client_options(self.cpu_device_count),
            )?);
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
        let name = self.profile.backend();
        let imp = self.options(implementation).with_context(|| {
            format!("{name} has no implementation `{implementation}` configured")
        })?;
        let (manifest, module) = match self.exporter.get(imp, run_as)? {
            Exported::Ready { manifest, module } => (manifest, module),
            Exported::Unsupported(r) => bail!("unsupported: {r}"),
            Exported::NotApplicable(r) => return Err(Refusal::NotApplicable(r).into()),
            Exported::BreaksContract(m) => return Err(Refusal::BreaksContract(m).into()),
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
                    &self.profile.plugin_key(),
                    self.profile.plugin_env(),
                )
            })?;
        let timing = if opts.repeats > 0 || res.timing.compile_s.is_some() {
            Some(res.timing)
        } else {
            None
        };
        let mut out = RunResult {
            outputs: Some(named_outputs(&spec, res.outputs)?),
            timing,
            memory: res.memory,
            cost: res.cost,
            exporter: Some(self.exporter.info(imp, &spec)),
            precision: spec.precision(),
            ..Default::default()
        };
        fill_speed(&mut out, res.derived, res.device_kind.as_deref(), case);
        Ok(out)
    }
}

impl Backend for PjrtExec {
    fn name(&self) -> &str {
        self.profile.backend()
    }

    fn shards(&self) -> bool {
        true
    }

    fn implementations(&self) -> Vec<String> {
        super::export::names(&self.impls)
    }

    fn supports(&self, implementation: &str, case: &Case) -> Result<(), Refusal> {
        let imp = super::export::entry(&self.impls, self.profile.backend(), implementation)?;
        // On the CPU plugin device memory is host memory, shared with the suite's own copy
        // of the inputs and the oracle: estimate and refuse rather than swap or get killed.
        if self.profile.device_is_host() {
            let need = super::cpu_working_set_bytes(case);
            if let Some(total) = mem_total_bytes() {
                if need as f64 > 0.75 * total as f64 {
                    return Err(Refusal::Unsupported(format!(
                        "needs ~{:.1} GiB of host memory on the CPU device, this machine has {:.1} GiB",
                        need as f64 / GIB,
                        total as f64 / GIB
                    )));
                }
            }
        }
        self.exporter.support(imp, case)
    }

    fn validate(&self) -> Result<()> {
        self.exporter.check_config(&self.impls)
    }

    fn broken(&self, implementation: &str) -> Option<String> {
        self.options(implementation)
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
        self.run_exported_as(implementation, case, case, inputs, opts)
    }

    fn budget(&self, implementation: &str) -> Option<crate::backends::Budget> {
        if !self.profile.judges_memory() {
            return None;
        }
        self.options(implementation)
            .and_then(crate::backends::Budget::of)
    }
}

/// Fills an execution's derived cost, its roofline on the device's generation and the
/// efficiency measured / roofline (from the median timed run).
pub fn fill_speed(
    out: &mut RunResult,
    derived: Option<Result<crate::cost::DerivedCost, String>>,
    device_kind: Option<&str>,
    case: &Case,
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

    fn timed(runs_s: Vec<f64>) -> RunResult {
        RunResult {
            timing: Some(Timing {
                compile_s: None,
                runs_s,
                compile_shared: false,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_execution_records_its_roofline_and_measured_over_roofline() {
        let case = crate::cases::parse_fixed("b: 1, t: 1024, v: 8192, dtype: bf16").unwrap();
        // 16.38 MB moved: 10 µs on v6e (1638 GB/s); measured median 25 µs → 2.5×.
        let d = DerivedCost {
            work: Work {
                hbm_bytes: 16.38e6,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut out = timed(vec![30e-6, 25e-6, 20e-6]);
        fill_speed(&mut out, Some(Ok(d.clone())), Some("TPU v6 lite"), &case);
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
        // An H100 (the CUDA plugin's device kind): 16.38 MB at 3.35 TB/s is 4.89 µs.
        let mut gpu = timed(vec![9.78e-6]);
        fill_speed(&mut gpu, Some(Ok(d)), Some("NVIDIA H100 80GB HBM3"), &case);
        let r = gpu.roofline.as_ref().expect("an H100 has a roofline row");
        assert_eq!(r.generation, "h100");
        assert!((r.time_s - 16.38e6 / 3.35e12).abs() < 1e-12, "{r:?}");
        assert!(
            (gpu.efficiency.unwrap().measured_over_roofline - 9.78e-6 / (16.38e6 / 3.35e12)).abs()
                < 1e-9
        );
        // A device kind without published peaks: no roofline, no efficiency, no guess.
        let mut other = timed(vec![1.0]);
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
