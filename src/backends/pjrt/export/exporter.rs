//! A backend's exporter: its Python and cache, the exports it runs, and its answers per
//! configured implementation and case.

use super::batch::{export_batch, Exported, Platform};
use super::manifest::{ImplInfo, Manifest};
use super::process::exporter_failure;
use super::pyenv::{check_python, PyEnv};
use crate::backends::Refusal;
use crate::cases::Case;
use crate::config::entry::ImplConfig;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;

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
) -> Result<&'a ImplConfig, Refusal> {
    find(impls, name).ok_or_else(|| {
        Refusal::Unsupported(format!(
            "{backend} has no implementation `{name}` configured"
        ))
    })
}

/// The display names of a backend's entries, in config order.
pub fn names(impls: &[ImplConfig]) -> Vec<String> {
    impls.iter().map(|c| c.display_name().to_string()).collect()
}

/// The exporter of one backend: which Python, which cache, which platform, and what it
/// has answered so far (per entry and case id). Only work a trial will
/// run is ever sent to it.
pub struct Exporter {
    /// The suite's Python environment (entries without their own).
    pub(super) default_env: PyEnv,
    /// The artifact cache the exporter writes to.
    pub(super) cache_dir: PathBuf,
    /// The platform it exports for.
    platform: Platform,
    /// Its answers so far, per entry ([`done_key`]) and case id.
    done: Mutex<HashMap<(String, String), Exported>>,
    /// Implementations (by name) whose module hung in the configuration check: why. Never
    /// exported (they would only hang again); their trials are errors.
    pub(super) broken: Mutex<HashMap<String, String>>,
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
    /// The exporter for `platform` (`cpu` or `tpu`; on `cpu`, emulating `emulates`):
    /// `GRPO_PYTHON` or the venv's Python, `GRPO_ARTIFACTS` or `target/grpo-artifacts`.
    /// Errors say what is missing.
    pub fn new(
        platform: &str,
        emulates: Option<crate::backends::pjrt::Emulates>,
    ) -> Result<Exporter> {
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
            platform: Platform {
                name: platform.into(),
                emulates,
            },
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

    /// The exporter's support answer: `Err` when the implementation declares the case
    /// unsupported, or of a level it does not have (not applicable). Export failures are
    /// trial errors (in `run`), never silent skips.
    pub fn support(&self, imp: &ImplConfig, case: &Case) -> Result<(), Refusal> {
        match self.get(imp, case) {
            Ok(Exported::Unsupported(reason)) => Err(Refusal::Unsupported(reason)),
            Ok(Exported::NotApplicable(reason)) => Err(Refusal::NotApplicable(reason)),
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
