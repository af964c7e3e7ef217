//! Calling the Python exporter (`python -m grpo_jax.export`) in batches and reading its
//! manifests. One process per batch: jax starts once, cached artifacts are reused.

use crate::cases::Case;
use crate::config::ImplConfig;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The exporter protocol this suite speaks (`grpo_jax.protocol.PROTOCOL_VERSION`): passed
/// as `--protocol` to every exporter command and checked by the probe, so a `grpo_jax`
/// installed in a user's environment from another checkout is one clear line.
pub const PROTOCOL: u32 = 1;

/// Exit status of the exporter on a protocol mismatch.
const MISMATCH_EXIT: i32 = 4;

/// The prefix of the exporter's progress lines on stderr (`grpo_jax.protocol`).
const MARKER_PREFIX: &str = "grpo-exporter: ";
/// Progress: the exporter's own imports (Python, jax, `grpo_jax`) are done
/// (`grpo_jax.protocol.READY_MARKER` without the prefix).
const READY: &str = "ready";
/// Progress: the `--check-config` entry whose index follows is being checked
/// (`grpo_jax.protocol.CHECK_MARKER` without the prefix).
const CHECKING: &str = "checking ";

/// The time limit of one module (the config's `export_timeout_s`), in seconds.
static TIMEOUT_S: AtomicU64 = AtomicU64::new(600);

/// Sets the time the exporter may spend on one implementation's module: importing it,
/// checking its entry, tracing and exporting one case (the config's `export_timeout_s`).
/// Past it the exporter is killed and that implementation's trials are errors.
pub fn set_timeout(secs: u64) {
    TIMEOUT_S.store(secs.max(1), Ordering::Relaxed);
}

/// The time limit of one module ([`set_timeout`]).
pub fn timeout() -> Duration {
    Duration::from_secs(TIMEOUT_S.load(Ordering::Relaxed))
}

/// The time limit of the exporter's own start-up (Python, jax, `grpo_jax`), before any
/// implementation's code runs: at least five minutes, a cold jax import on a loaded
/// machine is slow and is nobody's module.
fn startup_limit() -> Duration {
    timeout().max(Duration::from_secs(300))
}

/// One line of an exporter process: a stdout line, a stderr line, or a progress marker
/// (a stderr line starting with `grpo-exporter: `, prefix removed).
enum Said {
    Out(String),
    Err(String),
    Marker(String),
}

/// How a supervised exporter process ended.
enum Ended {
    /// It exited (or was killed by a signal of its own doing).
    Exited(ExitStatus),
    /// It passed a time limit and was killed.
    TimedOut,
}

/// Runs an exporter command with `input` on its stdin under time limits: `startup` until
/// `on` first returns true, then `limit` from each line for which `on` returns true (a
/// result, a progress marker). Past the limit the process is killed. Returns how it ended
/// and its last stderr lines (markers excluded).
fn supervised(
    mut cmd: Command,
    input: String,
    startup: Duration,
    limit: Duration,
    mut on: impl FnMut(&Said) -> bool,
) -> std::io::Result<(Ended, Vec<String>)> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdin = child.stdin.take();
    std::thread::spawn(move || {
        if let Some(mut stdin) = stdin {
            // A process that exits early closes its end: a write error is no news.
            stdin.write_all(input.as_bytes()).ok();
        }
    });
    // None: that stream ended.
    let (tx, rx) = channel::<Option<Said>>();
    let out = child.stdout.take();
    let tx_out = tx.clone();
    std::thread::spawn(move || {
        if let Some(out) = out {
            for l in BufReader::new(out).lines().map_while(|l| l.ok()) {
                if tx_out.send(Some(Said::Out(l))).is_err() {
                    return;
                }
            }
        }
        tx_out.send(None).ok();
    });
    let err = child.stderr.take();
    std::thread::spawn(move || {
        if let Some(err) = err {
            for l in BufReader::new(err).lines().map_while(|l| l.ok()) {
                let said = match l.strip_prefix(MARKER_PREFIX) {
                    Some(m) => Said::Marker(m.to_string()),
                    None => Said::Err(l),
                };
                if tx.send(Some(said)).is_err() {
                    return;
                }
            }
        }
        tx.send(None).ok();
    });
    let mut tail: VecDeque<String> = VecDeque::new();
    let mut deadline = Instant::now() + startup;
    let mut open_streams = 2;
    let killed = loop {
        let now = Instant::now();
        if now >= deadline {
            break true;
        }
        if open_streams == 0 {
            // Both streams closed: the process is exiting (or holds on without output).
            match child.try_wait()? {
                Some(_) => break false,
                None => {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            }
        }
        match rx.recv_timeout(deadline - now) {
            Ok(Some(said)) => {
                if on(&said) {
                    deadline = Instant::now() + limit;
                }
                if let Said::Err(l) = said {
                    if !l.trim().is_empty() {
                        tail.push_back(l);
                        if tail.len() > 20 {
                            tail.pop_front();
                        }
                    }
                }
            }
            Ok(None) => open_streams -= 1,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => open_streams = 0,
        }
    };
    let tail = tail.into_iter().collect();
    if killed {
        child.kill().ok();
        child.wait()?;
        return Ok((Ended::TimedOut, tail));
    }
    Ok((Ended::Exited(child.wait()?), tail))
}

/// The last stderr line worth quoting: the exception line of a traceback if there is one
/// (never the traceback), else the last non-empty line.
fn last_message(tail: &[String]) -> Option<String> {
    let last = tail.iter().rev().find(|l| !l.trim().is_empty())?;
    Some(last.trim().chars().take(500).collect())
}

/// Where an exporter runs: the interpreter and the directories put first on its
/// `PYTHONPATH` (an implementation entry's `python` / `pythonpath`, or the defaults).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyEnv {
    /// The Python interpreter.
    pub python: PathBuf,
    /// Extra import directories, first on `PYTHONPATH`.
    pub pythonpath: Vec<PathBuf>,
}

impl PyEnv {
    /// `python -m grpo_jax.export --protocol N <mode...>` in this environment.
    fn exporter(&self, mode: &[&str]) -> Command {
        let mut c = self.command();
        c.args(["-m", "grpo_jax.export", "--protocol", &PROTOCOL.to_string()])
            .args(mode);
        c
    }

    /// A command running this interpreter with the extra import directories.
    fn command(&self) -> Command {
        let mut c = Command::new(&self.python);
        if let Some(pp) = self.child_pythonpath(std::env::var_os("PYTHONPATH")) {
            c.env("PYTHONPATH", pp);
        }
        c.env("JAX_PLATFORMS", "cpu");
        crate::child_process::end_with_parent(&mut c);
        c
    }

    /// The child's `PYTHONPATH` when the entry names directories (`None`: the inherited
    /// one as it is): those directories, then the inherited value whole. That value may
    /// hold several directories (scripts/gpu_check.sh puts the checkout's backends/jax
    /// before a machine's own), so it is appended as it is: `join_paths` refuses an
    /// element holding `:`, and its empty fallback dropped grpo_jax from the path. (An
    /// entry's directory holding `:` is refused when the config is checked.)
    fn child_pythonpath(
        &self,
        inherited: Option<std::ffi::OsString>,
    ) -> Option<std::ffi::OsString> {
        if self.pythonpath.is_empty() {
            return None;
        }
        let inherited = inherited.filter(|o| !o.is_empty());
        let parts = self.pythonpath.iter().map(|p| p.as_os_str());
        let mut value = std::ffi::OsString::new();
        for (k, part) in parts.chain(inherited.as_deref()).enumerate() {
            if k > 0 {
                value.push(":");
            }
            value.push(part);
        }
        Some(value)
    }

    fn describe(&self) -> String {
        if self.pythonpath.is_empty() {
            self.python.display().to_string()
        } else {
            let pp: Vec<String> = self
                .pythonpath
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            format!("{} (pythonpath {})", self.python.display(), pp.join(":"))
        }
    }
}

/// One `--check-config` answer entry.
#[derive(Deserialize)]
struct CheckAnswer {
    name: String,
    ok: bool,
    error: Option<String>,
}

/// Parses the exporter's `--check-config` answer (a JSON list).
fn parse_check_answer(text: &str) -> Result<Vec<CheckAnswer>> {
    serde_json::from_str(text.trim()).context("unreadable --check-config answer")
}

/// The bad entries of a `--check-config` answer, one message each.
fn bad_entries(answers: Vec<CheckAnswer>) -> Vec<String> {
    answers
        .into_iter()
        .filter(|a| !a.ok)
        .map(|a| {
            format!(
                "implementation `{}`: {}",
                a.name,
                a.error.unwrap_or_default()
            )
        })
        .collect()
}

/// Writes `text` to `path` through a temporary sibling and a rename, so that a process
/// reading `path` at the same time (parallel runs sharing the artifact cache) sees the
/// whole file or none. Best effort: a cache that cannot be written is only a cache.
pub fn write_atomically(path: &Path, text: &str) {
    crate::atomic_file::replace(path, text.as_bytes()).ok();
}

/// The one-line error of a failed exporter process: the protocol mismatch line as is.
fn exporter_failure(env: &PyEnv, status: ExitStatus, stderr: &[u8]) -> anyhow::Error {
    let lines: Vec<String> = String::from_utf8_lossy(stderr)
        .lines()
        .map(str::to_string)
        .collect();
    exporter_failure_of(env, status, &lines)
}

/// [`exporter_failure`] from the process's last stderr lines.
fn exporter_failure_of(env: &PyEnv, status: ExitStatus, tail: &[String]) -> anyhow::Error {
    let last = last_message(tail).unwrap_or_else(|| "(no message)".into());
    if status.code() == Some(MISMATCH_EXIT) {
        anyhow!("{last}")
    } else {
        anyhow!("exporter {} exited with {status}: {last}", env.describe())
    }
}

/// The jax version `backends/jax/requirements.lock` pins: what the suite's plugins are
/// known to accept.
pub fn pinned_jax_version() -> &'static str {
    include_str!("../../../backends/jax/requirements.lock")
        .lines()
        .find_map(|l| l.trim().strip_prefix("jax=="))
        .unwrap_or("?")
}

/// A compile failure of a module, explained when its exporter's jax is not the pinned
/// one: a newer jax can emit StableHLO an older plugin cannot read (e.g. libtpu 0.0.42.1
/// on a jax 0.11.2 export: "unregistered operation 'vhlo.custom_call_v2'"). One line
/// naming both versions and the fix (`config_key` or the environment variable `env_key`
/// names the plugin), then the plugin's own message.
pub fn explain_compile_failure(
    err: anyhow::Error,
    manifest: &Manifest,
    plugin: &Path,
    config_key: &str,
    env_key: &str,
) -> anyhow::Error {
    let pinned = pinned_jax_version();
    // Only compile failures (pjrt-cpu's worker: "compile of <module>: ...", tpu-aot:
    // "TPU compile for <topology> failed: ..."), never run errors.
    let text = format!("{err:#}");
    let compile = text.starts_with("compile of") || text.starts_with("TPU compile for");
    if manifest.jax_version == pinned || !compile {
        return err;
    }
    // The plugin's own message spans lines (MLIR notes): one line, like every trial error.
    let plugin_error = text.split_whitespace().collect::<Vec<_>>().join(" ");
    anyhow!(
        "the module of `{}` was exported by jax {} but the PJRT plugin {} is tested with jax {pinned} (this suite's pin) and could not compile it: a newer jax may emit StableHLO the plugin cannot read; install a plugin built for jax {} and set `{config_key}` (or {}) to it, or export with jax {pinned} (docs/external.md). Plugin error: {plugin_error}",
        manifest.implementation,
        manifest.jax_version,
        plugin.display(),
        manifest.jax_version,
        env_key
    )
}

/// Shape and dtype of one module argument or result.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct TensorSpec {
    /// SPEC name.
    pub name: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// `f32`, `bf16`, `f16`, `i32` or `pred`.
    pub dtype: String,
    /// Multi-device modules: the axis split evenly over the devices in device order (None:
    /// every device holds the whole array).
    #[serde(default)]
    pub shard_axis: Option<usize>,
    /// The module's extent on `shard_axis` when it takes or returns the tensor padded there
    /// (vocab sharding with V not divisible by the devices); `shape` stays SPEC's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_to: Option<usize>,
    /// Inputs with `pad_to`: the value written into the padding (outputs' padding must be 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_value: Option<f64>,
}

/// The manifest written next to each exported module.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Manifest {
    /// Implementation id.
    #[serde(rename = "impl")]
    pub implementation: String,
    /// Target platform.
    pub platform: String,
    /// jax version that exported it.
    pub jax_version: String,
    /// Cache key.
    pub key: String,
    /// Module arguments in order (unused ones already dropped).
    pub inputs: Vec<TensorSpec>,
    /// Module results in order.
    pub outputs: Vec<TensorSpec>,
    /// Devices (partitions) the module is compiled for (1 when absent).
    #[serde(default = "one")]
    pub num_partitions: usize,
    /// SPEC outputs the implementation does not produce (e.g. `entropy` of an adapted
    /// partial kernel): placeholders in the module, dropped and never gated.
    #[serde(default)]
    pub not_provided: Vec<String>,
    /// TPU exports: every Mosaic kernel's cost as derived by the exporter from the kernel
    /// itself (grid, BlockSpecs, index maps, body), with its declared `CostEstimate`.
    #[serde(default)]
    pub kernels: Vec<crate::cost::KernelCost>,
    /// TPU exports whose kernel derivation failed: why (the cost is then not derived).
    #[serde(default)]
    pub kernel_cost_error: Option<String>,
    /// Every matmul with an f32 operand: operand types, precision, where it is written
    /// (a cpu export also says what it emulated).
    #[serde(default)]
    pub f32_dots: Vec<crate::precision::Dot>,
    /// The implementation's declaration of reduced precision under its options, if any.
    #[serde(default)]
    pub declared_precision: Option<String>,
    /// The 16-bit round trips a cpu export removed (emulated excess precision).
    #[serde(default)]
    pub round_trips: Vec<crate::precision::RoundTrip>,
}

impl Manifest {
    /// The precision verdict of this module on the platform it was exported for.
    pub fn precision(&self) -> Option<crate::precision::PrecisionReport> {
        crate::precision::PrecisionReport::judge(
            &self.platform,
            &self.f32_dots,
            self.declared_precision.as_deref(),
            &self.round_trips,
        )
    }
}

fn one() -> usize {
    1
}

/// One implementation of the exporter's registry (`--list-impls`).
#[derive(Debug, Clone, Deserialize)]
pub struct ImplInfo {
    /// Id.
    pub id: String,
    /// One line.
    #[serde(default)]
    pub description: String,
    /// Options and their defaults.
    #[serde(default)]
    pub default_options: serde_json::Map<String, serde_json::Value>,
    /// Option -> values worth sweeping (`grpo-suite sweep`).
    #[serde(default)]
    pub search_space: serde_json::Map<String, serde_json::Value>,
}

/// What the exporter said about one (implementation, case).
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one per (implementation, case): size does not matter
pub enum Exported {
    /// A module ready to compile.
    Ready {
        /// Its manifest.
        manifest: Manifest,
        /// `module.mlirbc` (StableHLO bytecode).
        module: PathBuf,
    },
    /// The implementation does not support the case (the reason).
    Unsupported(String),
    /// Export failed (one line: what, and where in the implementation's code).
    Failed(String),
}

/// One export request, as the exporter reads it.
#[derive(Debug, Serialize)]
struct Request<'a> {
    #[serde(rename = "impl")]
    implementation: &'a str,
    level: crate::spec::Level,
    b: usize,
    t: usize,
    v: usize,
    h: Option<usize>,
    dtype: &'static str,
    knobs: &'a crate::spec::Knobs,
    impl_options: &'a serde_json::Map<String, serde_json::Value>,
    platform: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    devices: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sharding: Option<crate::cases::Sharding>,
}

#[derive(Debug, Deserialize)]
struct Response {
    status: String,
    #[serde(default)]
    dir: Option<PathBuf>,
    #[serde(default)]
    manifest: Option<Manifest>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    detail: Option<String>,
}

/// Exports every (implementation, options, case) for `platform`. Each implementation's
/// requests go to one exporter process ([`export_batch_one`]); the implementations are
/// spread over up to [`export_jobs`] processes that run at once, balanced by their number
/// of requests. The answers come back in `work`'s order.
pub fn export_batch(
    env: &PyEnv,
    cache_dir: &Path,
    platform: &str,
    work: &[(&str, &serde_json::Map<String, serde_json::Value>, &Case)],
) -> Result<Vec<Exported>> {
    let names: Vec<&str> = work.iter().map(|w| w.0).collect();
    let shards = shard_by_implementation(&names, export_jobs());
    if shards.len() <= 1 {
        return export_batch_one(env, cache_dir, platform, work);
    }
    let answers: Vec<Result<Vec<Exported>>> = std::thread::scope(|s| {
        let running: Vec<_> = shards
            .iter()
            .map(|ks| {
                let sub: Vec<_> = ks.iter().map(|&k| work[k]).collect();
                s.spawn(move || export_batch_one(env, cache_dir, platform, &sub))
            })
            .collect();
        running
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("an exporter thread panicked")))
            })
            .collect()
    });
    let mut results: Vec<Option<Exported>> = vec![None; work.len()];
    for (ks, answer) in shards.iter().zip(answers) {
        for (&k, r) in ks.iter().zip(answer?) {
            results[k] = Some(r);
        }
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every request answered"))
        .collect())
}

/// How many exporter processes one batch may run at once: the machine's cores, at most 8
/// (each process holds its own jax, about 0.5 GB).
fn export_jobs() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8)
}

/// Splits request indices into at most `jobs` shards, every implementation (by name)
/// whole in one shard: the largest implementations first, each to the shard with the
/// fewest requests so far. Indices keep their order within a shard; empty shards are
/// dropped.
fn shard_by_implementation(names: &[&str], jobs: usize) -> Vec<Vec<usize>> {
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    for (k, n) in names.iter().enumerate() {
        match groups.iter_mut().find(|(g, _)| g == n) {
            Some((_, ks)) => ks.push(k),
            None => groups.push((n, vec![k])),
        }
    }
    // Stable: equal sizes keep their first-appearance order.
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()));
    let mut shards: Vec<Vec<usize>> = vec![Vec::new(); jobs.max(1)];
    for (_, ks) in groups {
        let least = (0..shards.len())
            .min_by_key(|&j| shards[j].len())
            .expect("at least one shard");
        shards[least].extend(ks);
    }
    shards.retain(|s| !s.is_empty());
    for s in &mut shards {
        s.sort_unstable();
    }
    shards
}

/// Exports every (implementation, options, case) for `platform` with one Python process,
/// each module under the time limit ([`timeout`], from the exporter's ready line or its
/// previous answer). A module that hangs or kills the exporter fails with one line (and so
/// does every other case of its implementation, which would only hang or die again); a new
/// process exports the rest. Failure details (tracebacks) go to files under
/// `<cache_dir>/export-errors/`, named in the line. `Err` only when the exporter cannot
/// start or fails before any implementation's code ran.
fn export_batch_one(
    env: &PyEnv,
    cache_dir: &Path,
    platform: &str,
    work: &[(&str, &serde_json::Map<String, serde_json::Value>, &Case)],
) -> Result<Vec<Exported>> {
    let mut lines = Vec::with_capacity(work.len());
    for (imp, opts, c) in work {
        let req = Request {
            implementation: imp,
            level: c.level,
            b: c.shape.b,
            t: c.shape.t,
            v: c.shape.v,
            h: c.shape.h,
            dtype: c.dtype.name(),
            knobs: &c.knobs,
            impl_options: opts,
            platform,
            devices: (c.devices > 1).then_some(c.devices),
            sharding: c.sharding.filter(|_| c.devices > 1),
        };
        lines.push(serde_json::to_string(&req)?);
    }
    let limit = timeout();
    let mut results: Vec<Option<Exported>> = vec![None; work.len()];
    let mut pending: Vec<usize> = (0..work.len()).collect();
    while !pending.is_empty() {
        let input: String = pending.iter().map(|&k| format!("{}\n", lines[k])).collect();
        let mut cmd = env.exporter(&["--requests", "-", "--cache-dir"]);
        cmd.arg(cache_dir);
        let mut answers: Vec<String> = Vec::new();
        let mut ready = false;
        let (ended, tail) = supervised(cmd, input, startup_limit(), limit, |said| match said {
            Said::Out(l) if !l.trim().is_empty() => {
                answers.push(l.clone());
                true
            }
            Said::Marker(m) if m == READY => {
                ready = true;
                true
            }
            _ => false,
        })
        .with_context(|| {
            format!(
                "cannot start the exporter {} (run scripts/setup.sh)",
                env.describe()
            )
        })?;
        if answers.len() > pending.len() {
            bail!(
                "the exporter {} answered {} lines to {} requests",
                env.describe(),
                answers.len(),
                pending.len()
            );
        }
        for (j, l) in answers.iter().enumerate() {
            let k = pending[j];
            results[k] = Some(parse_response(l, cache_dir, work[k].0, &work[k].2.id)?);
        }
        let answered = answers.len();
        if answered == pending.len() {
            break;
        }
        if answered == 0 && !ready {
            // Nothing of an implementation ran yet: the exporter itself does not work.
            return Err(match ended {
                Ended::Exited(status) => exporter_failure_of(env, status, &tail),
                Ended::TimedOut => anyhow!(
                    "the exporter {} did not start within {} s; it was killed",
                    env.describe(),
                    startup_limit().as_secs()
                ),
            });
        }
        let culprit = pending[answered];
        let (imp, case_id) = (work[culprit].0, &work[culprit].2.id);
        let why = match ended {
            Ended::TimedOut => format!(
                "the export of case {case_id} did not finish within {} s (export_timeout_s); the exporter was killed",
                limit.as_secs()
            ),
            Ended::Exited(status) => format!(
                "the exporter process exited ({}) while exporting case {case_id}: {}",
                status,
                last_message(&tail).unwrap_or_else(|| "no message (os._exit or a crash in the module)".into())
            ),
        };
        results[culprit] = Some(Exported::Failed(why.clone()));
        for &k in &pending[answered + 1..] {
            if work[k].0 == imp {
                results[k] = Some(Exported::Failed(format!(
                    "not exported: {why} (its other cases are not tried)"
                )));
            }
        }
        pending.retain(|&k| results[k].is_none());
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every request answered"))
        .collect())
}

/// One exporter result line. An error's detail (the traceback) is written to a file under
/// `<cache_dir>/export-errors/` and only named in the one-line message.
fn parse_response(line: &str, cache_dir: &Path, imp: &str, case_id: &str) -> Result<Exported> {
    let r: Response =
        serde_json::from_str(line).with_context(|| format!("unreadable exporter line: {line}"))?;
    Ok(match r.status.as_str() {
        "ok" => {
            let dir = r.dir.context("exporter result without dir")?;
            Exported::Ready {
                manifest: r.manifest.context("exporter result without manifest")?,
                module: dir.join("module.mlirbc"),
            }
        }
        "unsupported" => Exported::Unsupported(r.reason.unwrap_or_else(|| "unsupported".into())),
        "contract" => Exported::Failed(format!(
            "{}{}",
            crate::runner::BREAKS_CONTRACT,
            r.message.unwrap_or_default().replace('\n', " ")
        )),
        _ => {
            let message = r.message.unwrap_or_default().replace('\n', " ");
            let detail = r.detail.filter(|d| !d.trim().is_empty()).and_then(|d| {
                let key = xxhash_rust::xxh3::xxh3_64(format!("{imp}\n{case_id}\n{d}").as_bytes());
                let path = cache_dir
                    .join("export-errors")
                    .join(format!("{key:016x}.txt"));
                write_atomically(&path, &format!("{imp} on {case_id}\n{d}"));
                path.exists().then_some(path)
            });
            match detail {
                Some(p) => Exported::Failed(format!(
                    "export failed: {message} (traceback: {})",
                    p.display()
                )),
                None => Exported::Failed(format!("export failed: {message}")),
            }
        }
    })
}

/// Checks once per environment that the interpreter runs, finds the `grpo_jax` package
/// and speaks this suite's protocol (cheap: no jax import), so a wrong `python` is one
/// line naming it, not a traceback per batch.
fn check_python(env: &PyEnv) -> Result<()> {
    static CHECKED: Mutex<Vec<PyEnv>> = Mutex::new(Vec::new());
    if CHECKED.lock().unwrap().iter().any(|p| p == env) {
        return Ok(());
    }
    let probe = "import importlib.util, sys\nprint('grpo-probe')\nspec = importlib.util.find_spec('grpo_jax')\nif spec is None: sys.exit(3)\nprint('package', list(spec.submodule_search_locations)[0])\ntry:\n    from grpo_jax.protocol import PROTOCOL_VERSION\nexcept ImportError:\n    sys.exit(5)\nprint('protocol', PROTOCOL_VERSION)";
    let out = env.command().args(["-c", probe]).output();
    let python = env.python.display();
    let hint = format!(
        "set {} or the entry's `python` to a venv's python, or run scripts/setup.sh",
        crate::env::PYTHON
    );
    let install = format!(
        "{python} -m pip install {}",
        crate::repo_root().join("backends/jax").display()
    );
    match out {
        Err(e) => bail!("cannot run the exporter's Python {python}: {e} ({hint})"),
        Ok(o) if !String::from_utf8_lossy(&o.stdout).contains("grpo-probe") => {
            bail!("{python} is not a Python interpreter ({hint})")
        }
        Ok(o) if o.status.code() == Some(3) => bail!("the Python {} has no grpo_jax package: install it there with `{install}`", env.describe()),
        Ok(o) if o.status.code() == Some(5) => bail!(
            "the grpo_jax in {} predates the exporter protocol (this suite speaks protocol {PROTOCOL}): reinstall it with `{install}`",
            env.describe()
        ),
        Ok(o) if !o.status.success() => bail!(
            "the exporter's Python {python} does not work ({}): {} ({hint})",
            o.status,
            String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
        ),
        Ok(o) => {
            let stdout = String::from_utf8_lossy(&o.stdout);
            let theirs = stdout.lines().find_map(|l| l.strip_prefix("protocol ")).map(str::trim).unwrap_or("?");
            if theirs != PROTOCOL.to_string() {
                bail!(
                    "protocol mismatch: the grpo_jax exporter in {} speaks protocol {theirs}, this grpo-suite speaks {PROTOCOL}: reinstall it with `{install}`",
                    env.describe()
                );
            }
            if let Some(theirs) = stdout.lines().find_map(|l| l.strip_prefix("package ")) {
                check_same_package(Path::new(theirs.trim()), env, &install)?;
            }
            CHECKED.lock().unwrap().push(env.clone());
            Ok(())
        }
    }
}

/// Refuses an exporter whose `grpo_jax` is not this checkout's: an installed copy (a
/// venv set up before the sources changed) would export old code under the identity of
/// the new, and every verdict would be stale.
fn check_same_package(theirs: &Path, env: &PyEnv, install: &str) -> Result<()> {
    let ours = crate::repo_root().join("backends/jax/grpo_jax");
    let same_dir = match (theirs.canonicalize(), ours.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same_dir
        || crate::run_identity::python_sources_digest(&[theirs.to_path_buf()])
            == crate::run_identity::python_sources_digest(&[ours.clone()])
    {
        return Ok(());
    }
    bail!(
        "the grpo_jax in {} ({}) is not this checkout's: its sources differ from {} (installed before they changed?); reinstall it with `{install}`, or install it editable (`-e`)",
        env.describe(),
        theirs.display(),
        ours.display()
    )
}

/// The key of an export answer: the entry as the exporter sees it (name, id, options,
/// interpreter, pythonpath) and the case. Two entries with one name but other options
/// (two backends built in one process, as tests do) never share an answer.
fn done_key(imp: &ImplConfig, case: &Case) -> (String, String) {
    let entry = format!(
        "{}\n{}\n{}\n{:?}\n{:?}",
        imp.display_name(),
        imp.id,
        serde_json::Value::Object(imp.options.clone()),
        imp.python,
        imp.pythonpath
    );
    (entry, case.id.clone())
}

/// The configured implementation called `name` (its display name).
pub fn find<'a>(impls: &'a [ImplConfig], name: &str) -> Option<&'a ImplConfig> {
    impls.iter().find(|c| c.display_name() == name)
}

/// The entry named `name` of backend `backend`, or the unsupported reason that it has none.
pub fn entry<'a>(
    impls: &'a [ImplConfig],
    backend: &str,
    name: &str,
) -> Result<&'a ImplConfig, String> {
    find(impls, name).ok_or_else(|| format!("{backend} has no implementation `{name}` configured"))
}

/// The display names of a backend's entries, in config order.
pub fn names(impls: &[ImplConfig]) -> Vec<String> {
    impls.iter().map(|c| c.display_name().to_string()).collect()
}

/// The exporter of one backend: which Python, which cache, which platform, and what it
/// has answered so far (per entry and case id). Only work a trial will
/// run is ever sent to it.
pub struct Exporter {
    default_env: PyEnv,
    cache_dir: PathBuf,
    platform: String,
    done: Mutex<HashMap<(String, String), Exported>>,
    /// Implementations (by name) whose module hung in the configuration check: why. Never
    /// exported (they would only hang again); their trials are errors.
    broken: Mutex<HashMap<String, String>>,
}

/// How messages name a configured implementation: its entry name and, for a module outside
/// the package, its `module:attribute`.
fn describe_entry(imp: &ImplConfig) -> String {
    if imp.is_external() {
        format!(
            "implementation `{}` (external implementation '{}')",
            imp.display_name(),
            imp.id
        )
    } else if imp.display_name() != imp.id {
        format!("implementation `{}` ({})", imp.display_name(), imp.id)
    } else {
        format!("implementation `{}`", imp.id)
    }
}

impl Exporter {
    /// The exporter for `platform` (`cpu` or `tpu`): `GRPO_PYTHON` or the venv's Python,
    /// `GRPO_ARTIFACTS` or `target/grpo-artifacts`. Errors say what is missing.
    pub fn new(platform: &str) -> Result<Exporter> {
        let python =
            crate::env::python()?.unwrap_or_else(|| crate::repo_root().join(".venv/bin/python"));
        if !python.exists() {
            bail!(
                "no Python for the exporter at {} (run scripts/setup.sh or set {})",
                python.display(),
                crate::env::PYTHON
            );
        }
        let default_env = PyEnv {
            python,
            pythonpath: Vec::new(),
        };
        check_python(&default_env)?;
        let cache_dir = crate::env::artifacts()?
            .unwrap_or_else(|| crate::repo_root().join("target/grpo-artifacts"));
        Ok(Exporter {
            default_env,
            cache_dir,
            platform: platform.into(),
            done: Mutex::new(HashMap::new()),
            broken: Mutex::new(HashMap::new()),
        })
    }

    /// What a trial records of the environment that exported `manifest` for `imp`.
    pub fn info(&self, imp: &ImplConfig, manifest: &Manifest) -> crate::backends::ExporterInfo {
        crate::backends::ExporterInfo {
            jax_version: manifest.jax_version.clone(),
            python: self.env_of(imp).python.display().to_string(),
        }
    }

    /// The environment that exports `imp`: its entry's `python` / `pythonpath`, else the
    /// suite's.
    pub fn env_of(&self, imp: &ImplConfig) -> PyEnv {
        PyEnv {
            python: imp
                .python
                .clone()
                .unwrap_or_else(|| self.default_env.python.clone()),
            pythonpath: imp.pythonpath.clone(),
        }
    }

    /// Exports what is not exported yet (one Python process for the batch).
    pub fn ensure(&self, work: &[(&ImplConfig, &Case)]) -> Result<()> {
        let todo: Vec<(&ImplConfig, &Case)> = {
            let done = self.done.lock().unwrap();
            let mut seen = std::collections::HashSet::new();
            work.iter()
                .filter(|(i, c)| !done.contains_key(&done_key(i, c)))
                .filter(|(i, c)| seen.insert(done_key(i, c)))
                .copied()
                .collect()
        };
        if todo.is_empty() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.cache_dir).with_context(|| {
            format!("cannot create artifact cache {}", self.cache_dir.display())
        })?;
        // One exporter process per environment.
        let mut groups: Vec<(PyEnv, Vec<(&ImplConfig, &Case)>)> = Vec::new();
        for (i, c) in todo {
            if let Some(why) = self.broken(i) {
                self.done
                    .lock()
                    .unwrap()
                    .insert(done_key(i, c), Exported::Failed(why));
                continue;
            }
            let env = self.env_of(i);
            match groups.iter_mut().find(|(e, _)| *e == env) {
                Some((_, w)) => w.push((i, c)),
                None => groups.push((env, vec![(i, c)])),
            }
        }
        for (env, work) in groups {
            check_python(&env)?;
            let requests: Vec<_> = work
                .iter()
                .map(|(o, c)| (o.id.as_str(), &o.options, *c))
                .collect();
            let results = export_batch(&env, &self.cache_dir, &self.platform, &requests)?;
            let mut done = self.done.lock().unwrap();
            for ((i, c), r) in work.iter().zip(results) {
                let r = match r {
                    Exported::Failed(m) => Exported::Failed(format!("{}: {m}", describe_entry(i))),
                    r => r,
                };
                done.insert(done_key(i, c), r);
            }
        }
        Ok(())
    }

    /// The registry of the suite's exporter (`--list-impls`): ids, default options and
    /// the search spaces `grpo-suite sweep` uses.
    pub fn list_impls(&self) -> Result<Vec<ImplInfo>> {
        let env = &self.default_env;
        let out = env
            .exporter(&["--list-impls"])
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("cannot start the exporter {}", env.describe()))?;
        if !out.status.success() {
            return Err(exporter_failure(env, out.status, &out.stderr));
        }
        serde_json::from_slice(&out.stdout).context("unreadable --list-impls answer")
    }

    /// Why `imp`'s trials are errors without any export (its module hung in the
    /// configuration check, [`Exporter::check_config`]), if they are.
    pub fn broken(&self, imp: &ImplConfig) -> Option<String> {
        self.broken
            .lock()
            .unwrap()
            .get(imp.display_name())
            .map(|why| format!("{}: {why}", describe_entry(imp)))
    }

    /// The exporter's answer for one (implementation, case), exporting it if needed.
    pub fn get(&self, imp: &ImplConfig, case: &Case) -> Result<Exported> {
        self.ensure(&[(imp, case)])?;
        self.done
            .lock()
            .unwrap()
            .get(&done_key(imp, case))
            .cloned()
            .ok_or_else(|| {
                anyhow!(
                    "exporter gave no answer for {} on {}",
                    imp.display_name(),
                    case.id
                )
            })
    }

    /// Checks configured implementations with the exporter's registry (ids, option names,
    /// option values) without exporting; `Err` lists each bad entry as
    /// "implementation `name`: why". Answers are cached on disk by the Python, the entries
    /// and the package sources, so a run pays the jax import once.
    pub fn check_config(&self, impls: &[ImplConfig]) -> Result<()> {
        let mut groups: Vec<(PyEnv, Vec<&ImplConfig>)> = Vec::new();
        for i in impls {
            let env = self.env_of(i);
            match groups.iter_mut().find(|(e, _)| *e == env) {
                Some((_, w)) => w.push(i),
                None => groups.push((env, vec![i])),
            }
        }
        let mut bad: Vec<String> = Vec::new();
        for (env, group) in groups {
            check_python(&env)?;
            bad.extend(self.check_group(&env, &group)?);
        }
        if bad.is_empty() {
            Ok(())
        } else {
            bail!("{}", bad.join("; "))
        }
    }

    /// `--check-config` for the entries of one environment; the bad ones as messages.
    /// Answers for the suite's own package are cached on disk (keyed by the entries and
    /// the package sources); external ones are asked every time (their sources are not
    /// ours to hash here).
    fn check_group(&self, env: &PyEnv, impls: &[&ImplConfig]) -> Result<Vec<String>> {
        let entries: Vec<serde_json::Value> = impls
            .iter()
            .map(|i| serde_json::json!({"name": i.display_name(), "impl": i.id, "impl_options": i.options}))
            .collect();
        let body = serde_json::to_string(&entries)?;
        let cacheable = *env == self.default_env && impls.iter().all(|i| !i.is_external());
        let cached = cacheable.then(|| {
            let sources = crate::run_identity::python_sources_digest(&[
                crate::repo_root().join("backends/jax/grpo_jax")
            ]);
            let key_src = format!("{}\n{PROTOCOL}\n{body}\n{sources}", env.python.display());
            let key = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(key_src.as_bytes()));
            self.cache_dir.join(format!("config-check-{key}.json"))
        });
        // A cached answer that does not parse (another process's copy caught half-written
        // by an older suite, a disk full) is asked again, never an error.
        let from_cache = cached
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| parse_check_answer(&t).ok());
        if let Some(answers) = from_cache {
            return Ok(bad_entries(answers));
        }
        // One process for the entries; one that exits or hangs while its entry is checked
        // (the exporter says which on stderr) is set aside and the rest asked again.
        let limit = timeout();
        let mut bad = Vec::new();
        let mut pending: Vec<usize> = (0..impls.len()).collect();
        let mut whole = true;
        while !pending.is_empty() {
            let part: Vec<&serde_json::Value> = pending.iter().map(|&k| &entries[k]).collect();
            let cmd = env.exporter(&["--check-config"]);
            let mut stdout = String::new();
            let mut current: Option<usize> = None;
            let (ended, tail) = supervised(
                cmd,
                serde_json::to_string(&part)?,
                startup_limit(),
                limit,
                |said| match said {
                    Said::Out(l) => {
                        stdout.push_str(l);
                        stdout.push('\n');
                        false
                    }
                    Said::Marker(m) => match m
                        .strip_prefix(CHECKING)
                        .and_then(|k| k.trim().parse::<usize>().ok())
                    {
                        Some(k) => {
                            current = Some(k);
                            true
                        }
                        None => false,
                    },
                    Said::Err(_) => false,
                },
            )
            .with_context(|| format!("cannot start the exporter {}", env.describe()))?;
            let culprit = current.and_then(|j| pending.get(j).copied());
            match (ended, culprit) {
                (Ended::Exited(status), _) if status.success() => {
                    let answers = parse_check_answer(&stdout)?;
                    if answers.len() != pending.len() {
                        bail!(
                            "the exporter {} answered {} of {} --check-config entries",
                            env.describe(),
                            answers.len(),
                            pending.len()
                        );
                    }
                    if let Some(p) = cached.as_ref().filter(|_| whole) {
                        write_atomically(p, &stdout);
                    }
                    bad.extend(bad_entries(answers));
                    break;
                }
                (Ended::Exited(status), Some(k)) if status.code() != Some(MISMATCH_EXIT) => {
                    bad.push(format!(
                        "implementation `{}`: '{}': the exporter exited ({status}) while loading and checking it: {}",
                        impls[k].display_name(),
                        impls[k].id,
                        last_message(&tail).unwrap_or_else(|| "no message (os._exit or a crash in the module)".into())
                    ));
                    pending.retain(|&j| j != k);
                }
                (Ended::Exited(status), _) => {
                    return Err(exporter_failure_of(env, status, &tail)
                        .context("the exporter could not check the configuration"))
                }
                (Ended::TimedOut, Some(k)) => {
                    self.broken.lock().unwrap().insert(
                        impls[k].display_name().to_string(),
                        format!(
                            "loading and checking its module did not finish within {} s (export_timeout_s); the exporter was killed",
                            limit.as_secs()
                        ),
                    );
                    pending.retain(|&j| j != k);
                }
                (Ended::TimedOut, None) => bail!(
                    "the exporter {} did not start within {} s; it was killed",
                    env.describe(),
                    startup_limit().as_secs()
                ),
            }
            whole = false;
        }
        Ok(bad)
    }

    /// The exporter's support answer: `Err(reason)` when the implementation declares the
    /// case unsupported. Export failures are trial errors (in `run`), never silent skips.
    pub fn support(&self, imp: &ImplConfig, case: &Case) -> Result<(), String> {
        match self.get(imp, case) {
            Ok(Exported::Unsupported(reason)) => Err(reason),
            _ => Ok(()),
        }
    }

    /// Exports the work items whose implementation is one of `impls` (by name).
    pub fn prepare_named(&self, impls: &[ImplConfig], work: &[(&str, &Case)]) -> Result<()> {
        let w: Vec<(&ImplConfig, &Case)> = work
            .iter()
            .filter_map(|(n, c)| find(impls, n).map(|o| (o, *c)))
            .collect();
        self.ensure(&w)
    }

    /// How many modules this exporter has answered for (what a filtered run exported).
    pub fn count(&self) -> usize {
        self.done.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_pythonpath_goes_before_the_inherited_one_kept_whole() {
        let env = |dirs: &[&str]| PyEnv {
            python: PathBuf::from("python3"),
            pythonpath: dirs.iter().map(PathBuf::from).collect(),
        };
        let pp = |e: &PyEnv, inherited: Option<&str>| {
            e.child_pythonpath(inherited.map(Into::into))
                .map(|v| v.into_string().unwrap())
        };
        let ext = env(&["configs/../examples/external_kernel"]);
        // The GPU machine's case (scripts/gpu_check.sh puts the checkout's backends/jax
        // before a PYTHONPATH the machine already had): the inherited value holds several
        // directories. It was dropped whole (join_paths refuses an element holding `:`,
        // and the fallback was empty), and grpo_jax with it.
        assert_eq!(
            pp(&ext, Some("/c/backends/jax:/opt/image")).as_deref(),
            Some("configs/../examples/external_kernel:/c/backends/jax:/opt/image")
        );
        assert_eq!(
            pp(&ext, Some("/c/backends/jax")).as_deref(),
            Some("configs/../examples/external_kernel:/c/backends/jax")
        );
        assert_eq!(pp(&env(&["/a", "/b"]), None).as_deref(), Some("/a:/b"));
        assert_eq!(pp(&env(&["/a"]), Some("")).as_deref(), Some("/a"));
        // No directories of its own: the inherited PYTHONPATH is left as it is.
        assert_eq!(pp(&env(&[]), Some("/x:/y")), None);
    }

    #[test]
    fn shards_keep_each_implementation_whole_and_balance_the_rest() {
        let names = ["a", "b", "a", "c", "b", "a", "d"];
        // One job: everything, in order.
        assert_eq!(
            shard_by_implementation(&names, 1),
            vec![(0..7).collect::<Vec<_>>()]
        );
        // Two jobs, largest first to the lighter shard: a (3) | b (2), c (1) to b's (2 < 3),
        // then d to the first of the two equal shards; indices in order.
        let two = shard_by_implementation(&names, 2);
        assert_eq!(two, vec![vec![0, 2, 5, 6], vec![1, 3, 4]]);
        // More jobs than implementations: one shard each, none empty.
        let many = shard_by_implementation(&names, 8);
        assert_eq!(many.len(), 4);
        for s in &many {
            let first = names[s[0]];
            assert!(s.iter().all(|&k| names[k] == first), "{many:?}");
        }
        // Every index exactly once.
        let mut all: Vec<usize> = many.concat();
        all.sort_unstable();
        assert_eq!(all, (0..7).collect::<Vec<_>>());
        assert!(shard_by_implementation(&[], 2).is_empty());
    }

    fn manifest(jax: &str) -> Manifest {
        Manifest {
            implementation: "mine:IMPL".into(),
            platform: "cpu".into(),
            jax_version: jax.into(),
            key: "k".into(),
            inputs: vec![],
            outputs: vec![],
            not_provided: vec![],
            num_partitions: 1,
            kernels: vec![],
            kernel_cost_error: None,
            f32_dots: Vec::new(),
            declared_precision: None,
            round_trips: Vec::new(),
        }
    }

    #[test]
    fn a_compile_failure_of_another_jax_names_both_versions_and_the_fix() {
        let pinned = pinned_jax_version();
        assert!(
            pinned.chars().next().is_some_and(|c| c.is_ascii_digit()),
            "{pinned}"
        );
        let plugin = Path::new("/p/xla_cpu.so");
        let e = explain_compile_failure(
            // The plugin's message spans lines (as xla_cpu_pjrt's MLIR notes do).
            anyhow!("compile of m: unknown op vhlo.foo_v9\n  -:0:0: note: in bytecode version 6\n"),
            &manifest("0.99.0"),
            plugin,
            "backends.pjrt-cpu.plugin",
            crate::env::PJRT_PLUGIN,
        );
        let m = format!("{e:#}");
        assert!(
            m.contains("jax 0.99.0") && m.contains(&format!("jax {pinned}")),
            "{m}"
        );
        assert!(
            m.contains("backends.pjrt-cpu.plugin")
                && m.contains("/p/xla_cpu.so")
                && m.contains("vhlo.foo_v9")
                && m.contains("foo_v9 -:0:0: note: in bytecode version 6"),
            "{m}"
        );
        assert_eq!(m.lines().count(), 1, "{m}");
        // The pinned jax: the plugin's message as is.
        let e = explain_compile_failure(
            anyhow!("compile of m: boom"),
            &manifest(pinned),
            plugin,
            "x",
            "Y",
        );
        assert_eq!(format!("{e:#}"), "compile of m: boom");
        // Another jax, but not a compile failure: as is.
        let e = explain_compile_failure(
            anyhow!("execute: out of memory"),
            &manifest("0.99.0"),
            plugin,
            "x",
            "Y",
        );
        assert_eq!(format!("{e:#}"), "execute: out of memory");
        // tpu-aot's compile error (libtpu 0.0.42.1 on a jax 0.11.2 export) names libtpu's
        // setting and variable.
        let e = explain_compile_failure(
            anyhow!("TPU compile for v6e:2x2 failed: unregistered operation 'vhlo.custom_call_v2' found in dialect ('vhlo') that does not allow unknown operations"),
            &manifest("0.11.2"),
            Path::new("/v/libtpu/libtpu.so"),
            "backends.tpu-aot.plugin",
            crate::env::LIBTPU,
        );
        let m = format!("{e:#}");
        assert!(
            m.contains("jax 0.11.2")
                && m.contains(&format!("jax {pinned}"))
                && m.contains("backends.tpu-aot.plugin")
                && m.contains("GRPO_LIBTPU")
                && m.contains("vhlo.custom_call_v2")
                && m.lines().count() == 1,
            "{m}"
        );
    }
}
