//! The `tpu-aot-<topology>` backends: the TPU export of an implementation compiled by
//! libtpu for a TPU topology on this machine, without chips (`PJRT_TopologyDescription_Create`,
//! then `PJRT_Compile` with no client). No outputs: each trial is judged on whether the
//! TPU compiler accepts the module (a Mosaic lowering error, a compile error or a VMEM
//! overflow fails it with the compiler's message) and on its memory budget: compiled
//! peak HBM over the floor (arguments + outputs − aliased). The peak is deterministic
//! for a pinned libtpu, so budgets are conformance, not timing.

use super::export::{Exported, Exporter};
use super::worker::{cost_of, memory_of};
use super::TpuAotConfig;
use crate::backends::{Backend, RunOptions, RunResult, Timing};
use crate::cases::Case;
use crate::config::ImplConfig;
use crate::inputs::Inputs;
use anyhow::{anyhow, bail, Context, Result};
use grpo_pjrt::proto::OptionOverrideValue;
use grpo_pjrt::{Plugin, Program, Topology};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Environment libtpu needs on a machine that is not a Cloud TPU VM: without it, libtpu
/// retries the cloud metadata server for minutes before giving up.
pub const SKIP_METADATA: (&str, &str) = ("TPU_SKIP_MDS_QUERY", "1");

/// The XLA option that turns memory-space assignment off: every buffer stays in HBM.
pub const HBM_ONLY_OPTION: &str = "xla_msa_enable";
/// Environment variable: a directory where the HBM-only compile writes XLA's HLO dumps
/// (`*buffer-assignment.txt` lists every buffer and what is live at the peak).
pub const DUMP_ENV: &str = "GRPO_TPU_DUMP_TO";

/// libtpu lets one process at a time load it (a lockfile in /tmp), which is right for
/// chips but wrong for deviceless compiles: tests and runs in parallel processes would
/// fail with "Internal error when accessing libtpu multi-process lockfile". Allowed only
/// on machines without TPU chips.
pub const ALLOW_MULTIPLE_LOADS: (&str, &str) = ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1");

/// Sets [`SKIP_METADATA`] (and, without chips, [`ALLOW_MULTIPLE_LOADS`]) unless the user
/// set them. Front ends call this at start-up, before any thread exists; [`load_libtpu`]
/// calls it again as a fallback.
pub fn prepare_environment() {
    if std::env::var_os(SKIP_METADATA.0).is_none() {
        std::env::set_var(SKIP_METADATA.0, SKIP_METADATA.1);
    }
    if std::env::var_os(ALLOW_MULTIPLE_LOADS.0).is_none() && super::tpu::no_chips_reason().is_some() {
        std::env::set_var(ALLOW_MULTIPLE_LOADS.0, ALLOW_MULTIPLE_LOADS.1);
    }
}

/// libtpu to load: `GRPO_LIBTPU`, else `configured`, else the venv's `libtpu/libtpu.so`.
pub fn libtpu_path(configured: Option<&PathBuf>) -> Result<PathBuf> {
    if let Some(p) = crate::env::libtpu()? {
        return Ok(p);
    }
    if let Some(p) = configured {
        if !p.is_file() {
            bail!("libtpu {} (the config's `plugin`) does not exist", p.display());
        }
        return Ok(p.clone());
    }
    super::venv_site_file("libtpu/libtpu.so").map_err(|looked| {
        anyhow!(
            "no libtpu at {} (run scripts/setup.sh, which installs the pinned libtpu wheel, or set {})",
            looked.display(),
            crate::env::LIBTPU
        )
    })
}

/// The libtpu wheel version next to `libtpu.so` (from its `.dist-info`), or `unknown`.
pub fn libtpu_version(so: &Path) -> String {
    let site = so.parent().and_then(|p| p.parent());
    site.and_then(|s| std::fs::read_dir(s).ok())
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_prefix("libtpu-")).and_then(|n| n.strip_suffix(".dist-info")).map(String::from))
        .next()
        .unwrap_or_else(|| "unknown".into())
}

/// Loads libtpu (once per process; the binding caches plugins by path).
pub fn load_libtpu(path: &Path) -> Result<Plugin> {
    prepare_environment();
    Plugin::load(path).map_err(|e| anyhow!("libtpu {}: {e}", path.display()))
}

/// Chips of a topology name such as `v6e:2x4` (the product of its dimensions).
pub fn topology_chips(topology: &str) -> Option<usize> {
    let dims = topology.split(':').nth(1)?;
    dims.split('x').map(|d| d.trim().parse::<usize>().ok()).product()
}

/// One TPU export per (implementation, case), shared by every topology.
fn shared_exporter() -> Result<Arc<Exporter>> {
    static EXPORTER: OnceLock<Arc<Exporter>> = OnceLock::new();
    if let Some(e) = EXPORTER.get() {
        return Ok(e.clone());
    }
    let e = Arc::new(Exporter::new("tpu")?);
    Ok(EXPORTER.get_or_init(|| e).clone())
}

/// Compiles run one at a time (libtpu's compiler is the heavy part; two at once only
/// doubles the memory on a 2-core machine).
fn compile_lock() -> &'static Mutex<()> {
    static LOCK: Mutex<()> = Mutex::new(());
    &LOCK
}

/// Deviceless TPU compilation for one topology.
pub struct TpuAot {
    name: String,
    topology: String,
    plugin: PathBuf,
    version: String,
    impls: Vec<ImplConfig>,
    exporter: Arc<Exporter>,
}

impl TpuAot {
    /// The backend for `topology`. Unavailable (with the fix) when libtpu or the
    /// exporter's Python is missing. libtpu is loaded at the first compile, not here, so
    /// listing trials stays quick and quiet; a libtpu that fails to load or does not know
    /// the topology makes every trial an error with its message.
    pub fn new(cfg: &TpuAotConfig, topology: &str) -> Result<TpuAot> {
        let plugin = libtpu_path(cfg.plugin.as_ref())?;
        let version = libtpu_version(&plugin);
        Ok(TpuAot {
            name: super::tpu_aot_name(topology),
            topology: topology.to_string(),
            plugin,
            version,
            impls: crate::config::enabled(&cfg.implementations),
            exporter: shared_exporter()?,
        })
    }

    fn options(&self, implementation: &str) -> Option<&ImplConfig> {
        super::export::find(&self.impls, implementation)
    }

    /// Compiles a StableHLO module for this topology: memory, cost and compile time.
    ///
    /// Two compiles. The production one (default options) decides the verdict on errors
    /// and gives the cost analysis and compile time; its `peak_memory_in_bytes` counts
    /// buffers that memory-space assignment (MSA) prefetches into VMEM too: a module
    /// whose logits fit in VMEM (every ci shape) shows a whole extra logits copy that is
    /// not HBM. The second compile, with `xla_msa_enable=false`, keeps every buffer in
    /// HBM: its peak is the HBM figure (`peak_bytes`, what budgets judge; an upper bound,
    /// since MSA only moves buffers out of HBM). Measured at the nightly shapes (arrays far
    /// larger than VMEM) both peaks agree within 0.3%.
    pub fn compile_module(&self, module: &Path, num_partitions: usize) -> Result<RunResult> {
        let code = std::fs::read(module).with_context(|| format!("cannot read {}", module.display()))?;
        let _guard = compile_lock().lock().unwrap_or_else(|p| p.into_inner());
        let plugin = load_libtpu(&self.plugin)?;
        let topo = Topology::create(&plugin, &self.topology, &[])
            .map_err(|e| anyhow!("libtpu {} cannot describe topology `{}`: {e}", self.version, self.topology))?;
        let chips = topo.device_descriptions().map(|d| d.len()).unwrap_or(0);
        if num_partitions > chips.max(1) {
            bail!("the module is partitioned over {num_partitions} devices but topology {} has {chips} chips", self.topology);
        }
        // SPMD over the first N chips of the topology (ids 0..N).
        let ids: Vec<i64> = (0..num_partitions.max(1) as i64).collect();
        let options = super::worker::compile_options(num_partitions, &ids)?;
        let program = Program::mlir_bytecode(code);
        let t0 = Instant::now();
        let exe = topo
            .compile(&program, &options)
            .map_err(|e| anyhow!("TPU compile for {} failed: {e}", self.topology))?;
        let compile_s = t0.elapsed().as_secs_f64();
        let with_vmem = memory_of(&exe, "").and_then(|m| m.peak_bytes);
        let mut hbm_only = options.clone();
        hbm_only.option_overrides.push((HBM_ONLY_OPTION.into(), OptionOverrideValue::BoolField(false)));
        if let Some(dir) = std::env::var_os(DUMP_ENV) {
            // Debugging where the HBM goes: XLA's HLO dumps (buffer assignment included)
            // of the HBM-only compile.
            hbm_only.option_overrides.push(("xla_dump_to".into(), OptionOverrideValue::StringField(dir.to_string_lossy().into())));
            hbm_only.option_overrides.push(("xla_dump_hlo_as_text".into(), OptionOverrideValue::BoolField(true)));
        }
        let exe_hbm = topo
            .compile(&program, &hbm_only)
            .map_err(|e| anyhow!("TPU compile for {} with {HBM_ONLY_OPTION}=false failed: {e}", self.topology))?;
        let mut memory = memory_of(
            &exe_hbm,
            &format!("libtpu {} {} (deviceless, per chip, HBM: {HBM_ONLY_OPTION}=false)", self.version, self.topology),
        );
        match memory.as_mut() {
            Some(m) if m.peak_bytes.is_some() => m.peak_with_vmem_prefetch_bytes = with_vmem,
            _ => bail!("libtpu {} reported no peak memory for the executable", self.version),
        }
        Ok(RunResult {
            outputs: None,
            timing: Some(Timing { compile_s: Some(compile_s), runs_s: Vec::new() }),
            memory,
            cost: cost_of(&exe),
        })
    }
}

impl Backend for TpuAot {
    fn name(&self) -> &str {
        &self.name
    }

    fn implementations(&self) -> Vec<String> {
        self.impls.iter().map(|c| c.display_name().to_string()).collect()
    }

    fn supports(&self, implementation: &str, case: &Case) -> Result<(), String> {
        let Some(imp) = self.options(implementation) else {
            return Err(format!("{} has no implementation `{implementation}` configured", self.name));
        };
        if let Some(chips) = topology_chips(&self.topology).filter(|&c| case.devices > c) {
            return Err(format!("the case needs {} chips, topology {} has {chips}", case.devices, self.topology));
        }
        self.exporter.support(imp, case)
    }

    fn validate(&self) -> Result<()> {
        self.exporter.check_config(&self.impls)
    }

    fn prepare(&self, work: &[(&str, &Case)]) -> Result<()> {
        self.exporter.prepare_named(&self.impls, work)
    }

    fn run(&self, implementation: &str, case: &Case, _inputs: &Inputs, _opts: &RunOptions) -> Result<RunResult> {
        let imp = self.options(implementation).with_context(|| format!("{} has no implementation `{implementation}`", self.name))?;
        match self.exporter.get(imp, case)? {
            Exported::Ready { module, manifest } => self.compile_module(&module, manifest.num_partitions),
            Exported::Unsupported(r) => bail!("unsupported: {r}"),
            Exported::Failed(e) => bail!("{e}"),
        }
    }

    fn executes(&self) -> bool {
        false
    }

    fn budget(&self, implementation: &str) -> Option<crate::backends::Budget> {
        self.options(implementation).and_then(crate::backends::Budget::of)
    }
}

#[cfg(test)]
mod chip_tests {
    #[test]
    fn chips_of_topology_names() {
        assert_eq!(super::topology_chips("v6e:2x2"), Some(4));
        assert_eq!(super::topology_chips("v6e:2x4"), Some(8));
        assert_eq!(super::topology_chips("v5e:2x2x1"), Some(4));
        assert_eq!(super::topology_chips("bogus"), None);
    }
}
