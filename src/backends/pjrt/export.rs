//! Calling the Python exporter (`python -m grpo_jax.export`) in batches and reading its
//! manifests. One process per batch: jax starts once, cached artifacts are reused.

use crate::cases::Case;
use crate::config::ImplConfig;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::sync::Mutex;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Shape and dtype of one module argument or result.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct TensorSpec {
    /// SPEC name.
    pub name: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// `f32`, `bf16`, `f16`, `i32` or `pred`.
    pub dtype: String,
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
}

/// What the exporter said about one (implementation, case).
#[derive(Debug, Clone)]
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
    /// Export failed (one line, then the detail).
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

/// Exports every (implementation, options, case) for `platform` with one Python process.
pub fn export_batch(
    python: &Path,
    cache_dir: &Path,
    platform: &str,
    work: &[(&str, &serde_json::Map<String, serde_json::Value>, &Case)],
) -> Result<Vec<Exported>> {
    if work.is_empty() {
        return Ok(Vec::new());
    }
    let mut lines = String::new();
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
        };
        lines.push_str(&serde_json::to_string(&req)?);
        lines.push('\n');
    }
    let mut child = Command::new(python)
        .args(["-m", "grpo_jax.export", "--requests", "-", "--cache-dir"])
        .arg(cache_dir)
        .env("JAX_PLATFORMS", "cpu")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start the exporter {} (run scripts/setup.sh)", python.display()))?;
    let mut stdin = child.stdin.take().context("exporter stdin")?;
    let writer = std::thread::spawn(move || stdin.write_all(lines.as_bytes()));
    let out = child.wait_with_output().context("waiting for the exporter")?;
    writer.join().ok();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!("exporter exited with {}: {}", out.status, err.lines().last().unwrap_or("(no message)"));
    }
    let text = String::from_utf8(out.stdout).context("exporter output is not UTF-8")?;
    let results: Vec<Exported> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let r: Response = serde_json::from_str(l).with_context(|| format!("unreadable exporter line: {l}"))?;
            Ok(match r.status.as_str() {
                "ok" => {
                    let dir = r.dir.context("exporter result without dir")?;
                    Exported::Ready { manifest: r.manifest.context("exporter result without manifest")?, module: dir.join("module.mlirbc") }
                }
                "unsupported" => Exported::Unsupported(r.reason.unwrap_or_else(|| "unsupported".into())),
                _ => Exported::Failed(format!(
                    "export failed: {}{}",
                    r.message.unwrap_or_default(),
                    r.detail.map(|d| format!("\n{d}")).unwrap_or_default()
                )),
            })
        })
        .collect::<Result<_>>()?;
    if results.len() != work.len() {
        bail!("exporter answered {} of {} requests; stderr: {}", results.len(), work.len(), String::from_utf8_lossy(&out.stderr));
    }
    Ok(results)
}

/// Checks once per interpreter that it runs and finds the `grpo_jax` package (cheap: no
/// jax import), so a wrong `GRPO_PYTHON` is one line naming it, not a traceback per batch.
fn check_python(python: &Path) -> Result<()> {
    static CHECKED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    if CHECKED.lock().unwrap().iter().any(|p| p == python) {
        return Ok(());
    }
    let probe = "import importlib.util, sys; print('grpo-probe'); sys.exit(0 if importlib.util.find_spec('grpo_jax') else 3)";
    let out = Command::new(python).args(["-c", probe]).output();
    let hint = format!("set {} to the venv's python, or run scripts/setup.sh", crate::env::PYTHON);
    match out {
        Err(e) => bail!("cannot run the exporter's Python {}: {e} ({hint})", python.display()),
        Ok(o) if !String::from_utf8_lossy(&o.stdout).contains("grpo-probe") => {
            bail!("{} is not a Python interpreter ({hint})", python.display())
        }
        Ok(o) if o.status.code() == Some(3) => bail!("the Python {} has no grpo_jax package ({hint})", python.display()),
        Ok(o) if !o.status.success() => bail!(
            "the exporter's Python {} does not work ({}): {} ({hint})",
            python.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
        ),
        Ok(_) => {
            CHECKED.lock().unwrap().push(python.to_path_buf());
            Ok(())
        }
    }
}

/// The configured implementation called `name` (its display name).
pub fn find<'a>(impls: &'a [ImplConfig], name: &str) -> Option<&'a ImplConfig> {
    impls.iter().find(|c| c.display_name() == name)
}

/// The exporter of one backend: which Python, which cache, which platform, and what it
/// has answered so far (per implementation name and case id). Only work a trial will
/// run is ever sent to it.
pub struct Exporter {
    python: PathBuf,
    cache_dir: PathBuf,
    platform: String,
    done: Mutex<HashMap<(String, String), Exported>>,
}

impl Exporter {
    /// The exporter for `platform` (`cpu` or `tpu`): `GRPO_PYTHON` or the venv's Python,
    /// `GRPO_ARTIFACTS` or `target/grpo-artifacts`. Errors say what is missing.
    pub fn new(platform: &str) -> Result<Exporter> {
        let python = crate::env::python()?.unwrap_or_else(|| crate::repo_root().join(".venv/bin/python"));
        if !python.exists() {
            bail!("no Python for the exporter at {} (run scripts/setup.sh or set {})", python.display(), crate::env::PYTHON);
        }
        check_python(&python)?;
        let cache_dir = crate::env::artifacts()?.unwrap_or_else(|| crate::repo_root().join("target/grpo-artifacts"));
        Ok(Exporter { python, cache_dir, platform: platform.into(), done: Mutex::new(HashMap::new()) })
    }

    /// Exports what is not exported yet (one Python process for the batch).
    pub fn ensure(&self, work: &[(&ImplConfig, &Case)]) -> Result<()> {
        let todo: Vec<(&ImplConfig, &Case)> = {
            let done = self.done.lock().unwrap();
            let mut seen = std::collections::HashSet::new();
            work.iter()
                .filter(|(i, c)| !done.contains_key(&(i.display_name().to_string(), c.id.clone())))
                .filter(|(i, c)| seen.insert((i.display_name().to_string(), c.id.clone())))
                .copied()
                .collect()
        };
        if todo.is_empty() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.cache_dir)
            .with_context(|| format!("cannot create artifact cache {}", self.cache_dir.display()))?;
        let requests: Vec<_> = todo.iter().map(|(o, c)| (o.id.as_str(), &o.options, *c)).collect();
        let results = export_batch(&self.python, &self.cache_dir, &self.platform, &requests)?;
        let mut done = self.done.lock().unwrap();
        for ((i, c), r) in todo.iter().zip(results) {
            done.insert((i.display_name().to_string(), c.id.clone()), r);
        }
        Ok(())
    }

    /// The exporter's answer for one (implementation, case), exporting it if needed.
    pub fn get(&self, imp: &ImplConfig, case: &Case) -> Result<Exported> {
        self.ensure(&[(imp, case)])?;
        self.done
            .lock()
            .unwrap()
            .get(&(imp.display_name().to_string(), case.id.clone()))
            .cloned()
            .ok_or_else(|| anyhow!("exporter gave no answer for {} on {}", imp.display_name(), case.id))
    }

    /// Checks configured implementations with the exporter's registry (ids, option names,
    /// option values) without exporting; `Err` lists each bad entry as
    /// "implementation `name`: why". Answers are cached on disk by the Python, the entries
    /// and the package sources, so a run pays the jax import once.
    pub fn check_config(&self, impls: &[ImplConfig]) -> Result<()> {
        if impls.is_empty() {
            return Ok(());
        }
        let entries: Vec<serde_json::Value> = impls
            .iter()
            .map(|i| serde_json::json!({"name": i.display_name(), "impl": i.id, "impl_options": i.options}))
            .collect();
        let body = serde_json::to_string(&entries)?;
        let mut key_src = format!("{}\n{body}\n", self.python.display());
        let pkg = crate::repo_root().join("backends/jax/grpo_jax");
        let mut files = Vec::new();
        let mut stack = vec![pkg];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "py") {
                    files.push(p);
                }
            }
        }
        files.sort();
        for f in &files {
            key_src.push_str(&std::fs::read_to_string(f).unwrap_or_default());
        }
        let key = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(key_src.as_bytes()));
        let cached = self.cache_dir.join(format!("config-check-{key}.json"));
        let answer = match std::fs::read_to_string(&cached) {
            Ok(t) => t,
            Err(_) => {
                let mut child = Command::new(&self.python)
                    .args(["-m", "grpo_jax.export", "--check-config"])
                    .env("JAX_PLATFORMS", "cpu")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .with_context(|| format!("cannot start the exporter {}", self.python.display()))?;
                child.stdin.take().context("exporter stdin")?.write_all(body.as_bytes())?;
                let out = child.wait_with_output()?;
                if !out.status.success() {
                    bail!(
                        "the exporter could not check the configuration: {}",
                        String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("(no message)")
                    );
                }
                let t = String::from_utf8(out.stdout).context("exporter output is not UTF-8")?;
                std::fs::create_dir_all(&self.cache_dir).ok();
                std::fs::write(&cached, &t).ok();
                t
            }
        };
        #[derive(Deserialize)]
        struct Answer {
            name: String,
            ok: bool,
            error: Option<String>,
        }
        let answers: Vec<Answer> = serde_json::from_str(answer.trim()).context("unreadable --check-config answer")?;
        let bad: Vec<String> = answers
            .into_iter()
            .filter(|a| !a.ok)
            .map(|a| format!("implementation `{}`: {}", a.name, a.error.unwrap_or_default()))
            .collect();
        if bad.is_empty() {
            Ok(())
        } else {
            bail!("{}", bad.join("; "))
        }
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
        let w: Vec<(&ImplConfig, &Case)> = work.iter().filter_map(|(n, c)| find(impls, n).map(|o| (o, *c))).collect();
        self.ensure(&w)
    }

    /// How many modules this exporter has answered for (what a filtered run exported).
    pub fn count(&self) -> usize {
        self.done.lock().unwrap().len()
    }
}
