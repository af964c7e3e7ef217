//! The arguments of `grpo-suite run` and the checks and defaults that need only them and
//! the configuration.

use anyhow::{bail, Result};
use clap::Args;
use grpo_conformance::backends::RunOptions;
use grpo_conformance::cases::Suite;
use grpo_conformance::cases::{parse_id, Matrix};
use grpo_conformance::config::Config;
use grpo_conformance::trials::{Plan, Selection, Work};
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// smoke | ci | nightly | full
    #[arg(long, default_value = "smoke")]
    pub suite: Suite,
    /// Only run trials of these backends (default: every configured one).
    #[arg(long = "backend")]
    pub backends: Vec<String>,
    /// Only run trials of these implementations.
    #[arg(long = "impl")]
    pub impls: Vec<String>,
    /// Only trials this selects (names are `backend/implementation/case`, `golden/case`,
    /// `should-fail/variant`): whole `/`-separated segments (`logits/` is not
    /// `-inputlogits/`), a `*`-glob over the name, or `~substring`.
    #[arg(long)]
    pub filter: Option<String>,
    /// Run only this case's trials (repeatable): a case of the matrix, or any valid case
    /// id outside it (its inputs and oracle generated as for any case; `grpo-suite cases
    /// ID` says why an id is invalid). Golden and should-fail trials are left out.
    #[arg(long = "case", id = "case_ids", value_name = "ID")]
    pub case_ids: Vec<String>,
    /// Run configuration (default: GRPO_CONFIG, else configs/nightly.yaml for the nightly
    /// suite, else configs/default.yaml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Timed executions per trial (after warm-up); default from the config.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::cli::numbers::count)]
    pub repeats: Option<usize>,
    /// Untimed warm-up executions; default from the config.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::cli::numbers::count)]
    pub warmup: Option<usize>,
    /// JSONL record file (default: records/<suite>-<unix time>.jsonl).
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// Print the selected trial names and exit (nothing is exported or run).
    #[arg(long)]
    pub list: bool,
    /// With --list: load the configuration without its environments (no plugin,
    /// interpreter or pythonpath checked, no implementation imported; backends that do
    /// not open are listed as unavailable): checks that a config, an example's say, still
    /// loads against this suite.
    #[arg(long, requires = "list")]
    pub load_only: bool,
    /// Run shard I of N of the selected plan (1-based): whole cases (each with every trial
    /// that shares its inputs and oracle), dealt longest first by estimated cost; the
    /// records carry the plan's stamp (`<records>.plan.json`) for `grpo-suite merge`
    /// (docs/nightly.md, "Across machines").
    #[arg(long, value_name = "I/N")]
    pub partition: Option<grpo_conformance::partition::Partition>,
    /// Weigh the split by the seconds an earlier run's records measured per trial (an
    /// estimate for a trial it lacks). Every shard must be given the same file.
    #[arg(long, value_name = "RECORDS", requires = "partition")]
    pub partition_weights: Option<PathBuf>,
    /// Skip the trials this record file already has and append the rest to it.
    #[arg(long, value_name = "RECORDS")]
    pub resume: Option<PathBuf>,
    /// Seconds one trial may take before its worker is killed and the trial recorded as
    /// timed out (default: the config's `trial_timeout_s`).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::cli::numbers::seconds)]
    pub trial_timeout: Option<u64>,
    /// Run the trials in this process (a crash or hang ends the run).
    #[arg(long)]
    pub no_isolate: bool,
    /// Internal: run the trials named in FILE in this process, as a supervised worker.
    #[arg(long, hide = true, value_name = "FILE")]
    pub worker: Option<PathBuf>,
}

impl RunArgs {
    /// Refuses a `--backend` the configuration does not have.
    pub(super) fn check_backends(&self, config: &Config) -> Result<()> {
        let known = config.backends.names();
        for b in &self.backends {
            if !known.contains(b) {
                bail!(
                    "unknown backend `{b}`; the configuration {} has: {}",
                    config.origin,
                    known.join(", ")
                );
            }
        }
        Ok(())
    }

    /// Refuses an `--impl` that no trial of `plan` runs.
    pub(super) fn check_impls(&self, plan: &Plan, config: &Config) -> Result<()> {
        let all_impls: Vec<String> = plan.trials.iter().map(|t| t.key.1.clone()).collect();
        for i in &self.impls {
            if !all_impls.contains(i) {
                bail!(
                    "no configured backend has implementation `{i}` (configuration {})",
                    config.origin
                );
            }
        }
        Ok(())
    }

    /// The trials `--filter`, `--backend` and `--impl` select (whole name segments).
    pub(super) fn selection(&self) -> Selection {
        Selection {
            filters: self.filter.iter().cloned().collect(),
            segments: true,
            backends: self.backends.clone(),
            implementations: self.impls.clone(),
            ..Default::default()
        }
    }

    /// The matrix with `--case` ids outside it added (each a case of `--suite`), or None
    /// without `--case`. An invalid id is refused in one line.
    pub(super) fn case_matrix(&self, matrix: &Matrix) -> Result<Option<Matrix>> {
        if self.case_ids.is_empty() {
            return Ok(None);
        }
        let mut extra = Vec::new();
        for id in &self.case_ids {
            let mut c = match matrix.get(id) {
                Some(c) => c.clone(),
                None => {
                    let mut c = parse_id(id).map_err(|e| anyhow::anyhow!("--case: {e}"))?;
                    c.origin = "--case".into();
                    c
                }
            };
            c.suites = vec![self.suite];
            extra.push(c);
        }
        Ok(Some(matrix.clone().merged(Matrix { cases: extra })?))
    }

    /// With `--case`: keeps only the run and trajectory trials of those cases.
    pub(super) fn keep_cases(&self, plan: &mut Plan) {
        if self.case_ids.is_empty() {
            return;
        }
        plan.trials.retain(|t| match &t.work {
            Work::Run { case, .. } | Work::Trajectory { case, .. } => {
                self.case_ids.contains(&case.id)
            }
            _ => false,
        });
    }

    /// Warm-up and timed executions: the arguments', else the configuration's.
    pub(super) fn run_options(&self, config: &Config) -> RunOptions {
        RunOptions {
            warmup: self.warmup.unwrap_or(config.warmup),
            repeats: self.repeats.unwrap_or(config.repeats),
        }
    }

    /// How long one trial may take: `--trial-timeout`, else the configuration's.
    pub(super) fn trial_timeout(&self, config: &Config) -> Duration {
        Duration::from_secs(self.trial_timeout.unwrap_or(config.trial_timeout_s))
    }

    /// The records file: `--resume`'s or `--records`' (refused when the two name different
    /// files), else `records/<suite>-<unix time>.jsonl`; a `--resume` file must exist.
    pub(super) fn records_path(&self) -> Result<PathBuf> {
        let path = match (&self.resume, &self.records) {
            (Some(r), Some(p)) if r != p => bail!(
                "--resume {} and --records {} name different files",
                r.display(),
                p.display()
            ),
            (Some(r), _) => r.clone(),
            (None, Some(p)) => p.clone(),
            (None, None) => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                grpo_conformance::repo_root()
                    .join("records")
                    .join(format!("{}-{t}.jsonl", self.suite))
            }
        };
        if let Some(r) = self.resume.as_ref().filter(|r| !r.is_file()) {
            bail!(
                "--resume {}: no such records file (nothing to resume; without --resume a run starts a new file)",
                r.display()
            );
        }
        Ok(path)
    }
}
