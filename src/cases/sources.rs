//! Where a run's cases and their golden files come from: the suite's own `cases/` and
//! `golden/`, plus users' case directories (`--cases DIR`, added to the suite's matrix or,
//! with `--replace-cases`, instead of it) whose golden files live in a directory of the
//! user's (`--golden-dir`, default `DIR/golden`), never in this checkout.

use super::{load_dirs, Case, Matrix};
use anyhow::{bail, Result};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The case directories of a run, as the command line gave them.
#[derive(Debug, Clone)]
pub struct CaseSources {
    /// The suite's own case directory (`cases/` of this checkout).
    pub suite_dir: PathBuf,
    /// Users' case directories (`--cases`, in order).
    pub user_dirs: Vec<PathBuf>,
    /// Leave the suite's own cases out (`--replace-cases`).
    pub replace: bool,
    /// Where users' cases keep their golden files (`--golden-dir`).
    pub user_golden_dir: Option<PathBuf>,
}

/// Which golden directory each case's golden file is in.
#[derive(Debug, Clone)]
pub struct GoldenDirs {
    /// The suite's golden directory (`golden/` of this checkout).
    pub suite: PathBuf,
    /// The users' golden directory.
    pub user: PathBuf,
    /// Ids of the cases that only users' directories define.
    pub user_ids: BTreeSet<String>,
}

impl GoldenDirs {
    /// The suite's golden directory for every case.
    pub fn suite_only(suite: PathBuf) -> GoldenDirs {
        GoldenDirs {
            user: suite.clone(),
            suite,
            user_ids: BTreeSet::new(),
        }
    }

    /// Whether `case` is a user's case (defined by no case file of the suite).
    pub fn is_user(&self, case: &Case) -> bool {
        self.user_ids.contains(&case.id)
    }

    /// The directory holding `case`'s golden file.
    pub fn dir_for(&self, case: &Case) -> &Path {
        if self.is_user(case) {
            &self.user
        } else {
            &self.suite
        }
    }
}

impl CaseSources {
    /// The suite's cases alone (no `--cases`).
    pub fn suite(suite_dir: PathBuf) -> CaseSources {
        CaseSources {
            suite_dir,
            user_dirs: Vec::new(),
            replace: false,
            user_golden_dir: None,
        }
    }

    /// Loads the matrix and decides the golden directories. A user's case that the suite
    /// also defines (same id: same data and knobs) is the suite's, golden file included.
    pub fn load(&self, suite_golden: PathBuf) -> Result<(Matrix, GoldenDirs)> {
        if self.replace && self.user_dirs.is_empty() {
            bail!("--replace-cases needs at least one --cases DIR");
        }
        if self.user_dirs.is_empty() {
            if self.user_golden_dir.is_some() {
                bail!("--golden-dir is where the cases of --cases DIR keep their golden files; give --cases DIR too");
            }
            let matrix = load_dirs(&[&self.suite_dir])?;
            return Ok((matrix, GoldenDirs::suite_only(suite_golden)));
        }
        let users: Vec<&Path> = self.user_dirs.iter().map(PathBuf::as_path).collect();
        let user_matrix = load_dirs(&users)?;
        let suite_matrix = load_dirs(&[&self.suite_dir])?;
        let suite_ids: BTreeSet<&str> = suite_matrix.cases.iter().map(|c| c.id.as_str()).collect();
        let user_ids = user_matrix
            .cases
            .iter()
            .filter(|c| !suite_ids.contains(c.id.as_str()))
            .map(|c| c.id.clone())
            .collect();
        let user = self
            .user_golden_dir
            .clone()
            .unwrap_or_else(|| self.user_dirs[0].join("golden"));
        let dirs = GoldenDirs {
            suite: suite_golden,
            user,
            user_ids,
        };
        let matrix = if self.replace {
            user_matrix
        } else {
            suite_matrix.merged(user_matrix)?
        };
        Ok((matrix, dirs))
    }

    /// The global arguments that give a child `grpo-suite` process the same cases.
    pub fn args(&self) -> Vec<OsString> {
        let mut out = Vec::new();
        for d in &self.user_dirs {
            out.push("--cases".into());
            out.push(d.clone().into_os_string());
        }
        if self.replace {
            out.push("--replace-cases".into());
        }
        if let Some(g) = &self.user_golden_dir {
            out.push("--golden-dir".into());
            out.push(g.clone().into_os_string());
        }
        out
    }
}
