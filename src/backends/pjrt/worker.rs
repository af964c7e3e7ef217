//! The PJRT worker thread: owns the (non-Send) client and its compiled executables;
//! trials send it jobs over a channel. One worker also keeps timed runs from overlapping.

use super::export::Manifest;
use super::profile::{Profile, CLIENT_TIMEOUT};
use crate::backends::{Memory, Refusal, Timing};
use anyhow::{anyhow, bail, Context, Result};
use grpo_pjrt::{
    Client, ClientOptions, CompileOptions, DeviceAssignment, ElementType, LoadedExecutable, Plugin,
    Program,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Sender};
use std::time::Instant;

/// One host tensor for the device: element type name, dims, little-endian bytes.
pub struct HostArg {
    /// Manifest dtype name.
    pub dtype: String,
    /// Dimensions.
    pub dims: Vec<i64>,
    /// Bytes.
    pub bytes: Vec<u8>,
}

/// What a job returns.
pub struct JobResult {
    /// Outputs in manifest order, widened to f32.
    pub outputs: Vec<Vec<f32>>,
    /// Compile time (None when the executable was cached) and timed runs.
    pub timing: Timing,
    /// Compiled memory statistics.
    pub memory: Option<Memory>,
    /// Cost analysis (flops, bytes accessed, ...), when the plugin implements it.
    pub cost: Option<std::collections::BTreeMap<String, f64>>,
    /// TPU modules: the suite's derived cost of the compiled executable, or why not.
    pub derived: Option<Result<crate::cost::DerivedCost, String>>,
    /// Kind of the first device (`TPU v6 lite`, ...): which generation's peaks apply.
    pub device_kind: Option<String>,
}

struct Job {
    manifest: Manifest,
    module: PathBuf,
    args: Vec<HostArg>,
    warmup: usize,
    repeats: usize,
    reply: Sender<Result<JobResult>>,
}

/// Handle to the worker thread. Dropping it ends the thread and waits for it, so the
/// client and its executables are destroyed before the process exits (a CUDA plugin
/// otherwise logs "Failed to unload module ... leaking" for each at exit).
pub struct Worker {
    tx: Option<Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.tx.take(); // the thread's job loop ends
        if let Some(t) = self.thread.take() {
            t.join().ok();
        }
    }
}

/// The client, if its platform is one `profile` accepts.
fn check_platform(client: Client, profile: Profile, plugin: &std::path::Path) -> Result<Client> {
    let name = client
        .platform_name()
        .map_err(|e| anyhow!("PJRT plugin {}: no platform name: {e}", plugin.display()))?;
    if profile
        .client_platforms()
        .iter()
        .any(|p| name.eq_ignore_ascii_case(p))
    {
        Ok(client)
    } else {
        bail!(
            "PJRT plugin {} is a `{name}` plugin; backend `{}` needs a {} plugin (check {} and the config's `plugin`)",
            plugin.display(),
            profile.backend(),
            profile.platform(),
            profile.plugin_env()
        )
    }
}

fn element_type(name: &str) -> Result<ElementType> {
    Ok(match name {
        "f32" => ElementType::F32,
        "bf16" => ElementType::Bf16,
        "f16" => ElementType::F16,
        "i32" => ElementType::S32,
        "pred" => ElementType::Pred,
        other => bail!("unsupported dtype `{other}` in manifest"),
    })
}

fn widen(dtype: &str, bytes: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        "f32" => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        "bf16" => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        "f16" => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        "i32" => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        "pred" => bytes.iter().map(|&b| (b != 0) as u8 as f32).collect(),
        other => bail!("unsupported output dtype `{other}`"),
    })
}

impl Worker {
    /// Starts the worker: loads the plugin and creates the client of `profile` on its own
    /// thread. Fails (with the plugin's message) if either does, if client creation
    /// outlasts [`CLIENT_TIMEOUT`] (device plugins), or if the plugin is for another
    /// platform than the profile's.
    pub fn start(plugin: PathBuf, profile: Profile, options: ClientOptions) -> Result<Worker> {
        let label = profile.memory_label(&plugin);
        let timeout = profile.eager().then_some(CLIENT_TIMEOUT);
        let (tx, rx) = channel::<Job>();
        let (ready_tx, ready_rx) = channel::<Result<()>>();
        let thread = std::thread::Builder::new()
            .name("pjrt-worker".into())
            .spawn(move || {
                let client = Plugin::load(&plugin)
                    .and_then(|p| Client::new(&p, &options))
                    .map_err(|e| anyhow!("PJRT plugin {}: {e}", plugin.display()))
                    .and_then(|c| check_platform(c, profile, &plugin));
                let client = match client {
                    Ok(c) => {
                        ready_tx.send(Ok(())).ok();
                        c
                    }
                    Err(e) => {
                        ready_tx.send(Err(e)).ok();
                        return;
                    }
                };
                // Declared after the client, so dropped before it: executables and their
                // buffers go while the device context (CUDA's) still exists.
                let mut cache: HashMap<String, LoadedExecutable> = HashMap::new();
                for job in rx {
                    let r = run_job(&client, &mut cache, &job, &label, profile);
                    job.reply.send(r).ok();
                }
                drop(cache);
                drop(client);
            })
            .context("cannot start the PJRT worker thread")?;
        match timeout {
            None => ready_rx
                .recv()
                .context("PJRT worker died during start-up")??,
            Some(t) => ready_rx.recv_timeout(t).map_err(|_| {
                anyhow!(
                    "PJRT client creation did not finish within {} s",
                    t.as_secs()
                )
            })??,
        }
        Ok(Worker {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Compiles (once per manifest key) and runs a module: warm-up, then timed runs.
    pub fn run(
        &self,
        manifest: Manifest,
        module: PathBuf,
        args: Vec<HostArg>,
        warmup: usize,
        repeats: usize,
    ) -> Result<JobResult> {
        let (reply, rx) = channel();
        self.tx
            .as_ref()
            .context("PJRT worker is shut down")?
            .send(Job {
                manifest,
                module,
                args,
                warmup,
                repeats,
                reply,
            })
            .map_err(|_| anyhow!("PJRT worker is gone (an earlier job crashed it)"))?;
        rx.recv()
            .map_err(|_| anyhow!("PJRT worker died while running the job"))?
    }
}

/// Compile options of a module: one device, or SPMD over `ids` (Shardy: jax exports
/// multi-device modules with `sdy` ops, "lowered targeting Shardy" otherwise).
pub fn compile_options(num_partitions: usize, ids: &[i64]) -> Result<CompileOptions> {
    if num_partitions <= 1 {
        return Ok(CompileOptions::default());
    }
    Ok(CompileOptions {
        num_partitions: num_partitions as i64,
        use_spmd_partitioning: true,
        use_shardy_partitioner: true,
        device_assignment: Some(DeviceAssignment::new(vec![ids[..num_partitions].to_vec()])?),
        ..Default::default()
    })
}

/// XLA:CPU's compile settings of `pjrt-cpu` (docs/environment.md); `None` keeps XLA's
/// default. GPU and TPU compiles never take them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuCompile {
    /// The backend (LLVM) optimization level, `xla_backend_optimization_level`
    /// (`GRPO_XLA_CPU_OPT_LEVEL`).
    pub opt_level: Option<i64>,
    /// MLIR fusion emitters (`true`) or the elemental IR emitters (`false`),
    /// `xla_cpu_use_fusion_emitters` (`GRPO_XLA_CPU_FUSION_EMITTERS`).
    pub fusion_emitters: Option<bool>,
}

impl CpuCompile {
    /// The settings the environment asks for (an invalid value is an error naming it).
    pub fn from_env() -> Result<Self> {
        Ok(Self {
            opt_level: crate::env::cpu_opt_level()?,
            fusion_emitters: crate::env::cpu_fusion_emitters()?,
        })
    }

    /// `options` with these settings when the profile is the CPU's; a GPU or TPU compile
    /// is left as it is.
    pub fn apply(&self, mut options: CompileOptions, profile: Profile) -> CompileOptions {
        use grpo_pjrt::proto::OptionOverrideValue::{BoolField, IntField};
        if profile != Profile::Cpu {
            return options;
        }
        if let Some(level) = self.opt_level {
            options
                .option_overrides
                .push(("xla_backend_optimization_level".into(), IntField(level)));
        }
        if let Some(on) = self.fusion_emitters {
            options
                .option_overrides
                .push(("xla_cpu_use_fusion_emitters".into(), BoolField(on)));
        }
        options
    }
}

fn itemsize(dtype: &str) -> Result<usize> {
    Ok(match dtype {
        "f32" | "i32" => 4,
        "bf16" | "f16" => 2,
        "pred" => 1,
        other => bail!("unsupported dtype `{other}` in manifest"),
    })
}

/// Part `d` of `n` of a row-major array split evenly along `axis`: (dims, bytes).
pub fn shard_bytes(
    dims: &[i64],
    bytes: &[u8],
    item: usize,
    axis: usize,
    n: usize,
    d: usize,
) -> Result<(Vec<i64>, Vec<u8>)> {
    let size = dims[axis] as usize;
    if !size.is_multiple_of(n) {
        bail!("axis {axis} of {dims:?} does not split evenly over {n} devices");
    }
    let part = size / n;
    let outer: usize = dims[..axis].iter().map(|&x| x as usize).product();
    let inner: usize = dims[axis + 1..]
        .iter()
        .map(|&x| x as usize)
        .product::<usize>()
        * item;
    let mut out = Vec::with_capacity(outer * part * inner);
    for o in 0..outer {
        let start = (o * size + d * part) * inner;
        out.extend_from_slice(&bytes[start..start + part * inner]);
    }
    let mut sd = dims.to_vec();
    sd[axis] = part as i64;
    Ok((sd, out))
}

/// One element of `value` in `dtype`, little-endian.
fn element_bytes(dtype: &str, value: f64) -> Result<Vec<u8>> {
    Ok(match dtype {
        "f32" => (value as f32).to_le_bytes().to_vec(),
        "bf16" => half::bf16::from_f64(value).to_le_bytes().to_vec(),
        "f16" => half::f16::from_f64(value).to_le_bytes().to_vec(),
        "i32" => (value as i32).to_le_bytes().to_vec(),
        other => bail!("cannot pad a `{other}` tensor"),
    })
}

/// A row-major array extended along `axis` from `dims[axis]` to `to` with copies of `fill`
/// (one element's bytes): (dims, bytes).
pub fn pad_axis(
    dims: &[i64],
    bytes: &[u8],
    fill: &[u8],
    axis: usize,
    to: usize,
) -> (Vec<i64>, Vec<u8>) {
    let item = fill.len();
    let size = dims[axis] as usize;
    let outer: usize = dims[..axis].iter().map(|&x| x as usize).product();
    let inner: usize = dims[axis + 1..].iter().map(|&x| x as usize).product();
    let mut out = Vec::with_capacity(outer * to * inner * item);
    for o in 0..outer {
        out.extend_from_slice(&bytes[o * size * inner * item..(o + 1) * size * inner * item]);
        for _ in 0..(to - size) * inner {
            out.extend_from_slice(fill);
        }
    }
    let mut pd = dims.to_vec();
    pd[axis] = to as i64;
    (pd, out)
}

/// The inverse of [`pad_axis`]: the first `keep` entries along `axis`, and whether every
/// cut element is zero (+0 or −0; floats only, `item` 2 or 4 bytes).
pub fn crop_axis(
    dims: &[i64],
    bytes: &[u8],
    item: usize,
    axis: usize,
    keep: usize,
) -> (Vec<u8>, bool) {
    let size = dims[axis] as usize;
    let outer: usize = dims[..axis].iter().map(|&x| x as usize).product();
    let inner: usize = dims[axis + 1..]
        .iter()
        .map(|&x| x as usize)
        .product::<usize>()
        * item;
    let mut out = Vec::with_capacity(outer * keep * inner);
    let mut zero = true;
    for o in 0..outer {
        let row = &bytes[o * size * inner..(o + 1) * size * inner];
        out.extend_from_slice(&row[..keep * inner]);
        // ±0: every byte zero but the sign bit (the last byte, little-endian).
        zero &= row[keep * inner..]
            .chunks_exact(item)
            .all(|e| e[..item - 1].iter().all(|&b| b == 0) && e[item - 1] & 0x7f == 0);
    }
    (out, zero)
}

/// The inverse of [`shard_bytes`]: the parts (device order) joined along `axis`.
pub fn join_shards(parts: &[Vec<u8>], part_dims: &[i64], item: usize, axis: usize) -> Vec<u8> {
    let part = part_dims[axis] as usize;
    let outer: usize = part_dims[..axis].iter().map(|&x| x as usize).product();
    let inner: usize = part_dims[axis + 1..]
        .iter()
        .map(|&x| x as usize)
        .product::<usize>()
        * item;
    let mut out = Vec::with_capacity(parts.len() * outer * part * inner);
    for o in 0..outer {
        for p in parts {
            out.extend_from_slice(&p[o * part * inner..(o + 1) * part * inner]);
        }
    }
    out
}

/// The error for a module partitioned over more devices than the client has. On XLA:CPU
/// it is an error whose fix is the backend's `cpu_device_count`; on a TPU VM or a GPU
/// machine the devices are what the machine has, so the case does not apply here (as a
/// tpu-aot topology too small for it): a [`Refusal::NotApplicable`].
pub fn too_few_devices(
    n: usize,
    have: usize,
    profile: Profile,
    platform_label: &str,
) -> anyhow::Error {
    match profile {
        Profile::Cpu => anyhow!("the module is partitioned over {n} devices but the PJRT client has {have} (raise the backend's cpu_device_count to {n})"),
        Profile::Gpu => Refusal::NotApplicable(format!("not applicable: the case needs {n} GPUs, this machine's PJRT client has {have} ({platform_label}); a machine with at least {n} GPUs runs it")).into(),
        Profile::Tpu => Refusal::NotApplicable(format!("not applicable: the case needs {n} devices, this machine's PJRT client has {have} ({platform_label}); a slice with at least {n} chips runs it")).into(),
    }
}

/// On the CPU plugin device memory is host memory, shared with the suite's own inputs
/// and oracle: a compiled module whose arguments, outputs and temporaries (per device,
/// times `n` devices) need more than the tightest bound on what this process can still
/// allocate is not applicable here (rather than swapping or being killed).
fn host_memory_refusal(exe: &grpo_pjrt::Executable, n: usize) -> Option<String> {
    let s = exe.compiled_memory_stats().ok().flatten()?;
    let per_device = [
        s.argument_size_in_bytes,
        s.output_size_in_bytes,
        s.temp_size_in_bytes,
        -s.alias_size_in_bytes,
    ]
    .iter()
    .sum::<i64>()
    .max(0) as u64;
    let need = per_device * n as u64;
    let free = crate::host_memory::tightest(crate::host_memory::headrooms())?;
    (need > free.free).then(|| host_memory_message(need, n, &free))
}

/// The refusal of a compiled module needing `need` bytes on `n` CPU devices under `free`.
fn host_memory_message(need: u64, n: usize, free: &crate::host_memory::Headroom) -> String {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    format!(
        "not applicable: the compiled module needs {:.1} GiB of host memory on {n} CPU device(s) (arguments, outputs and XLA's temporaries), more than the {:.1} GiB free under {}; a machine with more memory, or an accelerator, runs it",
        gib(need),
        gib(free.free),
        free.source
    )
}

/// `mem` with the device allocator's figures around one job (`PJRT_Device_MemoryStats`
/// of the first device, before the arguments were uploaded and after the timed runs):
/// the bytes in use before, and the peak when the job raised it (the allocator's peak
/// counts from the client's start and cannot be reset, so a job below an earlier job's
/// peak has no figure of its own).
pub fn with_device_peak(
    mut mem: Memory,
    before: Option<&grpo_pjrt::DeviceMemoryStats>,
    after: Option<&grpo_pjrt::DeviceMemoryStats>,
) -> Memory {
    let (Some(b), Some(a)) = (before, after) else {
        return mem;
    };
    mem.device_in_use_before_bytes = Some(b.bytes_in_use.max(0) as u64);
    if let (Some(pb), Some(pa)) = (b.peak_bytes_in_use, a.peak_bytes_in_use) {
        if pa > pb {
            mem.device_peak_bytes = Some(pa.max(0) as u64);
        }
    }
    mem
}

fn run_job(
    client: &Client,
    cache: &mut HashMap<String, LoadedExecutable>,
    job: &Job,
    platform_label: &str,
    profile: Profile,
) -> Result<JobResult> {
    let m = &job.manifest;
    let n = m.num_partitions.max(1);
    let devices = client.addressable_devices()?;
    if devices.len() < n {
        return Err(too_few_devices(n, devices.len(), profile, platform_label));
    }
    let ids: Vec<i64> = devices
        .iter()
        .map(|d| d.id().map(i64::from))
        .collect::<std::result::Result<_, _>>()?;
    let mut timing = Timing::default();
    if !cache.contains_key(&m.key) {
        if cache.len() >= 16 {
            cache.clear();
        }
        let code = std::fs::read(&job.module)
            .with_context(|| format!("cannot read {}", job.module.display()))?;
        let options = CpuCompile::from_env()?.apply(compile_options(n, &ids)?, profile);
        let t0 = Instant::now();
        let exe = client
            .compile(&Program::mlir_bytecode(code), &options)
            .map_err(|e| anyhow!("compile of {}: {e}", job.module.display()))?;
        timing.compile_s = Some(t0.elapsed().as_secs_f64());
        cache.insert(m.key.clone(), exe);
    }
    let exe = &cache[&m.key];
    if profile.device_is_host() {
        if let Some(why) = host_memory_refusal(exe.executable(), n) {
            return Err(Refusal::NotApplicable(why).into());
        }
    }
    // After the compile (its autotuning allocates and frees device memory of its own):
    // the peak below is the arguments', the runs' temporaries and the outputs'.
    let before = devices
        .first()
        .and_then(|d| d.memory_stats().ok().flatten());
    // Sharded arguments whose axis the module takes padded: padded once, before the split.
    let mut padded: Vec<Option<(Vec<i64>, Vec<u8>)>> = Vec::with_capacity(job.args.len());
    for (a, spec) in job.args.iter().zip(&m.inputs) {
        padded.push(match (spec.shard_axis.filter(|_| n > 1), spec.pad_to) {
            (Some(axis), Some(to)) if to != a.dims[axis] as usize => {
                let fill = element_bytes(&a.dtype, spec.pad_value.unwrap_or(0.0))?;
                Some(pad_axis(&a.dims, &a.bytes, &fill, axis, to))
            }
            _ => None,
        });
    }
    // Per device: its shard of each sharded argument, the whole of the others.
    let mut bufs: Vec<Vec<grpo_pjrt::Buffer>> = Vec::with_capacity(n);
    for (d, device) in devices.iter().take(n).enumerate() {
        let mut row = Vec::with_capacity(job.args.len());
        for ((a, spec), pad) in job.args.iter().zip(&m.inputs).zip(&padded) {
            let et = element_type(&a.dtype)?;
            match spec.shard_axis.filter(|_| n > 1) {
                None => row.push(client.buffer_from_bytes(et, &a.bytes, &a.dims, device)?),
                Some(axis) => {
                    let (gdims, gbytes) = pad
                        .as_ref()
                        .map_or((&a.dims[..], &a.bytes[..]), |(d, b)| (&d[..], &b[..]));
                    let (dims, bytes) =
                        shard_bytes(gdims, gbytes, itemsize(&a.dtype)?, axis, n, d)?;
                    row.push(client.buffer_from_bytes(et, &bytes, &dims, device)?);
                }
            }
        }
        bufs.push(row);
    }
    let refs: Vec<Vec<&grpo_pjrt::Buffer>> = bufs.iter().map(|r| r.iter().collect()).collect();
    let lists: Vec<&[&grpo_pjrt::Buffer]> = refs.iter().map(Vec::as_slice).collect();
    for _ in 0..job.warmup {
        exe.execute(&lists)?;
    }
    let mut last = None;
    for _ in 0..job.repeats.max(1) {
        // The previous run's outputs go first: kept alive, they would add one output set to
        // the device peak (measured on an H100: the allocator's peak was the compiled peak
        // plus exactly the output bytes, docs/gpu.md).
        drop(last.take());
        let t0 = Instant::now();
        let outs = exe.execute(&lists)?; // waits for completion events
        timing.runs_s.push(t0.elapsed().as_secs_f64());
        last = Some(outs);
    }
    if job.repeats == 0 {
        timing.runs_s.clear();
    }
    let per_device = last.unwrap();
    let first = per_device.first().context("no outputs for device 0")?;
    if first.len() != m.outputs.len() {
        bail!(
            "module returned {} outputs, manifest lists {}",
            first.len(),
            m.outputs.len()
        );
    }
    let mut outputs = Vec::with_capacity(m.outputs.len());
    for (j, spec) in m.outputs.iter().enumerate() {
        let bytes = match spec.shard_axis.filter(|_| n > 1) {
            None => first[j].to_host_bytes()?,
            Some(axis) => {
                let parts = per_device
                    .iter()
                    .map(|outs| outs[j].to_host_bytes())
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                let part_dims = first[j].dims()?;
                let item = itemsize(&spec.dtype)?;
                let joined = join_shards(&parts, &part_dims, item, axis);
                let keep = spec.shape[axis];
                let total = part_dims[axis] as usize * n;
                if total == keep {
                    joined
                } else {
                    let mut dims = part_dims.clone();
                    dims[axis] = total as i64;
                    let (kept, zero) = crop_axis(&dims, &joined, item, axis, keep);
                    if !zero {
                        bail!("{}: the padded entries {keep}..{total} of axis {axis} came back nonzero (padding leaked into the result)", spec.name);
                    }
                    kept
                }
            }
        };
        outputs.push(widen(&spec.dtype, &bytes)?);
    }
    let after = devices
        .first()
        .and_then(|d| d.memory_stats().ok().flatten());
    let memory = memory_of(exe.executable(), platform_label)
        .map(|mem| with_device_peak(mem, before.as_ref(), after.as_ref()));
    let cost = cost_of(exe.executable());
    let derived = profile
        .derives_cost()
        .map(|rates| super::tpu_aot::derive_cost(exe.executable(), m, rates));
    let device_kind = devices.first().and_then(|d| d.kind().ok());
    Ok(JobResult {
        outputs,
        timing,
        memory,
        cost,
        derived,
        device_kind,
    })
}

/// Compiled memory statistics as [`Memory`] (floor filled in), labelled with `source`.
pub fn memory_of(exe: &grpo_pjrt::Executable, source: &str) -> Option<Memory> {
    exe.compiled_memory_stats().ok().flatten().map(|s| {
        Memory {
            peak_bytes: s.peak_memory_in_bytes.map(|x| x as u64),
            temp_bytes: Some(s.temp_size_in_bytes as u64),
            argument_bytes: Some(s.argument_size_in_bytes as u64),
            output_bytes: Some(s.output_size_in_bytes as u64),
            alias_bytes: Some(s.alias_size_in_bytes as u64),
            generated_code_bytes: Some(s.generated_code_size_in_bytes as u64),
            floor_bytes: None,
            source: Some(source.to_string()),
            ..Default::default()
        }
        .with_floor()
    })
}

/// The cost analysis properties the records keep.
pub fn cost_of(exe: &grpo_pjrt::Executable) -> Option<std::collections::BTreeMap<String, f64>> {
    let mut cost: Option<std::collections::BTreeMap<String, f64>> =
        exe.cost_analysis().ok().flatten().map(|c| {
            [
                "flops",
                "transcendentals",
                "bytes accessed",
                "optimal_seconds",
                "utilization",
            ]
            .iter()
            .filter_map(|k| c.get_f64(k).map(|v| (k.to_string(), v)))
            .collect()
        });
    // Multi-device modules: the collectives the partitioner inserted, from the compiled
    // HLO (the cost analysis has no separate figure for them).
    if exe.num_partitions().unwrap_or(1) > 1 {
        if let Ok(Some((format, bytes))) = exe.optimized_program() {
            if let Some(Ok(list)) = grpo_pjrt::hlo::collectives_of(&format, &bytes) {
                let c = cost.get_or_insert_with(Default::default);
                c.insert(
                    "collectives".into(),
                    list.iter().map(|x| x.count as f64).sum(),
                );
                c.insert(
                    "collective bytes".into(),
                    list.iter().map(|x| x.bytes as f64).sum(),
                );
                for x in list {
                    c.insert(format!("{} count", x.kind), x.count as f64);
                    c.insert(format!("{} bytes", x.kind), x.bytes as f64);
                }
            }
        }
    }
    cost
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_compile_settings_reach_cpu_compiles_only() {
        use grpo_pjrt::proto::OptionOverrideValue::{BoolField, IntField};
        let set = |p, opt_level, fusion_emitters| {
            CpuCompile {
                opt_level,
                fusion_emitters,
            }
            .apply(compile_options(1, &[0]).unwrap(), p)
            .option_overrides
        };
        assert_eq!(
            set(Profile::Cpu, Some(0), None),
            vec![("xla_backend_optimization_level".to_string(), IntField(0))]
        );
        assert_eq!(
            set(Profile::Cpu, Some(0), Some(false)),
            vec![
                ("xla_backend_optimization_level".to_string(), IntField(0)),
                ("xla_cpu_use_fusion_emitters".to_string(), BoolField(false)),
            ]
        );
        assert_eq!(
            set(Profile::Cpu, None, Some(true)),
            vec![("xla_cpu_use_fusion_emitters".to_string(), BoolField(true))]
        );
        assert_eq!(set(Profile::Cpu, None, None), vec![]);
        assert_eq!(set(Profile::Gpu, Some(0), Some(false)), vec![]);
        assert_eq!(set(Profile::Tpu, Some(0), Some(false)), vec![]);
        // A multi-device compile keeps its partitioning.
        let o = CpuCompile {
            opt_level: Some(1),
            fusion_emitters: Some(false),
        }
        .apply(compile_options(4, &[0, 1, 2, 3]).unwrap(), Profile::Cpu);
        assert_eq!((o.num_partitions, o.option_overrides.len()), (4, 2));
    }

    #[test]
    fn a_device_peak_is_a_jobs_own_only_when_the_job_raised_it() {
        let stats = |in_use: i64, peak: i64| grpo_pjrt::DeviceMemoryStats {
            bytes_in_use: in_use,
            peak_bytes_in_use: Some(peak),
            ..Default::default()
        };
        let m = with_device_peak(
            Memory::default(),
            Some(&stats(10, 100)),
            Some(&stats(10, 250)),
        );
        assert_eq!(
            (m.device_peak_bytes, m.device_in_use_before_bytes),
            (Some(250), Some(10))
        );
        // Below an earlier job's peak: no figure of its own, never the earlier job's.
        let m = with_device_peak(
            Memory::default(),
            Some(&stats(10, 300)),
            Some(&stats(10, 300)),
        );
        assert_eq!(
            (m.device_peak_bytes, m.device_in_use_before_bytes),
            (None, Some(10))
        );
        // A plugin without allocator statistics (XLA:CPU): nothing.
        let m = with_device_peak(Memory::default(), None, None);
        assert_eq!(
            (m.device_peak_bytes, m.device_in_use_before_bytes),
            (None, None)
        );
    }

    #[test]
    fn shards_split_and_join_back_along_any_axis() {
        let dims = [2i64, 3, 8];
        let bytes: Vec<u8> = (0..48u8).collect();
        for axis in [0usize, 2] {
            let n = dims[axis] as usize;
            let n = if n.is_multiple_of(4) { 4 } else { 2 };
            let parts: Vec<(Vec<i64>, Vec<u8>)> = (0..n)
                .map(|d| shard_bytes(&dims, &bytes, 1, axis, n, d).unwrap())
                .collect();
            assert_eq!(parts[0].0[axis], dims[axis] / n as i64);
            let joined = join_shards(
                &parts.iter().map(|p| p.1.clone()).collect::<Vec<_>>(),
                &parts[0].0,
                1,
                axis,
            );
            assert_eq!(joined, bytes, "axis {axis}");
        }
        // Element [1, 2, 5] of the last-axis split into 4: shard 2 (columns 4..6), column 1.
        let (_, p) = shard_bytes(&dims, &bytes, 1, 2, 4, 2).unwrap();
        let kind = |e: anyhow::Error| e.downcast::<Refusal>();
        let cpu = too_few_devices(4, 1, Profile::Cpu, "XLA:CPU (host memory)");
        assert!(format!("{cpu}").contains("cpu_device_count to 4"));
        assert!(kind(cpu).is_err(), "on XLA:CPU it is an error with a fix");
        let gpu = kind(too_few_devices(2, 1, Profile::Gpu, "XLA:GPU"));
        assert!(matches!(&gpu, Ok(Refusal::NotApplicable(m)) if m.contains("at least 2 GPUs")));
        let tpu = kind(too_few_devices(8, 4, Profile::Tpu, "TPU v6e"));
        assert!(matches!(&tpu, Ok(Refusal::NotApplicable(m)) if m.contains("at least 8 chips")));
        // Padding on the last axis, then cropping back, round-trips; the cut part is checked.
        let (pd, padded) = pad_axis(&[2, 3], &[1, 2, 3, 4, 5, 6], &[0], 1, 5);
        assert_eq!(
            (pd, padded.clone()),
            (vec![2, 5], vec![1, 2, 3, 0, 0, 4, 5, 6, 0, 0])
        );
        assert_eq!(
            crop_axis(&[2, 5], &padded, 1, 1, 3),
            (vec![1, 2, 3, 4, 5, 6], true)
        );
        let f = |x: f32| x.to_le_bytes();
        let neg0: Vec<u8> = [f(1.0), f(-0.0), f(2.0), f(0.0)].concat();
        assert!(crop_axis(&[2, 2], &neg0, 4, 1, 1).1, "-0 counts as zero");
        let leak: Vec<u8> = [f(1.0), f(1e-30), f(2.0), f(0.0)].concat();
        assert!(!crop_axis(&[2, 2], &leak, 4, 1, 1).1);
        assert_eq!(
            element_bytes("bf16", -1e30).unwrap(),
            half::bf16::from_f32(-1e30).to_le_bytes().to_vec()
        );
        assert_eq!(p[(3 + 2) * 2 + 1], (8 + 2 * 8 + 5) as u8 + 16);
        assert!(
            shard_bytes(&dims, &bytes, 1, 1, 2, 0).is_err(),
            "3 rows do not split in 2"
        );
    }
}
