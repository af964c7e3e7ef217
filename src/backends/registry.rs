//! Backend kinds, registered rather than enumerated: each kind names its section under
//! `backends:`, parses it into its own settings type and, from those settings, names its
//! backends, lists their implementations and opens them (the availability probe). The
//! configuration keeps `backends:` as named sections and knows no kind's settings; a new
//! kind is one file (its settings, [`Section`] and [`super::Backend`]) and one line in
//! [`builtin`] (or a [`register`] call, as a test does).

use super::{Backend, Unavailable};
use crate::config::entry::{enabled, resolve_entry_paths, ImplConfig, ImplEntry};
use anyhow::Result;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};

/// One kind of backend: its section name and how its settings are parsed.
#[derive(Clone, Copy)]
pub struct BackendKind {
    /// The section's name under `backends:` (`pjrt-cpu`, `tpu-aot`).
    pub section: &'static str,
    /// Parses the section's YAML into the kind's own settings (serde; the error names the
    /// field).
    pub parse: fn(serde_yaml_ng::Value) -> Result<Box<dyn Section>, serde_yaml_ng::Error>,
}

impl BackendKind {
    /// The kind of section `section` whose settings are `T`.
    pub const fn of<T: Section + DeserializeOwned>(section: &'static str) -> BackendKind {
        BackendKind {
            section,
            parse: parse_as::<T>,
        }
    }
}

/// Parses a section as `T`.
fn parse_as<T: Section + DeserializeOwned>(
    v: serde_yaml_ng::Value,
) -> Result<Box<dyn Section>, serde_yaml_ng::Error> {
    Ok(Box::new(serde_yaml_ng::from_value::<T>(v)?))
}

/// A kind's parsed settings: what the configuration and the trial list ask of them.
pub trait Section: std::fmt::Debug + Send + Sync + 'static {
    /// Checks the settings (`section` is the key it was read under); the error names the
    /// file, the backend and what is wrong.
    fn validate(&self, origin: &str, section: &str) -> Result<()>;

    /// The backends these settings configure (default: one, named as the section; one
    /// per topology for `tpu-aot`).
    fn backend_names(&self, section: &str) -> Vec<String> {
        vec![section.to_string()]
    }

    /// The implementation entries, in config order.
    fn entries(&self) -> &[ImplEntry];

    /// The implementation entries, to resolve their paths.
    fn entries_mut(&mut self) -> &mut Vec<ImplEntry>;

    /// The enabled implementations that run on `backend` (one of
    /// [`Section::backend_names`]).
    fn implementations_on(&self, _backend: &str) -> Vec<ImplConfig> {
        enabled(self.entries())
    }

    /// Whether the entries are exported by `grpo_jax` (an interpreter runs them).
    fn exports(&self) -> bool {
        true
    }

    /// The configured plugin, if the kind has one.
    fn plugin_mut(&mut self) -> Option<&mut Option<PathBuf>> {
        None
    }

    /// The configured plugin path, if any.
    fn plugin(&self) -> Option<&Path> {
        None
    }

    /// Opens the backends (the availability probe): each one available here is pushed on
    /// `ok`, each one that is not on `missing` with why.
    fn open(&self, section: &str, ok: &mut Vec<Arc<dyn Backend>>, missing: &mut Vec<Unavailable>);

    /// A copy.
    fn clone_box(&self) -> Box<dyn Section>;

    /// For typed access ([`BackendsConfig::get`]).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The kinds this build knows, one line each.
fn builtin() -> Vec<BackendKind> {
    vec![
        BackendKind::of::<super::ReferenceConfig>("reference"),
        BackendKind::of::<super::pjrt::PjrtCpuConfig>("pjrt-cpu"),
        BackendKind::of::<super::pjrt::PjrtGpuConfig>("pjrt-gpu"),
        BackendKind::of::<super::pjrt::TpuAotConfig>("tpu-aot"),
        BackendKind::of::<super::pjrt::PjrtTpuConfig>("pjrt-tpu"),
        BackendKind::of::<super::torch::TorchConfig>("torch"),
    ]
}

fn registry() -> &'static RwLock<Vec<BackendKind>> {
    static R: OnceLock<RwLock<Vec<BackendKind>>> = OnceLock::new();
    R.get_or_init(|| RwLock::new(builtin()))
}

/// Registers another kind (a test's, a user's build). A section name already registered
/// is an error.
pub fn register(kind: BackendKind) -> Result<()> {
    let mut r = registry().write().unwrap();
    if r.iter().any(|k| k.section == kind.section) {
        anyhow::bail!("backend kind `{}` is already registered", kind.section);
    }
    r.push(kind);
    Ok(())
}

/// The registered kind of section `name`.
pub fn kind(name: &str) -> Option<BackendKind> {
    registry()
        .read()
        .unwrap()
        .iter()
        .find(|k| k.section == name)
        .copied()
}

/// Every registered section name, in registration order.
pub fn sections() -> Vec<&'static str> {
    registry()
        .read()
        .unwrap()
        .iter()
        .map(|k| k.section)
        .collect()
}

/// Each backend section of a configuration, by name, in config order.
#[derive(Debug, Default)]
pub struct BackendsConfig {
    sections: Vec<(String, Box<dyn Section>)>,
}

impl Clone for BackendsConfig {
    fn clone(&self) -> Self {
        BackendsConfig {
            sections: self
                .sections
                .iter()
                .map(|(k, s)| (k.clone(), s.clone_box()))
                .collect(),
        }
    }
}

/// The `backends:` mapping as read, each section's YAML not yet parsed by its kind
/// ([`BackendsConfig::parse`] does that, naming the file and line of a bad section).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(transparent)]
pub struct RawBackends(serde_yaml_ng::Mapping);

/// The line (1-based) of section `name` under the top-level `backends:` of `text`, when
/// written in block style.
fn section_line(text: &str, name: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| l.starts_with("backends:"))?;
    lines[start + 1..]
        .iter()
        .take_while(|l| l.is_empty() || l.starts_with(' ') || l.starts_with('#'))
        .position(|l| {
            let t = l.trim_start();
            t.strip_prefix(name)
                .or_else(|| t.strip_prefix(&format!("\"{name}\"")))
                .is_some_and(|r| r.trim_start().starts_with(':'))
        })
        .map(|k| start + 1 + k + 1)
}

impl BackendsConfig {
    /// Parses each section of `raw` by its registered kind; `text` (the file's) gives the
    /// line of a bad one. An unknown section name is an error listing the known ones.
    pub fn parse(raw: RawBackends, origin: &str, text: &str) -> Result<BackendsConfig> {
        let mut sections: Vec<(String, Box<dyn Section>)> = Vec::new();
        for (k, v) in raw.0 {
            let Some(name) = k.as_str().map(str::to_string) else {
                anyhow::bail!("{origin}: backends: a backend's name must be a string");
            };
            let at = section_line(text, &name)
                .map(|l| format!(" (line {l})"))
                .unwrap_or_default();
            let Some(kind) = kind(&name) else {
                anyhow::bail!(
                    "{origin}: backends: unknown backend `{name}`{at}, expected one of {}",
                    self::sections()
                        .iter()
                        .map(|s| format!("`{s}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            };
            let s = (kind.parse)(v)
                .map_err(|e| anyhow::anyhow!("{origin}: backends.{name}{at}: {e}"))?;
            sections.push((name, s));
        }
        Ok(BackendsConfig { sections })
    }

    /// A configuration of these sections (tests, programs that build one).
    pub fn from_sections(sections: Vec<(String, Box<dyn Section>)>) -> BackendsConfig {
        BackendsConfig { sections }
    }

    /// The sections, by name, in config order.
    pub fn sections(&self) -> impl Iterator<Item = (&str, &dyn Section)> {
        self.sections.iter().map(|(k, s)| (k.as_str(), s.as_ref()))
    }

    /// The settings of section `name`, as its kind's type `T`.
    pub fn get<T: 'static>(&self, name: &str) -> Option<&T> {
        self.sections
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, s)| s.as_any().downcast_ref::<T>())
    }

    /// Whether section `name` is configured.
    pub fn has(&self, name: &str) -> bool {
        self.sections.iter().any(|(k, _)| k == name)
    }

    /// Puts `other`'s sections over these: each section `other` configures replaces this
    /// one's of the same name whole (a configuration that `extends` another).
    pub fn overlay(&mut self, other: BackendsConfig) {
        for (k, s) in other.sections {
            match self.sections.iter_mut().find(|(n, _)| *n == k) {
                Some(slot) => slot.1 = s,
                None => self.sections.push((k, s)),
            }
        }
    }

    /// Keeps the sections that name a backend `keep` holds (tpu-aot: any of its
    /// topologies' backends).
    pub fn retain_backends(&mut self, keep: &[String]) {
        self.sections
            .retain(|(k, s)| s.backend_names(k).iter().any(|n| keep.contains(n)));
    }

    /// Calls `f` on every implementation entry of every section.
    pub fn for_each_entry(&mut self, mut f: impl FnMut(&mut ImplEntry)) {
        for (_, s) in &mut self.sections {
            s.entries_mut().iter_mut().for_each(&mut f);
        }
    }

    /// Checks every section's settings.
    pub fn validate(&self, origin: &str) -> Result<()> {
        for (k, s) in &self.sections {
            // A section that lists nothing checks nothing: a configuration says so.
            if s.entries().is_empty() {
                anyhow::bail!("{origin}: backend `{k}` lists no implementation (`implementations: []`): name some, or leave the backend out");
            }
            s.validate(origin, k)?;
        }
        Ok(())
    }

    /// Makes implementation entries' `python` / `pythonpath` and the sections' `plugin`
    /// absolute against `base` (the config file's directory).
    pub fn resolve_paths(&mut self, base: &Path) {
        for (_, s) in &mut self.sections {
            resolve_entry_paths(s.entries_mut(), base);
            if let Some(q) = s.plugin_mut().and_then(|p| p.as_mut()) {
                if q.is_relative() {
                    *q = base.join(&*q);
                }
            }
        }
    }

    /// Checks that every path the configuration names exists: a section's `plugin` is a
    /// file, an implementation's `python` is a file and its `pythonpath` entries are
    /// directories. (Only an unnamed, default plugin may be missing: that backend is then
    /// unavailable.)
    pub fn check_paths(&self, origin: &str) -> Result<()> {
        for (b, s) in &self.sections {
            if let Some(p) = s.plugin() {
                if p.is_dir() {
                    anyhow::bail!(
                        "{origin}: backend `{b}`: plugin {} is a directory, not a shared library",
                        p.display()
                    );
                }
                if !p.is_file() {
                    anyhow::bail!(
                        "{origin}: backend `{b}`: plugin {} does not exist",
                        p.display()
                    );
                }
            }
        }
        // Every section's entries: an exporting kind's and one that runs its own worker
        // (torch) alike.
        for (b, list) in self.sections.iter().map(|(k, s)| (k.as_str(), s.entries())) {
            for imp in enabled(list) {
                let n = imp.display_name();
                if let Some(py) = &imp.python {
                    if !py.is_file() {
                        anyhow::bail!("{origin}: backend `{b}`, implementation `{n}`: python {} is not a file", py.display());
                    }
                }
                for d in &imp.pythonpath {
                    if d.as_os_str().as_encoded_bytes().contains(&b':') {
                        anyhow::bail!("{origin}: backend `{b}`, implementation `{n}`: pythonpath entry {} holds `:`, PYTHONPATH's separator (link the directory from a path without one)", d.display());
                    }
                    if !d.is_dir() {
                        anyhow::bail!("{origin}: backend `{b}`, implementation `{n}`: pythonpath entry {} is not a directory", d.display());
                    }
                }
            }
        }
        Ok(())
    }

    /// The implementation lists of the exporting sections, by section name, in config
    /// order.
    pub fn exported_lists(&self) -> Vec<(&str, &[ImplEntry])> {
        self.sections
            .iter()
            .filter(|(_, s)| s.exports())
            .map(|(k, s)| (k.as_str(), s.entries()))
            .collect()
    }

    /// The enabled implementation entries of the exporting sections, in config order.
    pub fn exported_implementations(&self) -> Vec<ImplConfig> {
        self.exported_lists()
            .into_iter()
            .flat_map(|(_, l)| enabled(l))
            .collect()
    }

    /// Names of the backends this configuration selects, in config order.
    pub fn names(&self) -> Vec<String> {
        self.sections
            .iter()
            .flat_map(|(k, s)| s.backend_names(k))
            .collect()
    }

    /// The one answer to "which implementations run on backend `backend`": the enabled
    /// entries of the section that names it, that run there.
    pub fn implementations_on(&self, backend: &str) -> Vec<ImplConfig> {
        self.sections
            .iter()
            .find(|(k, s)| s.backend_names(k).iter().any(|n| n == backend))
            .map(|(_, s)| s.implementations_on(backend))
            .unwrap_or_default()
    }

    /// Opens every configured backend: those available here, and why each other is not.
    pub fn open(&self) -> (Vec<Arc<dyn Backend>>, Vec<Unavailable>) {
        let mut ok = Vec::new();
        let mut missing = Vec::new();
        for (k, s) in &self.sections {
            s.open(k, &mut ok, &mut missing);
        }
        (ok, missing)
    }
}
