//! JSONL records: one line per trial, written and flushed as soon as the trial ends, so
//! nothing is lost if a long run crashes.

use crate::run_identity::RunIdentity;
use crate::runner::TrialOutcome;
use anyhow::{Context, Result};
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// An append-only JSONL file.
pub struct RecordWriter {
    path: PathBuf,
    out: BufWriter<File>,
    identity: Option<RunIdentity>,
    xla_cpu: String,
    shard: Option<crate::partition::ShardLine>,
}

/// One line of a record file.
#[derive(Debug, Serialize)]
pub struct Record<'a> {
    /// Seconds since the Unix epoch when the trial ended.
    pub unix_time: u64,
    /// Suite the run selected.
    pub suite: &'a str,
    /// Host name, to tell machines apart.
    pub host: String,
    /// The trial.
    #[serde(flatten)]
    pub outcome: &'a TrialOutcome,
    /// Oracle version.
    pub oracle_version: u32,
    /// Input generator version.
    pub generator_version: u32,
    /// Tolerance multiplier in force (`GRPO_TOL_SCALE`; 1 = the documented gates).
    pub tol_scale: f64,
    /// XLA:CPU's compile settings of pjrt-cpu trials ([`crate::env::xla_cpu_settings`]).
    pub xla_cpu: &'a str,
    /// Digest of the configuration file (runs of `grpo-suite run`; [`RunIdentity`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_digest: Option<&'a str>,
    /// Digest of the implementation's code (exported implementations; [`RunIdentity`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code_digest: Option<&'a str>,
    /// A shard's records (`run --partition`): the plan's digest, `I/N` and what weighed
    /// the split, from the stamp beside the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<&'a crate::partition::ShardLine>,
}

/// Opens `path` for appending, creating it and its directory.
fn open_append(path: &Path) -> Result<File> {
    if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open record file {}", path.display()))
}

impl RecordWriter {
    /// Creates (or appends to) `path`, creating its directory; fails on an invalid
    /// XLA:CPU setting, which every line records. A shard's records (a stamp beside the
    /// file: [`crate::partition::ShardStamp`]) carry its plan digest and `I/N` on every
    /// line.
    pub fn open(path: &Path) -> Result<RecordWriter> {
        let xla_cpu = crate::env::xla_cpu_settings()?;
        let f = open_append(path)?;
        let stamp = crate::partition::ShardStamp::path_for(path);
        let shard = stamp
            .exists()
            .then(|| crate::partition::ShardStamp::read(path))
            .transpose()?
            .map(|s| s.line());
        Ok(RecordWriter {
            path: path.to_path_buf(),
            out: BufWriter::new(f),
            identity: None,
            xla_cpu,
            shard,
        })
    }

    /// Stamps every line with `identity`'s configuration and code digests, which
    /// `--resume` checks.
    pub fn with_identity(mut self, identity: RunIdentity) -> RecordWriter {
        self.identity = Some(identity);
        self
    }

    /// The file written to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one trial and flushes.
    pub fn write(&mut self, suite: &str, outcome: &TrialOutcome) -> Result<()> {
        let rec = Record {
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            suite,
            host: std::fs::read_to_string("/etc/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            outcome,
            oracle_version: crate::oracle::ORACLE_VERSION,
            generator_version: crate::inputs::GENERATOR_VERSION,
            tol_scale: crate::gates::tiers::scale(),
            xla_cpu: &self.xla_cpu,
            config_digest: self.identity.as_ref().map(|i| i.config_digest.as_str()),
            code_digest: self
                .identity
                .as_ref()
                .and_then(|i| i.code_of(&outcome.implementation)),
            shard: self.shard.as_ref(),
        };
        serde_json::to_writer(&mut self.out, &rec)?;
        self.out.write_all(b"\n")?;
        self.out.flush()?;
        Ok(())
    }
}

/// The one writer of a records file: an exclusive advisory lock (`flock`) held for the
/// whole run, so two runs never interleave their lines in one file. Released when
/// dropped or when the process ends, however it ends.
pub struct SingleWriter {
    _file: File,
}

impl SingleWriter {
    /// Takes the lock on `path` (created if missing), or fails in one line naming the
    /// process that holds it.
    pub fn take(path: &Path) -> Result<SingleWriter> {
        let f = open_append(path)?;
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::io::AsRawFd;
            // SAFETY: flock on a file descriptor this function owns.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    use std::os::unix::fs::MetadataExt;
                    let holder = f
                        .metadata()
                        .ok()
                        .and_then(|m| flock_holder(m.ino()))
                        .map(|p| format!(" (pid {p})"))
                        .unwrap_or_default();
                    anyhow::bail!(
                        "{} is being written by another grpo-suite run{holder}; give this run its own --records file",
                        path.display()
                    );
                }
                return Err(err).with_context(|| format!("cannot lock {}", path.display()));
            }
        }
        Ok(SingleWriter { _file: f })
    }
}

/// The process holding a `flock` on the file with inode `ino`, from `/proc/locks`.
#[cfg(target_os = "linux")]
fn flock_holder(ino: u64) -> Option<u32> {
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    text.lines().find_map(|l| {
        // "1: FLOCK  ADVISORY  WRITE 12345 fd:01:1234567 0 EOF"
        let f: Vec<&str> = l.split_whitespace().collect();
        let dev = f.get(5)?;
        (f.get(1) == Some(&"FLOCK") && dev.rsplit(':').next()? == ino.to_string())
            .then(|| f.get(4)?.parse().ok())?
    })
}

/// What [`read`] found in a record file.
#[derive(Debug, Default)]
pub struct ReadBack {
    /// Every complete, readable trial line, in file order.
    pub outcomes: Vec<TrialOutcome>,
    /// A last line cut short (a crash while writing it): tolerated, reported here.
    pub truncated_last_line: Option<usize>,
}

/// Reads a JSONL record file back. A truncated *last* line is tolerated (and reported);
/// an unreadable line elsewhere is an error naming the file and line.
pub fn read(path: &Path) -> Result<ReadBack> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read record file {}", path.display()))?;
    let lines: Vec<&str> = text.lines().collect();
    let mut back = ReadBack::default();
    for (k, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<TrialOutcome>(line) {
            Ok(o) => back.outcomes.push(o),
            Err(_) if k + 1 == lines.len() && !text.ends_with('\n') => {
                back.truncated_last_line = Some(k + 1)
            }
            Err(e) => anyhow::bail!("{}:{}: unreadable record line: {e}", path.display(), k + 1),
        }
    }
    Ok(back)
}
