//! `grpo-suite export RECORDS --wandb DIR --tensorboard DIR`: a run's records as a W&B
//! offline run and TensorBoard event files (docs/nightly.md, "Dashboards"). The payload
//! is [`grpo_conformance::export::payload`]; the writers are the W&B SDK and
//! tensorboardX, in `.venvs/dashboards` (scripts/setup_dashboards.sh).

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::process::Command;

/// Arguments of `export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The run's JSONL records (a merged run's too).
    pub records: PathBuf,
    /// Write a W&B run in offline mode under this directory (`wandb sync` uploads it).
    #[arg(long, value_name = "DIR")]
    pub wandb: Option<PathBuf>,
    /// Write TensorBoard event files into this directory.
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,
    /// The W&B project.
    #[arg(long, default_value = "grpo-conformance")]
    pub project: String,
    /// The W&B run's name (default: the records file's stem).
    #[arg(long)]
    pub name: Option<String>,
    /// W&B tags (repeatable, or comma-separated): the same tags each night make one
    /// series of runs on a dashboard.
    #[arg(long = "tags", value_delimiter = ',')]
    pub tags: Vec<String>,
    /// The Python with wandb and tensorboardX (default: .venvs/dashboards/bin/python).
    #[arg(long)]
    pub python: Option<PathBuf>,
}

/// Runs `export`.
pub fn run(args: ExportArgs) -> Result<()> {
    if args.wandb.is_none() && args.tensorboard.is_none() {
        bail!("export: name --wandb DIR, --tensorboard DIR or both");
    }
    let text = std::fs::read_to_string(&args.records)
        .with_context(|| format!("cannot read record file {}", args.records.display()))?;
    let back = grpo_conformance::records::read(&args.records)?;
    if back.outcomes.is_empty() {
        bail!(
            "{}: no trial records: nothing to export",
            args.records.display()
        );
    }
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let payload = grpo_conformance::export::payload(&lines, &back.outcomes);
    let python = args
        .python
        .clone()
        .unwrap_or_else(|| grpo_conformance::repo_root().join(".venvs/dashboards/bin/python"));
    if !python.exists() {
        bail!(
            "no dashboards environment at {}: run scripts/setup_dashboards.sh (or give --python)",
            python.display()
        );
    }
    let file = std::env::temp_dir().join(format!("grpo-export-{}.json", std::process::id()));
    std::fs::write(&file, serde_json::to_vec(&payload)?)?;
    let name = args.name.clone().unwrap_or_else(|| {
        args.records
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "run".into())
    });
    let mut cmd = Command::new(&python);
    cmd.arg(grpo_conformance::repo_root().join("scripts/export_dashboards.py"))
        .arg(&file)
        .args(["--project", &args.project, "--name", &name]);
    for t in &args.tags {
        cmd.args(["--tag", t]);
    }
    if let Some(d) = &args.wandb {
        cmd.arg("--wandb").arg(d);
    }
    if let Some(d) = &args.tensorboard {
        cmd.arg("--tensorboard").arg(d);
    }
    let out = cmd.output();
    let _ = std::fs::remove_file(&file);
    let out = out.with_context(|| format!("cannot run {}", python.display()))?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "the dashboard writers failed (exit {}): {}",
            out.status.code().unwrap_or(-1),
            err.lines()
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or("no message")
        );
    }
    Ok(())
}
