//! `grpo-suite golden update|check`.

use anyhow::{bail, Result};
use clap::Subcommand;
use grpo_conformance::cases::{Matrix, Suite};
use grpo_conformance::golden::{self, Check, BLESS_HINT};
use grpo_conformance::runner::Prepared;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;

/// Which golden files.
#[derive(Debug, clap::Args)]
pub struct GoldenArgs {
    /// smoke | ci | nightly | full
    #[arg(long, default_value = "ci")]
    suite: Suite,
    /// Golden directory.
    #[arg(long, default_value_os_t = grpo_conformance::repo_root().join("golden"))]
    dir: PathBuf,
    /// Only cases whose id contains this.
    #[arg(long)]
    filter: Option<String>,
}

/// What to do with golden files.
#[derive(Debug, Subcommand)]
pub enum GoldenAction {
    /// Re-derive and write the golden files of a suite (bless).
    Update(GoldenArgs),
    /// Re-derive the golden values and compare with the stored files.
    Check(GoldenArgs),
}

fn bar(n: usize) -> ProgressBar {
    let pb = ProgressBar::new(n as u64);
    pb.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} {wide_msg}").unwrap());
    pb
}

/// Runs the action.
pub fn run(matrix: &Matrix, action: GoldenAction) -> Result<()> {
    let (update, GoldenArgs { suite, dir, filter }) = match action {
        GoldenAction::Update(a) => (true, a),
        GoldenAction::Check(a) => (false, a),
    };
    let cases: Vec<_> = matrix
        .suite(suite)
        .into_iter()
        .filter(|c| filter.as_deref().is_none_or(|f| c.id.contains(f)))
        .collect();
    if cases.is_empty() {
        bail!("no case of suite {suite} matches the filter: nothing would be checked");
    }
    if !update && !dir.is_dir() {
        bail!("golden directory {} does not exist (check --dir)", dir.display());
    }
    let pb = bar(cases.len());
    let mut problems = Vec::new();
    for c in &cases {
        pb.set_message(c.id.clone());
        if let Err(e) = grpo_conformance::trials::check_host_memory(c) {
            problems.push(format!("{}: {e}", c.id));
            pb.inc(1);
            continue;
        }
        let p = Prepared::new(c);
        let path = golden::path(&dir, c);
        if update {
            golden::store(&path, &golden::compute(c, &p.inputs, &p.oracle))?;
        } else {
            match golden::check(&dir, c, &p.inputs, &p.oracle) {
                Ok(Check::Match) => {}
                Ok(Check::Mismatch(d)) => problems.push(format!("{}:\n  {}", path.display(), d.join("\n  "))),
                Err(e) => problems.push(format!("{e:#}")),
            }
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    if update {
        eprintln!("wrote {} golden files under {}", cases.len(), dir.display());
        if suite == Suite::Full {
            for o in golden::orphans(&dir, &matrix.suite(Suite::Full)) {
                eprintln!("note: {} belongs to no case; delete it if the case was removed", o.display());
            }
        }
        return Ok(());
    }
    if problems.is_empty() {
        eprintln!("golden check: {} cases match", cases.len());
        Ok(())
    } else {
        for p in &problems {
            eprintln!("{p}");
        }
        bail!("golden check: {} of {} cases differ; {BLESS_HINT}", problems.len(), cases.len())
    }
}
