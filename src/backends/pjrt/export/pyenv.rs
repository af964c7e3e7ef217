//! Where an exporter runs (the interpreter and its `PYTHONPATH`) and the probe that checks
//! the interpreter has this checkout's `grpo_jax` speaking this suite's protocol.

use super::protocol::PROTOCOL;
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

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
    pub(super) fn exporter(&self, mode: &[&str]) -> Command {
        let mut c = self.command();
        c.args(["-m", "grpo_jax.export", "--protocol", &PROTOCOL.to_string()])
            .args(mode);
        c
    }

    /// A command running this interpreter with the extra import directories.
    pub(super) fn command(&self) -> Command {
        let mut c = Command::new(&self.python);
        if let Some(pp) = self.child_pythonpath(std::env::var_os("PYTHONPATH")) {
            c.env("PYTHONPATH", pp);
            let own = self.child_pythonpath(None).unwrap_or_default();
            c.env(crate::env::ENTRY_PYTHONPATH, own);
        } else {
            c.env_remove(crate::env::ENTRY_PYTHONPATH);
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
    pub(super) fn child_pythonpath(
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

    /// The interpreter, and the pythonpath if any, as messages name this environment.
    pub(super) fn describe(&self) -> String {
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

/// Checks once per environment that the interpreter runs, finds the `grpo_jax` package
/// and speaks this suite's protocol (cheap: no jax import), so a wrong `python` is one
/// line naming it, not a traceback per batch.
pub(super) fn check_python(env: &PyEnv) -> Result<()> {
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
