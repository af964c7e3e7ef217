//! Exporting a batch of requests: spread over exporter processes by implementation, each
//! process's requests under the time limit, and its answers read.

use super::manifest::Manifest;
use super::process::{
    exporter_failure_of, last_message, startup_limit, supervised, timeout, Ended, Said,
};
use super::protocol::READY;
use super::pyenv::PyEnv;
use crate::cases::Case;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Writes `text` to `path` through a temporary sibling and a rename, so that a process
/// reading `path` at the same time (parallel runs sharing the artifact cache) sees the
/// whole file or none. Best effort: a cache that cannot be written is only a cache.
pub fn write_atomically(path: &Path, text: &str) {
    crate::atomic_file::replace(path, text.as_bytes()).ok();
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
    /// The case is of a level the implementation does not have (the reason).
    NotApplicable(String),
    /// The module breaks SPEC's output contract: outputs of SPEC's shapes in other dtypes
    /// (what differs).
    BreaksContract(String),
    /// Export failed (one line: what, and where in the implementation's code).
    Failed(String),
}

/// What an exporter exports for: the platform (`cpu`, `tpu`, `cuda`) and, on `cpu`, the
/// accelerator whose precision it emulates (grpo_jax's `precision.py`).
#[derive(Debug, Clone, PartialEq)]
pub struct Platform {
    /// The platform's name.
    pub name: String,
    /// On `cpu`: the accelerator it stands for.
    pub emulates: Option<crate::backends::pjrt::Emulates>,
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
    emulates: Option<crate::backends::pjrt::Emulates>,
    #[serde(skip_serializing_if = "Option::is_none")]
    devices: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sharding: Option<crate::cases::Sharding>,
}

/// One exporter answer line, as the exporter writes it.
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
    platform: &Platform,
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
pub(super) fn shard_by_implementation(names: &[&str], jobs: usize) -> Vec<Vec<usize>> {
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
    platform: &Platform,
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
            platform: &platform.name,
            emulates: platform.emulates,
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
        "not_applicable" => {
            Exported::NotApplicable(r.reason.unwrap_or_else(|| "not applicable".into()))
        }
        "contract" => Exported::BreaksContract(r.message.unwrap_or_default().replace('\n', " ")),
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
