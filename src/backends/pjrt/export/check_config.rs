//! Checking the configured implementations with the exporter's registry (`--check-config`),
//! its answers cached on disk.

use super::batch::write_atomically;
use super::exporter::Exporter;
use super::process::{
    exporter_failure_of, last_message, startup_limit, supervised, timeout, Ended, Said,
};
use super::protocol::{CHECKING, MISMATCH_EXIT, PROTOCOL};
use super::pyenv::{check_python, PyEnv};
use crate::config::entry::ImplConfig;
use anyhow::{bail, Context, Result};
use serde::Deserialize;

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

impl Exporter {
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
}
