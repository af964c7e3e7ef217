//! What makes two runs' records comparable line for line: the suite, the configuration,
//! the tolerance scale, XLA:CPU's compile settings, the oracle and input-generator
//! versions, and each implementation's code. Every record line of `grpo-suite run` carries it, and
//! `--resume` refuses a records file written under a different identity (a resumed run
//! would otherwise mix verdicts of two different experiments and report them as one).

use crate::config::{Config, ImplConfig};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The identity of one run; per-trial fields are looked up by implementation name.
#[derive(Debug, Clone, PartialEq)]
pub struct RunIdentity {
    /// The suite selected.
    pub suite: String,
    /// xxh3 of the configuration file's bytes (with its base's, for one that `extends` another).
    pub config_digest: String,
    /// `GRPO_TOL_SCALE` in force.
    pub tol_scale: f64,
    /// XLA:CPU's compile settings ([`crate::env::xla_cpu_settings`]).
    pub xla_cpu: String,
    /// The oracle's version.
    pub oracle_version: u32,
    /// The input generator's version.
    pub generator_version: u32,
    /// Implementation name (as in trial names) → digest of the code that exports it: the
    /// `grpo_jax` package's sources and, for a `module:attribute` entry, the `.py` files
    /// under its `pythonpath`.
    pub code: BTreeMap<String, String>,
}

/// The identity fields of one record line, as read back.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
pub struct RecordedIdentity {
    /// Trial name.
    pub name: String,
    /// Suite.
    #[serde(default)]
    pub suite: Option<String>,
    /// Configuration digest (absent in records of older suites).
    #[serde(default)]
    pub config_digest: Option<String>,
    /// Tolerance scale.
    #[serde(default)]
    pub tol_scale: Option<f64>,
    /// XLA:CPU's compile settings (absent in records of older suites).
    #[serde(default)]
    pub xla_cpu: Option<String>,
    /// Oracle version.
    #[serde(default)]
    pub oracle_version: Option<u32>,
    /// Generator version.
    #[serde(default)]
    pub generator_version: Option<u32>,
    /// The implementation's code digest (exported implementations only).
    #[serde(default)]
    pub code_digest: Option<String>,
    /// Implementation name.
    #[serde(default)]
    pub implementation: Option<String>,
    /// The trial's kind (`sweep` rows come from `grpo-suite sweep`, not `run`).
    #[serde(default)]
    pub kind: Option<crate::outcome::TrialKind>,
}

/// Digest of every `.py` file under `dirs` (relative path and bytes, in sorted order).
pub fn python_sources_digest(dirs: &[PathBuf]) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for d in dirs {
        let mut files = Vec::new();
        let mut stack = vec![d.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let p = e.path();
                let name = e.file_name();
                let name = name.to_string_lossy();
                if p.is_dir() {
                    if !name.starts_with('.') && name != "__pycache__" {
                        stack.push(p);
                    }
                } else if name.ends_with(".py") {
                    files.push(p);
                }
            }
        }
        files.sort();
        for f in files {
            h.update(f.strip_prefix(d).unwrap_or(&f).to_string_lossy().as_bytes());
            h.update(b"\0");
            h.update(&std::fs::read(&f).unwrap_or_default());
            h.update(b"\0");
        }
    }
    format!("xxh3:{:016x}", h.digest())
}

/// The digest of the code behind one exported implementation entry.
fn code_digest(imp: &ImplConfig, package: &str) -> String {
    if imp.is_external() {
        let mut dirs = imp.pythonpath.clone();
        dirs.sort();
        let own = python_sources_digest(&dirs);
        let python = imp
            .python
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let h = xxhash_rust::xxh3::xxh3_64(format!("{package}\n{own}\n{python}").as_bytes());
        format!("xxh3:{h:016x}")
    } else {
        package.to_string()
    }
}

impl RunIdentity {
    /// The identity of a run of `suite` under the configuration read from `config_path`.
    /// A configuration that extends another is digested with every file it was read from,
    /// so an edit of its base changes the identity too.
    pub fn of(suite: &str, config_path: &Path, config: &Config) -> Result<RunIdentity> {
        let read = |p: &Path| {
            std::fs::read(p).with_context(|| format!("cannot read config {}", p.display()))
        };
        let bytes = if config.sources.len() > 1 {
            let mut all = Vec::new();
            for p in &config.sources {
                let b = read(p)?;
                all.extend_from_slice(&(b.len() as u64).to_le_bytes());
                all.extend_from_slice(&b);
            }
            all
        } else {
            read(config_path)?
        };
        let package = python_sources_digest(&[crate::repo_root().join("backends/jax/grpo_jax")]);
        let mut code = BTreeMap::new();
        for imp in config.backends.exported_implementations() {
            let d = code_digest(&imp, &package);
            // One name on two backends with different code: both count.
            code.entry(imp.display_name().to_string())
                .and_modify(|old: &mut String| {
                    if *old != d {
                        *old = format!("{old}+{d}");
                    }
                })
                .or_insert(d);
        }
        Ok(RunIdentity {
            suite: suite.to_string(),
            config_digest: format!("xxh3:{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes)),
            tol_scale: crate::gates::tiers::scale(),
            xla_cpu: crate::env::xla_cpu_settings()?,
            oracle_version: crate::oracle::ORACLE_VERSION,
            generator_version: crate::inputs::GENERATOR_VERSION,
            code,
        })
    }

    /// Checks that the record line `line` (1-based) of `path` was written under this
    /// identity; the error names the first field that differs and both values.
    pub fn check(&self, path: &Path, line: usize, r: &RecordedIdentity) -> Result<()> {
        let at = format!("{}:{line} ({})", path.display(), r.name);
        if r.kind == Some(crate::outcome::TrialKind::Sweep) {
            bail!("cannot resume from {at}: it is a row of `grpo-suite sweep`, and `run --resume` resumes a run's records; give `run` its own records file");
        }
        let Some(config_digest) = &r.config_digest else {
            bail!("cannot resume from {at}: the record has no run identity (written by an older grpo-suite); start a new records file");
        };
        let differs = |field: &str, was: String, now: String| -> Result<()> {
            if was != now {
                bail!("cannot resume from {at}: {field} differs (records: {was}; this run: {now}); resume with the same suite, configuration, GRPO_TOL_SCALE, XLA:CPU settings and code, or start a new records file");
            }
            Ok(())
        };
        let show = |o: Option<String>| o.unwrap_or_else(|| "none".into());
        differs("suite", show(r.suite.clone()), self.suite.clone())?;
        differs(
            "config digest",
            config_digest.clone(),
            self.config_digest.clone(),
        )?;
        differs(
            "tolerance scale (GRPO_TOL_SCALE)",
            show(r.tol_scale.map(|x| x.to_string())),
            self.tol_scale.to_string(),
        )?;
        differs(
            "XLA:CPU compile settings (GRPO_XLA_CPU_OPT_LEVEL, GRPO_XLA_CPU_FUSION_EMITTERS)",
            show(r.xla_cpu.clone()),
            self.xla_cpu.clone(),
        )?;
        differs(
            "oracle version",
            show(r.oracle_version.map(|x| x.to_string())),
            self.oracle_version.to_string(),
        )?;
        differs(
            "generator version",
            show(r.generator_version.map(|x| x.to_string())),
            self.generator_version.to_string(),
        )?;
        let now = r
            .implementation
            .as_ref()
            .and_then(|i| self.code.get(i).cloned());
        if let (Some(imp), Some(now)) = (&r.implementation, now) {
            differs(
                &format!("the code of implementation {imp}"),
                show(r.code_digest.clone()),
                now,
            )?;
        }
        Ok(())
    }

    /// The code digest recorded with a trial of `implementation`.
    pub fn code_of(&self, implementation: &str) -> Option<&str> {
        self.code.get(implementation).map(String::as_str)
    }
}

/// Reads the identity fields of every complete line of a record file.
pub fn read(path: &Path) -> Result<Vec<(usize, RecordedIdentity)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read record file {}", path.display()))?;
    Ok(text
        .lines()
        .enumerate()
        .filter_map(|(k, l)| {
            serde_json::from_str::<RecordedIdentity>(l)
                .ok()
                .map(|r| (k + 1, r))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> RunIdentity {
        RunIdentity {
            suite: "ci".into(),
            config_digest: "xxh3:1".into(),
            tol_scale: 1.0,
            xla_cpu: "opt_level=0 fusion_emitters=0".into(),
            oracle_version: 2,
            generator_version: 3,
            code: [("jax_baseline".to_string(), "xxh3:a".to_string())].into(),
        }
    }

    fn recorded(id: &RunIdentity) -> RecordedIdentity {
        RecordedIdentity {
            name: "pjrt-cpu/jax_baseline/x".into(),
            suite: Some(id.suite.clone()),
            config_digest: Some(id.config_digest.clone()),
            tol_scale: Some(id.tol_scale),
            xla_cpu: Some(id.xla_cpu.clone()),
            oracle_version: Some(id.oracle_version),
            generator_version: Some(id.generator_version),
            code_digest: id.code_of("jax_baseline").map(String::from),
            implementation: Some("jax_baseline".into()),
            kind: Some(crate::outcome::TrialKind::Run),
        }
    }

    #[test]
    fn a_sweeps_row_is_refused_as_a_sweeps_not_as_an_older_suites() {
        let id = identity();
        let mut r = recorded(&id);
        r.kind = Some(crate::outcome::TrialKind::Sweep);
        r.config_digest = None; // sweep rows carry no run identity
        let e = id
            .check(Path::new("s.jsonl"), 1, &r)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a row of `grpo-suite sweep`") && !e.contains("older"),
            "{e}"
        );
    }

    #[test]
    fn every_field_that_differs_is_named() {
        let id = identity();
        let p = Path::new("r.jsonl");
        id.check(p, 1, &recorded(&id)).unwrap();
        let cases: Vec<(&str, Box<dyn Fn(&mut RecordedIdentity)>)> = vec![
            (
                "suite differs",
                Box::new(|r| r.suite = Some("smoke".into())),
            ),
            (
                "config digest differs",
                Box::new(|r| r.config_digest = Some("xxh3:2".into())),
            ),
            (
                "tolerance scale (GRPO_TOL_SCALE) differs (records: 2;",
                Box::new(|r| r.tol_scale = Some(2.0)),
            ),
            (
                "XLA:CPU compile settings (GRPO_XLA_CPU_OPT_LEVEL, GRPO_XLA_CPU_FUSION_EMITTERS) differs (records: opt_level=default fusion_emitters=0;",
                Box::new(|r| r.xla_cpu = Some("opt_level=default fusion_emitters=0".into())),
            ),
            (
                "XLA:CPU compile settings (GRPO_XLA_CPU_OPT_LEVEL, GRPO_XLA_CPU_FUSION_EMITTERS) differs (records: none;",
                Box::new(|r| r.xla_cpu = None),
            ),
            (
                "oracle version differs",
                Box::new(|r| r.oracle_version = Some(1)),
            ),
            (
                "generator version differs",
                Box::new(|r| r.generator_version = Some(2)),
            ),
            (
                "the code of implementation jax_baseline differs",
                Box::new(|r| r.code_digest = Some("xxh3:b".into())),
            ),
            ("no run identity", Box::new(|r| r.config_digest = None)),
        ];
        for (want, change) in cases {
            let mut r = recorded(&id);
            change(&mut r);
            let e = id.check(p, 7, &r).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("r.jsonl:7"), "{want}: {e}");
        }
    }

    #[test]
    fn a_changed_source_file_changes_the_digest() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("pkg")).unwrap();
        std::fs::write(d.path().join("pkg/k.py"), "x = 1\n").unwrap();
        let dirs = [d.path().to_path_buf()];
        let a = python_sources_digest(&dirs);
        std::fs::write(d.path().join("pkg/k.py"), "x = 2\n").unwrap();
        assert_ne!(a, python_sources_digest(&dirs));
    }

    /// An external entry's code digest changes with its interpreter, its `pythonpath` and
    /// any source file there, so a resume never reuses verdicts of other code; a suite
    /// implementation's is the package's alone.
    #[test]
    fn an_external_entrys_digest_follows_its_python_pythonpath_and_sources() {
        let d = tempfile::tempdir().unwrap();
        let (a_dir, b_dir) = (d.path().join("a"), d.path().join("b"));
        for dir in [&a_dir, &b_dir] {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join("k.py"), "x = 1\n").unwrap();
        }
        std::fs::write(b_dir.join("k.py"), "x = 2\n").unwrap();
        let entry = |python: Option<&str>, dir: &std::path::Path| {
            let mut c = crate::config::ImplEntry::Id("k:IMPL".into()).resolved();
            c.python = python.map(PathBuf::from);
            c.pythonpath = vec![dir.to_path_buf()];
            c
        };
        let base = code_digest(&entry(None, &a_dir), "pkg");
        assert_ne!(
            base,
            code_digest(&entry(Some("/opt/venv/bin/python"), &a_dir), "pkg")
        );
        assert_ne!(base, code_digest(&entry(None, &b_dir), "pkg"));
        assert_ne!(base, code_digest(&entry(None, &a_dir), "pkg2"));
        std::fs::write(a_dir.join("k.py"), "x = 3\n").unwrap();
        assert_ne!(base, code_digest(&entry(None, &a_dir), "pkg"));
        let suite_impl = crate::config::ImplEntry::Id("jax_baseline".into()).resolved();
        assert_eq!(code_digest(&suite_impl, "pkg"), "pkg");
    }

    #[test]
    fn hidden_and_pycache_directories_are_not_sources() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("pkg")).unwrap();
        std::fs::write(d.path().join("pkg/k.py"), "x = 1\n").unwrap();
        let dirs = [d.path().to_path_buf()];
        let a = python_sources_digest(&dirs);
        for skipped in ["pkg/__pycache__", ".hidden"] {
            std::fs::create_dir_all(d.path().join(skipped)).unwrap();
            std::fs::write(d.path().join(skipped).join("y.py"), "y = 1\n").unwrap();
            assert_eq!(a, python_sources_digest(&dirs), "{skipped}");
        }
        std::fs::create_dir_all(d.path().join("pkg/sub")).unwrap();
        std::fs::write(d.path().join("pkg/sub/z.py"), "z = 1\n").unwrap();
        assert_ne!(a, python_sources_digest(&dirs), "a subpackage is a source");
    }

    #[test]
    fn one_name_on_two_backends_with_other_code_keeps_both_digests() {
        let d = tempfile::tempdir().unwrap();
        for (dir, text) in [("a", "x = 1\n"), ("b", "x = 2\n")] {
            std::fs::create_dir_all(d.path().join(dir)).unwrap();
            std::fs::write(d.path().join(dir).join("k.py"), text).unwrap();
        }
        let digests = |cpu_dir: &str, aot_dir: &str| {
            let text = format!(
                "backends:\n  pjrt-cpu:\n    implementations:\n      - {{id: 'k:IMPL', name: k, pythonpath: [{cpu_dir}]}}\n  tpu-aot:\n    topologies: [v6e:2x2]\n    implementations:\n      - {{id: 'k:IMPL', name: k, pythonpath: [{aot_dir}]}}\n"
            );
            let path = d.path().join("c.yaml");
            std::fs::write(&path, text).unwrap();
            let config = Config::load_unchecked(&path).unwrap();
            RunIdentity::of("ci", &path, &config).unwrap().code["k"].clone()
        };
        let same = digests("a", "a");
        assert!(!same.contains('+'), "{same}");
        let both = digests("a", "b");
        assert!(both.starts_with(&format!("{same}+")), "{both} after {same}");
    }

    #[test]
    fn read_gives_each_complete_line_with_its_number() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.jsonl");
        std::fs::write(
            &p,
            "{\"name\":\"a\",\"suite\":\"ci\"}\nnot json\n{\"name\":\"b\"}\n{\"name\":\"c\"",
        )
        .unwrap();
        let got: Vec<(usize, String, Option<String>)> = read(&p)
            .unwrap()
            .into_iter()
            .map(|(k, r)| (k, r.name, r.suite))
            .collect();
        assert_eq!(
            got,
            [(1, "a".into(), Some("ci".into())), (3, "b".into(), None)]
        );
        assert!(read(&d.path().join("missing.jsonl")).is_err());
    }
}
