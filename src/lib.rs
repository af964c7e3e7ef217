//! grpo-conformance: a conformance and performance suite for GRPO loss kernels.
//!
//! Layout: [`spec`] (the contract's vocabulary), [`cases`] (the YAML matrix), [`inputs`]
//! (deterministic data), [`oracle`] (f64 reference), [`gates`] (tolerances),
//! [`golden`] (stored oracle digests), [`backends`] (where implementations run),
//! [`cost`] (derived FLOPs, bytes and roofline time), [`trials`] (the one trial list
//! both front ends run), [`runner`] (one trial's
//! execution), [`judge`] (every verdict, from typed evidence), [`outcome`] (a trial's
//! result), [`records`] (JSONL results), [`env`] (every `GRPO_*`
//! variable), [`npy`] (files for Python), [`atomic_file`] (every file the suite replaces).
#![warn(missing_docs)]

pub mod atomic_file;
pub mod backends;
pub mod cases;
pub mod child_process;
pub mod compare;
pub mod config;
pub mod cost;
pub mod env;
pub mod export;
pub mod gates;
pub mod golden;
pub mod host_memory;
pub mod inputs;
pub mod judge;
pub mod listing;
pub mod merge;
pub mod npy;
pub mod oracle;
pub mod outcome;
pub mod outputs;
pub mod partition;
pub mod precision;
pub mod precision_class;
pub mod records;
pub mod report;
pub mod run_identity;
pub mod runner;
pub mod shown;
pub mod shrink;
pub mod spec;
pub mod sweep;
pub mod tally;
pub mod trajectory;
pub mod trials;

use std::path::PathBuf;

/// The repository root (where `cases/`, `golden/`, `configs/` live): `GRPO_ROOT` if set;
/// else the working directory or its nearest ancestor that holds both `cases/` and
/// `configs/` (so an installed binary works inside a checkout); else the crate directory
/// this binary was built from.
pub fn repo_root() -> PathBuf {
    if let Some(r) = std::env::var_os(env::ROOT) {
        return PathBuf::from(r);
    }
    if let Ok(cwd) = std::env::current_dir() {
        if let Some(r) = cwd
            .ancestors()
            .find(|d| d.join("cases").is_dir() && d.join("configs").is_dir())
        {
            return r.to_path_buf();
        }
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}
