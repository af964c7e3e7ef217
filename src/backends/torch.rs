//! The `torch` backend kind: PyTorch implementations run by a supervised Python worker
//! (`python -m grpo_torch.worker`, backends/torch), in the implementation's own
//! interpreter, on `device: cpu` or `device: cuda`. The backend is `torch-<device>`.
//!
//! Each trial writes the case's inputs as .npy files into a directory of its own (binary:
//! no text encoding), sends the worker one JSON line naming them, and reads the outputs
//! back as .npy files. The worker differentiates the implementation's loss with
//! `torch.autograd` (its own backward runs), times each execution (CUDA events on cuda,
//! a monotonic clock on cpu) and, on cuda, reports the allocator's peak
//! (`max_memory_allocated`). A Python exception costs the trial one line; a crash or a
//! hang (no answer in `timeout_s`) costs the trial it was on, and the next trial starts
//! a new worker.

use super::{Backend, Memory, NoDevice, Refusal, RunOptions, RunResult, Timing, Unavailable};
use crate::cases::Case;
use crate::config::entry::{enabled, ImplConfig, ImplEntry};
use crate::inputs::{HostData, Inputs};
use crate::outputs::Outputs;
use crate::spec::OutputName;
use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The worker protocol this build speaks (grpo_torch/worker.py's `PROTOCOL_VERSION`).
const PROTOCOL: u32 = 1;

/// Where a torch backend runs its implementations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TorchDevice {
    /// The CPU.
    #[default]
    Cpu,
    /// The first CUDA device.
    Cuda,
}

impl TorchDevice {
    /// `cpu` or `cuda`.
    pub fn name(self) -> &'static str {
        match self {
            TorchDevice::Cpu => "cpu",
            TorchDevice::Cuda => "cuda",
        }
    }
}

fn default_timeout() -> u64 {
    300
}

/// Settings of a `torch` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TorchConfig {
    /// `cpu` (default) or `cuda`.
    #[serde(default)]
    pub device: TorchDevice,
    /// Seconds a trial may take before its worker is killed as hung (default 300).
    #[serde(default = "default_timeout")]
    pub timeout_s: u64,
    /// The implementations: a grpo_torch id (`torch_baseline`) or `module:ATTR`, with
    /// their own `python` (default: `.venvs/torch/bin/python`, scripts/setup_torch.sh)
    /// and `pythonpath`.
    #[serde(deserialize_with = "crate::config::entry::impl_list")]
    pub implementations: Vec<ImplEntry>,
}

/// The interpreter of an entry without `python`: `GRPO_TORCH_PYTHON` where set (a GPU
/// machine's own torch, scripts/gpu_check.sh), else the torch backend's own environment.
fn default_python() -> PathBuf {
    match std::env::var_os("GRPO_TORCH_PYTHON") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => crate::repo_root().join(".venvs/torch/bin/python"),
    }
}

impl super::Section for TorchConfig {
    fn validate(&self, origin: &str, section: &str) -> Result<()> {
        crate::config::entry::check_implementations(origin, section, &[], &self.implementations)?;
        if self.timeout_s == 0 {
            bail!("{origin}: backend `{section}`: timeout_s must be at least 1");
        }
        for c in enabled(&self.implementations) {
            // The peak is the cuda allocator's; on cpu there is none, so a budget would
            // check nothing.
            if c.max_peak_over_floor.is_some() && self.device == TorchDevice::Cpu {
                bail!("{origin}: backend `{section}`, implementation `{}`: max_peak_over_floor is judged on `device: cuda` only (on cpu torch reports no allocator peak); leave it out", c.display_name());
            }
        }
        Ok(())
    }
    fn backend_names(&self, _section: &str) -> Vec<String> {
        vec![format!("torch-{}", self.device.name())]
    }
    fn entries(&self) -> &[ImplEntry] {
        &self.implementations
    }
    fn entries_mut(&mut self) -> &mut Vec<ImplEntry> {
        &mut self.implementations
    }
    fn exports(&self) -> bool {
        false
    }
    fn open(&self, _section: &str, ok: &mut Vec<Arc<dyn Backend>>, missing: &mut Vec<Unavailable>) {
        let name = format!("torch-{}", self.device.name());
        match TorchBackend::open(self) {
            Ok(b) => ok.push(Arc::new(b)),
            Err(e) => missing.push(Unavailable::of(name, &e)),
        }
    }
    fn clone_box(&self) -> Box<dyn super::Section> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The worker's first line.
#[derive(Debug, Deserialize)]
struct Ready {
    status: String,
    #[serde(default)]
    cuda: bool,
}

/// One answer of the worker.
#[derive(Debug, Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    outputs: Vec<String>,
    #[serde(default)]
    not_provided: Vec<String>,
    #[serde(default)]
    runs_s: Vec<f64>,
    #[serde(default)]
    peak_bytes: Option<u64>,
    #[serde(default)]
    argument_bytes: Option<u64>,
    #[serde(default)]
    output_bytes: Option<u64>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// The memory figures of an answer: on cuda the allocator's peak over the trial's runs
/// (the head uploaded each run, the batch once), with the floor from the bytes of the
/// arguments and outputs as the implementation held them; on cpu none.
fn memory_of(a: &Answer) -> Option<Memory> {
    let peak = a.peak_bytes?;
    Some(
        Memory {
            peak_bytes: Some(peak),
            device_peak_bytes: Some(peak),
            argument_bytes: a.argument_bytes,
            output_bytes: a.output_bytes,
            source: Some("torch.cuda.max_memory_allocated".into()),
            ..Memory::default()
        }
        .with_floor(),
    )
}

/// A running worker: its process, its stdin, its stdout's lines and its stderr's last ones.
struct Proc {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

impl Proc {
    /// Starts `python -m grpo_torch.worker` with `pythonpath` first on PYTHONPATH and waits
    /// for its ready line (up to `timeout`).
    fn start(python: &Path, pythonpath: &[PathBuf], timeout: Duration) -> Result<(Proc, Ready)> {
        let mut path: Vec<PathBuf> = pythonpath.to_vec();
        path.push(crate::repo_root().join("backends/torch"));
        if let Some(old) = std::env::var_os("PYTHONPATH") {
            path.extend(std::env::split_paths(&old));
        }
        let mut cmd = Command::new(python);
        cmd.args([
            "-m",
            "grpo_torch.worker",
            "--protocol",
            &PROTOCOL.to_string(),
        ])
        .env("PYTHONPATH", std::env::join_paths(path)?)
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        crate::child_process::end_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start the torch worker with {}", python.display()))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let tail = stderr.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let mut t = tail.lock().unwrap();
                if t.len() == 20 {
                    t.pop_front();
                }
                t.push_back(l);
            }
        });
        let mut p = Proc {
            child,
            stdin,
            lines,
            stderr,
        };
        let line = p.answer(timeout, "starting")?;
        let ready: Ready = serde_json::from_str(&line).with_context(|| {
            format!("the torch worker's first line is not its ready line: {line}")
        })?;
        if ready.status != "ready" {
            bail!("the torch worker's first line is not its ready line: {line}");
        }
        Ok((p, ready))
    }

    /// The next line, or why there is none: the worker died (its status and last stderr
    /// line) or gave no answer in `timeout` (it is killed).
    fn answer(&mut self, timeout: Duration, doing: &str) -> Result<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => Ok(l),
            Err(RecvTimeoutError::Timeout) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("the torch worker hung {doing}: no answer in {} s (killed; the next trial starts a new one)", timeout.as_secs())
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self
                    .child
                    .wait()
                    .map(|s| describe_exit(&s))
                    .unwrap_or_default();
                std::thread::sleep(Duration::from_millis(50)); // the stderr reader's last lines
                let last = self
                    .stderr
                    .lock()
                    .unwrap()
                    .iter()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .cloned();
                bail!(
                    "the torch worker died {doing} ({status}){}",
                    last.map(|l| format!(": {}", l.trim())).unwrap_or_default()
                )
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `exit status 1`, or the signal that ended the process (`signal 6, SIGABRT`).
fn describe_exit(s: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => {
            let name = match sig {
                6 => " SIGABRT",
                9 => " SIGKILL",
                11 => " SIGSEGV",
                _ => "",
            };
            format!(
                "signal {sig}{}",
                if name.is_empty() {
                    String::new()
                } else {
                    format!(",{name}")
                }
            )
        }
        _ => "ended".into(),
    }
}

/// The `torch-<device>` backend.
pub struct TorchBackend {
    name: String,
    device: TorchDevice,
    timeout: Duration,
    impls: Vec<ImplConfig>,
    /// One worker per implementation, started on its first trial.
    workers: BTreeMap<String, Mutex<Option<Proc>>>,
    /// Each (implementation, case)'s answer to the support check, asked once (None: the
    /// worker could not answer; the trial then runs and says why).
    checked: Mutex<BTreeMap<(String, String), Option<Result<(), Refusal>>>>,
}

impl TorchBackend {
    /// The backend of `cfg`: its default interpreter must exist and, on cuda, the probe
    /// worker must see a CUDA device.
    fn open(cfg: &TorchConfig) -> Result<TorchBackend> {
        let impls = enabled(&cfg.implementations);
        let timeout = Duration::from_secs(cfg.timeout_s);
        if impls.iter().any(|c| c.python.is_none()) && !default_python().is_file() {
            bail!(
                "no torch environment at {}: run scripts/setup_torch.sh",
                default_python().display()
            );
        }
        if cfg.device == TorchDevice::Cuda {
            let c = &impls[0];
            let (_, ready) = Proc::start(&python_of(c), &c.pythonpath, timeout)?;
            if !ready.cuda {
                return Err(NoDevice(
                    "torch sees no CUDA device here (torch.cuda.is_available() is false)".into(),
                )
                .into());
            }
        }
        let workers = impls
            .iter()
            .map(|c| (c.display_name().to_string(), Mutex::new(None)))
            .collect();
        Ok(TorchBackend {
            name: format!("torch-{}", cfg.device.name()),
            device: cfg.device,
            timeout,
            impls,
            workers,
            checked: Mutex::new(BTreeMap::new()),
        })
    }

    /// Sends `request` to `c`'s worker (started if needed) and returns its answer line; a
    /// dead or hung worker is dropped (the next request starts a new one).
    fn ask(&self, c: &ImplConfig, request: &serde_json::Value, doing: &str) -> Result<String> {
        let slot = &self.workers[c.display_name()];
        let mut guard = slot.lock().unwrap();
        if guard.is_none() {
            *guard = Some(Proc::start(&python_of(c), &c.pythonpath, self.timeout)?.0);
        }
        let p = guard.as_mut().expect("started");
        let sent = writeln!(p.stdin, "{request}").and_then(|_| p.stdin.flush());
        let line = match sent {
            Ok(()) => p.answer(self.timeout, doing),
            Err(e) => Err(anyhow!("cannot write to the torch worker: {e}")),
        };
        if line.is_err() {
            *guard = None;
        }
        line
    }

    /// The request that runs (or, with `check`, only checks) `c` on `case`.
    fn request(&self, c: &ImplConfig, case: &Case) -> serde_json::Value {
        let s = case.shape;
        serde_json::json!({
            "impl": c.id, "options": c.options, "level": case.level,
            "b": s.b, "t": s.t, "v": s.v, "h": s.h, "dtype": case.dtype.name(),
            "knobs": case.knobs, "device": self.device.name(),
        })
    }

    /// Whether `c` runs `case`, asked of its worker once (its level, dtype and own
    /// `supports`).
    fn check(&self, c: &ImplConfig, case: &Case) -> Option<Result<(), Refusal>> {
        let key = (c.display_name().to_string(), case.id.clone());
        if let Some(d) = self.checked.lock().unwrap().get(&key) {
            return d.clone();
        }
        let mut req = self.request(c, case);
        req["check"] = true.into();
        let answer = self
            .ask(c, &req, &format!("checking {}", key.0))
            .ok()
            .and_then(|l| serde_json::from_str::<Answer>(&l).ok())
            .and_then(|a| match a.status.as_str() {
                "ok" => Some(Ok(())),
                "unsupported" => Some(Err(Refusal::Unsupported(a.reason.unwrap_or_default()))),
                "not_applicable" => Some(Err(Refusal::NotApplicable(a.reason.unwrap_or_default()))),
                _ => None,
            });
        self.checked.lock().unwrap().insert(key, answer.clone());
        answer
    }

    fn entry(&self, name: &str) -> Result<&ImplConfig> {
        self.impls
            .iter()
            .find(|c| c.display_name() == name)
            .ok_or_else(|| {
                anyhow!(Refusal::Unsupported(format!(
                    "{} does not configure `{name}`",
                    self.name
                )))
            })
    }
}

fn python_of(c: &ImplConfig) -> PathBuf {
    c.python.clone().unwrap_or_else(default_python)
}

/// A directory of its own for one trial, removed when dropped.
struct TrialDir(PathBuf);

impl TrialDir {
    fn new() -> Result<TrialDir> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("grpo-torch-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
        Ok(TrialDir(d))
    }
}

impl Drop for TrialDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Backend for TorchBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn budget(&self, implementation: &str) -> Option<crate::backends::Budget> {
        self.entry(implementation)
            .ok()
            .and_then(crate::backends::Budget::of)
    }

    fn implementations(&self) -> Vec<String> {
        self.impls
            .iter()
            .map(|c| c.display_name().to_string())
            .collect()
    }

    fn supports(&self, implementation: &str, case: &Case) -> Result<(), Refusal> {
        let c = self.entry(implementation).map_err(|_| {
            Refusal::Unsupported(format!(
                "{} does not configure `{implementation}`",
                self.name
            ))
        })?;
        if let Some(Err(r)) = self.check(c, case) {
            return Err(r);
        }
        if case.devices > 1 {
            return Err(Refusal::Unsupported(format!(
                "{} runs one device; the case asks for {}",
                self.name, case.devices
            )));
        }
        Ok(())
    }

    fn run(
        &self,
        implementation: &str,
        case: &Case,
        inputs: &Inputs,
        opts: &RunOptions,
    ) -> Result<RunResult> {
        let c = self.entry(implementation)?;
        let dir = TrialDir::new()?;
        for t in inputs.tensors(case) {
            let path = dir.0.join(format!("{}.npy", t.name));
            match t.data {
                HostData::Float { values, .. } => crate::npy::write_f32(&path, &t.shape, values)?,
                HostData::I32(values) => crate::npy::write_i32(&path, &t.shape, values)?,
            }
        }
        let mut request = self.request(c, case);
        request["dir"] = serde_json::json!(dir.0);
        request["warmup"] = opts.warmup.into();
        request["repeats"] = opts.repeats.max(1).into();
        let line = self.ask(c, &request, &format!("on {implementation}"))?;
        let a: Answer = serde_json::from_str(&line).with_context(|| {
            format!("the torch worker answered a line that is not its protocol's: {line}")
        })?;
        match a.status.as_str() {
            "ok" => {}
            "unsupported" => return Err(Refusal::Unsupported(a.reason.unwrap_or_default()).into()),
            "not_applicable" => {
                return Err(Refusal::NotApplicable(a.reason.unwrap_or_default()).into())
            }
            _ => bail!("{}", a.message.unwrap_or(line)),
        }
        let mut outputs = Outputs::default();
        for n in &a.outputs {
            let name = OutputName::parse(n)
                .ok_or_else(|| anyhow!("the torch worker returned `{n}`, not a SPEC output"))?;
            let arr = crate::npy::read(&dir.0.join(format!("out_{n}.npy")))?;
            outputs.insert(
                name,
                arr.shape,
                arr.data.iter().map(|&x| x as f32).collect(),
            );
        }
        for n in &a.not_provided {
            if let Some(name) = OutputName::parse(n) {
                outputs.not_provided.insert(name);
            }
        }
        let memory = memory_of(&a);
        Ok(RunResult {
            outputs: Some(outputs),
            timing: Some(Timing {
                compile_s: None,
                runs_s: a.runs_s,
                compile_shared: false,
            }),
            memory,
            ..RunResult::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::Section;

    fn answer(json: &str) -> Answer {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn on_cuda_the_allocator_peak_is_judged_against_arguments_plus_outputs() {
        let a = answer(
            r#"{"status": "ok", "peak_bytes": 3000, "argument_bytes": 1000, "output_bytes": 500}"#,
        );
        let m = memory_of(&a).unwrap();
        assert_eq!(m.peak_bytes, Some(3000));
        assert_eq!(m.floor_bytes, Some(1500));
        assert_eq!(m.peak_over_floor(), Some(2.0));
        let b = crate::backends::Budget {
            max_peak_over_floor: 1.5,
            slack_bytes: 0,
        };
        let r = crate::judge::memory::BudgetReport::judge(b, Some(&m)).unwrap();
        assert!(!r.passed, "{}", r.message);
        assert!(
            r.message.contains("torch.cuda.max_memory_allocated"),
            "{}",
            r.message
        );
        // On cpu the worker reports no peak: no memory figures, never a made-up one.
        let cpu = answer(
            r#"{"status": "ok", "peak_bytes": null, "argument_bytes": 1000, "output_bytes": 500}"#,
        );
        assert!(memory_of(&cpu).is_none());
    }

    fn section(yaml: &str) -> Result<()> {
        let c: TorchConfig = serde_yaml_ng::from_str(yaml).unwrap();
        c.validate("t.yaml", "torch")
    }

    #[test]
    fn a_memory_budget_is_refused_on_cpu_and_taken_on_cuda() {
        let entry = "implementations: [{id: torch_baseline, max_peak_over_floor: 2}]";
        let e = section(&format!("device: cpu\n{entry}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.yaml: backend `torch`, implementation `torch_baseline`: max_peak_over_floor is judged on `device: cuda` only"), "{e}");
        section(&format!("device: cuda\n{entry}")).unwrap();
    }
}
