//! The `tpu-aot-<topology>` backends: the TPU export of an implementation compiled by
//! libtpu for a TPU topology on this machine, without chips (`PJRT_TopologyDescription_Create`,
//! then `PJRT_Compile` with no client). No outputs: each trial is judged on whether the
//! TPU compiler accepts the module (a Mosaic lowering error, a compile error or a VMEM
//! overflow fails it with the compiler's message) and on its memory budget: compiled
//! peak HBM over the floor (arguments + outputs − aliased). The peak is deterministic
//! for a pinned libtpu, so budgets are conformance, not timing.

use super::export::{Exported, Exporter, Manifest};
use super::worker::{cost_of, memory_of};
use super::TpuAotConfig;
use crate::backends::{Backend, Refusal, RunOptions, RunResult, Timing};
use crate::cases::Case;
use crate::config::entry::ImplConfig;
use crate::cost::roofline::{generation_of_topology, roofline, Generation};
use crate::cost::speed::{SpeedClass, BASELINE};
use crate::cost::{DerivedCost, COST_MODEL_VERSION};
use crate::inputs::Inputs;
use crate::precision_class::PrecisionClass;
use anyhow::{anyhow, bail, Context, Result};
use grpo_pjrt::proto::OptionOverrideValue;
use grpo_pjrt::{Plugin, Program, Topology};
use std::collections::HashMap;
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

/// Without the metadata server, libtpu reads the host's accelerator type and worker
/// hostnames from the environment and, when they are unset, logs three lines of warnings
/// and an `E0000` error at load. A deviceless compile uses neither (the topology is given
/// to the compiler; results are identical with and without these, checked on the smoke
/// suite for v5e, v6e and tpu7x), so without chips they are set to quiet values.
pub const DEVICELESS_HOST: [(&str, &str); 2] = [
    ("TPU_ACCELERATOR_TYPE", "v6e-4"),
    ("TPU_WORKER_HOSTNAMES", "localhost"),
];

/// Sets [`SKIP_METADATA`] (and, without chips, [`ALLOW_MULTIPLE_LOADS`] and
/// [`DEVICELESS_HOST`]) unless the user set them. Front ends call this at start-up, before any thread exists; [`load_libtpu`]
/// calls it again as a fallback.
pub fn prepare_environment() {
    if std::env::var_os(SKIP_METADATA.0).is_none() {
        std::env::set_var(SKIP_METADATA.0, SKIP_METADATA.1);
    }
    if super::profile::no_chips_reason().is_some() {
        for (k, v) in std::iter::once(ALLOW_MULTIPLE_LOADS).chain(DEVICELESS_HOST) {
            if std::env::var_os(k).is_none() {
                std::env::set_var(k, v);
            }
        }
    }
}

/// libtpu to load: `GRPO_LIBTPU`, else `configured`, else the venv's `libtpu/libtpu.so`.
pub fn libtpu_path(configured: Option<&PathBuf>) -> Result<PathBuf> {
    if let Some(p) = crate::env::libtpu()? {
        return Ok(p);
    }
    if let Some(p) = configured {
        if !p.is_file() {
            bail!(
                "libtpu {} (the config's `plugin`) does not exist",
                p.display()
            );
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
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("libtpu-"))
                .and_then(|n| n.strip_suffix(".dist-info"))
                .map(String::from)
        })
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
    dims.split('x')
        .map(|d| d.trim().parse::<usize>().ok())
        .product()
}

/// Devices of a topology: its chips times the devices per chip of its generation (a
/// tpu7x chip is two devices, one per TensorCore: libtpu describes `tpu7x:2x2x1` as 8).
pub fn topology_devices(topology: &str) -> Option<usize> {
    let per_chip = crate::cost::roofline::generation_of_topology(topology)
        .map_or(1, |g| g.devices_per_chip as usize);
    topology_chips(topology).map(|c| c * per_chip)
}

/// One TPU export per (implementation, case), shared by every topology.
fn shared_exporter() -> Result<Arc<Exporter>> {
    static EXPORTER: OnceLock<Arc<Exporter>> = OnceLock::new();
    if let Some(e) = EXPORTER.get() {
        return Ok(e.clone());
    }
    let e = Arc::new(Exporter::new("tpu", None)?);
    Ok(EXPORTER.get_or_init(|| e).clone())
}

/// Compiles run one at a time (libtpu's compiler is the heavy part; two at once only
/// doubles the memory on a 2-core machine).
fn compile_lock() -> &'static Mutex<()> {
    static LOCK: Mutex<()> = Mutex::new(());
    &LOCK
}

/// jax_baseline's derived cost per case id, each computed by the first trial that needs it.
/// A baseline's derived cost per (case id, precision class), each computed once.
type BaselineCosts =
    Mutex<HashMap<(String, PrecisionClass), Arc<OnceLock<Result<DerivedCost, String>>>>>;

/// Compile results per exported module file, each computed by the first trial that needs
/// it (`Err`: the compiler's message).
type Compiled = Mutex<HashMap<PathBuf, Arc<OnceLock<Result<RunResult, String>>>>>;

/// Deviceless TPU compilation for one topology.
pub struct TpuAot {
    name: String,
    topology: String,
    plugin: PathBuf,
    version: String,
    impls: Vec<ImplConfig>,
    exporter: Arc<Exporter>,
    /// Each class's jax_baseline's derived cost per case id (speed budgets), computed once.
    baselines: BaselineCosts,
    /// Compile results per module: cases that differ only in their data (profile, mask,
    /// advantages) export the same module (the artifact directory is keyed by the export
    /// request), and its compile is the same.
    compiled: Compiled,
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
            impls: cfg.implementations_for(topology),
            exporter: shared_exporter()?,
            baselines: Mutex::default(),
            compiled: Mutex::default(),
        })
    }

    /// The exporter this backend uses (shared by every topology).
    pub fn exporter(&self) -> &Exporter {
        &self.exporter
    }

    fn options(&self, implementation: &str) -> Option<&ImplConfig> {
        super::export::find(&self.impls, implementation)
    }

    /// Compiles a StableHLO module for this topology: memory, cost (the compiler's and the
    /// suite's derived one with its roofline time) and compile time.
    ///
    /// Two compiles. The production one (default options) decides the verdict on errors
    /// and gives the cost analysis, the derived cost (its optimized HLO: what runs, with
    /// the buffers memory-space assignment keeps in VMEM) and compile time; its
    /// `peak_memory_in_bytes` counts buffers that MSA prefetches into VMEM too: a module
    /// whose logits fit in VMEM (every ci shape) shows a whole extra logits copy that is
    /// not HBM. The second compile, with `xla_msa_enable=false`, keeps every buffer in
    /// HBM: its peak is the HBM figure (`peak_bytes`, what budgets judge; an upper bound,
    /// since MSA only moves buffers out of HBM). Measured at the nightly shapes (arrays far
    /// larger than VMEM) both peaks agree within 0.3%.
    pub fn compile_module(&self, module: &Path, manifest: &Manifest) -> Result<RunResult> {
        let num_partitions = manifest.num_partitions;
        let code =
            std::fs::read(module).with_context(|| format!("cannot read {}", module.display()))?;
        let _guard = compile_lock().lock().unwrap_or_else(|p| p.into_inner());
        let plugin = load_libtpu(&self.plugin)?;
        let topo = Topology::create(&plugin, &self.topology, &[]).map_err(|e| {
            anyhow!(
                "libtpu {} cannot describe topology `{}`: {e}",
                self.version,
                self.topology
            )
        })?;
        let devices = topo.device_descriptions().map(|d| d.len()).unwrap_or(0);
        if num_partitions > devices.max(1) {
            bail!("the module is partitioned over {num_partitions} devices but topology {} has {devices}", self.topology);
        }
        // SPMD over the first N chips of the topology (ids 0..N).
        let ids: Vec<i64> = (0..num_partitions.max(1) as i64).collect();
        let options = super::worker::compile_options(num_partitions, &ids)?;
        let program = Program::mlir_bytecode(code);
        let t0 = Instant::now();
        let exe = topo
            .compile(&program, &options)
            .map_err(|e| anyhow!(compile_failure(&self.topology, "", &e, module)))?;
        let compile_s = t0.elapsed().as_secs_f64();
        let with_vmem = memory_of(&exe, "").and_then(|m| m.peak_bytes);
        let derived = derive_cost(&exe, manifest, crate::cost::Accelerator::Tpu);
        let mut hbm_only = options.clone();
        hbm_only.option_overrides.push((
            HBM_ONLY_OPTION.into(),
            OptionOverrideValue::BoolField(false),
        ));
        if let Some(dir) = std::env::var_os(DUMP_ENV) {
            // Debugging where the HBM goes: XLA's HLO dumps (buffer assignment included)
            // of the HBM-only compile.
            hbm_only.option_overrides.push((
                "xla_dump_to".into(),
                OptionOverrideValue::StringField(dir.to_string_lossy().into()),
            ));
            hbm_only.option_overrides.push((
                "xla_dump_hlo_as_text".into(),
                OptionOverrideValue::BoolField(true),
            ));
        }
        let exe_hbm = topo.compile(&program, &hbm_only).map_err(|e| {
            let with = format!(" with {HBM_ONLY_OPTION}=false");
            anyhow!(compile_failure(&self.topology, &with, &e, module))
        })?;
        let mut memory = memory_of(
            &exe_hbm,
            &format!(
                "libtpu {} {} (deviceless, per device, HBM: {HBM_ONLY_OPTION}=false)",
                self.version, self.topology
            ),
        );
        match memory.as_mut() {
            Some(m) if m.peak_bytes.is_some() => m.peak_with_vmem_prefetch_bytes = with_vmem,
            _ => bail!(
                "libtpu {} reported no peak memory for the executable",
                self.version
            ),
        }
        let (derived, cost_error) = match derived {
            Ok(d) => (Some(d), None),
            Err(e) => (None, Some(e)),
        };
        Ok(RunResult {
            outputs: None,
            timing: Some(Timing {
                compile_s: Some(compile_s),
                runs_s: Vec::new(),
                compile_shared: false,
            }),
            memory,
            cost: cost_of(&exe),
            derived,
            cost_error,
            ..Default::default()
        })
    }

    /// [`TpuAot::compile_module`] once per module file and backend: a later trial of the
    /// same module gets the first one's result, marked [`Timing::compile_shared`].
    fn compile_shared(&self, module: &Path, manifest: &Manifest) -> Result<RunResult, String> {
        let cell = self
            .compiled
            .lock()
            .unwrap()
            .entry(module.to_path_buf())
            .or_default()
            .clone();
        let mut first = false;
        let res = cell
            .get_or_init(|| {
                first = true;
                self.compile_module(module, manifest)
                    .map_err(|e| format!("{e:#}"))
            })
            .clone()?;
        Ok(if first {
            res
        } else {
            let mut res = res;
            if let Some(t) = res.timing.as_mut() {
                t.compile_shared = true;
            }
            res
        })
    }

    /// The derived cost of a module on this topology from the production compile alone
    /// (no memory figures): what a speed budget needs of the baseline.
    fn derive_only(&self, module: &Path, manifest: &Manifest) -> Result<DerivedCost, String> {
        let code =
            std::fs::read(module).map_err(|e| format!("cannot read {}: {e}", module.display()))?;
        let _guard = compile_lock().lock().unwrap_or_else(|p| p.into_inner());
        let plugin = load_libtpu(&self.plugin).map_err(|e| format!("{e:#}"))?;
        let topo = Topology::create(&plugin, &self.topology, &[])
            .map_err(|e| format!("libtpu cannot describe topology `{}`: {e}", self.topology))?;
        let ids: Vec<i64> = (0..manifest.num_partitions.max(1) as i64).collect();
        let options = super::worker::compile_options(manifest.num_partitions, &ids)
            .map_err(|e| format!("{e:#}"))?;
        let exe = topo
            .compile(&Program::mlir_bytecode(code), &options)
            .map_err(|e| compile_failure(&self.topology, "", &e, module))?;
        derive_cost(&exe, manifest, crate::cost::Accelerator::Tpu)
    }

    /// The generation of this backend's topology, if the roofline table has it.
    pub fn generation(&self) -> Option<&'static Generation> {
        generation_of_topology(&self.topology)
    }

    /// The once-cell of `class`'s jax_baseline's derived cost on case `id` (shared by the
    /// baseline's own trial and the speed budgets of the case).
    fn baseline_cell(
        &self,
        id: &str,
        class: PrecisionClass,
    ) -> Arc<OnceLock<Result<DerivedCost, String>>> {
        self.baselines
            .lock()
            .unwrap()
            .entry((id.to_string(), class))
            .or_default()
            .clone()
    }

    /// `class`'s jax_baseline's derived cost on `case` and this topology (computed once
    /// per case, class and process, and kept on disk next to the baseline's export).
    fn baseline_cost(&self, case: &Case, class: PrecisionClass) -> Result<DerivedCost, String> {
        let cell = self.baseline_cell(&case.id, class);
        cell.get_or_init(|| {
            let base = self.baseline_entry(class);
            let name = base.display_name().to_string();
            let (module, manifest) = match self
                .exporter
                .get(&base, case)
                .map_err(|e| format!("{e:#}"))?
            {
                Exported::Ready { module, manifest } => (module, manifest),
                Exported::Unsupported(r) | Exported::NotApplicable(r) => {
                    return Err(format!("{name} does not support the case: {r}"))
                }
                Exported::BreaksContract(m) => {
                    return Err(format!(
                        "the speed reference {name} breaks SPEC's output contract: {m}"
                    ))
                }
                Exported::Failed(e) => return Err(format!("the speed reference {name}: {e}")),
            };
            let cached = module.with_file_name(format!(
                "derived-{}-libtpu{}-v{COST_MODEL_VERSION}.json",
                self.topology.replace(':', "-"),
                self.version
            ));
            if let Some(d) = std::fs::read_to_string(&cached)
                .ok()
                .and_then(|t| serde_json::from_str::<DerivedCost>(&t).ok())
            {
                return Ok(d);
            }
            let d = self
                .derive_only(&module, &manifest)
                .map_err(|e| format!("{name}: {e}"))?;
            if let Ok(text) = serde_json::to_string(&d) {
                super::export::write_atomically(&cached, &text);
            }
            Ok(d)
        })
        .clone()
    }

    /// The class `imp`'s speed on `case` is compared within: the class its entry must
    /// reach on the case's dtype (the configuration's rule is folded into each entry).
    fn speed_class_of(&self, imp: &ImplConfig, case: &Case) -> SpeedClass {
        let class =
            crate::precision_class::required(imp.min_precision_class.as_ref(), None, case.dtype);
        SpeedClass {
            class,
            baseline: self.baseline_entry(class).display_name().to_string(),
        }
    }

    /// The jax_baseline entry `class`'s speed budgets compare against: a configured one
    /// with the class's `dz_precision` and no other option (so its export and compile are
    /// shared), else a synthesized one, `jax_baseline@speed-baseline` (`-CLASS` past
    /// `bf16`).
    fn baseline_entry(&self, class: PrecisionClass) -> ImplConfig {
        self.impls
            .iter()
            .find(|c| is_baseline_of(c, class))
            .cloned()
            .unwrap_or_else(|| {
                let mut c = crate::config::entry::ImplEntry::Id(BASELINE.into()).resolved();
                let dz = class.baseline_dz_precision();
                c.name = Some(match dz {
                    "default" => format!("{BASELINE}@speed-baseline"),
                    _ => format!("{BASELINE}@speed-baseline-{class}"),
                });
                if dz != "default" {
                    c.options.insert("dz_precision".into(), dz.into());
                }
                c
            })
    }
}

/// Whether `c` is `class`'s baseline: jax_baseline (the suite's own) with the class's
/// `dz_precision` (absent: `default`) and no other option.
fn is_baseline_of(c: &ImplConfig, class: PrecisionClass) -> bool {
    let dz = c
        .options
        .get("dz_precision")
        .map_or(Some("default"), |v| v.as_str());
    c.id == BASELINE
        && !c.is_external()
        && c.options.keys().all(|k| k == "dz_precision")
        && dz == Some(class.baseline_dz_precision())
}

/// The suite's derived cost of a compiled executable: its optimized HLO walked with the
/// manifest's kernel derivations; `Err` says why it cannot be derived.
pub fn derive_cost(
    exe: &grpo_pjrt::Executable,
    manifest: &Manifest,
    rates: crate::cost::Accelerator,
) -> Result<DerivedCost, String> {
    if let Some(e) = &manifest.kernel_cost_error {
        return Err(format!(
            "the exporter could not derive the Mosaic kernels' cost: {e}"
        ));
    }
    let (format, bytes) = exe
        .optimized_program()
        .map_err(|e| format!("the plugin gave no optimized program: {e}"))?
        .ok_or("the plugin gave no optimized program")?;
    let module = grpo_pjrt::hlo::decode(&format, &bytes)
        .ok_or_else(|| format!("the optimized program is in format `{format}`, not HLO"))?
        .map_err(|e| format!("unreadable optimized HLO: {e}"))?;
    Ok(crate::cost::hlo_walk::derive_on(
        &module,
        &manifest.kernels,
        rates,
    ))
}

impl Backend for TpuAot {
    fn name(&self) -> &str {
        &self.name
    }

    fn implementations(&self) -> Vec<String> {
        super::export::names(&self.impls)
    }

    fn supports(&self, implementation: &str, case: &Case) -> Result<(), Refusal> {
        let imp = super::export::entry(&self.impls, &self.name, implementation)?;
        if let Some(devices) = topology_devices(&self.topology).filter(|&c| case.devices > c) {
            // A topology too small for the case is not a limitation of the implementation.
            return Err(Refusal::NotApplicable(format!(
                "not applicable: the case needs {} devices, topology {} has {devices}",
                case.devices, self.topology
            )));
        }
        self.exporter.support(imp, case)
    }

    fn validate(&self) -> Result<()> {
        self.exporter.check_config(&self.impls)
    }

    fn broken(&self, implementation: &str) -> Option<String> {
        super::export::find(&self.impls, implementation).and_then(|i| self.exporter.broken(i))
    }

    fn prepare(&self, work: &[(&str, &Case)]) -> Result<()> {
        // Speed budgets compare with jax_baseline on the same case: export it in the batch.
        let mut bases: Vec<(ImplConfig, &Case)> = Vec::new();
        let mut w: Vec<(&ImplConfig, &Case)> = Vec::new();
        for (n, c) in work {
            if let Some(o) = super::export::find(&self.impls, n) {
                w.push((o, *c));
                if !matches!(o.speed_budget_on(&c.id, &self.topology), Ok(None)) {
                    let class = self.speed_class_of(o, c).class;
                    bases.push((self.baseline_entry(class), *c));
                }
            }
        }
        w.extend(bases.iter().map(|(b, c)| (b, *c)));
        self.exporter.ensure(&w)
    }

    fn run(
        &self,
        implementation: &str,
        case: &Case,
        _inputs: &Inputs,
        _opts: &RunOptions,
    ) -> Result<RunResult> {
        let imp = self
            .options(implementation)
            .with_context(|| format!("{} has no implementation `{implementation}`", self.name))?;
        let (module, manifest) = match self.exporter.get(imp, case)? {
            Exported::Ready { module, manifest } => (module, manifest),
            Exported::Unsupported(r) => bail!("unsupported: {r}"),
            Exported::NotApplicable(r) => return Err(Refusal::NotApplicable(r).into()),
            Exported::BreaksContract(m) => return Err(Refusal::BreaksContract(m).into()),
            Exported::Failed(e) => bail!("{e}"),
        };
        let mut res = self.compile_shared(&module, &manifest).map_err(|e| {
            super::export::explain_compile_failure(
                anyhow!(e),
                &manifest,
                &self.plugin,
                "backends.tpu-aot.plugin",
                crate::env::LIBTPU,
            )
        })?;
        res.exporter = Some(self.exporter.info(imp, &manifest));
        res.precision = manifest.precision();
        let floor = res.memory.as_ref().and_then(|m| m.floor_bytes);
        res.derived = res.derived.take().map(|d| d.with_ratios(case, floor));
        let generation = self.generation();
        if let (Some(d), Some(g)) = (&res.derived, generation) {
            res.roofline = Some(roofline(d, g));
        }
        if let Some(d) = &res.derived {
            for class in PrecisionClass::STRICT_FIRST {
                if is_baseline_of(imp, class) {
                    // Shared with this case's speed budgets (no second compile).
                    let cell = self.baseline_cell(&case.id, class);
                    cell.get_or_init(|| Ok(d.clone()));
                }
            }
        }
        let class = self.speed_class_of(imp, case);
        res.speed_class = Some(class.clone());
        let budget = imp
            .speed_budget_on(&case.id, &self.topology)
            .map_err(|e| anyhow!("speed budget of {}: {e}", imp.display_name()))?;
        if let Some(max) = budget {
            let g = generation.with_context(|| format!("a speed budget is configured but topology {} has no published peaks in the roofline table (v5e, v6e, tpu7x)", self.topology))?;
            let own = res.derived.as_ref().ok_or_else(|| {
                anyhow!(
                    "a speed budget is configured but the cost could not be derived: {}",
                    res.cost_error.clone().unwrap_or_default()
                )
            })?;
            let base = self.baseline_cost(case, class.class).map_err(|e| anyhow!("a speed budget is configured but {}'s cost on the case is not available: {e}", class.baseline))?.with_ratios(case, None);
            let _ = max;
            res.speed = Some(crate::cost::speed::SpeedMeasure {
                own: own.clone(),
                own_roofline: roofline(own, g),
                baseline_roofline: roofline(&base, g),
                baseline: base,
                manifest_class: res.precision.as_ref().map(|p| p.expected_class()),
                class,
            });
        }
        Ok(res)
    }

    fn executes(&self) -> bool {
        false
    }

    fn budget(&self, implementation: &str) -> Option<crate::backends::Budget> {
        self.options(implementation)
            .and_then(crate::backends::Budget::of)
    }

    fn speed_budget(&self, implementation: &str, case: &Case) -> Option<f64> {
        self.options(implementation)
            .and_then(|c| c.speed_budget_on(&case.id, &self.topology).ok().flatten())
    }
}

/// The one-line error of a failed compile: `TPU compile for <topology><with> failed:` and
/// the compiler's first line. A longer message (libtpu's VMEM report runs to dozens of
/// lines) is written whole beside the module, and the line names that file.
fn compile_failure(topology: &str, with: &str, e: &dyn std::fmt::Display, module: &Path) -> String {
    let text = e.to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("no message").to_string();
    let head = format!("TPU compile for {topology}{with} failed: {first}");
    if lines.next().is_none() {
        return head;
    }
    let name = format!("compile-error-{}.txt", topology.replace([':', '/'], "_"));
    let path = module.with_file_name(name);
    super::export::write_atomically(&path, &format!("{head}\n{text}"));
    if path.exists() {
        format!("{head} (the compiler's whole message: {})", path.display())
    } else {
        format!("{head} ({} more lines not kept)", text.lines().count() - 1)
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
        assert_eq!(super::topology_devices("v6e:2x4"), Some(8));
        assert_eq!(super::topology_devices("tpu7x:2x2x1"), Some(8));
    }
}

#[cfg(test)]
mod compile_failure_tests {
    use super::compile_failure;

    #[test]
    fn a_long_compiler_message_is_one_line_naming_the_file_that_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let module = dir.path().join("module.mlirbc");
        let vmem = "XLA:TPU compile permanent error. Used 79.08M of 64.00M vmem.\n\n  Program vmem requirement 79.08M:\n    scoped 79.08M\n  1. Size: 16.00M";
        let line = compile_failure("tpu7x:2x2x1", "", &vmem, &module);
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.starts_with("TPU compile for tpu7x:2x2x1 failed: XLA:TPU compile permanent error. Used 79.08M of 64.00M vmem."),
            "{line}"
        );
        let kept = dir.path().join("compile-error-tpu7x_2x2x1.txt");
        assert!(
            line.ends_with(&format!(
                "(the compiler's whole message: {})",
                kept.display()
            )),
            "{line}"
        );
        assert!(std::fs::read_to_string(&kept)
            .unwrap()
            .contains("1. Size: 16.00M"));

        let short = compile_failure(
            "v6e:2x2",
            " with x=false",
            &"unregistered operation",
            &module,
        );
        assert_eq!(
            short,
            "TPU compile for v6e:2x2 with x=false failed: unregistered operation"
        );
    }
}
