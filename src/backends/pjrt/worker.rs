//! The PJRT worker thread: owns the (non-Send) client and its compiled executables;
//! trials send it jobs over a channel. One worker also keeps timed runs from overlapping.

use super::export::Manifest;
use crate::backends::{Memory, Timing};
use anyhow::{anyhow, bail, Context, Result};
use grpo_pjrt::{Client, ClientOptions, CompileOptions, ElementType, LoadedExecutable, Plugin, Program};
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
}

struct Job {
    manifest: Manifest,
    module: PathBuf,
    args: Vec<HostArg>,
    warmup: usize,
    repeats: usize,
    reply: Sender<Result<JobResult>>,
}

/// Handle to the worker thread.
pub struct Worker {
    tx: Sender<Job>,
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
        "f32" => bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
        "bf16" => bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        "f16" => bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        "i32" => bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
        "pred" => bytes.iter().map(|&b| (b != 0) as u8 as f32).collect(),
        other => bail!("unsupported output dtype `{other}`"),
    })
}

impl Worker {
    /// Starts the worker: loads the plugin and creates the client on its own thread.
    /// Fails (with the plugin's message) if either does.
    pub fn start(plugin: PathBuf, cpu_device_count: Option<i64>) -> Result<Worker> {
        Worker::start_labelled(plugin, cpu_device_count, "XLA:CPU (host memory: peak = arguments + outputs)", None)
    }

    /// Starts a worker whose memory figures carry `label`; `timeout` bounds client
    /// creation (libtpu without chips must fail fast, not hang).
    pub fn start_labelled(plugin: PathBuf, cpu_device_count: Option<i64>, label: &str, timeout: Option<std::time::Duration>) -> Result<Worker> {
        let label = label.to_string();
        let (tx, rx) = channel::<Job>();
        let (ready_tx, ready_rx) = channel::<Result<()>>();
        std::thread::Builder::new()
            .name("pjrt-worker".into())
            .spawn(move || {
                let client = Plugin::load(&plugin)
                    .and_then(|p| Client::new(&p, &ClientOptions { cpu_device_count, ..Default::default() }))
                    .map_err(|e| anyhow!("PJRT plugin {}: {e}", plugin.display()));
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
                let mut cache: HashMap<String, LoadedExecutable> = HashMap::new();
                for job in rx {
                    let r = run_job(&client, &mut cache, &job, &label);
                    job.reply.send(r).ok();
                }
            })
            .context("cannot start the PJRT worker thread")?;
        match timeout {
            None => ready_rx.recv().context("PJRT worker died during start-up")??,
            Some(t) => ready_rx
                .recv_timeout(t)
                .map_err(|_| anyhow!("PJRT client creation did not finish within {} s", t.as_secs()))??,
        }
        Ok(Worker { tx })
    }

    /// Compiles (once per manifest key) and runs a module: warm-up, then timed runs.
    pub fn run(&self, manifest: Manifest, module: PathBuf, args: Vec<HostArg>, warmup: usize, repeats: usize) -> Result<JobResult> {
        let (reply, rx) = channel();
        self.tx
            .send(Job { manifest, module, args, warmup, repeats, reply })
            .map_err(|_| anyhow!("PJRT worker is gone (an earlier job crashed it)"))?;
        rx.recv().map_err(|_| anyhow!("PJRT worker died while running the job"))?
    }
}

fn run_job(client: &Client, cache: &mut HashMap<String, LoadedExecutable>, job: &Job, platform_label: &str) -> Result<JobResult> {
    let m = &job.manifest;
    let mut timing = Timing::default();
    if !cache.contains_key(&m.key) {
        if cache.len() >= 16 {
            cache.clear();
        }
        let code = std::fs::read(&job.module).with_context(|| format!("cannot read {}", job.module.display()))?;
        let t0 = Instant::now();
        let exe = client
            .compile(&Program::mlir_bytecode(code), &CompileOptions::default())
            .map_err(|e| anyhow!("compile of {}: {e}", job.module.display()))?;
        timing.compile_s = Some(t0.elapsed().as_secs_f64());
        cache.insert(m.key.clone(), exe);
    }
    let exe = &cache[&m.key];
    let device = client.addressable_devices()?.into_iter().next().context("the client has no device")?;
    let mut bufs = Vec::with_capacity(job.args.len());
    for a in &job.args {
        bufs.push(client.buffer_from_bytes(element_type(&a.dtype)?, &a.bytes, &a.dims, &device)?);
    }
    let refs: Vec<&grpo_pjrt::Buffer> = bufs.iter().collect();
    for _ in 0..job.warmup {
        exe.execute(&[refs.as_slice()])?;
    }
    let mut last = None;
    for _ in 0..job.repeats.max(1) {
        let t0 = Instant::now();
        let outs = exe.execute(&[refs.as_slice()])?; // waits for completion events
        timing.runs_s.push(t0.elapsed().as_secs_f64());
        last = Some(outs);
    }
    if job.repeats == 0 {
        timing.runs_s.clear();
    }
    let outs = last.unwrap().into_iter().next().context("no outputs for device 0")?;
    if outs.len() != m.outputs.len() {
        bail!("module returned {} outputs, manifest lists {}", outs.len(), m.outputs.len());
    }
    let outputs = outs
        .iter()
        .zip(&m.outputs)
        .map(|(b, spec)| widen(&spec.dtype, &b.to_host_bytes()?))
        .collect::<Result<Vec<_>>>()?;
    let memory = memory_of(exe.executable(), platform_label);
    let cost = cost_of(exe.executable());
    Ok(JobResult { outputs, timing, memory, cost })
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
            peak_with_vmem_prefetch_bytes: None,
            source: Some(source.to_string()),
        }
        .with_floor()
    })
}

/// The cost analysis properties the records keep.
pub fn cost_of(exe: &grpo_pjrt::Executable) -> Option<std::collections::BTreeMap<String, f64>> {
    exe.cost_analysis().ok().flatten().map(|c| {
        ["flops", "transcendentals", "bytes accessed", "optimal_seconds", "utilization"]
            .iter()
            .filter_map(|k| c.get_f64(k).map(|v| (k.to_string(), v)))
            .collect()
    })
}
